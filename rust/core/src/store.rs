//! The store: put / get / contains / delete / clear / stats / evict / verify.
//!
//! Rules kept here (DESIGN.md): entries are immutable files published by rename, never
//! written in place; a reader verifies header and checksum before exposing a byte; any
//! failure inside `get` or `put` is a miss or a `false`, logged and counted, never an error;
//! a read-only store writes nothing at all.

use crate::blob::Blob;
use crate::entry::{self, EntryError};
use crate::error::{io_err, StoreError};
use crate::fsinfo::{self, FsInfo};
use crate::hash::{entry_name, name_hex, parse_name_hex, MAX_KEY_LEN};
use crate::index::IndexView;
use crate::journal::{self, JournalWriter, Record};
use crate::layout::{is_real_dir, Layout};
use crate::lock::{LockDir, LockGuard, LockMode, LockOptions};
use crate::publish::{publish_no_replace, sync_dir, unique_suffix};
use crate::stats::{add_into, Counter, Counters, COUNTER_NAMES, N_COUNTERS};
use memmap2::MmapOptions;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Below this size a file is read into memory rather than mapped: one read is cheaper than
/// mmap + page faults + munmap up to a few MiB (measured: 550 KB read 67 us vs mapped 113 us;
/// 4 MiB mapped 360 us vs read 725 us; 64 MiB mapped 11 ms vs read 53 ms). Mappings are not
/// pre-faulted (MAP_POPULATE made 4 MiB and 64 MiB hits slower, 630 us and 15 ms).
const MMAP_MIN_BYTES: u64 = 2 * 1024 * 1024;
/// Journals untouched this long whose owner cannot be checked (another host) are folded
/// and removed by compaction.
const REMOTE_JOURNAL_AGE: Duration = Duration::from_secs(24 * 3600);
const EVICT_LOCK: &str = "evict";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    Auto,
    Mmap,
    Pread,
}

impl std::str::FromStr for ReadMode {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, StoreError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(ReadMode::Auto),
            "mmap" => Ok(ReadMode::Mmap),
            "pread" | "read" => Ok(ReadMode::Pread),
            _ => Err(StoreError::Invalid(format!(
                "read mode {s:?} is not one of 'auto', 'mmap', 'pread'"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_size: Option<u64>,
    pub read_only: bool,
    pub durable: bool,
    pub lock_mode: LockMode,
    pub lock_timeout: Duration,
    pub lease_time: Duration,
    /// A process records a hit on the same entry at most once per interval.
    pub hit_interval: Duration,
    pub trash_grace: Duration,
    pub tmp_grace: Duration,
    pub read_mode: ReadMode,
    /// How often a writer re-reads the other processes' journals to re-check the budget.
    pub refresh_interval: Duration,
    /// Eviction brings the cache down to this fraction of the budget.
    pub low_watermark: f64,
    /// How often pending counters are written to the journal.
    pub stats_interval: Duration,
    /// When set, every eviction appends `pid start_ns end_ns` (time the evictor lock was
    /// held) to this file: lets tests and operators check that evictors do not overlap.
    pub evict_trace: Option<PathBuf>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_size: None,
            read_only: false,
            durable: false,
            lock_mode: LockMode::Auto,
            lock_timeout: Duration::from_millis(500),
            lease_time: Duration::from_secs(30),
            hit_interval: Duration::from_secs(60),
            trash_grace: Duration::from_secs(300),
            tmp_grace: Duration::from_secs(3600),
            read_mode: ReadMode::Auto,
            refresh_interval: Duration::from_secs(1),
            low_watermark: 0.9,
            stats_interval: Duration::from_secs(2),
            evict_trace: None,
        }
    }
}

/// A key as the caller gave it: the bytes, and whether it was text.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    pub bytes: &'a [u8],
    pub is_text: bool,
}

fn check_key(key: &Key<'_>) -> Result<(), StoreError> {
    if key.bytes.is_empty() {
        return Err(StoreError::Invalid("key must not be empty".into()));
    }
    if key.bytes.len() > MAX_KEY_LEN {
        return Err(StoreError::Invalid(format!(
            "key is {} bytes long; the limit is {MAX_KEY_LEN}",
            key.bytes.len()
        )));
    }
    Ok(())
}

/// What `evict` did.
#[derive(Debug, Default, Clone)]
pub struct EvictReport {
    pub removed: u64,
    pub bytes: u64,
    pub keys: Vec<String>,
    pub skipped: Option<String>,
}

/// What `verify` found (and repaired when asked).
#[derive(Debug, Default, Clone)]
pub struct VerifyReport {
    pub entries: u64,
    pub bytes: u64,
    pub corrupt: Vec<String>,
    pub foreign: Vec<String>,
    pub unindexed: u64,
    pub dangling: u64,
    pub stale_tmp: u64,
    pub stale_trash: u64,
    pub repaired: bool,
}

impl VerifyReport {
    /// Problems: corrupt or foreign files, and entries the index does not know (they would
    /// escape the budget). Index records of files that are gone ("dangling") are not counted:
    /// races between a delete and a hit can leave them by design, they only make eviction
    /// err toward removing more, and eviction drops them when it meets them. Stale temp and
    /// trash files are housekeeping, not faults.
    pub fn problems(&self) -> u64 {
        (self.corrupt.len() + self.foreign.len()) as u64 + self.unindexed
    }
}

