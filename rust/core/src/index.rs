//! The LRU index: a compacted snapshot plus the journals' records since, folded into an
//! in-memory view that is brought up to date incrementally (only new journal bytes are
//! read). The index is a hint: the entry files are the truth, and `verify` reconciles.

use crate::hash::checksum;
use crate::journal::{self, Record};
use crate::layout::Layout;
use crate::lru::Lru;
use crate::stats::{add_into, N_COUNTERS};
use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;

const SNAP_MAGIC: &[u8; 4] = b"XPCS";
const SNAP_VERSION: u32 = 1;
/// Per-entry hit counts, appended after the version-1 body so older readers still load it.
const HITS_TAG: &[u8; 4] = b"HITS";

#[derive(Debug, Clone, Default)]
pub struct JournalState {
    pub offset: u64,
    pub counters: Vec<u64>,
}

/// Identity of the snapshot file last loaded, to notice when another process replaced it.
type SnapId = (u64, u64, i64, i64, u64);

#[derive(Debug, Default)]
pub struct IndexView {
    pub lru: Lru,
    pub journals: HashMap<String, JournalState>,
    /// Counters of journals folded and removed.
    pub base_counters: Vec<u64>,
    snapshot_id: Option<SnapId>,
    loaded: bool,
    /// Journal bytes read since the snapshot: when large, compaction pays for itself.
    pub unfolded_bytes: u64,
    pub snapshot_bytes: u64,
    /// Journals left after the last compaction (live ones are kept): compaction for the sake
    /// of journal count is wanted again only once that number has doubled.
    journals_after_compaction: usize,
}

fn snap_id(m: &fs::Metadata) -> SnapId {
    (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len())
}

impl IndexView {
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

    fn reset(&mut self) {
        *self = IndexView::default();
    }

    /// Brings the view up to date: reloads the snapshot if another process replaced it,
    /// then reads what each journal gained since last time.
    pub fn refresh(&mut self, layout: &Layout) -> io::Result<()> {
        self.check_snapshot(layout)?;
        let names = match journal::list(&layout.journal_dir()) {
            Ok(n) => n,
            // No journal directory: an empty (or vanished) cache, not an error.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        if self
            .journals
            .keys()
            .any(|k| names.binary_search(k).is_err())
        {
            // A journal we were following was folded and removed by a compaction (whose
            // snapshot holds its records), or the cache was removed: start again from
            // whatever snapshot there is now.
            self.loaded = false;
            self.check_snapshot(layout)?;
        }
        for name in names {
            let state = self.journals.entry(name.clone()).or_default();
            let path = layout.journal_dir().join(&name);
            // One stat tells an unchanged journal (most of them, most of the time).
            match fs::metadata(&path) {
                Ok(m) if m.len() == state.offset => continue,
                Ok(_) => {}
                Err(_) => continue,
            }
            let (recs, end) = match journal::read_from(&path, state.offset) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => continue,
                Err(e) => return Err(e),
            };
            self.unfolded_bytes += end - state.offset;
            state.offset = end;
            let mut counters = None;
            for r in recs {
                match r {
                    Record::Touch {
                        name,
                        disk_bytes,
                        t,
                        put,
                    } => {
                        if put {
                            self.lru.touch(name, disk_bytes, t)
                        } else {
                            self.lru.hit(name, disk_bytes, t)
                        }
                    }
                    Record::Delete { name, t } => {
                        self.lru.remove_if_older(name, t);
                    }
                    Record::Clear { t } => self.lru.clear_up_to(t),
                    Record::Stats { counters: c } => counters = Some(c),
                }
            }
            if let Some(c) = counters {
                if let Some(state) = self.journals.get_mut(&name) {
                    state.counters = c;
                }
            }
        }
        self.loaded = true;
        Ok(())
    }

