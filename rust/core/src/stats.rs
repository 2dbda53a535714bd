//! Per-process counters. Each process writes its cumulative counters to its own journal;
//! `Store::stats` sums the latest record of every journal.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    Hits,
    Misses,
    Puts,
    PutExists,
    Corrupt,
    Errors,
    Evictions,
    EvictedBytes,
    BytesWritten,
    BytesRead,
    TooLarge,
    /// Compile claims taken (single flight), takeovers of stale ones among them.
    ClaimsTaken,
    ClaimTakeovers,
    /// Claims given up without a publish (compile failed or not cached).
    ClaimsAbandoned,
    /// Calls that waited for another process's claim, their total wait, and how many
    /// ran out of time.
    ClaimWaits,
    ClaimWaitMs,
    ClaimWaitTimeouts,
    /// Puts not published because, with them, this process's view of the cache (counting
    /// the other processes' likely unseen puts) was over the budget, and no eviction made
    /// room in time: another process held the evictor lock for all of `lock_timeout` while
    /// what its eviction removed did not make room, or this process evicted (at most three
    /// time slices) and what it could remove did not. Counted once per put, before or after
    /// its file was written.
    PutsRefused,
    /// Paths refused because a component was not a real directory inside the cache (a
    /// symbolic link, a file or a FIFO where a directory belongs) or an entry's name held
    /// a directory: the operation skipped them.
    UnsafePaths,
    /// Index files (journals, snapshot) skipped because they could not be read (another
    /// user's mode 0600, or not a regular file).
    Unreadable,
    /// Compile time the hits saved: each hit adds the compile time its entry's producer
    /// recorded (`COMPILE_TIME_META`), in milliseconds. Appended last: journals and
    /// snapshots carry their counter count, so older records read as 0 here and older
    /// readers ignore it.
    CompileSavedMs,
    /// The remote tiers (Redis, object stores) behind the store, summed over the tiers:
    /// counted by the Python chain through `Store::add_named`, kept here so that they are
    /// aggregated across processes like the rest. Appended last, as `CompileSavedMs` was.
    RemoteHits,
    RemoteMisses,
    RemoteRejected,
    RemoteErrors,
    RemotePuts,
    RemotePutExists,
    RemoteReadBytes,
    RemoteWrittenBytes,
    RemoteGetMs,
    RemoteBackfills,
    /// Entries a store with trusted keys would not serve (unsigned, signed by a key it does
    /// not trust, or a signature that does not verify): a miss each, never loaded; also
    /// what a trusting `import` rejected. Appended after the per-kind tier counters.
    Untrusted = 71,
}

/// The first counter callers outside the core may add to by name (`Store::add_named`);
/// every counter from it on is theirs.
const FIRST_NAMED: usize = Counter::RemoteHits as usize;

// After the `Counter` variants come the remote tiers' counters per kind of tier
// (`remote_<kind>_<counter>`: kinds redis, s3, gs, az, in this order, each with the counters
// of the `remote_*` totals in their order; the test below holds the layout). A process's
// chain may differ from another's, but a kind means the same in every process, so these sum
// across processes where a tier's position would not. Only callers outside the core count
// them (by name), so they have no variant. Appended last, as `CompileSavedMs` was: never
// reordered.

/// The index of the counter named `name`, if it is one callers outside the core may add to
/// (the `remote_*` totals and the per-kind `remote_<kind>_*`).
pub fn named(name: &str) -> Option<usize> {
    COUNTER_NAMES[FIRST_NAMED..]
        .iter()
        .position(|n| *n == name)
        .map(|i| FIRST_NAMED + i)
}