/// One entry as `entries()` lists it.
#[derive(Debug, Clone)]
pub struct EntrySummary {
    pub name: String,
    pub key: Vec<u8>,
    pub key_is_text: bool,
    pub size: u64,
    pub disk_bytes: u64,
    pub created_ns: u64,
    pub last_use_ns: Option<u64>,
    pub meta: Vec<(String, String)>,
}

/// Aggregated statistics.
#[derive(Debug, Clone)]
pub struct Stats {
    pub counters: [u64; N_COUNTERS],
    pub entries: u64,
    pub bytes: u64,
    pub journals: u64,
}

struct State {
    journal: JournalWriter,
    view: IndexView,
    hits_logged: HashMap<u128, Instant>,
    /// Bytes this process published since its view was last refreshed.
    pending_bytes: u64,
    last_refresh: Option<Instant>,
    last_stats: Instant,
    /// Hit records not yet written.
    pending: Vec<Record>,
}

pub struct Store {
    layout: Layout,
    opts: StoreOptions,
    fs: FsInfo,
    mmap: bool,
    host: String,
    counters: Counters,
    state: Mutex<State>,
    locks: LockDir,
    warned: Mutex<HashMap<&'static str, Instant>>,
}

enum ReadError {
    Missing,
    Corrupt(EntryError, u64),
    Io(io::Error),
}

fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
}

fn disk_bytes(m: &fs::Metadata) -> u64 {
    let blocks = m.blocks() * 512;
    if blocks > 0 {
        blocks
    } else {
        m.len().div_ceil(4096) * 4096
    }
}

fn age(m: &fs::Metadata, now_ns: u64) -> Duration {
    let ctime_ns = (m.ctime().max(0) as u64) * 1_000_000_000 + m.ctime_nsec().max(0) as u64;
    let mtime_ns = (m.mtime().max(0) as u64) * 1_000_000_000 + m.mtime_nsec().max(0) as u64;
    Duration::from_nanos(now_ns.saturating_sub(ctime_ns.max(mtime_ns)))
}