    fn check_snapshot(&mut self, layout: &Layout) -> io::Result<()> {
        let path = layout.snapshot();
        let meta = match fs::metadata(&path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let id = meta.as_ref().map(snap_id);
        if self.loaded && id == self.snapshot_id {
            return Ok(());
        }
        self.reset();
        self.snapshot_id = id;
        if meta.is_none() {
            return Ok(());
        }
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        self.snapshot_bytes = bytes.len() as u64;
        if let Err(why) = self.decode_snapshot(&bytes) {
            log::warn!(
                "xla_pcache: ignoring unreadable index snapshot {} ({why}); the index is rebuilt \
                 from the journals; run `xla-pcache verify --repair` to reindex older entries",
                path.display()
            );
            let id = self.snapshot_id;
            self.reset();
            self.snapshot_id = id;
        }
        Ok(())
    }

    fn decode_snapshot(&mut self, b: &[u8]) -> Result<(), &'static str> {
        if b.len() < 32 || &b[..4] != SNAP_MAGIC {
            return Err("bad magic");
        }
        let (body, sum) = b.split_at(b.len() - 8);
        if checksum(body) != u64::from_le_bytes(sum.try_into().map_err(|_| "short")?) {
            return Err("checksum mismatch");
        }
        let mut r = Reader { b: body, at: 4 };
        if r.u32()? != SNAP_VERSION {
            return Err("unknown version");
        }
        let n_entries = r.u64()?;
        let n_journals = r.u32()?;
        let n_counters = r.u32()? as usize;
        for _ in 0..n_entries {
            let name = r.u128()?;
            let disk_bytes = r.u64()?;
            let last_use = r.u64()?;
            self.lru.touch(name, disk_bytes, last_use);
        }
        for _ in 0..n_journals {
            let len = r.u16()? as usize;
            let name = String::from_utf8(r.take(len)?.to_vec()).map_err(|_| "bad name")?;
            let offset = r.u64()?;
            let counters = (0..n_counters)
                .map(|_| r.u64())
                .collect::<Result<Vec<_>, _>>()?;
            self.journals
                .insert(name, JournalState { offset, counters });
        }
        self.base_counters = (0..n_counters)
            .map(|_| r.u64())
            .collect::<Result<Vec<_>, _>>()?;
        // Optional trailing section (readers before it ignore trailing bytes, and a snapshot
        // written before it has none: every entry then has 0 hits).
        if r.at < r.b.len() {
            if r.take(4)? != HITS_TAG {
                return Err("unknown trailing section");
            }
            let n = r.u64()?;
            for _ in 0..n {
                let name = r.u128()?;
                let hits = r.u32()?;
                self.lru.add_hits(name, hits);
            }
        }
        Ok(())
    }

    fn encode_snapshot(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32 + self.lru.len() * 32 + self.journals.len() * 160);
        b.extend_from_slice(SNAP_MAGIC);
        b.extend_from_slice(&SNAP_VERSION.to_le_bytes());
        b.extend_from_slice(&(self.lru.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.journals.len() as u32).to_le_bytes());
        b.extend_from_slice(&(N_COUNTERS as u32).to_le_bytes());
        for (name, info) in self.lru.iter() {
            b.extend_from_slice(&name.to_le_bytes());
            b.extend_from_slice(&info.disk_bytes.to_le_bytes());
            b.extend_from_slice(&info.last_use.to_le_bytes());
        }
        let fixed = |v: &[u64]| -> Vec<u64> {
            (0..N_COUNTERS)
                .map(|i| v.get(i).copied().unwrap_or(0))
                .collect()
        };
        for (name, st) in &self.journals {
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            b.extend_from_slice(&st.offset.to_le_bytes());
            for c in fixed(&st.counters) {
                b.extend_from_slice(&c.to_le_bytes());
            }
        }
        for c in fixed(&self.base_counters) {
            b.extend_from_slice(&c.to_le_bytes());
        }
        let hits: Vec<(u128, u32)> = self
            .lru
            .iter()
            .filter(|(_, i)| i.hits > 0)
            .map(|(n, i)| (n, i.hits))
            .collect();
        b.extend_from_slice(HITS_TAG);
        b.extend_from_slice(&(hits.len() as u64).to_le_bytes());
        for (name, n) in hits {
            b.extend_from_slice(&name.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        let sum = checksum(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// Whether enough journal bytes accumulated that folding them into a new snapshot is
    /// cheaper than reading them again (amortised: each compaction at least doubles the
    /// bytes it replaces).
    pub fn wants_compaction(&self) -> bool {
        self.unfolded_bytes > (1 << 20).max(self.snapshot_bytes)
            || self.journals.len() > 64.max(2 * self.journals_after_compaction)
    }

    /// Writes the view as the new snapshot (temp file + rename), folding the journals in
    /// `remove` (fully read, owner gone) into the base counters; then deletes those journals.
    pub fn compact(&mut self, layout: &Layout, remove: &[String]) -> io::Result<()> {
        for name in remove {
            if let Some(st) = self.journals.remove(name) {
                let mut acc = [0u64; N_COUNTERS];
                add_into(&mut acc, &self.base_counters);
                add_into(&mut acc, &st.counters);
                self.base_counters = acc.to_vec();
            }
        }
        let bytes = self.encode_snapshot();
        let tmp = layout
            .tmp()
            .join(format!("snapshot.{}", crate::publish::unique_suffix()));
        let res = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            drop(f);
            fs::rename(&tmp, layout.snapshot())
        })();
        if res.is_err() {
            let _ = fs::remove_file(&tmp);
            return res;
        }
        self.snapshot_id = fs::metadata(layout.snapshot()).ok().map(|m| snap_id(&m));
        self.snapshot_bytes = bytes.len() as u64;
        self.unfolded_bytes = 0;
        self.journals_after_compaction = self.journals.len();
        for name in remove {
            let _ = fs::remove_file(layout.journal_dir().join(name));
        }
        Ok(())
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("overflow")?;
        if end > self.b.len() {
            return Err("truncated");
        }
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u128(&mut self) -> Result<u128, &'static str> {
        Ok(u128::from_le_bytes(
            self.take(16)?.try_into().map_err(|_| "short")?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::JournalWriter;

    fn layout() -> (tempfile::TempDir, Layout) {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::new(d.path().to_path_buf());
        l.create().unwrap();
        (d, l)
    }

    #[test]
    fn view_follows_journals_and_snapshots() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.journal_dir(), "h".into());
        w.append(&[
            Record::Touch {
                name: 1,
                disk_bytes: 100,
                t: 1,
                put: true,
            },
            Record::Touch {
                name: 2,
                disk_bytes: 200,
                t: 2,
                put: true,
            },
            Record::Stats {
                counters: vec![5, 6],
            },
        ])
        .unwrap();
        let mut v = IndexView::default();
        v.refresh(&l).unwrap();
        assert_eq!(v.lru.total_bytes(), 300);
        assert_eq!(v.counters()[..2], [5, 6]);
        w.append(&[Record::Delete { name: 1, t: 3 }]).unwrap();
        v.refresh(&l).unwrap();
        assert_eq!(v.lru.len(), 1);

        v.compact(&l, &[]).unwrap();
        let mut fresh = IndexView::default();
        fresh.refresh(&l).unwrap();
        assert_eq!(fresh.lru.len(), 1);
        assert_eq!(fresh.lru.get(2).unwrap().disk_bytes, 200);
        assert_eq!(
            fresh.counters()[..2],
            [5, 6],
            "journal stats not double counted"
        );

        // A journal folded and removed by someone else: the view restarts from the snapshot.
        let name = journal::list(&l.journal_dir()).unwrap().remove(0);
        fresh.compact(&l, &[name]).unwrap();
        assert!(journal::list(&l.journal_dir()).unwrap().is_empty());
        v.refresh(&l).unwrap();
        assert_eq!(v.lru.len(), 1);
        assert_eq!(v.counters()[..2], [5, 6]);
    }

    fn touch(name: u128, t: u64, put: bool) -> Record {
        Record::Touch {
            name,
            disk_bytes: 4096,
            t,
            put,
        }
    }

    #[test]
    fn hit_records_are_counted_and_survive_compaction() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.journal_dir(), "h".into());
        w.append(&[
            touch(1, 1, true),
            touch(2, 2, true),
            touch(1, 3, false),
            touch(1, 4, false),
            touch(2, 5, true), // a put of a present entry is no hit
        ])
        .unwrap();
        let mut v = IndexView::default();
        v.refresh(&l).unwrap();
        assert_eq!(v.lru.get(1).unwrap().hits, 2);
        assert_eq!(v.lru.get(2).unwrap().hits, 0);
        v.compact(&l, &[]).unwrap();
        w.append(&[touch(1, 6, false), touch(2, 7, false)]).unwrap();
        let mut fresh = IndexView::default();
        fresh.refresh(&l).unwrap();
        assert_eq!(fresh.lru.get(1).unwrap().hits, 3, "snapshot + journal tail");
        assert_eq!(fresh.lru.get(2).unwrap().hits, 1);
        w.append(&[Record::Delete { name: 1, t: 8 }, touch(1, 9, true)])
            .unwrap();
        fresh.refresh(&l).unwrap();
        assert_eq!(
            fresh.lru.get(1).unwrap().hits,
            0,
            "republished: starts over"
        );
    }

