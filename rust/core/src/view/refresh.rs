//! The view brought up to date: the snapshot reloaded when another process replaced it,
//! then what each journal gained since the last refresh read and folded in.

use super::{JournalState, View, INDEX_DIR, SNAPSHOT};
use crate::dir::{Dir, Name, Root};
use crate::entries::Entries;
use crate::journal::{self, JournalRecord};
use crate::layout::JOURNAL;
use crate::snapshot::{Base, Opened};
use crate::stats::{add_tiers_into, tier_values, TierCounters};
use std::io;
use std::time::Instant;

impl View {
    /// Brings the view up to date: reloads the snapshot if another process replaced it,
    /// then reads what each journal gained since last time. `fresh` says the caller made
    /// the journal directory's listing fresh first (see `freshen_dir`); `from_server`
    /// asks the server for each journal's length (a network filesystem's client would
    /// serve a cached one).
    ///
    /// What it cannot read (a journal or snapshot of another user's mode 0600, or that is
    /// not a regular file) is skipped and noted in `unreadable` (one warning per file): the
    /// view is then what the readable files say.
    pub fn refresh(&mut self, root: &Root, fresh: bool, from_server: bool) -> io::Result<()> {
        self.prune_tombstones();
        self.check_snapshot(root)?;
        let jdir = match root.sub(&JOURNAL) {
            Ok(d) => Some(d),
            // No journal directory: an empty (or vanished) cache, not an error.
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let (names, bad) = match &jdir {
            Some(d) => journal::list(d)?,
            None => (Vec::new(), 0),
        };
        if bad > self.listed_bad_names {
            self.newly_bad_names += bad - self.listed_bad_names;
        }
        self.listed_bad_names = bad;
        if self
            .journals
            .keys()
            .any(|k| names.binary_search(k).is_err())
        {
            // A journal we were following was folded and removed by a compaction (whose
            // snapshot holds its records), or the cache was removed: start again from
            // whatever snapshot there is now.
            self.loaded = false;
            self.check_snapshot(root)?;
            // What the snapshot lists and the directory does not hold is not followed (nor
            // written into the next snapshot): a journal list is only ever what exists.
            self.journals.retain(|k, _| names.binary_search(k).is_ok());
        }
        let Some(jdir) = jdir else {
            self.loaded = true;
            self.counting = true;
            self.fresh = fresh;
            self.writers = 0;
            return Ok(());
        };
        let now = Instant::now();
        let mut writers = 0;
        let counting = self.counting;
        for name in names {
            let others = counting && self.own_journal.as_ref() != Some(&name);
            let offset = self.journals.get(&name).map_or(0, |s| s.offset);
            // One stat tells an unchanged journal (most of them, most of the time).
            let len = if from_server {
                jdir.len_from_server(&name)
            } else {
                jdir.stat(&name).map(|m| (m.len(), m.is_file()))
            };
            let len = match len {
                Ok((_, false)) => {
                    self.skip_unreadable(&jdir, &name, "it is not a regular file");
                    continue;
                }
                Ok((len, true)) if len == offset && self.journals.contains_key(&name) => {
                    if let Some(state) = self.journals.get_mut(&name) {
                        state.seen = Some(now);
                    }
                    continue;
                }
                Ok((len, true)) => len,
                Err(_) => continue,
            };
            let read = crate::dir::open_regular(&jdir, &name)
                .and_then(|(f, _)| journal::read_from(&f, offset, len));
            let (recs, end) = match read {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => continue,
                Err(e) => {
                    self.skip_unreadable(&jdir, &name, &e.to_string());
                    continue;
                }
            };
            self.unreadable.remove(name.as_str());
            let state = self.journals.entry(name.clone()).or_default();
            self.unfolded_bytes += end - state.offset;
            writers += usize::from(end > state.offset);
            state.offset = end;
            state.seen = Some(now);
            // The snapshot's records of the names these records mention, each block read
            // once, rather than one lookup per record.
            let mut names: Vec<u128> = recs
                .iter()
                .filter_map(|r| match r {
                    JournalRecord::Touch { name, .. } | JournalRecord::Delete { name, .. } => {
                        Some(*name)
                    }
                    _ => None,
                })
                .collect();
            self.entries.materialize_many(&mut names);
            let mut counters = None;
            let mut tiers = TierCounters::new();
            for r in recs {
                if let JournalRecord::Touch { disk_bytes, .. } = &r {
                    let room = *self
                        .room
                        .get_or_insert_with(|| crate::snapshot::filesystem_bytes(&jdir));
                    if u128::from(*disk_bytes) > room {
                        self.newly_bad_sizes += 1;
                        continue;
                    }
                }
                match r {
                    JournalRecord::Stats { counters: c } => counters = Some(c),
                    // Cumulative: the latest record of a tier replaces the one before.
                    JournalRecord::TierStats { tier, counters: c } => {
                        tiers.remove(&tier);
                        add_tiers_into(&mut tiers, &TierCounters::from([(tier, tier_values(&c))]));
                    }
                    JournalRecord::Touch {
                        disk_bytes,
                        put: true,
                        ..
                    } if others => {
                        self.others_put_bytes = self.others_put_bytes.saturating_add(disk_bytes);
                        self.apply(r)
                    }
                    r => self.apply(r),
                }
            }
            if let Some(state) = self.journals.get_mut(&name) {
                if let Some(c) = counters {
                    state.counters = c;
                }
                for (tier, values) in tiers {
                    state.tiers.remove(&tier);
                    add_tiers_into(&mut state.tiers, &TierCounters::from([(tier, values)]));
                }
            }
        }
        self.loaded = true;
        self.counting = true;
        self.fresh = fresh;
        self.writers = writers;
        Ok(())
    }

    /// Notes a file of the index that cannot be read, warning once per file (with its
    /// owner: typically another user's journal under a umask of 077).
    fn skip_unreadable(&mut self, dir: &Dir, name: &Name, why: &str) {
        if self.unreadable.contains_key(name.as_str()) {
            return;
        }
        let owner = dir
            .stat(name)
            .map(|s| crate::dir::user_name(s.uid()))
            .unwrap_or_else(|_| "unknown".into());
        log::warn!(
            "xla_pcache: skipping {} (owner {owner}): {why}; the cache's accounting goes on \
             without it",
            dir.display(name.as_str())
        );
        self.unreadable.insert(name.to_string(), owner);
        self.newly_unreadable += 1;
    }

    fn check_snapshot(&mut self, root: &Root) -> io::Result<()> {
        let idir = match root.sub(&INDEX_DIR) {
            Ok(d) => Some(d),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let meta = match idir.as_ref().map(|d| d.stat(&SNAPSHOT)) {
            None => None,
            Some(Ok(m)) => Some(m),
            Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => None,
            Some(Err(e)) => return Err(e),
        };
        let id = meta.as_ref().map(|m| m.id());
        if self.loaded && id == self.snapshot_id {
            return Ok(());
        }
        self.reset();
        self.snapshot_id = id;
        let (Some(idir), Some(meta)) = (idir, meta) else {
            return Ok(());
        };
        if !meta.is_file() {
            self.skip_unreadable(&idir, &SNAPSHOT, &format!("it is {}", meta.kind()));
            self.apply_tombstones();
            return Ok(());
        }
        let opened = match crate::dir::open_regular(&idir, &SNAPSHOT) {
            Ok((f, st)) => {
                // The snapshot read is the one opened (it may have been replaced since the
                // stat above).
                self.snapshot_id = Some(st.id());
                Base::open(f, st.len()).map(|o| (o, st.len()))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                self.skip_unreadable(&idir, &SNAPSHOT, &e.to_string());
                self.apply_tombstones();
                return Ok(());
            }
        };
        self.unreadable.remove(SNAPSHOT.as_str());
        match opened {
            Ok((o, len)) => {
                self.snapshot_bytes = len;
                self.install(o);
            }
            Err(why) => {
                self.snapshot_bad = true;
                log::warn!(
                    "xla_pcache: ignoring unreadable index snapshot {} ({why}); the index is \
                     rebuilt from the journals; run `xla-pcache verify --repair` to reindex \
                     older entries",
                    idir.display(SNAPSHOT.as_str())
                );
            }
        }
        self.apply_tombstones();
        Ok(())
    }

    /// Makes an opened snapshot the view's base.
    pub(super) fn install(&mut self, opened: Opened) {
        let meta = match opened {
            Opened::V2(base, meta) => {
                self.entries = Entries::with_base(Some(base));
                meta
            }
            Opened::V1(lru, meta) => {
                self.entries = Entries::from_lru(lru);
                meta
            }
        };
        if meta.bad_names > 0 {
            log::warn!(
                "xla_pcache: the index snapshot lists {} journal name(s) that are not a \
                 journal's (a path, or another shape); ignored, never opened or removed",
                meta.bad_names
            );
            self.newly_bad_names += meta.bad_names;
        }
        self.journals = meta
            .journals
            .into_iter()
            .map(|j| {
                (
                    j.name,
                    JournalState {
                        offset: j.offset,
                        counters: j.counters,
                        tiers: j.tiers,
                        seen: None,
                    },
                )
            })
            .collect();
        self.base_counters = meta.base_counters;
        self.base_tiers = meta.base_tiers;
    }
}

#[cfg(test)]
mod tests {
    use crate::journal::{JournalRecord, JournalWriter};
    use crate::snapshot::{self, Meta};
    use crate::view::tests::{journals, layout, snapshot_path};
    use crate::view::View;
    use std::fs;

    #[test]
    fn view_follows_journals_and_snapshots() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.clone(), "h".into());
        w.append(&[
            JournalRecord::Touch {
                name: 1,
                disk_bytes: 100,
                t: 1,
                put: true,
            },
            JournalRecord::Touch {
                name: 2,
                disk_bytes: 200,
                t: 2,
                put: true,
            },
            JournalRecord::Stats {
                counters: vec![5, 6],
            },
        ])
        .unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert_eq!(v.entries.total_bytes(), 300);
        assert_eq!(v.counters()[..2], [5, 6]);
        w.append(&[JournalRecord::Delete { name: 1, t: 3 }])
            .unwrap();
        v.refresh(&l, true, false).unwrap();
        assert_eq!(v.entries.len(), 1);

        v.compact(&l, &[]).unwrap();
        let mut fresh = View::default();
        fresh.refresh(&l, true, false).unwrap();
        assert_eq!(fresh.entries.len(), 1);
        assert_eq!(fresh.entries.get(2).unwrap().disk_bytes, 200);
        assert_eq!(
            fresh.counters()[..2],
            [5, 6],
            "journal stats not double counted"
        );

        // A journal folded and removed by someone else: the view restarts from the snapshot.
        let name = journals(&l).remove(0);
        fresh.compact(&l, &[name]).unwrap();
        assert!(journals(&l).is_empty());
        v.refresh(&l, true, false).unwrap();
        assert_eq!(v.entries.len(), 1);
        assert_eq!(v.counters()[..2], [5, 6]);
    }

