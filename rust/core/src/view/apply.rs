//! The journals' records folded into the view. A delete is remembered for a while (a
//! tombstone), and a clear by its time, so that an older put or hit read later from another
//! journal cannot bring the entry back.

use super::View;
use crate::journal::JournalRecord;
use std::time::{Duration, Instant};

/// How long a view remembers a deleted name. Journals reach a reader late (a network
/// client caches their lengths: 20 s on sshfs, up to 60 s on NFS, more on a loaded server),
/// so an older put or hit of a deleted entry may still arrive from another journal; within
/// this time it cannot bring the entry back.
const TOMBSTONE_KEEP: Duration = Duration::from_secs(600);

impl View {
    /// Folds one journal record into the view. A delete is remembered (a tombstone), so
    /// that a put or hit of that name from before the delete, read later from another
    /// journal, is ignored; a put from after it (the entry published again) wins. Times
    /// come from the writers' clocks: a republish on another host within the clock skew
    /// of the delete may be missed (the file is then unindexed until an explicit evict or
    /// `verify --repair` finds it), the price of never counting a deleted file.
    pub fn apply(&mut self, rec: JournalRecord) {
        match rec {
            JournalRecord::Touch {
                name,
                disk_bytes,
                t,
                put,
            } => {
                if self.cleared_at > 0 && t <= self.cleared_at && self.entries.get(name).is_none() {
                    return;
                }
                match self.tombstones.get(&name) {
                    // A hit never brings an entry back: only a publish does.
                    Some(_) if !put && self.entries.get(name).is_none() => return,
                    Some(&(dt, _)) if put && t <= dt => return,
                    Some(_) if put => {
                        self.tombstones.remove(&name);
                    }
                    _ => {}
                }
                if put {
                    self.entries.touch(name, disk_bytes, t)
                } else {
                    self.entries.hit(name, disk_bytes, t)
                }
            }
            JournalRecord::Delete { name, t } => {
                self.entries.remove_if_older(name, t);
                self.tombstone(name, t);
            }
            JournalRecord::Clear { t } => {
                self.entries.clear_up_to(t);
                self.cleared_at = self.cleared_at.max(t);
            }
            JournalRecord::Stats { .. } | JournalRecord::TierStats { .. } => {}
        }
    }

    fn tombstone(&mut self, name: u128, t: u64) {
        let now = Instant::now();
        let e = self.tombstones.entry(name).or_insert((t, now));
        if t >= e.0 {
            *e = (t, now);
        }
    }

    /// Removes `name`, deleted at `t` by this process (evicted, or its file found gone).
    pub fn forget(&mut self, name: u128, t: u64) -> Option<crate::lru::EntryInfo> {
        self.tombstone(name, t);
        self.entries.remove(name)
    }

    /// Records that `name`'s file was found on disk with `disk_bytes` (a fact, which no
    /// tombstone overrides), used at `t` unless the view knows a later use.
    pub fn found(&mut self, name: u128, disk_bytes: u64, t: u64) {
        self.tombstones.remove(&name);
        self.entries.touch(name, disk_bytes, t);
    }

    pub(super) fn prune_tombstones(&mut self) {
        if self
            .last_prune
            .is_some_and(|t| t.elapsed() < TOMBSTONE_KEEP / 10)
        {
            return;
        }
        self.last_prune = Some(Instant::now());
        self.tombstones
            .retain(|_, (_, learnt)| learnt.elapsed() < TOMBSTONE_KEEP);
    }

    /// Drops entries of a freshly loaded snapshot that a remembered delete removed (the
    /// snapshot's writer may not have read that delete yet).
    pub(super) fn apply_tombstones(&mut self) {
        let mut names: Vec<u128> = self.tombstones.keys().copied().collect();
        self.entries.materialize_many(&mut names);
        let dead: Vec<u128> = self
            .tombstones
            .iter()
            .filter(|(&n, &(t, _))| self.entries.get(n).is_some_and(|i| i.last_use <= t))
            .map(|(&n, _)| n)
            .collect();
        for n in dead {
            self.entries.remove(n);
        }
        if self.cleared_at > 0 {
            self.entries.clear_up_to(self.cleared_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::journal::{JournalRecord, JournalWriter};
    use crate::view::tests::{layout, put, touch};
    use crate::view::View;

    #[test]
    fn clear_record_empties_the_view() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.clone(), "h".into());
        w.append(&[
            JournalRecord::Touch {
                name: 1,
                disk_bytes: 1,
                t: 1,
                put: true,
            },
            JournalRecord::Clear { t: 5 },
            JournalRecord::Touch {
                name: 2,
                disk_bytes: 1,
                t: 6,
                put: true,
            },
        ])
        .unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert_eq!(v.entries.len(), 1);
        assert!(v.entries.get(2).is_some());
    }

    #[test]
    fn a_delete_read_first_is_not_undone_by_an_older_put_or_hit_of_another_journal() {
        let (_d, l) = layout();
        // Journal "a..." is read before "b..." (name order): the delete (t=20) is folded
        // before the put (t=10) and the buffered hit (t=15) it follows.
        let mut deleter = JournalWriter::new(l.clone(), "a".into());
        let mut putter = JournalWriter::new(l.clone(), "b".into());
        deleter
            .append(&[JournalRecord::Delete { name: 1, t: 20 }])
            .unwrap();
        putter
            .append(&[put(1, 10), touch(1, 15, false), put(2, 11)])
            .unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert!(v.entries.get(1).is_none(), "resurrected by an older put");
        assert_eq!(v.entries.len(), 1);
        assert_eq!(v.entries.total_bytes(), 4096);
        // The same records read across two refreshes (a journal seen late).
        putter.append(&[touch(1, 18, false)]).unwrap();
        v.refresh(&l, true, false).unwrap();
        assert!(v.entries.get(1).is_none(), "a hit brings no entry back");
        // Published again after the delete: the newer put wins.
        putter.append(&[put(1, 30)]).unwrap();
        v.refresh(&l, true, false).unwrap();
        assert_eq!(v.entries.get(1).unwrap().last_use, 30);
    }

    #[test]
    fn tombstones_survive_a_snapshot_reload_and_prune_its_entries() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.clone(), "w".into());
        w.append(&[put(1, 10), put(2, 11)]).unwrap();
        // A compactor that has not read the delete yet writes 1 into the snapshot.
        let mut compactor = View::default();
        compactor.refresh(&l, true, false).unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert!(v.forget(1, 20).is_some());
        compactor.compact(&l, &[]).unwrap();
        v.refresh(&l, true, false).unwrap();
        assert!(
            v.entries.get(1).is_none(),
            "snapshot brought back a deleted entry"
        );
        assert!(v.entries.get(2).is_some());
        // A file found on disk is a fact: it is indexed whatever the tombstone says.
        v.found(1, 8192, 5);
        assert_eq!(v.entries.get(1).unwrap().disk_bytes, 8192);
    }

    #[test]
    fn clear_is_not_undone_by_older_records_read_later() {
        let (_d, l) = layout();
        let mut a = JournalWriter::new(l.clone(), "a".into());
        let mut b = JournalWriter::new(l.clone(), "b".into());
        a.append(&[JournalRecord::Clear { t: 50 }]).unwrap();
        b.append(&[put(1, 40), put(2, 60)]).unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert!(v.entries.get(1).is_none());
        assert!(v.entries.get(2).is_some());
    }
}
