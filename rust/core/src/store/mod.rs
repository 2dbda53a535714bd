//! The store: put / get / contains / delete / clear / stats / evict / verify.
//!
//! Rules kept here (ARCHITECTURE.md, "Rules, and where each is kept"): entries are immutable files published by rename, never
//! written in place; a reader verifies header and checksum before exposing a byte; any
//! failure inside `get` or `put` is a miss or a `false`, logged and counted, never an error;
//! a read-only store writes nothing at all.
//!
//! Each part of the store is a module named for what it holds: this one the options,
//! opening a cache, the state a handle keeps and the journal appends every part shares;
//! `read.rs` the read path (get, contains), `write.rs` the write path (put), `evict.rs`
//! eviction, compaction and sweeping, `admission.rs` whether a put may go on in a bounded
//! cache, `budget.rs` the budget a process keeps, `refresh.rs` the view brought up to date,
//! `reconcile.rs` the view checked against the files, `gate.rs` the one gate for what may be
//! loaded, `entry_file.rs` whole entry files as bytes (tiers, bundles), `claim.rs` compile
//! claims, `delete.rs` delete and clear, `listing.rs` the entries listed, `verify.rs` every
//! file checked, `counters.rs` the counters and the cache's figures (stats, len).

mod admission;
mod budget;
mod claim;
#[cfg(test)]
mod claim_tests;
mod counters;
mod delete;
mod entry_file;
mod evict;
mod gate;
mod listing;
#[cfg(test)]
mod newer_tests;
mod read;
mod reconcile;
mod refresh;
#[cfg(test)]
mod sign_tests;
#[cfg(test)]
mod tests;
mod verify;
mod write;

use crate::bounds::{check_duration, positive_size};
use crate::dir::{self as cdir, Dir, Name, Rel, Root, Stat};
use crate::error::{io_err, StoreError};
use crate::forksafe::ForkMutex;
use crate::fsinfo::{self, FsInfo};
use crate::hash::MAX_KEY_LEN;
use crate::journal::{JournalRecord, JournalWriter};
use crate::layout::{Layout, ENTRIES, LOCKS};
use crate::lock::{LockDir, LockMode, LockOptions};
use crate::sign::{Signer, TrustSet};
use crate::stats::{Counter, Counters};
use crate::view::View;
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

pub use claim::{Claim, ClaimOutcome, ClaimState};
pub use counters::Stats;
pub use evict::EvictReport;
pub use gate::{head_key, judge_head, tier_names, Refusal};
pub use listing::EntrySummary;
pub use verify::VerifyReport;
pub use write::Published;

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
    /// Longest a put spends evicting; the rest continues with the next puts, so no caller
    /// stalls for a whole batch (evicting a tenth of a large cache takes a good part of a
    /// second: docs/benchmarks.md, "Measurements behind the code").
    pub evict_slice: Duration,
    /// How often pending counters are written to the journal.
    pub stats_interval: Duration,
    /// When set, every eviction appends `pid start_ns end_ns` (time the evictor lock was
    /// held) to this file: lets tests and operators check that evictors do not overlap.
    pub evict_trace: Option<PathBuf>,
    /// A compile claim whose content a waiter has seen unchanged for longer than this is
    /// taken over; its holder heartbeats every quarter of it.
    pub claim_lease: Duration,
    /// Every put is signed with this key (`sign.rs`).
    pub signer: Option<Arc<Signer>>,
    /// When set, only entries signed by one of these keys are served; any other is a miss,
    /// counted `untrusted`, its payload never read. None: every verified entry is served.
    pub trust: Option<Arc<TrustSet>>,
    /// A handle on `root` that the caller opened and checked as a directory of this user's
    /// own (`owndir`: a bucket path's host-local store): the store works beneath it and
    /// never resolves `root` again, so a directory renamed into its place is never used.
    /// Checked once more when the store opens; `root` must exist.
    pub own_root: Option<Arc<std::os::fd::OwnedFd>>,
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
            evict_slice: Duration::from_millis(20),
            stats_interval: Duration::from_secs(2),
            evict_trace: None,
            claim_lease: Duration::from_secs(30),
            signer: None,
            trust: None,
            own_root: None,
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

