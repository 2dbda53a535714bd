//! Per-process counters. Each process writes its cumulative counters to its own journal;
//! `Store::stats` sums the latest record of every journal.
//!
//! Besides its own fixed counters, the core keeps counters per remote tier, keyed by the
//! name its caller gives the tier: the core knows no kind of tier, only names (data).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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
    /// a directory: the operation skipped them. Also a trusting reader's verification
    /// record refused (`verified.rs`): it verified as without one.
    UnsafePaths,
    /// Index files (journals, snapshot) skipped because they could not be read (another
    /// user's mode 0600, or not a regular file).
    Unreadable,
    /// Compile time the hits saved: each hit adds the compile time its entry's producer
    /// recorded (`COMPILE_TIME_META`), in milliseconds. Appended last: journals and
    /// snapshots carry their counter count, so older records read as 0 here and older
    /// readers ignore it.
    CompileSavedMs,
    /// The remote tiers behind the store, summed over the tiers: counted through
    /// `Store::add_tier` (which also counts them per tier), kept here
    /// so that they are aggregated across processes like the rest. Appended last, as
    /// `CompileSavedMs` was.
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
    /// what a trusting `import` rejected. Appended after the remote totals; see
    /// `PER_KIND_RECORD` for the records of the release that kept per-kind counters here.
    Untrusted,
    /// Lookups served from the files another program's cache left (JAX's own cache
    /// directory), each also counted a hit (`Store::count_adopted`).
    Adopted,
    /// Misses of a key that has an entry made by another build of the framework's runtime
    /// (another jaxlib or torch_xla binary, or a PJRT plugin), or by a release that did not
    /// record builds: each also counted a miss (`Store::count_other_build`). Appended after
    /// `Adopted`.
    OtherBuild,
    /// Loading ahead (the JAX adapter's prefetch, counted through `Store::add_prefetch`):
    /// entries a plan named, loaded ahead, taken by a read, loaded and never taken, failed
    /// in the background, the time the reads saved (ms), plans written, plans refused.
    /// Appended after `OtherBuild` (journals that end at `other_build` read them as 0), in
    /// `PREFETCH_COUNTER_NAMES` order; the compile-ahead ones, below, follow `BuildRehashes`.
    PrefetchPlanned,
    PrefetchLoaded,
    PrefetchUsed,
    PrefetchWasted,
    PrefetchErrors,
    PrefetchSavedMs,
    PrefetchPlansWritten,
    PrefetchPlansRefused,
    /// Process starts whose runtime build was computed with no record to keep its binaries'
    /// identities in (`build_id/`: neither the home nor a directory of this user's own on
    /// this host could be written), so every such start hashes them again. Appended after
    /// the loading-ahead counters.
    BuildRehashes,
    /// Compiling ahead (the JAX adapter, counted through `Store::add_prefetch` as loading
    /// ahead is, the last three of `PREFETCH_COUNTER_NAMES`): programs compiled ahead from
    /// their module records, those handed to the framework's compile, module records
    /// refused. Appended last, after `BuildRehashes` (journals that end there, or at
    /// `prefetch_plans_refused`, read them as 0).
    PrefetchCompiled,
    PrefetchCompiledUsed,
    PrefetchModulesRefused,
    /// Lookups and received files that met an entry of a later release's format (its
    /// version above this one's): a miss each, never removed as corrupt. Appended last,
    /// after `PrefetchModulesRefused` (journals that end there read it as 0).
    NewerFormat,
}

/// The first of the remote totals, in `TIER_COUNTER_NAMES` order.
const FIRST_REMOTE: usize = Counter::RemoteHits as usize;

// Journals written before the core counted tiers by name held 40 more counters after these
// (per kind of tier, by position). A record of more counters than `N_COUNTERS` adds only the
// first `N_COUNTERS` (`add_into`), so those journals still sum into the totals; their
// per-kind figures are not read, since reading them would take the core knowing the kinds.

pub const COUNTER_NAMES: [&str; 47] = [
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
    "untrusted",
    "adopted",
    "other_build",
    "prefetch_planned",
    "prefetch_loaded",
    "prefetch_used",
    "prefetch_wasted",
    "prefetch_errors",
    "prefetch_saved_ms",
    "prefetch_plans_written",
    "prefetch_plans_refused",
    "build_rehashes",
    "prefetch_compiled",
    "prefetch_compiled_used",
    "prefetch_modules_refused",
    "newer_format",
];
pub const N_COUNTERS: usize = COUNTER_NAMES.len();

