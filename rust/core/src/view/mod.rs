//! The view: what this process knows of the LRU index, a compacted snapshot plus the
//! journals' records since, brought up to date incrementally (only new journal bytes are
//! read; `stats` reports its age as `view_age`). The snapshot's entries stay on disk and
//! are looked up as the journals mention them (`entries::Entries`, whose `oldest` is the
//! evictor's order). The index is a hint: the entry files are the truth, and `verify`
//! reconciles.
//!
//! Each part has its own file: this one the view's state and what it tells (totals, age,
//! whether to compact); `apply.rs` the journals' records folded in, deletes remembered so
//! that an older record read later cannot undo them; `refresh.rs` the view brought up to
//! date from the snapshot and the journals on disk; `compact.rs` the view written as the
//! new snapshot.

mod apply;
mod compact;
mod refresh;

use crate::dir::{Name, Rel};
use crate::entries::Entries;
use crate::stats::{add_into, add_tiers_into, TierCounters, N_COUNTERS};
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Default)]
pub struct JournalState {
    pub offset: u64,
    pub counters: Vec<u64>,
    /// Its latest counters per remote tier name.
    pub tiers: TierCounters,
    /// When a refresh last found this journal's end (None: never since loaded from the
    /// snapshot). On a network filesystem that end is only as fresh as the listing was.
    pub seen: Option<Instant>,
}

/// Identity of the snapshot file last loaded, to notice when another process replaced it.
type SnapId = (u64, u64, u64, u64);
/// The index's directory and snapshot file under the root.
pub const INDEX_DIR: Rel = crate::layout::INDEX;
pub const SNAPSHOT: Name = Name::fixed("snapshot");

#[derive(Debug, Default)]
pub struct View {
    /// The entries: the snapshot's on disk, under the journals' records since in memory.
    pub entries: Entries,
    pub journals: HashMap<Name, JournalState>,
    /// Counters of journals folded and removed.
    pub base_counters: Vec<u64>,
    /// Their counters per remote tier name.
    pub base_tiers: TierCounters,
    snapshot_id: Option<SnapId>,
    loaded: bool,
    /// Journal bytes read since the snapshot: when large, compaction pays for itself.
    pub unfolded_bytes: u64,
    pub snapshot_bytes: u64,
    /// Journals left after the last compaction (live ones are kept): compaction for the sake
    /// of journal count is wanted again only once that number has doubled.
    journals_after_compaction: usize,
    /// Deleted names: the delete's time and when this view learnt of it. Journals are read
    /// one after another, and each may be read late, so a delete can be read before an older
    /// put or hit of the same name from another journal; without this, that record would
    /// bring back an entry whose file is gone (kept across snapshot reloads).
    tombstones: HashMap<u128, (u64, Instant)>,
    /// Time of the latest clear: no record at or before it brings an entry back.
    cleared_at: u64,
    last_prune: Option<Instant>,
    /// Whether the last refresh read the journals through a listing known to be fresh
    /// (`refresh(.., fresh=true)`).
    pub fresh: bool,
    /// Journals that had grown at the last refresh: how many processes are writing.
    pub writers: usize,
    /// This process's journal (file name), whose puts `others_put_bytes` leaves out.
    pub own_journal: Option<Name>,
    /// Bytes of the puts of other processes read from their journals since this view was
    /// created, not counting what a first read or a snapshot reload brings in (history,
    /// not recent puts): its growth over time is the fleet's put rate.
    pub others_put_bytes: u64,
    /// Whether the next refresh reads only what arrived since the previous one.
    counting: bool,
    /// Files of the index skipped because they cannot be read (name -> owner), and how
    /// many were newly found so since the caller last took the count.
    pub unreadable: HashMap<String, String>,
    pub newly_unreadable: u64,
    /// Names in the journal directory or a snapshot's journal list that are not a
    /// journal's (never opened, never removed), newly found since the caller last took the
    /// count, and how many the last listing had.
    pub newly_bad_names: u64,
    listed_bad_names: u64,
    /// Journal records skipped, since the caller last took the count, because they claim
    /// an entry larger than the filesystem holding it: a forged size that would otherwise
    /// count against the budget (and evict real entries) until the next compaction.
    pub newly_bad_sizes: u64,
    /// The size of the filesystem holding the journals, read once per view (a statfs is a
    /// server round trip on a network filesystem).
    room: Option<u128>,
    /// The snapshot there could not be used (damaged, inconsistent, or claiming what no
    /// writer writes): the next compaction replaces it.
    snapshot_bad: bool,
}

