//! Eviction: an explicit `evict()`, and the time slices a put runs when the cache is over
//! its budget or holds entries past their max age, under the evictor lock; compaction of the
//! journals into the snapshot; sweeping tmp/, trash/ and leftover leases.

use super::{claim, disk_bytes, errno, State, Store};
use crate::clock::unique_suffix;
use crate::dir::{self as cdir, Kind, Name, Stat};
use crate::error::{io_err, StoreError};
use crate::journal::{self, JournalRecord};
use crate::layout::{Layout, JOURNAL, LOCKS, TMP, TRASH};
use crate::lock::LockGuard;
use crate::snapshot;
use crate::stats::Counter;
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// An explicit eviction re-reads the journals after its pass and goes on if what arrived
/// meanwhile put the view over the target again, at most this many passes in all.
const EXPLICIT_ROUNDS: u32 = 4;

pub(super) const EVICT_LOCK: &str = "evict";

/// Journals untouched this long whose owner cannot be checked (another host) are folded
/// and removed by compaction.
const REMOTE_JOURNAL_AGE: Duration = Duration::from_secs(24 * 3600);

/// What `evict` did.
#[derive(Debug, Default, Clone)]
pub struct EvictReport {
    pub removed: u64,
    /// Bytes freed: the `st_blocks` of the files moved to trash.
    pub bytes: u64,
    /// Index records dropped because their file was already gone (removed by a process
    /// whose records this view had not read yet): they counted toward the budget, freed
    /// nothing.
    pub dropped: u64,
    /// Files the index did not know, found on disk by an explicit `evict()` and indexed.
    pub added: u64,
    /// File names (hex) of the evicted entries.
    pub names: Vec<String>,
    pub skipped: Option<String>,
    /// Stopped early by `interrupt`.
    pub interrupted: bool,
    /// Files and directories it could not use and went on without: index files it could
    /// not read, directories that were not real directories inside the cache.
    pub skipped_files: Vec<String>,
}

/// Renews the evictor's lease every quarter lease while a long job holds it.
pub(super) struct Heartbeat {
    last: Instant,
    every: Duration,
}

impl Heartbeat {
    pub(super) fn new(lease_time: Duration) -> Self {
        Self {
            last: Instant::now(),
            every: lease_time / 4,
        }
    }

    /// False if the lease was taken over: the caller stops and leaves the rest to its new
    /// holder.
    pub(super) fn beat(&mut self, guard: &mut LockGuard, store: &Store) -> bool {
        if self.last.elapsed() <= self.every {
            return true;
        }
        if let Err(e) = guard.heartbeat() {
            store.warn("lease", || format!("eviction stopped early: {e}"));
            return false;
        }
        self.last = Instant::now();
        true
    }
}