/// The counters kept per remote tier: those of the `remote_*` totals, in their order.
pub const TIER_COUNTER_NAMES: [&str; N_TIER_COUNTERS] = [
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
pub const N_TIER_COUNTERS: usize = 10;
/// The counters a caller outside the core keeps of its loading and compiling ahead
/// (`Store::add_prefetch`), without their `prefetch_` prefix: the core knows them by name
/// only. Each is the counter of the same place in `PREFETCH_COUNTERS`.
pub const PREFETCH_COUNTER_NAMES: [&str; N_PREFETCH_COUNTERS] = [
    "planned",
    "loaded",
    "used",
    "wasted",
    "errors",
    "saved_ms",
    "plans_written",
    "plans_refused",
    "compiled",
    "compiled_used",
    "modules_refused",
];
pub const N_PREFETCH_COUNTERS: usize = 11;
/// Where each of `PREFETCH_COUNTER_NAMES` is counted: loading ahead's after `OtherBuild`,
/// compiling ahead's after `BuildRehashes` (each appended in its turn).
const PREFETCH_COUNTERS: [Counter; N_PREFETCH_COUNTERS] = [
    Counter::PrefetchPlanned,
    Counter::PrefetchLoaded,
    Counter::PrefetchUsed,
    Counter::PrefetchWasted,
    Counter::PrefetchErrors,
    Counter::PrefetchSavedMs,
    Counter::PrefetchPlansWritten,
    Counter::PrefetchPlansRefused,
    Counter::PrefetchCompiled,
    Counter::PrefetchCompiledUsed,
    Counter::PrefetchModulesRefused,
];

/// The index among the counters of the prefetch counter `counter` (a name of
/// `PREFETCH_COUNTER_NAMES`).
pub fn prefetch_counter(counter: &str) -> Option<usize> {
    PREFETCH_COUNTER_NAMES
        .iter()
        .position(|n| *n == counter)
        .map(|i| PREFETCH_COUNTERS[i] as usize)
}

/// Tiers counted at most, in one process and in the sum over every journal: a journal is
/// untrusted, and one naming thousands of tiers must not grow every reader's view.
pub const MAX_TIERS: usize = 32;
/// Longest tier name, in bytes.
pub const MAX_TIER_NAME: usize = 40;

/// Counters per tier name.
pub type TierCounters = BTreeMap<String, [u64; N_TIER_COUNTERS]>;

/// A tier name the core keeps: 1 to `MAX_TIER_NAME` bytes of lower-case letters, digits,
/// `_`, `-` and `.` (it becomes part of a counter's name, `remote_<tier>_hits`).
pub fn valid_tier_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TIER_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b))
}

/// The index of `counter` among `TIER_COUNTER_NAMES`.
pub fn tier_counter(counter: &str) -> Option<usize> {
    TIER_COUNTER_NAMES.iter().position(|n| *n == counter)
}

/// Adds `from` into `acc`, tier by tier; tiers past `MAX_TIERS` are left out.
pub fn add_tiers_into(acc: &mut TierCounters, from: &TierCounters) {
    for (name, values) in from {
        if !acc.contains_key(name) && acc.len() >= MAX_TIERS {
            continue;
        }
        let slot = acc.entry(name.clone()).or_insert([0; N_TIER_COUNTERS]);
        for (a, b) in slot.iter_mut().zip(values) {
            *a = a.saturating_add(*b);
        }
    }
}

/// A tier's counters from a record holding `values` (fewer read as 0, more are ignored).
pub fn tier_values(values: &[u64]) -> [u64; N_TIER_COUNTERS] {
    std::array::from_fn(|i| values.get(i).copied().unwrap_or(0))
}

#[derive(Debug)]
pub struct Counters {
    values: [AtomicU64; N_COUNTERS],
    tiers: Mutex<TierCounters>,
    dirty: std::sync::atomic::AtomicBool,
}