struct State {
    journal: JournalWriter,
    view: View,
    hits_logged: HashMap<u128, Instant>,
    /// Bytes this process published since its view was last refreshed.
    pending_bytes: u64,
    last_refresh: Option<Instant>,
    last_stats: Instant,
    /// Hit records not yet written.
    pending: Vec<JournalRecord>,
    /// Target of an eviction that ran out of its time slice and is not finished.
    evict_backlog: Option<u64>,
    /// When an eviction from a put last swept tmp/ and trash/.
    last_sweep: Option<Instant>,
    /// When the journal directory's listing was last made fresh (network filesystems).
    last_freshen: Option<Instant>,
    /// The other processes' put rate, as this view saw their journals grow.
    put_rate: admission::PutRate,
    /// When the cache's CONFIG was last read, and why it was not used if it was not (each
    /// new reason is warned about once).
    stored_budget_read: Option<Instant>,
    stored_budget_problem: Option<String>,
}

impl State {
    fn new(root: Arc<Root>, host: String) -> State {
        State {
            journal: JournalWriter::new(root, host),
            view: View::default(),
            hits_logged: HashMap::new(),
            pending_bytes: 0,
            last_refresh: None,
            last_stats: Instant::now(),
            pending: Vec::new(),
            evict_backlog: None,
            last_sweep: None,
            last_freshen: None,
            put_rate: admission::PutRate::default(),
            stored_budget_read: None,
            stored_budget_problem: None,
        }
    }
}

pub struct Store {
    layout: Layout,
    /// The cache root, opened once; every file is reached beneath it (see `dir/`).
    root: Arc<Root>,
    opts: StoreOptions,
    fs: FsInfo,
    mmap: bool,
    host: String,
    counters: Counters,
    state: ForkMutex<State>,
    locks: LockDir,
    claims: std::sync::Arc<claim::Keeper>,
    warned: ForkMutex<HashMap<&'static str, Instant>>,
    /// Set by `interrupt` while a walk runs: the running `verify` or explicit `evict` stops
    /// at the next entry, leaving the cache as valid as after any entry.
    interrupt: std::sync::atomic::AtomicBool,
    /// The keys whose entries this store's own signed puts accept as already there: the
    /// trusted set and the signer's own key (None without a signer).
    write_trust: Option<TrustSet>,
    /// How many walks (`verify`, explicit `evict`) run now: an `interrupt` with none
    /// running is nobody's, and must not stop the next one at once.
    walks: std::sync::atomic::AtomicUsize,
    /// The cache's CONFIG as last read (`budget.rs`).
    stored: budget::LastReadBudget,
}

/// A walk running (see `Store::walks`); when the last one ends, a request to stop that
/// came too late for it is dropped.
pub struct Walk<'a>(&'a Store);

impl Drop for Walk<'_> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.0.walks.fetch_sub(1, SeqCst) == 1 {
            self.0.interrupt.store(false, SeqCst);
        }
    }
}

fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
}

fn disk_bytes(m: &Stat) -> u64 {
    let blocks = m.blocks() * 512;
    if blocks > 0 {
        blocks
    } else {
        m.len().div_ceil(4096) * 4096
    }
}

fn make_shards(r: &Root, layout: &Layout) -> Result<(), StoreError> {
    let entries = r
        .sub(&ENTRIES)
        .map_err(|e| io_err("open", &layout.entries(), e))?;
    for shard in 0..=255u8 {
        match entries.mkdir(&Name::shard(shard), 0o777) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("create directory", &layout.shard(shard), e)),
        }
    }
    Ok(())
}

impl Store {
    /// A new handle on the cache's directory (`O_PATH`, the caller's to close): the one the
    /// store works in now, for files beside the store's own (a miss log, a spool).
    pub fn root_fd(&self) -> Result<std::os::fd::OwnedFd, StoreError> {
        self.root
            .dir()
            .map(Dir::into_fd)
            .map_err(|e| io_err("open", &self.layout.root, e))
    }
}

