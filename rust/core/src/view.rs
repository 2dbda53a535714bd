//! The view: what this process knows of the LRU index, a compacted snapshot plus the
//! journals' records since, brought up to date incrementally (only new journal bytes are
//! read; `stats` reports its age as `view_age`). The snapshot's entries stay on disk and
//! are looked up as the journals mention them (`entries::Entries`, whose `oldest` is the
//! evictor's order). The index is a hint: the entry files are the truth, and `verify`
//! reconciles.

use crate::dir::{Dir, Name, Rel, Root};
use crate::entries::Entries;
use crate::journal::{self, JournalRecord};
use crate::layout::{JOURNAL, TMP};
use crate::snapshot::{self, Base, JournalMark, Meta, Opened};
use crate::stats::{add_into, add_tiers_into, tier_values, TierCounters, N_COUNTERS};
use std::collections::HashMap;
use std::io;
use std::time::{Duration, Instant};

/// How long a view remembers a deleted name. Journals reach a reader late (a network
/// client caches their lengths: 20 s on sshfs, up to 60 s on NFS, more on a loaded server),
/// so an older put or hit of a deleted entry may still arrive from another journal; within
/// this time it cannot bring the entry back.
const TOMBSTONE_KEEP: Duration = Duration::from_secs(600);

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

    fn prune_tombstones(&mut self) {
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
    fn apply_tombstones(&mut self) {
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
    fn install(&mut self, opened: Opened) {
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
    use super::*;
    use crate::journal::JournalWriter;
    use crate::layout::Layout;
    use std::fs;
    use std::sync::Arc;

    fn layout() -> (tempfile::TempDir, Arc<Root>) {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::new(d.path().to_path_buf());
        let root = Arc::new(Root::open(d.path()).unwrap());
        l.create(&root).unwrap();
        (d, root)
    }

    fn snapshot_path(l: &Root) -> std::path::PathBuf {
        l.path().join(INDEX_DIR.as_str()).join(SNAPSHOT.as_str())
    }

    fn journals(l: &Root) -> Vec<Name> {
        journal::list(&l.sub(&JOURNAL).unwrap()).unwrap().0
    }

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

    fn touch(name: u128, t: u64, put: bool) -> JournalRecord {
        JournalRecord::Touch {
            name,
            disk_bytes: 4096,
            t,
            put,
        }
    }

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

    fn put(name: u128, t: u64) -> JournalRecord {
        touch(name, t, true)
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