// By hand: `Default` is derived for arrays of at most 32 elements.
impl Default for Counters {
    fn default() -> Self {
        Self {
            values: std::array::from_fn(|_| AtomicU64::new(0)),
            tiers: Mutex::new(TierCounters::new()),
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
    /// Adds `n` to counter `counter` (an index into `TIER_COUNTER_NAMES`) of the tier named
    /// `tier`, and to its `remote_*` total. False, counting nothing, for an invalid name or
    /// counter, or a new tier past `MAX_TIERS`.
    pub fn add_tier(&self, tier: &str, counter: usize, n: u64) -> bool {
        if counter >= N_TIER_COUNTERS || !valid_tier_name(tier) {
            return false;
        }
        let mut tiers = self.tiers.lock().unwrap_or_else(|p| p.into_inner());
        if !tiers.contains_key(tier) && tiers.len() >= MAX_TIERS {
            return false;
        }
        let slot = tiers
            .entry(tier.to_string())
            .or_insert([0; N_TIER_COUNTERS]);
        slot[counter] = slot[counter].saturating_add(n);
        drop(tiers);
        self.add_at(FIRST_REMOTE + counter, n);
        true
    }
    /// This process's counters per tier.
    pub fn tiers(&self) -> TierCounters {
        self.tiers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize].load(Ordering::Relaxed)
    }
    /// Back to zero (a forked child starts its own counts, in its own journal).
    pub fn reset(&self) {
        for v in &self.values {
            v.store(0, Ordering::Relaxed);
        }
        self.tiers.lock().unwrap_or_else(|p| p.into_inner()).clear();
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

/// How many counters a record of the release that counted tiers per kind holds: its 40
/// per-kind counters followed the remote totals, where `untrusted` is now. Such a record adds
/// only what comes before them, so that a fleet mixing that release and this one counts no
/// remote hit as an untrusted entry.
pub const PER_KIND_RECORD: usize = 71;
const FIRST_PER_KIND: usize = Counter::RemoteBackfills as usize + 1;
const _: () = assert!(
    N_COUNTERS != PER_KIND_RECORD,
    "a record of this release must not read as one of that release"
);

pub fn add_into(acc: &mut [u64; N_COUNTERS], v: &[u64]) {
    let v = if v.len() == PER_KIND_RECORD {
        &v[..FIRST_PER_KIND]
    } else {
        v
    };
    for (a, b) in acc.iter_mut().zip(v) {
        *a = a.saturating_add(*b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const FIRST_TIER: usize = Counter::RemoteBackfills as usize + 1;
    /// The first of the loading-ahead counters, in `PREFETCH_COUNTER_NAMES` order.
    const FIRST_PREFETCH: usize = Counter::PrefetchPlanned as usize;

    fn meta(v: &str) -> Vec<(String, String)> {
        vec![
            ("framework".into(), "jax".into()),
            (COMPILE_TIME_META.into(), v.into()),
        ]
    }

    #[test]
    fn tier_counters_follow_the_totals_in_order() {
        assert_eq!(
            FIRST_TIER,
            Counter::Untrusted as usize,
            "untrusted follows the remote totals"
        );
        for (i, counter) in TIER_COUNTER_NAMES.iter().enumerate() {
            assert_eq!(COUNTER_NAMES[FIRST_REMOTE + i], format!("remote_{counter}"));
            assert_eq!(tier_counter(counter), Some(i));
        }
    }

    #[test]
    fn prefetch_counters_follow_other_build_in_order() {
        // The order journals are read in: loading ahead's eight after `other_build`, then
        // `build_rehashes`, then compiling ahead's three, last.
        assert_eq!(FIRST_PREFETCH, Counter::OtherBuild as usize + 1);
        assert_eq!(COUNTER_NAMES[Counter::OtherBuild as usize], "other_build");
        assert_eq!(FIRST_PREFETCH + 8, Counter::BuildRehashes as usize);
        assert_eq!(
            COUNTER_NAMES[Counter::BuildRehashes as usize],
            "build_rehashes"
        );
        assert_eq!(
            Counter::BuildRehashes as usize + 1,
            Counter::PrefetchCompiled as usize
        );
        assert_eq!(
            Counter::PrefetchModulesRefused as usize + 1,
            Counter::NewerFormat as usize
        );
        assert_eq!(Counter::NewerFormat as usize + 1, N_COUNTERS);
        let mut places = Vec::new();
        for (i, counter) in PREFETCH_COUNTER_NAMES.iter().enumerate() {
            let at = if i < 8 {
                FIRST_PREFETCH + i
            } else {
                Counter::BuildRehashes as usize + i - 7
            };
            assert_eq!(COUNTER_NAMES[at], format!("prefetch_{counter}"));
            assert_eq!(prefetch_counter(counter), Some(at));
            assert_eq!(PREFETCH_COUNTERS[i] as usize, at);
            places.push(at);
        }
        assert_eq!(
            places,
            [34, 35, 36, 37, 38, 39, 40, 41, 43, 44, 45],
            "the places journals hold them at"
        );
        for bad in ["", "hits", "prefetch_used", "Used", "used "] {
            assert_eq!(prefetch_counter(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn counting_by_tier_name_adds_to_the_tier_and_the_total() {
        let c = Counters::default();
        assert!(c.add_tier("s3", tier_counter("hits").unwrap(), 2));
        assert!(c.add_tier("my-redis.1", tier_counter("get_ms").unwrap(), 5));
        assert!(c.add_tier("s3", tier_counter("hits").unwrap(), 1));
        assert_eq!(c.tiers()["s3"][0], 3);
        assert_eq!(c.tiers()["my-redis.1"][8], 5);
        assert_eq!(c.get(Counter::RemoteHits), 3);
        assert_eq!(c.get(Counter::RemoteGetMs), 5);
        assert!(c.is_dirty());
        // Names that could not be part of a counter's name, and unknown counters, count
        // nothing.
        for bad in ["", "S3", "a b", "x\n", &"t".repeat(MAX_TIER_NAME + 1)] {
            assert!(!c.add_tier(bad, 0, 1), "{bad:?}");
        }
        assert!(!c.add_tier("s3", N_TIER_COUNTERS, 1));
        assert_eq!(c.tiers().len(), 2);
        c.reset();
        assert!(c.tiers().is_empty());
    }

    #[test]
    fn tiers_are_bounded() {
        let c = Counters::default();
        for i in 0..MAX_TIERS {
            assert!(c.add_tier(&format!("t{i}"), 0, 1));
        }
        assert!(!c.add_tier("one-more", 0, 1));
        assert!(c.add_tier("t0", 0, 1), "a known tier still counts");
        let mut acc = TierCounters::new();
        let mut many = TierCounters::new();
        for i in 0..3 * MAX_TIERS {
            many.insert(format!("u{i}"), [1; N_TIER_COUNTERS]);
        }
        add_tiers_into(&mut acc, &many);
        add_tiers_into(&mut acc, &many);
        assert_eq!(acc.len(), MAX_TIERS);
        assert!(acc.values().all(|v| *v == [2; N_TIER_COUNTERS]));
    }

    #[test]
    fn records_of_other_lengths_add_what_they_hold() {
        // A journal of an older version holds fewer counters (read as 0), or the 40
        // per-kind ones of before tiers were counted by name (ignored here, as any
        // newer version's extra counters are).
        let mut acc = [0u64; N_COUNTERS];
        add_into(&mut acc, &[1; 21]);
        add_into(&mut acc, &[2; N_COUNTERS + 40]);
        assert!(acc[..21].iter().all(|v| *v == 3));
        assert!(acc[21..].iter().all(|v| *v == 2));
        // The release that counted per kind: its per-kind counters sat where `untrusted` is.
        let mut acc = [0u64; N_COUNTERS];
        add_into(&mut acc, &[1; PER_KIND_RECORD]);
        assert_eq!(acc[Counter::RemoteBackfills as usize], 1);
        assert_eq!(acc[Counter::Untrusted as usize], 0);
        // A record that ends at `other_build` (before loading ahead was counted) keeps it
        // where it was and reads the prefetch counters as 0.
        let mut acc = [0u64; N_COUNTERS];
        add_into(&mut acc, &[1; Counter::OtherBuild as usize + 1]);
        assert_eq!(acc[Counter::OtherBuild as usize], 1);
        assert!(acc[FIRST_PREFETCH..].iter().all(|v| *v == 0));
        // One that ends at `prefetch_plans_refused` (before the build's rehashes were
        // counted), or at `build_rehashes` (before compiling ahead was), reads what follows
        // as 0.
        for last in [Counter::PrefetchPlansRefused, Counter::BuildRehashes] {
            let mut acc = [0u64; N_COUNTERS];
            add_into(&mut acc, &[1; N_COUNTERS][..last as usize + 1]);
            assert_eq!(acc[last as usize], 1);
            assert!(acc[last as usize + 1..].iter().all(|v| *v == 0));
        }
        assert_eq!(tier_values(&[1, 2]), [1, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(tier_values(&[7; 12]), [7; N_TIER_COUNTERS]);
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