impl Store {
    /// Opens the cache at `root`, creating it unless read-only.
    pub fn open(root: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        if opts.max_size == Some(0) {
            return Err(StoreError::Invalid(
                "max_size must be positive (or None for no limit)".into(),
            ));
        }
        if !(0.0..=1.0).contains(&opts.low_watermark) {
            return Err(StoreError::Invalid(
                "low_watermark must be within 0..1".into(),
            ));
        }
        let root = if root.is_relative() {
            std::env::current_dir()
                .map_err(|e| io_err("resolve", root, e))?
                .join(root)
        } else {
            root.to_path_buf()
        };
        let layout = Layout::new(root.clone());
        if opts.read_only {
            match fs::metadata(&root) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(StoreError::Format(format!(
                        "{} is not a directory",
                        root.display()
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(StoreError::NotFound(root))
                }
                Err(e) => return Err(io_err("open", &root, e)),
            }
            // An empty or half-created directory is an empty cache; a foreign format is not.
            layout.read_format()?;
        } else {
            layout.create()?;
            for shard in 0..=255u8 {
                let d = layout.entries().join(format!("{shard:02x}"));
                match fs::create_dir(&d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_err("create directory", &d, e)),
                }
            }
        }
        let fs_info = fsinfo::probe(&root);
        let mmap = match opts.read_mode {
            ReadMode::Auto => fs_info.local,
            ReadMode::Mmap => true,
            ReadMode::Pread => false,
        };
        let host = crate::clock::hostname().to_string();
        // FUSE network filesystems (sshfs, ...) grant fcntl locks that exclude only the
        // processes of one host, and say nothing: leases exclude across hosts there.
        let lock_mode = match opts.lock_mode {
            LockMode::Auto if fs_info.name.starts_with("fuse") => LockMode::Lease,
            m => m,
        };
        let locks = LockDir::new(
            layout.locks(),
            LockOptions {
                mode: lock_mode,
                timeout: opts.lock_timeout,
                lease_time: opts.lease_time,
                host: host.clone(),
            },
        );
        Ok(Store {
            state: Mutex::new(State {
                journal: JournalWriter::new(layout.journal_dir(), host.clone()),
                view: IndexView::default(),
                hits_logged: HashMap::new(),
                pending_bytes: 0,
                last_refresh: None,
                last_stats: Instant::now(),
                pending: Vec::new(),
            }),
            layout,
            opts,
            fs: fs_info,
            mmap,
            host,
            counters: Counters::default(),
            locks,
            warned: Mutex::new(HashMap::new()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.layout.root
    }
    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }
    pub fn filesystem(&self) -> &FsInfo {
        &self.fs
    }
    pub fn mmap_reads(&self) -> bool {
        self.mmap
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent in a way that
        // matters (it is a cache of hints), so a poisoned lock is simply taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs a warning, at most once per 10 s per kind, so a vanished cache directory does not
    /// flood the user's log with one line per operation.
    fn warn(&self, kind: &'static str, msg: impl FnOnce() -> String) {
        let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if w.get(kind)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(10))
        {
            return;
        }
        w.insert(kind, now);
        log::warn!("xla_pcache: {}", msg());
    }

    // ---------------------------------------------------------------- get

    /// The verified entry for `key`, or None. Never fails for cache reasons.
    pub fn get(&self, key: Key<'_>) -> Result<Option<Blob>, StoreError> {
        check_key(&key)?;
        let name = entry_name(key.bytes);
        let path = self.layout.entry_path(name);
        let mut retried = false;
        let result = loop {
            match self.read_entry(&path) {
                Ok(blob) => break Some(blob),
                Err(ReadError::Missing) => break None,
                Err(ReadError::Corrupt(why, _))
                    if !self.fs.local
                        && matches!(
                            why,
                            EntryError::BadLength { .. } | EntryError::TooShort(_)
                        ) =>
                {
                    // Entries are never written in place, so on a network filesystem a length
                    // that disagrees with the header is far more likely this client's stale
                    // view of a file another host replaced (cached size, clamped reads) than
                    // damage. Removing it would destroy a good entry for every host: miss only.
                    self.counters.inc(Counter::Errors);
                    self.warn("stale", || {
                        format!(
                            "incomplete view of cache entry {} ({why}), likely a stale network \
                             filesystem cache; treated as a miss",
                            path.display()
                        )
                    });
                    break None;
                }
                Err(ReadError::Corrupt(why, ino)) => {
                    self.counters.inc(Counter::Corrupt);
                    self.warn("corrupt", || {
                        format!(
                            "corrupt cache entry {} ({why}); treated as a miss",
                            path.display()
                        )
                    });
                    if !self.opts.read_only {
                        self.remove_corrupt(&path, ino, name);
                    }
                    break None;
                }
                Err(ReadError::Io(e)) if !retried && errno(&e) == Some(libc::ESTALE) => {
                    retried = true;
                }
                Err(ReadError::Io(e)) => {
                    self.counters.inc(Counter::Errors);
                    self.warn("read", || {
                        format!("cannot read {}: {e}; treated as a miss", path.display())
                    });
                    break None;
                }
            }
        };
        let result = result.filter(|b| {
            let same = b.header.key == key.bytes;
            if !same {
                self.warn("collision", || {
                    format!(
                        "{} holds a different key; treated as a miss",
                        path.display()
                    )
                });
            }
            same
        });
        match &result {
            Some(b) => {
                self.counters.inc(Counter::Hits);
                self.counters.add(Counter::BytesRead, b.header.payload_len);
                self.note_hit(name, b.header.file_len());
            }
            None => {
                self.counters.inc(Counter::Misses);
                self.maybe_flush_stats(false);
            }
        }
        Ok(result)
    }

    fn read_entry(&self, path: &Path) -> Result<Blob, ReadError> {
        let mut f = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            // A symbolic link planted in the cache is never followed; treat it as foreign.
            Err(e) if errno(&e) == Some(libc::ELOOP) => {
                return Err(ReadError::Corrupt(EntryError::BadMagic, 0))
            }
            Err(e) => return Err(ReadError::Io(e)),
        };
        let meta = f.metadata().map_err(ReadError::Io)?;
        let len = meta.len();
        if !meta.is_file() {
            return Err(ReadError::Corrupt(EntryError::BadMagic, meta.ino()));
        }
        if len < entry::FIXED_HEADER as u64 {
            return Err(ReadError::Corrupt(EntryError::TooShort(len), meta.ino()));
        }
        let corrupt = |e| ReadError::Corrupt(e, meta.ino());
        if self.mmap && len >= MMAP_MIN_BYTES {
            // SAFETY: entry files are immutable once published (never written in place), and
            // mapping is used only on local filesystems where a removed file stays readable.
            let map = unsafe { MmapOptions::new().map(&f) }.map_err(ReadError::Io)?;
            let header = entry::verify(&map).map_err(corrupt)?;
            Ok(Blob::mapped(map, header))
        } else {
            // Read to end of file rather than to the size fstat gave: on a network filesystem
            // that size may be a cached one from before another host replaced the file.
            let mut buf = Vec::with_capacity(len as usize + 1);
            f.read_to_end(&mut buf).map_err(ReadError::Io)?;
            let header = entry::verify(&buf).map_err(corrupt)?;
            Ok(Blob::owned(buf, header))
        }
    }

    /// Removes a corrupt file, taking care not to remove a good entry that replaced it since
    /// it was read: move it aside, check it is the same inode, put it back if not.
    fn remove_corrupt(&self, path: &Path, ino: u64, name: u128) {
        // Deletes are stamped before they happen and puts after, so a racing re-put always
        // wins in the index: it may err toward a record of a missing file (harmless, dropped
        // when eviction meets it), never toward an unindexed file that escapes the budget.
        let t = crate::clock::unix_ns();
        let aside =
            self.layout
                .trash()
                .join(format!("{}.corrupt.{}", name_hex(name), unique_suffix()));
        if fs::rename(path, &aside).is_err() {
            return;
        }
        match fs::symlink_metadata(&aside) {
            Ok(m) if ino == 0 || m.ino() == ino => {
                let _ = fs::remove_file(&aside);
                self.append(&[Record::Delete { name, t }]);
            }
            _ => {
                let _ = publish_no_replace(&aside, path);
                let _ = fs::remove_file(&aside);
            }
        }
    }

    fn note_hit(&self, name: u128, file_len: u64) {
        if self.opts.read_only {
            return;
        }
        // A hit never waits behind an eviction in another thread: if the state is busy the
        // recency record is skipped (recency is approximate by design).
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        let now = Instant::now();
        let due = st
            .hits_logged
            .get(&name)
            .is_none_or(|t| now.duration_since(*t) >= self.opts.hit_interval);
        if due {
            st.hits_logged.insert(name, now);
            let disk = file_len.div_ceil(4096) * 4096;
            // Buffered, not written: a hit costs no journal write (nor, for the first hit of
            // a process, a journal creation). It goes out with the next put or counters flush.
            st.pending.push(Record::Touch {
                name,
                disk_bytes: disk,
                t: crate::clock::unix_ns(),
                put: false,
            });
        }
        self.flush_stats_locked(&mut st, false);
    }

    // ---------------------------------------------------------------- put

    /// Stores `value` under `key`. Ok(true) if this call published it; Ok(false) if the key
    /// exists, the store is read-only, the value is larger than the budget, or writing failed.
    pub fn put(
        &self,
        key: Key<'_>,
        value: &[u8],
        meta: &[(String, String)],
    ) -> Result<bool, StoreError> {
        check_key(&key)?;
        if self.opts.read_only {
            return Ok(false);
        }
        let name = entry_name(key.bytes);
        let path = self.layout.entry_path(name);
        if fs::symlink_metadata(&path).is_ok() {
            self.counters.inc(Counter::PutExists);
            self.maybe_flush_stats(false);
            return Ok(false);
        }
        let header = entry::encode_header(
            key.bytes,
            key.is_text,
            meta,
            value.len() as u64,
            crate::hash::checksum(value),
            crate::clock::unix_ns(),
        )
        .map_err(|e| StoreError::Invalid(format!("cannot encode entry: {e}")))?;
        let total = (header.len() + value.len()) as u64;
        if let Some(max) = self.opts.max_size {
            if total > max {
                self.counters.inc(Counter::TooLarge);
                self.warn("too-large", || {
                    format!("not caching a {total}-byte entry: it is larger than the cache budget of {max} bytes")
                });
                return Ok(false);
            }
        }
        let outcome = self
            .write_and_publish(name, &path, &header, value)
            .or_else(|e| {
                // The root may have been replaced by an empty directory: lay it out again, once.
                if e.kind() == io::ErrorKind::NotFound && self.relayout() {
                    self.write_and_publish(name, &path, &header, value)
                } else {
                    Err(e)
                }
            });
        match outcome {
            Ok(Some(disk)) => {
                self.counters.inc(Counter::Puts);
                self.counters.add(Counter::BytesWritten, total);
                let mut st = self.state();
                let rec = Record::Touch {
                    name,
                    disk_bytes: disk,
                    t: crate::clock::unix_ns(),
                    put: true,
                };
                self.append_locked(&mut st, &[rec]);
                st.pending_bytes += disk;
                self.flush_stats_locked(&mut st, false);
                self.maybe_evict(&mut st);
                Ok(true)
            }
            Ok(None) => {
                self.counters.inc(Counter::PutExists);
                self.maybe_flush_stats(false);
                Ok(false)
            }
            Err(e) => {
                self.counters.inc(Counter::Errors);
                self.warn("write", || {
                    format!(
                        "cannot write cache entry under {}: {e}; not cached",
                        self.layout.root.display()
                    )
                });
                self.maybe_flush_stats(false);
                Ok(false)
            }
        }
    }

    /// Writes a temp file and links it into place. Ok(Some(disk bytes)) if published,
    /// Ok(None) if another writer got there first.
    fn write_and_publish(
        &self,
        name: u128,
        path: &Path,
        header: &[u8],
        value: &[u8],
    ) -> io::Result<Option<u64>> {
        let tmp = self
            .layout
            .tmp()
            .join(format!("{}.{}.tmp", name_hex(name), unique_suffix()));
        let res = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(header)?;
            f.write_all(value)?;
            if self.opts.durable {
                f.sync_all()?;
            }
            let disk = disk_bytes(&f.metadata()?);
            // close() is where NFS flushes to the server and reports errors such as ENOSPC.
            close_checked(f)?;
            let published = match publish_no_replace(&tmp, path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && fs::metadata(&tmp).is_ok() => {
                    // The shard directory was removed (e.g. by hand); recreate it once.
                    fs::create_dir_all(self.layout.shard_dir(name))?;
                    publish_no_replace(&tmp, path)?
                }
                other => other?,
            };
            if published && self.opts.durable {
                sync_dir(&self.layout.shard_dir(name))?;
            }
            Ok(published.then_some(disk))
        })();
        if !matches!(res, Ok(Some(_))) {
            let _ = fs::remove_file(&tmp);
        }
        res
    }

    /// Re-creates the layout if the root exists but lost its sub-directories. Never creates
    /// the root itself: a missing root may be an unmounted filesystem.
    fn relayout(&self) -> bool {
        if !is_real_dir(&self.layout.root) {
            return false;
        }
        let ok = self.layout.create().is_ok();
        if ok {
            for shard in 0..=255u8 {
                let _ = fs::create_dir(self.layout.entries().join(format!("{shard:02x}")));
            }
            log::warn!(
                "xla_pcache: cache directory {} was emptied or replaced; re-created its layout",
                self.layout.root.display()
            );
        }
        ok
    }

    // ---------------------------------------------------------------- journal & counters

    fn append(&self, recs: &[Record]) {
        if self.opts.read_only {
            return;
        }
        let mut st = self.state();
        self.append_locked(&mut st, recs);
    }

    /// Appends the buffered hit records and `recs` to this process's journal, in one write.
    fn append_locked(&self, st: &mut State, recs: &[Record]) {
        if self.opts.read_only || (recs.is_empty() && st.pending.is_empty()) {
            return;
        }
        let mut all = std::mem::take(&mut st.pending);
        all.extend_from_slice(recs);
        if let Err(e) = st.journal.append(&all) {
            self.counters.inc(Counter::Errors);
            self.warn("journal", || {
                format!(
                    "cannot append to the cache journal in {}: {e}",
                    self.layout.journal_dir().display()
                )
            });
        }
    }

    fn maybe_flush_stats(&self, force: bool) {
        if self.opts.read_only {
            return;
        }
        if let Ok(mut st) = self.state.try_lock() {
            self.flush_stats_locked(&mut st, force);
        } else if force {
            let mut st = self.state();
            self.flush_stats_locked(&mut st, force);
        }
    }

    fn flush_stats_locked(&self, st: &mut State, force: bool) {
        if self.opts.read_only {
            return;
        }
        if !force && st.last_stats.elapsed() < self.opts.stats_interval {
            return;
        }
        st.last_stats = Instant::now();
        if !self.counters.take_dirty() && !force {
            self.append_locked(st, &[]);
            return;
        }
        st.journal.check_alive();
        let rec = Record::Stats {
            counters: self.counters.snapshot().to_vec(),
        };
        self.append_locked(st, &[rec]);
    }

    /// Writes this process's counters to its journal now.
    pub fn flush(&self) {
        self.maybe_flush_stats(true);
    }

    // ---------------------------------------------------------------- eviction

    fn refresh(&self, st: &mut State) -> io::Result<()> {
        // Our own buffered hits belong in the view too.
        self.append_locked(st, &[]);
        st.view.refresh(&self.layout)?;
        st.pending_bytes = 0;
        st.last_refresh = Some(Instant::now());
        Ok(())
    }

    /// After a put: re-read the journals when due; evict when over budget and compact when
    /// the journals grew. Skips (never waits) when another process holds the evictor lock.
    fn maybe_evict(&self, st: &mut State) {
        let max = self.opts.max_size;
        let due = st
            .last_refresh
            .is_none_or(|t| t.elapsed() >= self.opts.refresh_interval)
            || max.is_some_and(|m| st.view.lru.total_bytes() + st.pending_bytes > m);
        if !due {
            return;
        }
        if let Err(e) = self.refresh(st) {
            self.counters.inc(Counter::Errors);
            self.warn("index", || format!("cannot read the cache index: {e}"));
            return;
        }
        let over = max.filter(|&m| st.view.lru.total_bytes() > m);
        if over.is_none() && !st.view.wants_compaction() {
            return;
        }
        let guard = match self.locks.try_lock_for(EVICT_LOCK, Duration::ZERO) {
            Ok(Some(g)) => g,
            Ok(None) => return,
            Err(e) => {
                self.warn("lock", || format!("cannot take the evictor lock: {e}"));
                return;
            }
        };
        let target = over.map(|m| (m as f64 * self.opts.low_watermark) as u64);
        if let Err(e) = self.evict_locked(st, guard, target, None) {
            self.counters.inc(Counter::Errors);
            self.warn("evict", || format!("eviction failed: {e}"));
        }
    }

    /// Evicts with the lock held: refreshes, removes oldest entries until the total is at
    /// most `target` and every entry unused for `older_than`, then compacts and sweeps.
    fn evict_locked(
        &self,
        st: &mut State,
        mut guard: LockGuard,
        target: Option<u64>,
        older_than: Option<Duration>,
    ) -> io::Result<EvictReport> {
        let started = crate::clock::unix_ns();
        let res = self.evict_with(st, &mut guard, target, older_than);
        if let Some(trace) = &self.opts.evict_trace {
            let line = format!(
                "{} {started} {}\n",
                std::process::id(),
                crate::clock::unix_ns()
            );
            let _ = OpenOptions::new()
                .append(true)
                .create(true)
                .open(trace)
                .and_then(|mut f| f.write_all(line.as_bytes()));
        }
        drop(guard);
        res
    }

    fn evict_with(
        &self,
        st: &mut State,
        guard: &mut LockGuard,
        target: Option<u64>,
        older_than: Option<Duration>,
    ) -> io::Result<EvictReport> {
        self.refresh(st)?;
        let mut report = EvictReport::default();
        let now = crate::clock::unix_ns();
        let cutoff = older_than.map(|d| now.saturating_sub(d.as_nanos() as u64));
        let total = st.view.lru.total_bytes();
        let mut victims = Vec::new();
        let mut remaining = total;
        for (name, info) in st.view.lru.oldest() {
            let over = target.is_some_and(|t| remaining > t);
            let old = cutoff.is_some_and(|c| info.last_use < c);
            if !over && !old {
                break;
            }
            remaining = remaining.saturating_sub(info.disk_bytes);
            victims.push((name, info));
        }
        let mut records = Vec::with_capacity(victims.len());
        let mut last_beat = Instant::now();
        for (name, info) in victims {
            let path = self.layout.entry_path(name);
            let aside = self
                .layout
                .trash()
                .join(format!("{}.{}", name_hex(name), unique_suffix()));
            match fs::rename(&path, &aside) {
                Ok(()) => {
                    report.removed += 1;
                    report.bytes += info.disk_bytes;
                    report.keys.push(name_hex(name));
                }
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound || errno(&e) == Some(libc::ESTALE) => {}
                Err(e) => {
                    self.counters.inc(Counter::Errors);
                    self.warn("evict", || format!("cannot evict {}: {e}", path.display()));
                    continue;
                }
            }
            st.view.lru.remove(name);
            records.push(Record::Delete { name, t: now });
            if last_beat.elapsed() > self.opts.lease_time / 4 {
                if let Err(e) = guard.heartbeat() {
                    // Someone took the lease over: stop and leave the rest to them.
                    self.warn("lease", || format!("eviction stopped early: {e}"));
                    break;
                }
                last_beat = Instant::now();
            }
        }
        self.counters.add(Counter::Evictions, report.removed);
        self.counters.add(Counter::EvictedBytes, report.bytes);
        if !records.is_empty() {
            self.append_locked(st, &records);
        }
        self.flush_stats_locked(st, true);
        self.sweep(false);
        if st.view.wants_compaction() {
            self.compact_locked(st);
        }
        Ok(report)
    }

    fn compact_locked(&self, st: &mut State) {
        // Read our own latest records too, so the snapshot is as fresh as it can be.
        if self.refresh(st).is_err() {
            return;
        }
        let now = crate::clock::unix_ns();
        let own = st
            .journal
            .path()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .map(str::to_string);
        let mut remove = Vec::new();
        for (name, js) in &st.view.journals {
            if Some(name) == own.as_ref() {
                continue;
            }
            let Ok(m) = fs::metadata(self.layout.journal_dir().join(name)) else {
                continue;
            };
            if m.len() != js.offset {
                continue;
            }
            let gone = match journal::owner_gone(name, &self.host) {
                Some(g) => g,
                None => age(&m, now) > REMOTE_JOURNAL_AGE,
            };
            if gone {
                remove.push(name.clone());
            }
        }
        if let Err(e) = st.view.compact(&self.layout, &remove) {
            self.warn("compact", || {
                format!("cannot write the cache index snapshot: {e}")
            });
        }
    }

    /// Removes temp files, trash and lease leftovers older than their grace periods; returns
    /// how many (temp + lease leftovers, trash). With `dry_run` it only counts (for verify).
    fn sweep(&self, dry_run: bool) -> (u64, u64) {
        let now = crate::clock::unix_ns();
        let mut counts = (0, 0);
        for (dir, grace, slot) in [
            (self.layout.tmp(), self.opts.tmp_grace, 0),
            (self.layout.trash(), self.opts.trash_grace, 1),
            (self.layout.locks(), self.opts.tmp_grace, 0),
        ] {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                // In locks/ only the leftovers of killed lease writers (dot files) are swept.
                if slot == 0
                    && dir == self.layout.locks()
                    && !e.file_name().to_string_lossy().starts_with('.')
                {
                    continue;
                }
                let Ok(m) = e.metadata() else { continue };
                if age(&m, now) <= grace {
                    continue;
                }
                if slot == 0 {
                    counts.0 += 1;
                } else {
                    counts.1 += 1;
                }
                if !dry_run {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        counts
    }

    /// Evicts now: down to `max_size` bytes (default: the budget's low watermark, or nothing
    /// if unbounded) and every entry unused for `older_than`.
    pub fn evict(
        &self,
        max_size: Option<u64>,
        older_than: Option<Duration>,
    ) -> Result<EvictReport, StoreError> {
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        let target = max_size.or(self
            .opts
            .max_size
            .map(|m| (m as f64 * self.opts.low_watermark) as u64));
        let guard = self
            .locks
            .try_lock_for(EVICT_LOCK, self.opts.lock_timeout)?;
        let Some(guard) = guard else {
            return Ok(EvictReport {
                skipped: Some("another process holds the evictor lock".into()),
                ..Default::default()
            });
        };
        let mut st = self.state();
        self.evict_locked(&mut st, guard, target, older_than)
            .map_err(|e| io_err("evict in", &self.layout.root, e))
    }

    // ---------------------------------------------------------------- other operations

    pub fn contains(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        Ok(fs::symlink_metadata(self.layout.entry_path(entry_name(key.bytes))).is_ok())
    }

    /// Removes the entry (moved to trash first, so readers that opened it finish). True if
    /// there was one.
    pub fn delete(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        let name = entry_name(key.bytes);
        let path = self.layout.entry_path(name);
        let aside = self
            .layout
            .trash()
            .join(format!("{}.{}", name_hex(name), unique_suffix()));
        let t = crate::clock::unix_ns();
        match fs::rename(&path, &aside) {
            Ok(()) => {
                self.append(&[Record::Delete { name, t }]);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("delete", &path, e)),
        }
    }

    /// Removes every entry. Returns how many.
    pub fn clear(&self) -> Result<u64, StoreError> {
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        let t = crate::clock::unix_ns();
        let mut n = 0;
        for path in self.entry_files()? {
            match fs::remove_file(&path) {
                Ok(()) => n += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path, e)),
            }
        }
        self.append(&[Record::Clear { t }]);
        let mut st = self.state();
        st.view.lru.clear_up_to(t);
        Ok(n)
    }

    /// Every file under entries/ (walks the directory).
    fn entry_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        let mut out = Vec::new();
        let entries = self.layout.entries();
        let rd = match fs::read_dir(&entries) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err("list", &entries, e)),
        };
        let mut shards: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        shards.sort();
        for shard in shards {
            if !is_real_dir(&shard) {
                out.push(shard);
                continue;
            }
            let rd = match fs::read_dir(&shard) {
                Ok(rd) => rd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("list", &shard, e)),
            };
            out.extend(rd.flatten().map(|e| e.path()));
        }
        Ok(out)
    }

    fn read_header(path: &Path) -> Result<(entry::Header, fs::Metadata), ReadError> {
        let mut f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) => return Err(ReadError::Io(e)),
        };
        let m = f.metadata().map_err(ReadError::Io)?;
        let mut fixed = [0u8; entry::FIXED_HEADER];
        f.read_exact(&mut fixed)
            .map_err(|_| ReadError::Corrupt(EntryError::TooShort(m.len()), m.ino()))?;
        let hl = entry::header_len(&fixed).map_err(|e| ReadError::Corrupt(e, m.ino()))?;
        let mut h = fixed.to_vec();
        h.resize(hl, 0);
        f.read_exact(&mut h[entry::FIXED_HEADER..])
            .map_err(|_| ReadError::Corrupt(EntryError::TooShort(m.len()), m.ino()))?;
        let header = entry::decode_header(&h).map_err(|e| ReadError::Corrupt(e, m.ino()))?;
        if header.file_len() != m.len() {
            return Err(ReadError::Corrupt(
                EntryError::BadLength {
                    expected: header.file_len(),
                    actual: m.len(),
                },
                m.ino(),
            ));
        }
        Ok((header, m))
    }

    /// Every entry with its header (walks the directory; headers only, payloads unread).
    pub fn entries(&self) -> Result<Vec<EntrySummary>, StoreError> {
        let files = self.entry_files()?;
        let view_uses: HashMap<u128, u64> = {
            let mut st = self.state();
            let _ = self.refresh(&mut st);
            st.view.lru.iter().map(|(n, i)| (n, i.last_use)).collect()
        };
        let mut out = Vec::with_capacity(files.len());
        for path in files {
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(parse_name_hex)
            else {
                continue;
            };
            let Ok((h, m)) = Self::read_header(&path) else {
                continue;
            };
            out.push(EntrySummary {
                name: name_hex(name),
                key: h.key.clone(),
                key_is_text: h.key_is_text,
                size: h.payload_len,
                disk_bytes: disk_bytes(&m),
                created_ns: h.created_ns,
                last_use_ns: view_uses.get(&name).copied(),
                meta: h.meta,
            });
        }
        Ok(out)
    }

    /// Number of entries, from the index. A cache whose directory vanished has none; an index
    /// that cannot be read now gives the last count seen (with a warning).
    pub fn len(&self) -> Result<u64, StoreError> {
        let mut st = self.state();
        if let Err(e) = self.refresh(&mut st) {
            if !is_real_dir(&self.layout.root) {
                self.warn("vanished", || {
                    format!("cache directory {} is gone", self.layout.root.display())
                });
                return Ok(0);
            }
            self.warn("index", || format!("cannot read the cache index: {e}"));
        }
        Ok(st.view.lru.len() as u64)
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
        }
        let mut counters = st.view.counters();
        if self.opts.read_only || !st.view.is_loaded() {
            add_into(&mut counters, &self.counters.snapshot());
        }
        Ok(Stats {
            counters,
            entries: st.view.lru.len() as u64,
            bytes: st.view.lru.total_bytes(),
            journals: st.view.journals.len() as u64,
        })
    }

    /// Walks every file: verifies entries, reconciles the index, reports leftovers. With
    /// `repair`, removes corrupt and foreign files and fixes the index.
    pub fn verify(
        &self,
        repair: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport, StoreError> {
        if repair && self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        let files = self.entry_files()?;
        let total = files.len() as u64;
        let mut report = VerifyReport {
            repaired: repair,
            ..Default::default()
        };
        let mut seen: HashMap<u128, u64> = HashMap::new();
        let mut fix = Vec::new();
        for (i, path) in files.iter().enumerate() {
            progress(i as u64, total);
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(parse_name_hex)
                .filter(|n| path.parent() == Some(self.layout.shard_dir(*n).as_path()));
            let Some(name) = name else {
                report.foreign.push(path.display().to_string());
                if repair {
                    let _ = if is_real_dir(path) {
                        fs::remove_dir_all(path)
                    } else {
                        fs::remove_file(path)
                    };
                }
                continue;
            };
            match self.read_entry(path) {
                Ok(blob) if entry_name(&blob.header.key) == name => {
                    let disk = fs::symlink_metadata(path)
                        .map(|m| disk_bytes(&m))
                        .unwrap_or(0);
                    report.entries += 1;
                    report.bytes += disk;
                    seen.insert(name, disk);
                    let _ = blob;
                }
                Ok(_) | Err(ReadError::Corrupt(..)) => {
                    report.corrupt.push(path.display().to_string());
                    if repair {
                        let _ = fs::remove_file(path);
                        fix.push(Record::Delete {
                            name,
                            t: crate::clock::unix_ns(),
                        });
                    }
                }
                Err(ReadError::Missing) => {}
                Err(ReadError::Io(e)) => return Err(io_err("read", path, e)),
            }
        }
        progress(total, total);
        let mut st = self.state();
        self.refresh(&mut st)
            .map_err(|e| io_err("read index of", &self.layout.root, e))?;
        let now = crate::clock::unix_ns();
        for (&name, &disk) in &seen {
            match st.view.lru.get(name) {
                Some(info) if info.disk_bytes == disk => {}
                _ => {
                    report.unindexed += u64::from(st.view.lru.get(name).is_none());
                    fix.push(Record::Touch {
                        name,
                        disk_bytes: disk,
                        t: now,
                        put: false,
                    });
                }
            }
        }
        let dangling: Vec<u128> = st
            .view
            .lru
            .iter()
            .map(|(n, _)| n)
            .filter(|n| !seen.contains_key(n))
            .collect();
        report.dangling = dangling.len() as u64;
        let (tmp, trash) = self.sweep(true);
        report.stale_tmp = tmp;
        report.stale_trash = trash;
        if repair {
            for name in dangling {
                st.view.lru.remove(name);
                fix.push(Record::Delete { name, t: now });
            }
            for r in &fix {
                if let Record::Touch {
                    name,
                    disk_bytes,
                    t,
                    ..
                } = r
                {
                    st.view.lru.touch(*name, *disk_bytes, *t);
                }
            }
            self.append_locked(&mut st, &fix);
            self.sweep(false);
        }
        Ok(report)
    }

    pub fn counter_names() -> &'static [&'static str] {
        &COUNTER_NAMES
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.maybe_flush_stats(true);
    }
}

