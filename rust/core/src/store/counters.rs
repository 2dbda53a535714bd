//! Counting: this process's counters, written to its journal at the stats interval (and
//! by `flush`), and the cache's figures summed over every process that used it (`stats`,
//! `len`).

use super::{State, Store};
use crate::error::StoreError;
use crate::journal::JournalRecord;
use crate::stats::{
    add_into, Counter, Counters, COUNTER_NAMES, MAX_TIERS, MAX_TIER_NAME, N_COUNTERS,
    PREFETCH_COUNTER_NAMES, TIER_COUNTER_NAMES,
};
use std::fs;
use std::time::{Duration, Instant};

/// Aggregated statistics.
#[derive(Debug, Clone)]
pub struct Stats {
    pub counters: [u64; N_COUNTERS],
    /// Counters per remote tier name (empty when no process ever counted a tier).
    pub tiers: crate::stats::TierCounters,
    pub entries: u64,
    pub bytes: u64,
    pub journals: u64,
    /// How long ago the journal read longest ago was last read to its end (None: not
    /// known, e.g. the index could not be read).
    pub view_age: Option<Duration>,
    /// Whether those reads went through a listing known to be fresh: false for a
    /// read-only store on a network filesystem, whose view may lag by however long the
    /// client caches file lengths (20 s on sshfs, up to 60 s on NFS) on top of `view_age`.
    pub view_fresh: bool,
}

impl Stats {
    /// Hits over lookups (hits and misses), None before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        let hits = self.counters[Counter::Hits as usize];
        let misses = self.counters[Counter::Misses as usize];
        (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64)
    }
}

impl Store {
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Adds `n` to the counter `counter` (one of `stats::TIER_COUNTER_NAMES`) of the remote
    /// tier its caller names `tier`, and to the `remote_*` total; false, counting nothing,
    /// for a name `stats::valid_tier_name` refuses, an unknown counter, or a tier past
    /// `stats::MAX_TIERS`. Written to the journal, summed across processes by `stats`.
    pub fn add_tier(&self, tier: &str, counter: &str, n: u64) -> bool {
        crate::stats::tier_counter(counter).is_some_and(|c| self.counters.add_tier(tier, c, n))
    }

    /// Adds `n` to the prefetch counter `counter` (one of `stats::PREFETCH_COUNTER_NAMES`);
    /// false, counting nothing, for any other name. Written to the journal with the rest.
    pub fn add_prefetch(&self, counter: &str, n: u64) -> bool {
        match crate::stats::prefetch_counter(counter) {
            Some(i) => {
                self.counters.add_at(i, n);
                self.maybe_flush_stats(false);
                true
            }
            None => false,
        }
    }

    /// `add_prefetch` of each `(counter, n)` of `counts`, all checked first: `Invalid`
    /// naming the first that is not one of `PREFETCH_COUNTER_NAMES`, and then nothing is
    /// added (a process's loading-ahead counts come in one call).
    pub fn add_prefetch_counts(&self, counts: &[(String, u64)]) -> Result<(), StoreError> {
        if let Some((counter, _)) = counts
            .iter()
            .find(|(c, _)| crate::stats::prefetch_counter(c).is_none())
        {
            return Err(StoreError::Invalid(format!(
                "invalid prefetch counter {counter:?}: one of {PREFETCH_COUNTER_NAMES:?}"
            )));
        }
        for (counter, n) in counts {
            self.add_prefetch(counter, *n);
        }
        Ok(())
    }

    /// `add_tier` of each `(tier, counter, n)` of `counts`, all checked first: `Invalid`
    /// naming the first whose tier name `stats::valid_tier_name` refuses or whose counter is
    /// not one of `TIER_COUNTER_NAMES`, and then nothing is added (a remote hit's counts come
    /// in one call). Past `MAX_TIERS` a new name is not counted, as by `add_tier`.
    pub fn add_tier_counts(&self, counts: &[(String, String, u64)]) -> Result<(), StoreError> {
        if let Some((tier, counter, _)) = counts.iter().find(|(t, c, _)| {
            !(crate::stats::valid_tier_name(t) && crate::stats::tier_counter(c).is_some())
        }) {
            return Err(StoreError::Invalid(format!(
                "invalid tier {tier:?} or counter {counter:?}: a tier name is 1 to \
                 {MAX_TIER_NAME} of a-z 0-9 _ - . (at most {MAX_TIERS} tiers), a counter \
                 one of {TIER_COUNTER_NAMES:?}"
            )));
        }
        for (tier, counter, n) in counts {
            self.add_tier(tier, counter, *n);
        }
        Ok(())
    }

    /// Counts `n` misses of lookups made outside the store: a framework that looks in a
    /// copy the store filled (torch_xla reads a host-local copy, never the store itself)
    /// reports its misses here, so that `stats` counts them with the rest.
    pub fn count_misses(&self, n: u64) {
        if n > 0 {
            self.counters.add(Counter::Misses, n);
            self.maybe_flush_stats(false);
        }
    }