pub const COUNTER_NAMES: [&str; 72] = [
    "hits",
    "misses",
    "puts",
    "put_exists",
    "corrupt",
    "errors",
    "evictions",
    "evicted_bytes",
    "bytes_written",
    "bytes_read",
    "too_large",
    "claims",
    "claim_takeovers",
    "claims_abandoned",
    "claim_waits",
    "claim_wait_ms",
    "claim_wait_timeouts",
    "puts_refused",
    "unsafe_paths",
    "unreadable",
    "compile_saved_ms",
    "remote_hits",
    "remote_misses",
    "remote_rejected",
    "remote_errors",
    "remote_puts",
    "remote_put_exists",
    "remote_read_bytes",
    "remote_written_bytes",
    "remote_get_ms",
    "remote_backfills",
    "remote_redis_hits",
    "remote_redis_misses",
    "remote_redis_rejected",
    "remote_redis_errors",
    "remote_redis_puts",
    "remote_redis_put_exists",
    "remote_redis_read_bytes",
    "remote_redis_written_bytes",
    "remote_redis_get_ms",
    "remote_redis_backfills",
    "remote_s3_hits",
    "remote_s3_misses",
    "remote_s3_rejected",
    "remote_s3_errors",
    "remote_s3_puts",
    "remote_s3_put_exists",
    "remote_s3_read_bytes",
    "remote_s3_written_bytes",
    "remote_s3_get_ms",
    "remote_s3_backfills",
    "remote_gs_hits",
    "remote_gs_misses",
    "remote_gs_rejected",
    "remote_gs_errors",
    "remote_gs_puts",
    "remote_gs_put_exists",
    "remote_gs_read_bytes",
    "remote_gs_written_bytes",
    "remote_gs_get_ms",
    "remote_gs_backfills",
    "remote_az_hits",
    "remote_az_misses",
    "remote_az_rejected",
    "remote_az_errors",
    "remote_az_puts",
    "remote_az_put_exists",
    "remote_az_read_bytes",
    "remote_az_written_bytes",
    "remote_az_get_ms",
    "remote_az_backfills",
    "untrusted",
];
pub const N_COUNTERS: usize = COUNTER_NAMES.len();

#[derive(Debug)]
pub struct Counters {
    values: [AtomicU64; N_COUNTERS],
    dirty: std::sync::atomic::AtomicBool,
}