impl Store {
    /// Evicts now: down to `max_size` bytes (default: the budget's low watermark, or nothing
    /// if unbounded) and every entry unused for `older_than`.
    pub fn evict(
        &self,
        max_size: Option<u64>,
        older_than: Option<Duration>,
    ) -> Result<EvictReport, StoreError> {
        self.writable()?;
        let _walk = self.walk();
        let target = max_size.or(self.max_size().map(|m| self.low_water(m)));
        // The cache's stored max-age applies to an explicit eviction too, unless the caller
        // named its own.
        let older_than = older_than.or(self.max_age());
        // A lock that cannot be taken (a planted takeover ticket that is no file, say) is a
        // skipped eviction like a held one: counted and warned, never an error.
        let guard = match self.locks.try_lock_for(EVICT_LOCK, self.opts.lock_timeout) {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                return Ok(EvictReport {
                    skipped: Some("another process holds the evictor lock".into()),
                    ..Default::default()
                })
            }
            Err(e) => {
                self.counters.inc(Counter::Errors);
                self.warn("lock", || format!("cannot take the evictor lock: {e}"));
                return Ok(EvictReport {
                    skipped: Some(format!("cannot take the evictor lock: {e}")),
                    ..Default::default()
                });
            }
        };
        let mut st = self.state();
        let mut report = self
            .evict_locked(&mut st, guard, target, older_than, None)
            .map_err(|e| io_err("evict in", &self.layout.root, e))?;
        report.skipped_files = self.unreadable_files(&st);
        Ok(report)
    }

    /// After a put: re-read the journals when due; evict when over budget and compact when
    /// the journals grew. Skips (never waits) when another process holds the evictor lock.
    pub(super) fn maybe_evict(&self, st: &mut State) {
        let max = self.max_size();
        // The other writers are likely putting about as much as this one: re-read their
        // journals once the budget may be full, not only every refresh_interval (a cold
        // cache filled by many processes would otherwise overshoot by their number).
        let likely = st.likely_unseen();
        let due = st
            .last_refresh
            .is_none_or(|t| t.elapsed() >= self.opts.refresh_interval)
            || max.is_some_and(|m| st.view.entries.total_bytes().saturating_add(likely) > m)
            || st.evict_backlog.is_some();
        if !due {
            return;
        }
        let res = self.refresh_for_put(st);
        if !self.refresh_ok(res) {
            return;
        }
        // The refresh may have read new stored settings.
        let (max, max_age) = (self.max_size(), self.max_age());
        let total = st.view.entries.total_bytes();
        let over = max.filter(|&m| total > m);
        // An eviction cut short by its time slice goes on with the next put.
        let backlog = st.evict_backlog.filter(|&t| total > t);
        let aged = max_age.filter(|a| {
            let cutoff = crate::clock::unix_ns().saturating_sub(a.as_nanos() as u64);
            st.view
                .entries
                .oldest()
                .next()
                .is_some_and(|(_, i)| i.last_use < cutoff)
        });
        if over.is_none() && backlog.is_none() && aged.is_none() && !st.view.wants_compaction() {
            return;
        }
        let Some(guard) = self.take_evict_lock(Duration::ZERO) else {
            return;
        };
        let target = over.map(|m| self.put_low_water(st, m)).or(backlog);
        self.evict_slice_locked(st, guard, target, aged);
    }

    /// The evictor lock, waiting up to `wait`; None when another process holds it (or it
    /// cannot be taken: logged).
    pub(super) fn take_evict_lock(&self, wait: Duration) -> Option<LockGuard> {
        match self.locks.try_lock_for(EVICT_LOCK, wait) {
            Ok(g) => g,
            Err(e) => {
                self.warn("lock", || format!("cannot take the evictor lock: {e}"));
                None
            }
        }
    }

    /// One time slice of eviction from the put path, toward `target`; failures are
    /// counted and logged, never returned.
    pub(super) fn evict_slice_locked(
        &self,
        st: &mut State,
        guard: LockGuard,
        target: Option<u64>,
        older_than: Option<Duration>,
    ) {
        let deadline = Instant::now() + self.opts.evict_slice;
        if let Err(e) = self.evict_locked(st, guard, target, older_than, Some(deadline)) {
            self.counters.inc(Counter::Errors);
            self.warn("evict", || format!("eviction failed: {e}"));
        }
    }

    /// Where an eviction for a budget of `max` bytes stops.
    pub(super) fn low_water(&self, max: u64) -> u64 {
        (max as f64 * self.opts.low_watermark) as u64
    }

    /// Evicts with the lock held: refreshes, removes oldest entries until the total is at
    /// most `target` and every entry unused for `older_than`, then compacts and sweeps. Past
    /// `deadline` it stops and leaves the rest to the next put (`State::evict_backlog`).
    /// Without a deadline (an explicit `evict()`), it first reconciles the view with the
    /// files (`reconcile`), and re-reads the journals when done, going on while records
    /// that arrived meanwhile keep it over the target.
    pub(super) fn evict_locked(
        &self,
        st: &mut State,
        mut guard: LockGuard,
        target: Option<u64>,
        older_than: Option<Duration>,
        deadline: Option<Instant>,
    ) -> io::Result<EvictReport> {
        let started = crate::clock::unix_ns();
        let res = self.evict_with(st, &mut guard, target, older_than, deadline);
        if let Some(trace) = &self.opts.evict_trace {
            let line = format!(
                "{} {started} {}\n",
                std::process::id(),
                crate::clock::unix_ns()
            );
            if let Err(e) = append_trace(trace, line.as_bytes()) {
                self.warn("evict-trace", || {
                    format!("not writing the evict trace {}: {e}", trace.display())
                });
            }
        }
        drop(guard);
        res
    }

    pub(super) fn evict_with(
        &self,
        st: &mut State,
        guard: &mut LockGuard,
        target: Option<u64>,
        older_than: Option<Duration>,
        deadline: Option<Instant>,
    ) -> io::Result<EvictReport> {
        let explicit = deadline.is_none();
        if explicit {
            self.refresh(st)?;
        } else {
            self.refresh_for_put(st)?;
        }
        st.evict_backlog = None;
        let mut report = EvictReport::default();
        let mut beat = Heartbeat::new(self.opts.lease_time);
        if explicit {
            self.reconcile(st, guard, &mut beat, &mut report)?;
        }
        let now = crate::clock::unix_ns();
        let cutoff = older_than.map(|d| now.saturating_sub(d.as_nanos() as u64));
        let mut skip = HashSet::new();
        let mut rounds = 0;
        loop {
            rounds += 1;
            let done = self.evict_pass(
                st,
                guard,
                &mut beat,
                &mut report,
                (target, cutoff, now),
                deadline,
                &mut skip,
            );
            let over = |st: &State| target.is_some_and(|t| st.view.entries.total_bytes() > t);
            if !done {
                report.interrupted = explicit && self.interrupted();
                // Out of time, or the lease was lost: the next put goes on (if it can).
                st.evict_backlog = target.filter(|_| over(st));
                break;
            }
            if !explicit {
                break;
            }
            // Records that arrived while this eviction worked (other hosts' puts read only
            // now) may have put the view over the target again: go on on the new view.
            self.refresh(st)?;
            if !over(st) || rounds >= EXPLICIT_ROUNDS || !beat.beat(guard, self) {
                break;
            }
        }
        self.counters.add(Counter::Evictions, report.removed);
        self.counters.add(Counter::EvictedBytes, report.bytes);
        self.flush_stats_locked(st, true);
        // Sweeping lists tmp/ and trash/ and stats every file there: once per eviction, not
        // once per time slice, and from puts at most every tenth of the shortest grace (the
        // trash holds every entry evicted within its grace, so a small cache that evicts every
        // few puts would otherwise stat thousands of files per eviction). `evict()` always
        // sweeps.
        if st.evict_backlog.is_none() && (explicit || self.sweep_due(st)) {
            // With a large trash on a network filesystem the sweep can outlast a lease.
            self.sweep_with(false, &mut || beat.beat(guard, self));
            st.last_sweep = Some(Instant::now());
        }
        if st.view.wants_compaction() && beat.beat(guard, self) {
            self.compact_locked(st);
            // Compaction re-read the journals: a view that grew over the target is the next
            // put's to bring down.
            if !explicit && target.is_some_and(|t| st.view.entries.total_bytes() > t) {
                st.evict_backlog = target;
            }
        }
        Ok(report)
    }

    /// Removes the oldest entries, one at a time, while the view is over `target` or the
    /// oldest is older than `cutoff`. A record whose file is already gone (evicted or
    /// deleted by another host the view has not heard from) frees nothing: it is dropped
    /// and counted in `dropped`, and eviction goes on. Freed bytes are those of the files
    /// actually moved to trash (`st_blocks`). False if it stopped early (deadline, lease).
    #[allow(clippy::too_many_arguments)]
    fn evict_pass(
        &self,
        st: &mut State,
        guard: &mut LockGuard,
        beat: &mut Heartbeat,
        report: &mut EvictReport,
        (target, cutoff, now): (Option<u64>, Option<u64>, u64),
        deadline: Option<Instant>,
        skip: &mut HashSet<u128>,
    ) -> bool {
        let mut records = Vec::new();
        let mut done = true;
        let mut first = true;
        let mut paused = false;
        let trash = self.dir(&TRASH);
        loop {
            let over = target.is_some_and(|t| st.view.entries.total_bytes() > t);
            let next = st
                .view
                .entries
                .oldest()
                .find(|(n, _)| !skip.contains(n))
                .filter(|(_, info)| over || cutoff.is_some_and(|c| info.last_use < c));
            let Some((name, info)) = next else { break };
            if deadline.is_none() && report.removed == 1 && !paused {
                // A test interrupts the walk here, once it has removed an entry.
                paused = true;
                crate::testhook::pause("walk", || self.interrupt_pending());
            }
            if deadline.is_none() && self.interrupt_pending() {
                done = false;
                break;
            }
            // At least one entry per slice, so a backlog always shrinks.
            if !first && deadline.is_some_and(|d| Instant::now() >= d) {
                done = false;
                break;
            }
            first = false;
            let file = Name::entry(name);
            let shard_rel = Layout::shard_rel(name);
            let shard_and_aside = self.dir(&shard_rel).and_then(|shard| {
                let aside = Name::checked(Kind::Made, &format!("{file}.{}", unique_suffix()))?;
                Ok((shard, aside))
            });
            let moved = match (&trash, shard_and_aside) {
                (Ok(trash), Ok((shard, aside))) => {
                    // What the file really takes, not what the index believed (a client's
                    // cached attributes where it has them: no extra round trip on a network
                    // filesystem).
                    match shard.stat(&file) {
                        Ok(m) if m.is_dir() => {
                            // Not an entry: verify --repair's to remove, never moved to trash.
                            self.unsafe_path(Layout::entry_rel(name).as_str(), &"a directory");
                            Err(io::Error::from_raw_os_error(libc::ENOENT))
                        }
                        size => shard
                            .rename(&file, trash, &aside)
                            .map(|()| size.map(|m| disk_bytes(&m))),
                    }
                }
                (Err(e), _) => Err(e.raw_os_error().map_or_else(
                    || io::Error::new(e.kind(), e.to_string()),
                    io::Error::from_raw_os_error,
                )),
                (_, Err(e)) => Err(e),
            };
            match moved {
                Ok(size) => {
                    report.removed += 1;
                    report.bytes += size.unwrap_or(info.disk_bytes);
                    report.names.push(file.to_string());
                }
                // Gone, or not reachable inside the cache (a shard that is a link: counted
                // where it was met): the record frees nothing here.
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        || errno(&e) == Some(libc::ESTALE)
                        || cdir::is_unsafe(&e) =>
                {
                    report.dropped += 1;
                }
                Err(e) => {
                    self.counters.inc(Counter::Errors);
                    self.warn("evict", || {
                        format!(
                            "cannot evict {}: {e}",
                            self.layout.entry_path(name).display()
                        )
                    });
                    skip.insert(name);
                    continue;
                }
            }
            st.view.forget(name, now);
            records.push(JournalRecord::Delete { name, t: now });
            if !beat.beat(guard, self) {
                done = false;
                break;
            }
        }
        if !records.is_empty() {
            self.append_locked(st, &records);
        }
        done
    }

    pub(super) fn compact_locked(&self, st: &mut State) {
        // A later release's snapshot is that release's index: replacing it with this one's
        // would lose what only it holds. This release goes on from the journals, and that
        // release compacts them, rewriting it. One not rewritten for a day has no release
        // keeping it (or was planted to stop compaction): replaced.
        if let Some(v) = self.later_snapshot() {
            self.warn("newer-snapshot", || {
                format!(
                    "the index snapshot of {} is of version {v}, a later release's (this one \
                     writes version {}): not compacted by this release, which reads the \
                     journals alone until it is upgraded",
                    self.layout.root.display(),
                    snapshot::SNAP_VERSION
                )
            });
            return;
        }
        // Read our own latest records too, so the snapshot is as fresh as it can be.
        if self.refresh(st).is_err() {
            return;
        }
        let now = crate::clock::unix_ns();
        let own = st.journal.name().cloned();
        let Ok(jdir) = self.dir(&JOURNAL) else {
            return;
        };
        let mut remove = Vec::new();
        for (name, js) in &st.view.journals {
            if Some(name) == own.as_ref() {
                continue;
            }
            let Ok(m) = jdir.stat(name) else {
                continue;
            };
            if m.len() != js.offset {
                continue;
            }
            let old = age(&m, now) > REMOTE_JOURNAL_AGE;
            let gone = match journal::owner_gone(name.as_str(), &self.host) {
                Some(g) => g,
                None => old,
            };
            // A journal holding a later release's records is that release's to fold: kept
            // until it is as old as another host's journal would be.
            if gone && (old || !self.holds_later_records(&jdir, name, m.len())) {
                remove.push(name.clone());
            }
        }
        if let Err(e) = st.view.compact(&self.root, &remove) {
            self.warn("compact", || {
                format!("cannot write the cache index snapshot: {e}")
            });
        }
    }

    /// The version of the index snapshot on disk when it is a later release's (its first
    /// bytes say so) written or changed within `REMOTE_JOURNAL_AGE` (by its change time,
    /// which no one sets), else None.
    fn later_snapshot(&self) -> Option<u32> {
        use std::os::unix::fs::FileExt;
        let rel = crate::layout::INDEX.join(&Name::fixed("snapshot"));
        let f = self.root.open_file(&rel, libc::O_RDONLY, 0).ok()?;
        let m = cdir::fstat(&f).ok().filter(|m| m.is_file())?;
        if !kept_for_its_release(m.ctime_ns(), crate::clock::unix_ns()) {
            return None;
        }
        let mut head = [0u8; 8];
        f.read_exact_at(&mut head, 0).ok()?;
        let version = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        (&head[..4] == snapshot::SNAP_MAGIC && version > snapshot::SNAP_VERSION).then_some(version)
    }

    /// Whether the journal `name` (of `len` bytes) holds records of a later release.
    fn holds_later_records(&self, jdir: &cdir::Dir, name: &Name, len: u64) -> bool {
        jdir.open_file(name, libc::O_RDONLY, 0)
            .and_then(|f| journal::holds_later_kinds(&f, len))
            .unwrap_or(false)
    }

    fn sweep_due(&self, st: &State) -> bool {
        let every = self.opts.trash_grace.min(self.opts.tmp_grace) / 10;
        st.last_sweep.is_none_or(|t| t.elapsed() >= every)
    }

    /// Removes temp files, trash and lease leftovers older than their grace periods; returns
    /// how many (temp + lease leftovers, trash). With `dry_run` it only counts (for verify).
    pub(super) fn sweep(&self, dry_run: bool) -> (u64, u64) {
        self.sweep_with(dry_run, &mut || true)
    }

    /// `sweep`, asking `go_on` (the evictor's heartbeat) before each file; stops when it
    /// says no (the lease was lost: its new holder sweeps).
    fn sweep_with(&self, dry_run: bool, go_on: &mut dyn FnMut() -> bool) -> (u64, u64) {
        let now = crate::clock::unix_ns();
        let mut counts = (0, 0);
        // (directory, grace, counted as trash, dot files only: in locks/ only the leftovers
        // of killed lease writers are swept). Each is opened beneath the root without
        // following links, and its files removed through that handle: a directory swapped
        // for a link to elsewhere is skipped (counted, warned), never swept.
        for (dir, grace, trash, dot_only) in [
            (TMP, self.opts.tmp_grace, false, false),
            (TRASH, self.opts.trash_grace, true, false),
            (LOCKS, self.opts.tmp_grace, false, true),
            // Compile claims of holders that died, retired ones nobody took, and their temp
            // files (a live claim is rewritten every quarter lease, so it is never this old).
            (claim::CLAIMS, self.opts.tmp_grace, false, false),
        ] {
            let Ok(d) = self.dir(&dir) else { continue };
            let Ok(names) = d.list() else { continue };
            for name in names {
                if !go_on() {
                    return counts;
                }
                let name = &name;
                if dot_only && !name.as_str().starts_with('.') {
                    continue;
                }
                let Ok(m) = d.stat(name) else { continue };
                // The claims' own directory lives in locks/.
                if dot_only && m.is_dir() {
                    continue;
                }
                if age(&m, now) <= grace {
                    continue;
                }
                if trash {
                    counts.1 += 1;
                } else {
                    counts.0 += 1;
                }
                if !dry_run {
                    let _ = if m.is_dir() {
                        d.remove_any(name).map(drop)
                    } else {
                        d.unlink(name)
                    };
                }
            }
        }
        counts
    }
}

/// Appends `line` to the evict trace at `path`: opened without following a link or waiting
/// on a FIFO (`O_NOFOLLOW | O_NONBLOCK`), and written only if it is a regular file. The
/// path is the user's, but what stands there may be anyone's.
fn append_trace(path: &Path, line: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o666)
        .custom_flags(cdir::SAFE_OPEN)
        .open(path)?;
    let st = cdir::fstat(&f)?;
    if !st.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("it is {}, not a regular file", st.kind()),
        ));
    }
    f.write_all(line)
}

/// Whether a later release's snapshot, last changed at `changed_ns` (its change time, which
/// no one can set back), is still that release's to keep at `now_ns`: changed within
/// `REMOTE_JOURNAL_AGE`, as a release that compacts the cache rewrites it. One older was left
/// by a release no longer running here, or planted to stop compaction: this one replaces it.
pub(super) fn kept_for_its_release(changed_ns: u64, now_ns: u64) -> bool {
    Duration::from_nanos(now_ns.saturating_sub(changed_ns)) <= REMOTE_JOURNAL_AGE
}

fn age(m: &Stat, now_ns: u64) -> Duration {
    Duration::from_nanos(now_ns.saturating_sub(m.ctime_ns().max(m.mtime_ns())))
}