/// Closes a file and reports the error close() returns (NFS reports write errors there).
fn close_checked(f: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: fd was just released from a File that owned it; it is closed exactly once.
    let rc = unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key<'_> {
        Key {
            bytes: s.as_bytes(),
            is_text: true,
        }
    }

    fn open(dir: &Path, max: Option<u64>) -> Store {
        Store::open(
            dir,
            StoreOptions {
                max_size: max,
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn round_trip_first_writer_and_delete() {
        let d = tempfile::tempdir().unwrap();
        let s = open(d.path(), None);
        assert!(s.put(key("k"), b"one", &[]).unwrap());
        assert!(!s.put(key("k"), b"two", &[]).unwrap());
        assert_eq!(s.get(key("k")).unwrap().unwrap().payload(), b"one");
        assert!(s.delete(key("k")).unwrap());
        assert!(s.get(key("k")).unwrap().is_none());
        assert!(matches!(
            s.put(key(""), b"x", &[]),
            Err(StoreError::Invalid(_))
        ));
    }

    #[test]
    fn corrupt_file_is_a_counted_miss_and_removed() {
        let d = tempfile::tempdir().unwrap();
        let s = open(d.path(), None);
        s.put(key("k"), &[1u8; 1000], &[]).unwrap();
        let p = s.layout.entry_path(entry_name(b"k"));
        let mut bytes = fs::read(&p).unwrap();
        bytes[500] ^= 1;
        fs::write(&p, bytes).unwrap();
        assert!(s.get(key("k")).unwrap().is_none());
        assert_eq!(s.counters.get(Counter::Corrupt), 1);
        assert!(!p.exists());
    }

    #[test]
    fn read_only_store_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        open(d.path(), None).put(key("k"), b"v", &[]).unwrap();
        let ro = Store::open(
            d.path(),
            StoreOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        let journals = journal::list(&ro.layout.journal_dir()).unwrap();
        assert!(!ro.put(key("new"), b"v", &[]).unwrap());
        assert!(ro.get(key("k")).unwrap().is_some());
        assert!(matches!(ro.clear(), Err(StoreError::ReadOnly(_))));
        ro.flush();
        drop(ro);
        assert_eq!(journal::list(&d.path().join("journal")).unwrap(), journals);
    }

    #[test]
    fn budget_is_kept_and_oldest_go_first() {
        let d = tempfile::tempdir().unwrap();
        let s = open(d.path(), Some(100_000));
        for i in 0..30 {
            assert!(s.put(key(&format!("k{i}")), &[0u8; 10_000], &[]).unwrap());
        }
        let st = s.stats().unwrap();
        assert!(st.bytes <= 100_000, "{} bytes over budget", st.bytes);
        assert!(s.get(key("k29")).unwrap().is_some());
        assert!(s.get(key("k0")).unwrap().is_none());
    }

    #[test]
    fn compaction_folds_journals_of_dead_processes() {
        let d = tempfile::tempdir().unwrap();
        let s = open(d.path(), Some(1 << 30));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        let dead = child.id();
        for i in 0..70u64 {
            let name = journal::file_name(crate::clock::hostname(), dead, i);
            let mut buf = Vec::new();
            Record::Touch {
                name: i as u128 + 1,
                disk_bytes: 4096,
                t: i,
                put: true,
            }
            .encode(&mut buf);
            Record::Stats {
                counters: vec![1, 0, 1],
            }
            .encode(&mut buf);
            fs::write(s.layout.journal_dir().join(name), buf).unwrap();
        }
        assert!(s.put(key("trigger"), b"v", &[]).unwrap());
        let left = journal::list(&s.layout.journal_dir()).unwrap();
        assert_eq!(
            left.len(),
            1,
            "only this process's journal remains: {left:?}"
        );
        let fresh = open(d.path(), None);
        let st = fresh.stats().unwrap();
        assert_eq!(st.entries, 71, "entries of dead processes stay indexed");
        assert_eq!(
            st.counters[Counter::Hits as usize],
            70,
            "their counters are kept"
        );
    }
}