    #[test]
    fn version_1_snapshots_are_read_with_or_without_hits() {
        for with_hits in [false, true] {
            let (_d, l) = layout();
            let mut lru = crate::lru::Lru::default();
            lru.touch(1, 4096, 1);
            lru.hit(1, 4096, 2);
            lru.touch(2, 100, 3);
            let meta = Meta {
                journals: Vec::new(),
                base_counters: vec![7],
                bad_names: 0,
                ..Default::default()
            };
            fs::write(
                snapshot_path(&l),
                snapshot::encode_v1(&lru, &meta, with_hits),
            )
            .unwrap();
            let mut old = View::default();
            old.refresh(&l, true, false).unwrap();
            assert_eq!(old.entries.len(), 2);
            assert_eq!(old.entries.total_bytes(), 4196);
            assert_eq!(old.entries.get(1).unwrap().hits, u32::from(with_hits));
            assert_eq!(old.entries.get(1).unwrap().last_use, 2);
            assert_eq!(old.counters()[0], 7);
            // Compaction writes the current version, which reads back the same.
            old.compact(&l, &[]).unwrap();
            let mut new = View::default();
            new.refresh(&l, true, false).unwrap();
            assert_eq!(new.entries.len(), 2);
            assert_eq!(new.entries.total_bytes(), 4196);
            assert_eq!(new.entries.get(1).unwrap().hits, u32::from(with_hits));
        }
    }

    #[test]
    fn corrupt_snapshot_is_ignored() {
        // (And one of an unknown future version.)
        let (_d, l) = layout();
        fs::write(snapshot_path(&l), b"XPCS\x09\0\0\0 garbage garbage garbage").unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert!(v.entries.is_empty());
        let (_d, l) = layout();
        fs::write(snapshot_path(&l), b"XPCS garbage garbage garbage garbage").unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert!(v.entries.is_empty());
    }
}