// By hand: `Default` is derived for arrays of at most 32 elements.
impl Default for Counters {
    fn default() -> Self {
        Self {
            values: std::array::from_fn(|_| AtomicU64::new(0)),
            dirty: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Counters {
    pub fn add(&self, c: Counter, n: u64) {
        self.values[c as usize].fetch_add(n, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Relaxed);
    }
    /// Adds to the counter at `index` (from `named`); out of range is ignored.
    pub fn add_at(&self, index: usize, n: u64) {
        if let Some(v) = self.values.get(index) {
            v.fetch_add(n, Ordering::Relaxed);
            self.dirty.store(true, Ordering::Relaxed);
        }
    }
    pub fn inc(&self, c: Counter) {
        self.add(c, 1);
    }
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize].load(Ordering::Relaxed)
    }
    /// Back to zero (a forked child starts its own counts, in its own journal).
    pub fn reset(&self) {
        for v in &self.values {
            v.store(0, Ordering::Relaxed);
        }
        self.dirty.store(false, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> [u64; N_COUNTERS] {
        std::array::from_fn(|i| self.values[i].load(Ordering::Relaxed))
    }
    /// Whether anything changed since the last `take_dirty`.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }
    /// Whether anything changed since the last call; clears the flag.
    pub fn take_dirty(&self) -> bool {
        self.dirty.swap(false, Ordering::Relaxed)
    }
}

/// Entry metadata under which a producer records how long the entry took to compile, in
/// seconds (a decimal number). Hits count it as compile time saved.
pub const COMPILE_TIME_META: &str = "compile_time_s";

/// The compile time an entry's metadata records, in whole milliseconds (0 when absent or
/// malformed; capped at a year, so a hostile value cannot overflow the counter).
pub fn compile_ms(meta: &[(String, String)]) -> u64 {
    const MAX_MS: f64 = 365.0 * 86_400_000.0;
    meta.iter()
        .find(|(k, _)| k == COMPILE_TIME_META)
        .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(0, |s| (s * 1000.0).round().min(MAX_MS) as u64)
}

pub fn add_into(acc: &mut [u64; N_COUNTERS], v: &[u64]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a = a.saturating_add(*b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const TIER_KINDS: [&str; 4] = ["redis", "s3", "gs", "az"];
    const TIER_COUNTERS: [&str; 10] = [
        "hits",
        "misses",
        "rejected",
        "errors",
        "puts",
        "put_exists",
        "read_bytes",
        "written_bytes",
        "get_ms",
        "backfills",
    ];
    const FIRST_TIER: usize = Counter::RemoteBackfills as usize + 1;

    fn meta(v: &str) -> Vec<(String, String)> {
        vec![
            ("framework".into(), "jax".into()),
            (COMPILE_TIME_META.into(), v.into()),
        ]
    }

    #[test]
    fn named_counters_are_the_appended_ones() {
        assert_eq!(named("remote_hits"), Some(Counter::RemoteHits as usize));
        assert_eq!(
            named("remote_backfills"),
            Some(Counter::RemoteBackfills as usize)
        );
        for (i, name) in COUNTER_NAMES.iter().enumerate() {
            assert_eq!(named(name), (i >= FIRST_NAMED).then_some(i));
        }
        assert_eq!(named("hits"), None);
        assert_eq!(named("nonsense"), None);
    }

    #[test]
    fn per_kind_counters_follow_the_totals_in_order() {
        assert_eq!(
            FIRST_TIER, 31,
            "the per-kind counters come after the existing ones"
        );
        assert_eq!(
            Counter::Untrusted as usize,
            FIRST_TIER + TIER_KINDS.len() * TIER_COUNTERS.len()
        );
        assert_eq!(COUNTER_NAMES[Counter::Untrusted as usize], "untrusted");
        for (k, kind) in TIER_KINDS.iter().enumerate() {
            for (c, counter) in TIER_COUNTERS.iter().enumerate() {
                let i = FIRST_TIER + k * TIER_COUNTERS.len() + c;
                assert_eq!(COUNTER_NAMES[i], format!("remote_{kind}_{counter}"));
                assert_eq!(named(COUNTER_NAMES[i]), Some(i));
            }
        }
        for counter in TIER_COUNTERS {
            assert!(named(&format!("remote_{counter}")).is_some(), "{counter}");
        }
        let c = Counters::default();
        c.add_at(named("remote_s3_hits").unwrap_or(usize::MAX), 2);
        c.add_at(N_COUNTERS, 1);
        assert_eq!(c.snapshot()[FIRST_TIER + TIER_COUNTERS.len()], 2);
        assert!(c.is_dirty());
    }

    #[test]
    fn records_of_other_lengths_add_what_they_hold() {
        // A journal of an older version holds fewer counters (the per-kind ones read as
        // 0); one of a newer version more (ignored here).
        let mut acc = [0u64; N_COUNTERS];
        add_into(&mut acc, &[1; FIRST_TIER]);
        add_into(&mut acc, &[2; N_COUNTERS + 5]);
        assert!(acc[..FIRST_TIER].iter().all(|v| *v == 3));
        assert!(acc[FIRST_TIER..].iter().all(|v| *v == 2));
    }

    #[test]
    fn compile_time_from_meta() {
        assert_eq!(compile_ms(&meta("1.2345")), 1235);
        assert_eq!(compile_ms(&meta(" 2 ")), 2000);
        for bad in ["", "x", "-1", "nan", "inf"] {
            assert_eq!(compile_ms(&meta(bad)), 0, "{bad:?}");
        }
        assert_eq!(compile_ms(&meta("1e300")), 365 * 86_400_000);
        assert_eq!(compile_ms(&[]), 0);
    }
}