impl View {
    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Total counters over every process that used the cache, as of the last refresh.
    pub fn counters(&self) -> [u64; N_COUNTERS] {
        let mut acc = [0u64; N_COUNTERS];
        add_into(&mut acc, &self.base_counters);
        for j in self.journals.values() {
            add_into(&mut acc, &j.counters);
        }
        acc
    }

    /// Counters per remote tier name over every process, as of the last refresh (at most
    /// `stats::MAX_TIERS` tiers).
    pub fn tier_counters(&self) -> TierCounters {
        let mut acc = self.base_tiers.clone();
        for j in self.journals.values() {
            add_tiers_into(&mut acc, &j.tiers);
        }
        acc
    }

    fn reset(&mut self) {
        let tombstones = std::mem::take(&mut self.tombstones);
        let (cleared_at, last_prune) = (self.cleared_at, self.last_prune);
        let own_journal = self.own_journal.take();
        let others_put_bytes = self.others_put_bytes;
        let unreadable = std::mem::take(&mut self.unreadable);
        let newly = self.newly_unreadable;
        let (bad, listed_bad) = (self.newly_bad_names, self.listed_bad_names);
        let bad_sizes = self.newly_bad_sizes;
        *self = View::default();
        self.newly_bad_names = bad;
        self.newly_bad_sizes = bad_sizes;
        self.listed_bad_names = listed_bad;
        self.unreadable = unreadable;
        self.newly_unreadable = newly;
        self.own_journal = own_journal;
        self.others_put_bytes = others_put_bytes;
        self.tombstones = tombstones;
        self.cleared_at = cleared_at;
        self.last_prune = last_prune;
    }

    /// Seconds since the journal folded longest ago was last read to its end: how stale
    /// the view may be (plus, when `fresh` is false, however long the filesystem client
    /// caches file lengths).
    pub fn age(&self) -> Option<Duration> {
        if !self.loaded {
            return None;
        }
        let mut oldest = Duration::ZERO;
        for j in self.journals.values() {
            // A journal not read since the snapshot was loaded: its age is unknown.
            oldest = oldest.max(j.seen?.elapsed());
        }
        Some(oldest)
    }

    /// Whether enough journal bytes accumulated that folding them into a new snapshot is
    /// cheaper than reading them again. A new process reads (and looks up in the snapshot)
    /// every record since the snapshot before its first put, so the journals are kept to at
    /// most a sixteenth of the snapshot's size, and never over 2 MiB (about 40,000 records;
    /// what folding them costs is in docs/benchmarks.md, "Measurements behind the code");
    /// compaction streams the snapshot and costs its size in I/O (about 40 bytes per
    /// entry), in the process that holds the evictor lock.
    pub fn wants_compaction(&self) -> bool {
        self.snapshot_bad
            || self.unfolded_bytes > (self.snapshot_bytes / 16).clamp(1 << 20, 2 << 20)
            || self.journals.len() > 64.max(2 * self.journals_after_compaction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dir::Root;
    use crate::journal::{self, JournalRecord, JournalWriter};
    use crate::layout::{Layout, JOURNAL};
    use std::sync::Arc;

    pub(super) fn layout() -> (tempfile::TempDir, Arc<Root>) {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::new(d.path().to_path_buf());
        let root = Arc::new(Root::open(d.path()).unwrap());
        l.create(&root).unwrap();
        (d, root)
    }

    pub(super) fn snapshot_path(l: &Root) -> std::path::PathBuf {
        l.path().join(INDEX_DIR.as_str()).join(SNAPSHOT.as_str())
    }

    pub(super) fn journals(l: &Root) -> Vec<Name> {
        journal::list(&l.sub(&JOURNAL).unwrap()).unwrap().0
    }

    pub(super) fn touch(name: u128, t: u64, put: bool) -> JournalRecord {
        JournalRecord::Touch {
            name,
            disk_bytes: 4096,
            t,
            put,
        }
    }

    pub(super) fn put(name: u128, t: u64) -> JournalRecord {
        touch(name, t, true)
    }

    #[test]
    fn age_counts_from_the_last_read_of_every_journal() {
        let (_d, l) = layout();
        let mut v = View::default();
        assert!(v.age().is_none(), "never read");
        let mut w = JournalWriter::new(l.clone(), "w".into());
        w.append(&[put(1, 1)]).unwrap();
        v.refresh(&l, true, false).unwrap();
        let age = v.age().unwrap();
        assert!(age < Duration::from_secs(5));
        assert!(v.fresh);
        assert_eq!(v.writers, 1);
        v.refresh(&l, false, false).unwrap();
        assert!(!v.fresh);
        assert_eq!(v.writers, 0);
    }
}