    #[test]
    fn snapshot_without_hits_section_loads_with_zero_hits() {
        let (_d, l) = layout();
        let mut v = IndexView::default();
        v.lru.touch(1, 4096, 1);
        v.lru.hit(1, 4096, 2);
        let mut b = v.encode_snapshot();
        // What a writer before the hits section produced: the body up to the base counters.
        let section = 4 + 8 + (16 + 4);
        b.truncate(b.len() - 8 - section);
        let sum = checksum(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        fs::write(l.snapshot(), &b).unwrap();
        let mut old = IndexView::default();
        old.refresh(&l).unwrap();
        assert_eq!(old.lru.get(1).unwrap().hits, 0);
        assert_eq!(old.lru.get(1).unwrap().last_use, 2);
    }

    #[test]
    fn corrupt_snapshot_is_ignored() {
        let (_d, l) = layout();
        fs::write(l.snapshot(), b"XPCS garbage garbage garbage garbage").unwrap();
        let mut v = IndexView::default();
        v.refresh(&l).unwrap();
        assert!(v.lru.is_empty());
    }

    #[test]
    fn clear_record_empties_the_view() {
        let (_d, l) = layout();
        let mut w = JournalWriter::new(l.journal_dir(), "h".into());
        w.append(&[
            Record::Touch {
                name: 1,
                disk_bytes: 1,
                t: 1,
                put: true,
            },
            Record::Clear { t: 5 },
            Record::Touch {
                name: 2,
                disk_bytes: 1,
                t: 6,
                put: true,
            },
        ])
        .unwrap();
        let mut v = IndexView::default();
        v.refresh(&l).unwrap();
        assert_eq!(v.lru.len(), 1);
        assert!(v.lru.get(2).is_some());
    }
}