impl Store {
    /// Opens the cache at `root`, creating it unless read-only.
    pub fn open(root: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        if let Some(size) = opts.max_size {
            positive_size("max_size", size.into())?;
        }
        for (what, d) in [
            ("lock_timeout", opts.lock_timeout),
            ("lease_time", opts.lease_time),
            ("hit_interval", opts.hit_interval),
            ("trash_grace", opts.trash_grace),
            ("tmp_grace", opts.tmp_grace),
            ("refresh_interval", opts.refresh_interval),
            ("evict_slice", opts.evict_slice),
            ("stats_interval", opts.stats_interval),
            ("claim_lease", opts.claim_lease),
        ] {
            check_duration(what, d)?;
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
        let not_a_dir =
            |root: &Path| StoreError::Format(format!("{} is not a directory", root.display()));
        let root_dir = if let Some(fd) = &opts.own_root {
            use std::os::fd::AsFd;
            crate::owndir::check_fd(fd.as_fd())
                .map_err(|why| StoreError::Invalid(format!("{} {why}", root.display())))?;
            let dir =
                Dir::from_borrowed(fd.as_fd(), &root).map_err(|e| io_err("open", &root, e))?;
            let r = Root::pinned(&root, dir);
            if opts.read_only {
                layout.read_format(&r)?;
            } else {
                layout.create(&r)?;
                make_shards(&r, &layout)?;
            }
            r
        } else if opts.read_only {
            let r = match Root::open(&root) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(StoreError::NotFound(root))
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Err(not_a_dir(&root)),
                Err(e) => return Err(io_err("open", &root, e)),
            };
            // An empty or half-created directory is an empty cache; a foreign format is not.
            layout.read_format(&r)?;
            r
        } else {
            fs::create_dir_all(&root).map_err(|e| io_err("create directory", &root, e))?;
            let r = match Root::open(&root) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Err(not_a_dir(&root)),
                Err(e) => return Err(io_err("open", &root, e)),
            };
            layout.create(&r)?;
            make_shards(&r, &layout)?;
            r
        };
        let root_dir = Arc::new(root_dir);
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
        let locks = LockDir::beneath(
            Arc::clone(&root_dir),
            LOCKS,
            LockOptions {
                mode: lock_mode,
                timeout: opts.lock_timeout,
                lease_time: opts.lease_time,
                host: host.clone(),
            },
        );
        let claims = claim::Keeper::new(Arc::clone(&root_dir), opts.claim_lease, host.clone());
        let write_trust = opts
            .signer
            .as_deref()
            .map(|s| TrustSet::with_signer(opts.trust.as_deref(), s));
        if let Some(t) = &opts.trust {
            // Here, with the store, rather than in its first get.
            t.open_record();
        }
        Ok(Store {
            write_trust,
            claims,
            state: ForkMutex::new(State::new(Arc::clone(&root_dir), host.clone())),
            root: root_dir,
            layout,
            opts,
            fs: fs_info,
            mmap,
            host,
            counters: Counters::default(),
            locks,
            warned: ForkMutex::new(HashMap::new()),
            interrupt: std::sync::atomic::AtomicBool::new(false),
            walks: std::sync::atomic::AtomicUsize::new(0),
            stored: budget::LastReadBudget::default(),
        })
        // The cache's stored settings bound the first put already.
        .inspect(|s| s.reload_stored_budget(&mut s.state()))
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

    /// Asks the running `verify` or explicit `evict` (or the next one) to stop after the
    /// entry it is at: each step leaves a valid cache, so stopping between two is clean.
    /// Safe from any thread (a signal handler's, while another thread runs the call).
    pub fn interrupt(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.walks.load(SeqCst) > 0 {
            self.interrupt.store(true, SeqCst);
        }
    }