    /// Counts a lookup the store missed but served from another program's cache files (an
    /// adopted JAX entry of `bytes` payload bytes): a hit, and adopted. `compile_ms`: the
    /// compile time it saved when that program recorded one; None (unknown) adds nothing
    /// to the time saved. Its caller asked the store nothing before (no miss was counted).
    pub fn count_adopted(&self, bytes: u64, compile_ms: Option<u64>) {
        self.counters.inc(Counter::Hits);
        self.counters.inc(Counter::Adopted);
        self.counters.add(Counter::BytesRead, bytes);
        if let Some(ms) = compile_ms {
            self.counters.add(Counter::CompileSavedMs, ms);
        }
        self.maybe_flush_stats(false);
    }

    /// Counts a miss (already counted by the `get` that missed) that another build of the
    /// framework's runtime has an entry for: the caller found it under that build's key.
    pub fn count_other_build(&self) {
        self.counters.inc(Counter::OtherBuild);
        self.maybe_flush_stats(false);
    }

    /// Counts a process start that computed its runtime build with no record to keep the
    /// binaries' identities in: every such start hashes them again.
    pub fn count_build_rehash(&self) {
        self.counters.inc(Counter::BuildRehashes);
        self.maybe_flush_stats(false);
    }

    pub(super) fn maybe_flush_stats(&self, force: bool) {
        // Claims released through their own handle count here (they cannot reach us).
        self.note_abandoned();
        if self.opts.read_only {
            return;
        }
        // The guard is bound first: one held inside a poisoned `Err` would live on into an
        // `else` branch that locks again, and the thread would wait on itself for ever.
        let busy = self.try_state();
        match busy {
            Some(mut st) => self.flush_stats_locked(&mut st, force),
            None if force => self.flush_stats_locked(&mut self.state(), force),
            None => {}
        }
    }

    pub(super) fn flush_stats_locked(&self, st: &mut State, force: bool) {
        if self.opts.read_only {
            return;
        }
        if !force && st.last_stats.elapsed() < self.opts.stats_interval {
            return;
        }
        st.last_stats = Instant::now();
        // Unchanged counters are not written again (so dropping a closed store writes nothing).
        if !self.counters.take_dirty() {
            self.append_locked(st, &[]);
            return;
        }
        st.journal.check_alive();
        let mut recs = vec![JournalRecord::Stats {
            counters: self.counters.snapshot().to_vec(),
        }];
        recs.extend(self.counters.tiers().into_iter().map(|(tier, values)| {
            JournalRecord::TierStats {
                tier,
                counters: values.to_vec(),
            }
        }));
        self.append_locked(st, &recs);
    }

    /// Writes this process's counters to its journal now.
    pub fn flush(&self) {
        self.maybe_flush_stats(true);
    }

    pub fn counter_names() -> &'static [&'static str] {
        &COUNTER_NAMES
    }

    /// Number of entries, from the index. A cache whose directory vanished has none; an index
    /// that cannot be read now gives the last count seen (with a warning).
    pub fn len(&self) -> Result<u64, StoreError> {
        let mut st = self.state();
        if let Err(e) = self.refresh(&mut st) {
            if !fs::symlink_metadata(&self.layout.root).is_ok_and(|m| m.is_dir()) {
                self.warn("vanished", || {
                    format!("cache directory {} is gone", self.layout.root.display())
                });
                return Ok(0);
            }
            self.warn("index", || format!("cannot read the cache index: {e}"));
        }
        Ok(st.view.entries.len() as u64)
    }

    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }

    /// Counters of every process that used the cache, plus entries and bytes from the index.
    pub fn stats(&self) -> Result<Stats, StoreError> {
        self.maybe_flush_stats(true);
        let mut st = self.state();
        if let Err(e) = self.refresh(&mut st) {
            // Stats of a vanished cache are this process's own counters.
            self.warn("index", || format!("cannot read the cache index: {e}"));
        } else if !self.opts.read_only && self.counters.is_dirty() {
            // The refresh itself counted something (an unreadable journal, a path that is
            // not a real directory): in the figures now, not at the next call.
            self.flush_stats_locked(&mut st, true);
            let _ = self.refresh(&mut st);
        }
        let mut counters = st.view.counters();
        let mut tiers = st.view.tier_counters();
        if self.opts.read_only || !st.view.is_loaded() {
            add_into(&mut counters, &self.counters.snapshot());
            crate::stats::add_tiers_into(&mut tiers, &self.counters.tiers());
        }
        Ok(Stats {
            counters,
            tiers,
            entries: st.view.entries.len() as u64,
            bytes: st.view.entries.total_bytes(),
            journals: st.view.journals.len() as u64,
            view_age: st.view.age(),
            view_fresh: st.view.fresh,
        })
    }
}
