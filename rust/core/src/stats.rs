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
    /// Puts not published because the cache was far over its budget and this process
    /// could not evict at that moment (another was evicting).
    PutsRefused,
    /// Paths refused because a component was not a real directory inside the cache (a
    /// symbolic link, a file or a FIFO where a directory belongs) or an entry's name held
    /// a directory: the operation skipped them.
    UnsafePaths,
    /// Index files (journals, snapshot) skipped because they could not be read (another
    /// user's mode 0600, or not a regular file).
    Unreadable,
}

pub const COUNTER_NAMES: [&str; 20] = [
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
];
pub const N_COUNTERS: usize = COUNTER_NAMES.len();

#[derive(Debug, Default)]
pub struct Counters {
    values: [AtomicU64; N_COUNTERS],
    dirty: std::sync::atomic::AtomicBool,
}

impl Counters {
    pub fn add(&self, c: Counter, n: u64) {
        self.values[c as usize].fetch_add(n, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Relaxed);
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

pub fn add_into(acc: &mut [u64; N_COUNTERS], v: &[u64]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a = a.saturating_add(*b);
    }
}