    /// Marks a walk as running for as long as the result lives (a caller that runs one on
    /// another thread holds it from before that thread starts, so an `interrupt` meanwhile
    /// is not lost).
    pub fn walk(&self) -> Walk<'_> {
        self.walks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Walk(self)
    }

    /// Whether `interrupt` was called; consumes the request.
    fn interrupted(&self) -> bool {
        self.interrupt
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `interrupt` was called, leaving the request for `interrupted` to consume.
    fn interrupt_pending(&self) -> bool {
        self.interrupt.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent in a way that
        // matters (it is a cache of hints), so a poisoned lock is simply taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state if no other thread holds it (a poisoned lock taken over, as by `state`).
    fn try_state(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(st) => Some(st),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
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

    /// The directory `rel` beneath the root, every component a real directory. One that is
    /// not (a symbolic link, a file, a FIFO) is counted and warned about, and the error
    /// returned: the caller skips what it was about to do there.
    fn dir(&self, rel: &Rel) -> io::Result<Dir> {
        let r = self.root.sub(rel);
        if let Err(e) = &r {
            if cdir::is_unsafe(e) {
                self.unsafe_path(rel.as_str(), e);
            }
        }
        r
    }

    /// Counts and warns about a path of the cache that is not what it must be.
    /// A later release's entry met by `what` (a lookup, a received file, a tier's head):
    /// counted `newer_format`, one warning naming its version, never removed.
    pub(crate) fn newer_format(&self, version: u16, what: &str) {
        self.counters.inc(Counter::NewerFormat);
        self.warn("newer-format", || {
            format!(
                "{what} under {} is of entry format version {version}, a later release's \
                 (this one reads version {}): a miss, left as it is for the release that \
                 wrote it",
                self.layout.root.display(),
                crate::entry::ENTRY_VERSION
            )
        });
    }

    /// Counts a later release's entry that a caller met outside the directory (a remote
    /// tier's object, refused after its first bytes: `judge_head`), as a lookup here would.
    pub fn count_newer_format(&self, version: u16) {
        self.newer_format(version, "an entry a remote tier holds");
    }

    fn unsafe_path(&self, rel: &str, why: &dyn std::fmt::Display) {
        self.counters.inc(Counter::UnsafePaths);
        self.warn("unsafe-path", || {
            format!(
                "{} is not a real directory or file inside the cache ({why}); skipped, never \
                 followed (someone with write access to the cache directory replaced it)",
                self.layout.root.join(rel).display()
            )
        });
    }

    /// Resets what a forked child must not inherit: the parent's journal (one writer per
    /// journal: the child opens its own on its first write), its buffered records, held
    /// claims and their heartbeat thread, lease observations, counters, and every mutex
    /// another thread of the parent may have held at the fork. Locks are not taken: in
    /// the child they may be held by threads that no longer exist.
    ///
    /// # Safety
    /// Call only in the child right after `fork()`, before it starts threads or uses this
    /// store from more than this thread (Python's `os.register_at_fork(after_in_child=)`).
    pub unsafe fn after_fork_child(&self) {
        // SAFETY: per this function's contract, the child is single-threaded now.
        unsafe {
            self.state
                .reset(State::new(Arc::clone(&self.root), self.host.clone()));
            self.warned.reset(HashMap::new());
            self.claims.reset_after_fork();
            self.locks.reset_after_fork();
        }
        self.counters.reset();
    }

    /// `ReadOnly` for a store opened read-only: what each operation that must write or
    /// remove (delete, clear, evict, a repair, the stored budget) asks before it starts. The
    /// ones that quietly do less instead (a put that publishes nothing, a hit that records
    /// no use) read the open mode themselves.
    fn writable(&self) -> Result<(), StoreError> {
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        Ok(())
    }

    fn append(&self, recs: &[JournalRecord]) {
        if self.opts.read_only {
            return;
        }
        let mut st = self.state();
        self.append_locked(&mut st, recs);
    }

    /// Appends the buffered hit records and `recs` to this process's journal, in one write.
    fn append_locked(&self, st: &mut State, recs: &[JournalRecord]) {
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
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close_claims();
        self.maybe_flush_stats(true);
    }
}
