//! The view written as the new snapshot (temp file, rename), the journals it folded
//! removed; the view goes on from the file just written.

use super::{JournalState, View, INDEX_DIR, SNAPSHOT};
use crate::dir::{Name, Root};
use crate::layout::{JOURNAL, TMP};
use crate::snapshot::{self, Base, JournalMark, Meta, Opened};
use crate::stats::{add_into, add_tiers_into, N_COUNTERS};
use std::io;

impl View {
    /// Writes the view as the new snapshot (temp file + rename), folding the journals in
    /// `remove` (fully read, owner gone) into the base counters; then deletes those journals.
    pub fn compact(&mut self, root: &Root, remove: &[Name]) -> io::Result<()> {
        for name in remove {
            if let Some(st) = self.journals.remove(name) {
                let mut acc = [0u64; N_COUNTERS];
                add_into(&mut acc, &self.base_counters);
                add_into(&mut acc, &st.counters);
                self.base_counters = acc.to_vec();
                add_tiers_into(&mut self.base_tiers, &st.tiers);
            }
        }
        // What the view followed, which is what the journal directory listed: never more
        // than a reader accepts. Past that, the journals read furthest are kept (a reader
        // starts the others from their beginning).
        let mut marks: Vec<(&Name, &JournalState)> = self.journals.iter().collect();
        if marks.len() > snapshot::MAX_JOURNALS {
            marks.sort_unstable_by(|a, b| b.1.offset.cmp(&a.1.offset).then(a.0.cmp(b.0)));
            marks.truncate(snapshot::MAX_JOURNALS);
        }
        let meta = Meta {
            journals: marks
                .into_iter()
                .map(|(name, st)| JournalMark {
                    name: name.clone(),
                    offset: st.offset,
                    counters: st.counters.clone(),
                    tiers: st.tiers.clone(),
                })
                .collect(),
            base_counters: self.base_counters.clone(),
            base_tiers: self.base_tiers.clone(),
            bad_names: 0,
        };
        let tmp_dir = root.sub(&TMP)?;
        let idir = root.sub(&INDEX_DIR)?;
        let tmp = Name::checked(
            crate::dir::Kind::Made,
            &format!("snapshot.{}", crate::clock::unique_suffix()),
        )?;
        let res = (|| {
            let f = tmp_dir.open_file(&tmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o666)?;
            let mut w = snapshot::Writer::new(f, self.entries.len() as u64)?;
            for (name, info) in self.entries.iter_by_name() {
                w.push(name, info)?;
            }
            let (f, len) = w.finish(&meta)?;
            tmp_dir.rename(&tmp, &idir, &SNAPSHOT)?;
            Ok((f, len))
        })();
        let (f, len) = match res {
            Ok(x) => x,
            Err(e) => {
                let _ = tmp_dir.unlink(&tmp);
                return Err(e);
            }
        };
        self.snapshot_id = crate::dir::fstat(&f).ok().map(|m| m.id());
        self.snapshot_bytes = len;
        self.snapshot_bad = false;
        // The view goes on from the snapshot just written (the same file, still open),
        // holding nothing of it in memory.
        match Base::open(f, len) {
            Ok(opened @ Opened::V2(..)) => {
                let (journals, counters, tiers) = (
                    std::mem::take(&mut self.journals),
                    std::mem::take(&mut self.base_counters),
                    std::mem::take(&mut self.base_tiers),
                );
                self.install(opened);
                self.journals = journals;
                self.base_counters = counters;
                self.base_tiers = tiers;
            }
            _ => self.loaded = false,
        }
        self.unfolded_bytes = 0;
        self.journals_after_compaction = self.journals.len();
        if !remove.is_empty() {
            if let Ok(jdir) = root.sub(&JOURNAL) {
                for name in remove {
                    let _ = jdir.unlink(name);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::journal::{JournalRecord, JournalWriter};
    use crate::view::tests::{layout, put, touch};
    use crate::view::View;

    #[test]
    fn hit_records_are_counted_and_survive_compaction() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.clone(), "h".into());
        w.append(&[
            touch(1, 1, true),
            touch(2, 2, true),
            touch(1, 3, false),
            touch(1, 4, false),
            touch(2, 5, true), // a put of a present entry is no hit
        ])
        .unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        assert_eq!(v.entries.get(1).unwrap().hits, 2);
        assert_eq!(v.entries.get(2).unwrap().hits, 0);
        v.compact(&l, &[]).unwrap();
        w.append(&[touch(1, 6, false), touch(2, 7, false)]).unwrap();
        let mut fresh = View::default();
        fresh.refresh(&l, true, false).unwrap();
        assert_eq!(
            fresh.entries.get(1).unwrap().hits,
            3,
            "snapshot + journal tail"
        );
        assert_eq!(fresh.entries.get(2).unwrap().hits, 1);
        w.append(&[JournalRecord::Delete { name: 1, t: 8 }, touch(1, 9, true)])
            .unwrap();
        fresh.refresh(&l, true, false).unwrap();
        assert_eq!(
            fresh.entries.get(1).unwrap().hits,
            0,
            "republished: starts over"
        );
    }

    #[test]
    fn a_put_reads_the_totals_not_the_snapshot() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.clone(), "w".into());
        let n = 5000u128;
        let recs: Vec<JournalRecord> = (0..n).map(|i| put(i * 1_000_003, i as u64)).collect();
        w.append(&recs).unwrap();
        let mut v = View::default();
        v.refresh(&l, true, false).unwrap();
        v.compact(&l, &[]).unwrap();
        assert_eq!(
            v.entries.in_memory(),
            0,
            "compaction keeps nothing in memory"
        );
        // A new process: totals from the header, journal tail looked up by block.
        w.append(&[
            put(7, 9_000_000),
            JournalRecord::Delete {
                name: 0,
                t: 9_000_001,
            },
        ])
        .unwrap();
        let mut fresh = View::default();
        fresh.refresh(&l, true, false).unwrap();
        assert_eq!(fresh.entries.len(), n as usize);
        assert_eq!(fresh.entries.total_bytes(), n as u64 * 4096);
        assert!(
            fresh.entries.in_memory() <= 2,
            "{}",
            fresh.entries.in_memory()
        );
        assert!(
            fresh.entries.blocks_read() <= 2,
            "{}",
            fresh.entries.blocks_read()
        );
        assert!(fresh.entries.get(0).is_none());
        assert_eq!(fresh.entries.get(1_000_003).unwrap().last_use, 1);
        // The evictor's order merges the snapshot's oldest with the journals'.
        let first: Vec<u128> = fresh.entries.oldest().take(3).map(|(n, _)| n).collect();
        assert_eq!(first, vec![1_000_003, 2_000_006, 3_000_009]);
        let all: Vec<u128> = fresh.entries.oldest().map(|(n, _)| n).collect();
        assert_eq!(all.len(), n as usize);
        assert_eq!(*all.last().unwrap(), 7);
        assert_eq!(fresh.entries.iter().count(), n as usize);
        // Every entry removed through the order: totals follow.
        loop {
            let next = fresh.entries.oldest().next();
            let Some((name, _)) = next else { break };
            fresh.forget(name, 10_000_000);
        }
        assert_eq!(fresh.entries.len(), 0);
        assert_eq!(fresh.entries.total_bytes(), 0);
    }
}
