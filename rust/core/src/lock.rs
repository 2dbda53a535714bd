//! The evictor lock: one exclusive, named lock per purpose under `<root>/locks`,
//! taken with a timeout so that it never hangs a job.
//!
//! Two mechanisms:
//!
//! * **fcntl** — open-file-description locks (`F_OFD_SETLK`) on `<dir>/<name>.lock`,
//!   polled until the timeout. They exclude every other open file description,
//!   including other threads and other [`LockDir`]s of the same process, and the
//!   kernel (or the NFS lock manager) drops them when the holder dies.
//! * **lease** — a file `<dir>/<name>.lease` holding one line `host pid nonce counter`,
//!   created atomically with `link()`. Where locks are unavailable (`ENOLCK` on an NFS
//!   `nolock` mount, ...) [`LockMode::Auto`] falls back to it. A lease is judged
//!   stale only when *this process* has watched its content stay unchanged for longer
//!   than `lease_time` on its own monotonic clock; wall clocks of different hosts are
//!   never compared. The holder must call [`LockGuard::heartbeat`] more often than
//!   `lease_time` (every `lease_time / 3` is a good pace).
//!
//! The cache's correctness never rests on this lock (design rule 7): it only saves
//! duplicated eviction and compaction work. On `local_lock` NFS mounts and FUSE network
//! filesystems a lock may exclude only the processes of one host, and a lease can in rare
//! races be held twice. Hence the priorities: never block longer than the timeout, never
//! panic, and report errors instead of printing them.

use crate::dir::{open_regular, read_capped, Dir, Root};
use crate::forksafe::ForkMutex;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::hash::{BuildHasher, Hash, Hasher};
use std::io::{self, Write};
use std::os::unix::io::{AsRawFd, IntoRawFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long to sleep between two attempts while waiting for a held lock.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Longest lock name accepted (the name ends up in several file names).
const MAX_NAME_LEN: usize = 64;
/// Last word of the content of a retired lease (see [`LockGuard::retire`]).
const RETIRED: &str = "retired";
/// Longest host name written into a lease.
const MAX_HOST_LEN: usize = 64;
/// A lease file is one short line; never read more than this.
const MAX_LEASE_LEN: u64 = 4096;

/// Which locking mechanism a [`LockDir`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// fcntl locks, falling back to leases for good where locks are unavailable.
    Auto,
    /// fcntl (open-file-description) locks only; unavailability is an error.
    Fcntl,
    /// Lease files only.
    Lease,
}

impl LockMode {
    /// The name accepted by [`FromStr`]: `"auto"`, `"fcntl"` or `"lease"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Auto => "auto",
            LockMode::Fcntl => "fcntl",
            LockMode::Lease => "lease",
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LockMode {
    type Err = LockError;

    /// Parses `auto`, `fcntl` or `lease` (surrounding blanks and ASCII case ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(LockMode::Auto),
            "fcntl" => Ok(LockMode::Fcntl),
            "lease" => Ok(LockMode::Lease),
            _ => Err(LockError::InvalidMode {
                value: s.to_string(),
            }),
        }
    }
}

/// Settings of a [`LockDir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOptions {
    /// Mechanism to use.
    pub mode: LockMode,
    /// Longest time [`LockDir::try_lock`] waits for a held lock (zero: one attempt).
    pub timeout: Duration,
    /// A lease whose content this process has watched unchanged for longer than this
    /// is stale and may be taken over. Holders heartbeat well within it.
    pub lease_time: Duration,
    /// Host name written into leases (for people reading them; whitespace is replaced).
    pub host: String,
}

impl Default for LockOptions {
    /// `Auto`, a 100 ms timeout, a 60 s lease and this machine's host name.
    fn default() -> Self {
        LockOptions {
            mode: LockMode::Auto,
            timeout: Duration::from_millis(100),
            lease_time: Duration::from_secs(60),
            host: hostname(),
        }
    }
}

/// Errors of the lock module. A lock that is merely held by someone else is not an
/// error: [`LockDir::try_lock`] returns `Ok(None)`.
#[derive(thiserror::Error, Debug)]
pub enum LockError {
    /// A filesystem call failed.
    #[error("lock: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An unknown lock mode name.
    #[error("invalid lock mode {value:?}: expected \"auto\", \"fcntl\" or \"lease\"")]
    InvalidMode { value: String },
    /// A lock name that is empty, too long, starts with a dot or holds characters
    /// other than ASCII letters, digits, `-`, `_` and `.`.
    #[error("invalid lock name {name:?}: use 1-{MAX_NAME_LEN} characters of [A-Za-z0-9_.-], not starting with '.'")]
    InvalidName { name: String },
    /// The lease is no longer ours: another process judged it stale and took it over
    /// (the holder did not heartbeat within `lease_time`), or it was removed.
    #[error("lock: lease {path} was taken over or removed; this process no longer holds it")]
    LeaseLost { path: PathBuf },
}

impl LockError {
    fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        LockError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A lease content seen by this process, and when it was first seen with that content.
struct Observation {
    content: String,
    since: Instant,
}

/// A directory of named locks (normally `<root>/locks`).
///
/// It remembers, per lock name, the lease content it last saw and since when, so a
/// stale lease is recognised across several [`try_lock`](LockDir::try_lock) calls, even
/// when each call's timeout is shorter than `lease_time`. It is `Send + Sync`.
pub struct LockDir {
    dir: PathBuf,
    /// Where the directory is reached from: by its path, or beneath a cache root without
    /// following any link (see `dir.rs`), at each use.
    beneath: Option<(Arc<Root>, String)>,
    opts: LockOptions,
    /// `Auto` only: set once fcntl locks were found unavailable here.
    use_lease: AtomicBool,
    observed: ForkMutex<HashMap<String, Observation>>,
}

impl fmt::Debug for LockDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockDir")
            .field("dir", &self.dir)
            .field("mode", &self.opts.mode)
            .field("effective_mode", &self.effective_mode())
            .finish()
    }
}

impl LockDir {
    /// A lock directory at `dir`. Nothing is touched until the first `try_lock`, which
    /// creates `dir` (with the process umask) if it is missing.
    pub fn new(dir: PathBuf, opts: LockOptions) -> Self {
        let mut opts = opts;
        opts.host = sanitize_host(&opts.host);
        LockDir {
            dir,
            beneath: None,
            opts,
            use_lease: AtomicBool::new(false),
            observed: ForkMutex::new(HashMap::new()),
        }
    }

    /// A lock directory at `rel` beneath a cache root, reached through directory handles
    /// at each use: a `rel` replaced by a symbolic link (or a file) is refused (ELOOP or
    /// ENOTDIR), never followed.
    pub fn beneath(root: Arc<Root>, rel: &str, opts: LockOptions) -> Self {
        let mut d = LockDir::new(root.path().join(rel), opts);
        d.beneath = Some((root, rel.to_string()));
        d
    }

    /// Forgets what this process observed of other holders' leases (after `fork`: the
    /// child starts with a fresh table, whatever lock another thread of the parent held).
    ///
    /// # Safety
    /// As `ForkMutex::reset`: only in a forked child that is still single-threaded.
    pub unsafe fn reset_after_fork(&self) {
        // SAFETY: per the contract.
        unsafe { self.observed.reset(HashMap::new()) };
    }

    /// Opens the directory (creating it, never its parents, when `create` and it is
    /// missing: a vanished parent may be an unmounted filesystem, whose mount point must
    /// not be written to).
    fn open_dir(&self, create: bool) -> io::Result<Arc<Dir>> {
        let open = || match &self.beneath {
            Some((root, rel)) => root.sub(rel),
            None => Dir::open_path(&self.dir, true),
        };
        match open() {
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                let made = match &self.beneath {
                    Some((root, rel)) => match rel.rsplit_once('/') {
                        Some((parent, last)) => root.sub(parent)?.mkdir(last, 0o777),
                        None => root.dir()?.mkdir(rel, 0o777),
                    },
                    None => std::fs::create_dir(&self.dir),
                };
                match made {
                    // Another thread or process created it first: as good.
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                    _ => {}
                }
                open().map(Arc::new)
            }
            other => other.map(Arc::new),
        }
    }

    /// The directory holding the lock files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options given to [`new`](LockDir::new) (host name sanitized).
    pub fn options(&self) -> &LockOptions {
        &self.opts
    }

    /// The mechanism in use now: `Fcntl` or `Lease` (`Auto` resolves to `Fcntl` until
    /// locks are found unavailable, then to `Lease` for good).
    pub fn effective_mode(&self) -> LockMode {
        match self.opts.mode {
            LockMode::Auto if self.use_lease.load(Ordering::Relaxed) => LockMode::Lease,
            LockMode::Auto | LockMode::Fcntl => LockMode::Fcntl,
            LockMode::Lease => LockMode::Lease,
        }
    }

    /// Tries to take the exclusive lock `name`, polling for at most `opts.timeout`.
    ///
    /// Returns `Ok(Some(guard))` when taken, `Ok(None)` when someone else holds it
    /// until the timeout, and `Err` when the filesystem fails (or, in `Fcntl` mode,
    /// when locks are unavailable). Never blocks much longer than the timeout, apart
    /// from single filesystem calls.
    pub fn try_lock(&self, name: &str) -> Result<Option<LockGuard>, LockError> {
        self.try_lock_for(name, self.opts.timeout)
    }

    /// `try_lock` with its own timeout (zero: a single attempt).
    pub fn try_lock_for(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<LockGuard>, LockError> {
        validate_name(name)?;
        // A huge timeout must not overflow (and panic): cap it at a day.
        let deadline = Instant::now() + timeout.min(Duration::from_secs(86_400));
        if self.effective_mode() == LockMode::Fcntl {
            match self.try_fcntl(name, deadline)? {
                FcntlOutcome::Taken(guard) => return Ok(Some(guard)),
                FcntlOutcome::Busy => return Ok(None),
                FcntlOutcome::Unavailable(path, err) => {
                    if self.opts.mode == LockMode::Fcntl {
                        return Err(LockError::io("fcntl(F_OFD_SETLK)", &path, err));
                    }
                    self.fall_back_to_lease(&path, &err);
                }
            }
        }
        self.try_lease(name, deadline)
    }

    /// `Auto` mode: remember that fcntl locks do not work here, warn once.
    fn fall_back_to_lease(&self, path: &Path, err: &io::Error) {
        if !self.use_lease.swap(true, Ordering::Relaxed) {
            log::warn!(
                "xla_pcache: fcntl locks are unavailable on {} ({err}); using lease files in {} instead",
                path.display(),
                self.dir.display()
            );
        }
    }

    // ---------------------------------------------------------------- fcntl

    fn try_fcntl(&self, name: &str, deadline: Instant) -> Result<FcntlOutcome, LockError> {
        let fname = format!("{name}.lock");
        let path = self.dir.join(&fname);
        let open = |d: &Dir| {
            let f = d.open_file(&fname, libc::O_RDWR | libc::O_CREAT, 0o666)?;
            if !crate::dir::fstat(&f)?.is_file() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not a regular file",
                ));
            }
            Ok(f)
        };
        let file = self
            .open_dir(true)
            .and_then(|d| match open(&d) {
                // A FIFO, a directory or a link planted under the lock's name would keep
                // the lock from ever being taken: it is nobody's, so it goes.
                Err(e)
                    if e.kind() == io::ErrorKind::InvalidData
                        || matches!(e.raw_os_error(), Some(libc::EISDIR) | Some(libc::ELOOP)) =>
                {
                    remove_foreign(&d, name, &fname);
                    open(&d)
                }
                other => other,
            })
            .map_err(|e| LockError::io("open", &path, e))?;
        loop {
            match lock_exclusive_nonblocking(&file) {
                Ok(()) => {
                    return Ok(FcntlOutcome::Taken(LockGuard {
                        inner: GuardInner::Fcntl { _file: file, path },
                    }))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_busy(&e) => {
                    if !sleep_until_next_poll(deadline) {
                        return Ok(FcntlOutcome::Busy);
                    }
                }
                Err(e) if is_unavailable(&e) => return Ok(FcntlOutcome::Unavailable(path, e)),
                Err(e) => return Err(LockError::io("fcntl(F_OFD_SETLK)", &path, e)),
            }
        }
    }

    // ---------------------------------------------------------------- lease

    fn try_lease(&self, name: &str, deadline: Instant) -> Result<Option<LockGuard>, LockError> {
        let lease_name = format!("{name}.lease");
        let lease = self.dir.join(&lease_name);
        let dir = self
            .open_dir(true)
            .map_err(|e| LockError::io("open", &self.dir, e))?;
        let id = LeaseId {
            host: self.opts.host.clone(),
            pid: std::process::id(),
            nonce: new_nonce(),
        };
        let content = id.content(0);
        let tmp_name = id.temp_name(name, 0);
        let tmp = self.dir.join(&tmp_name);
        write_new_file(&dir, &tmp_name, content.as_bytes())
            .map_err(|e| LockError::io("write", &tmp, e))?;
        let _tmp_guard = RemoveOnDrop(&dir, &tmp_name);

        loop {
            if link_exclusive(&dir, &tmp_name, &lease_name)
                .map_err(|e| LockError::io("link", &lease, e))?
            {
                self.forget(name);
                return Ok(Some(LockGuard::lease(
                    &dir, lease, name, id, content, false,
                )));
            }
            // Held by someone else (or it vanished between link and read).
            match read_small(&dir, &lease_name) {
                Ok(current) => {
                    if let Some(held_for) = self.observe_stale(name, &current) {
                        match self.take_over(name, &dir, &current, held_for, &id, &tmp_name)? {
                            TakeOver::Won => {
                                return Ok(Some(LockGuard::lease(
                                    &dir, lease, name, id, content, true,
                                )));
                            }
                            TakeOver::GaveUp => return Ok(None),
                            TakeOver::Retry => {}
                        }
                    }
                }
                Err(e) if is_gone(&e) => {}
                // Not a regular file: nobody's lease; removed, then the name is tried again.
                Err(e) if is_foreign(&e) => remove_foreign(&dir, name, &lease_name),
                Err(e) => return Err(LockError::io("read", &lease, e)),
            }
            if !sleep_until_next_poll(deadline) {
                return Ok(None);
            }
        }
    }

    /// Records that the lease `name` holds `content` now. Returns how long this process
    /// has seen that content unchanged if that is longer than `lease_time` (stale).
    /// The first observation of a content is never stale.
    fn observe_stale(&self, name: &str, content: &str) -> Option<Duration> {
        if is_retired(content) {
            // Its holder is done with it: nothing to wait for.
            return Some(Duration::ZERO);
        }
        let now = Instant::now();
        let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        match observed.get_mut(name) {
            Some(seen) if seen.content == content => {
                let held_for = now.saturating_duration_since(seen.since);
                (held_for > self.opts.lease_time).then_some(held_for)
            }
            Some(seen) => {
                seen.content = content.to_string();
                seen.since = now;
                None
            }
            None => {
                observed.insert(
                    name.to_string(),
                    Observation {
                        content: content.to_string(),
                        since: now,
                    },
                );
                None
            }
        }
    }

    fn forget(&self, name: &str) {
        let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        observed.remove(name);
    }

    /// Looks at the lease `name` without trying to take it: one read of the lease file.
    /// Records the content like an attempt does, so staleness is judged across peeks the
    /// same way (by how long this process has seen the content unchanged). A peek at a
    /// missing lease forgets what was seen of it.
    pub fn peek(&self, name: &str) -> Result<LeaseView, LockError> {
        validate_name(name)?;
        let lease_name = format!("{name}.lease");
        let lease = self.dir.join(&lease_name);
        let read = self
            .open_dir(false)
            .and_then(|dir| read_small(&dir, &lease_name));
        match read {
            Ok(content) => {
                let stale = self.observe_stale(name, &content);
                Ok(LeaseView::Held {
                    retired: is_retired(&content),
                    stale: stale.is_some(),
                    content,
                })
            }
            Err(e) if is_gone(&e) => {
                self.forget(name);
                Ok(LeaseView::Free)
            }
            // Not a lease (a FIFO, a directory, a link): nobody holds it; taking the lock
            // removes it.
            Err(e) if is_foreign(&e) => Ok(LeaseView::Held {
                content: String::new(),
                stale: true,
                retired: true,
            }),
            Err(e) => Err(LockError::io("read", &lease, e)),
        }
    }

    /// Drops what this process remembers of the lease `name` (its last content and since
    /// when), e.g. once a waiter stops watching it.
    pub fn forget_lease(&self, name: &str) {
        self.forget(name);
    }

    /// Takes over the lease `lease` judged stale with content `judged`: moves it aside,
    /// checks that what was moved is still what was judged, and links our own `tmp`.
    fn take_over(
        &self,
        name: &str,
        dir: &Dir,
        judged: &str,
        held_for: Duration,
        id: &LeaseId,
        tmp: &str,
    ) -> Result<TakeOver, LockError> {
        let lease_name = format!("{name}.lease");
        let lease = self.dir.join(&lease_name);
        let aside_name = id.aside_name(name);
        let aside = self.dir.join(&aside_name);
        match dir.rename(&lease_name, dir, &aside_name) {
            Ok(()) => {}
            Err(e) if is_gone(&e) => return Ok(TakeOver::Retry),
            Err(e) => return Err(LockError::io("rename", &lease, e)),
        }
        let _aside_guard = RemoveOnDrop(dir, &aside_name);
        self.forget(name);
        match read_small(dir, &aside_name) {
            Ok(moved) if moved == judged => {
                // Unlink the stale copy before linking ours (also done by the guard).
                if let Err(e) = dir.unlink(&aside_name) {
                    if !is_gone(&e) {
                        return Err(LockError::io("unlink", &aside, e));
                    }
                }
                if link_exclusive(dir, tmp, &lease_name)
                    .map_err(|e| LockError::io("link", &lease, e))?
                {
                    // A retired lease is routine to take; a stale one is worth a line.
                    let level = if is_retired(judged) {
                        log::Level::Debug
                    } else {
                        log::Level::Info
                    };
                    log::log!(
                        level,
                        "xla_pcache: took over lock lease {} from `{}` (unchanged for {:.1?})",
                        lease.display(),
                        judged.trim_end(),
                        held_for
                    );
                    Ok(TakeOver::Won)
                } else {
                    Ok(TakeOver::Retry)
                }
            }
            moved => {
                // Refreshed or replaced between our read and the rename: put it back if
                // the name is still free, and leave the lock to its holder this time.
                if !link_exclusive(dir, &aside_name, &lease_name)
                    .map_err(|e| LockError::io("link", &lease, e))?
                {
                    log::warn!(
                        "xla_pcache: could not put back refreshed lease {}: taken meanwhile",
                        lease.display()
                    );
                }
                match moved {
                    Ok(_) => Ok(TakeOver::GaveUp),
                    Err(e) => Err(LockError::io("read", &aside, e)),
                }
            }
        }
    }
}

enum FcntlOutcome {
    Taken(LockGuard),
    Busy,
    Unavailable(PathBuf, io::Error),
}

enum TakeOver {
    Won,
    GaveUp,
    Retry,
}

/// What [`LockDir::peek`] saw of a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseView {
    /// No lease file.
    Free,
    /// A lease file. `stale`: this process has seen this content unchanged for longer than
    /// `lease_time`, or it is `retired` (its holder is done with it and left it behind);
    /// either may be taken over at once.
    Held {
        content: String,
        stale: bool,
        retired: bool,
    },
}

/// Who holds a lease: written into the lease file as `host pid nonce counter`.
#[derive(Clone, Debug)]
struct LeaseId {
    host: String,
    pid: u32,
    nonce: u64,
}

impl LeaseId {
    fn content(&self, counter: u64) -> String {
        format!(
            "{} {} {:016x} {}\n",
            self.host, self.pid, self.nonce, counter
        )
    }

    /// The last content of a lease its holder is done with (see [`LockGuard::retire`]).
    fn retired_content(&self, counter: u64) -> String {
        format!(
            "{} {} {:016x} {} {RETIRED}\n",
            self.host, self.pid, self.nonce, counter
        )
    }

    fn temp_name(&self, name: &str, counter: u64) -> String {
        format!(
            ".{name}.lease.{}.{}.{:016x}.{counter}.tmp",
            self.host, self.pid, self.nonce
        )
    }

    fn aside_name(&self, name: &str) -> String {
        format!(
            ".{name}.lease.{}.{}.{:016x}.stale",
            self.host, self.pid, self.nonce
        )
    }
}

/// An exclusive lock, released when dropped (or by [`release`](LockGuard::release)).
#[derive(Debug)]
pub struct LockGuard {
    inner: GuardInner,
}

#[derive(Debug)]
enum GuardInner {
    /// Closing the file releases the OFD lock. The lock file itself stays (removing
    /// it would let two processes lock two different inodes of one name).
    Fcntl { _file: File, path: PathBuf },
    Lease {
        /// The lease's directory (the handle it was taken through) and file name; `path`
        /// is for messages.
        dir: Arc<Dir>,
        file: String,
        path: PathBuf,
        name: String,
        id: LeaseId,
        counter: u64,
        content: String,
        released: bool,
        /// Taken from a holder judged stale.
        took_over: bool,
    },
}

impl LockGuard {
    fn lease(
        dir: &Arc<Dir>,
        path: PathBuf,
        name: &str,
        id: LeaseId,
        content: String,
        took_over: bool,
    ) -> Self {
        LockGuard {
            inner: GuardInner::Lease {
                dir: Arc::clone(dir),
                file: format!("{name}.lease"),
                path,
                name: name.to_string(),
                id,
                counter: 0,
                content,
                released: false,
                took_over,
            },
        }
    }

    /// Whether this lease was taken over from a holder judged stale (or retired).
    pub fn took_over(&self) -> bool {
        matches!(
            self.inner,
            GuardInner::Lease {
                took_over: true,
                ..
            }
        )
    }

    /// `"fcntl"` or `"lease"`.
    pub fn kind(&self) -> &'static str {
        match self.inner {
            GuardInner::Fcntl { .. } => "fcntl",
            GuardInner::Lease { .. } => "lease",
        }
    }

    /// The lock or lease file.
    pub fn path(&self) -> &Path {
        match &self.inner {
            GuardInner::Fcntl { path, .. } | GuardInner::Lease { path, .. } => path,
        }
    }

    /// Refreshes a lease so that no other process judges it stale: rewrites it with the
    /// counter incremented (temp file + rename), after checking that it is still ours.
    /// Call it more often than `lease_time`. A no-op for fcntl locks.
    ///
    /// Returns [`LockError::LeaseLost`] if the lease was taken over or removed; the
    /// caller should then stop the work the lock protects.
    pub fn heartbeat(&mut self) -> Result<(), LockError> {
        self.rewrite(false)
    }

    /// Marks a lease as done with while leaving its file in place: its last content says
    /// "retired", which every [`LockDir`] takes over at once, and which watchers of the
    /// lease can tell apart from a lease that was released (removed) or went stale. A
    /// later [`release`](LockGuard::release) or drop removes the file (if still ours);
    /// [`leave`](LockGuard::leave) keeps it. A no-op for fcntl locks.
    pub fn retire(&mut self) -> Result<(), LockError> {
        self.rewrite(true)
    }

    /// Lets go of the guard without removing the lease file (normally after
    /// [`retire`](LockGuard::retire)); an fcntl lock is released as on drop.
    pub fn leave(mut self) {
        if let GuardInner::Lease { released, .. } = &mut self.inner {
            *released = true;
        }
    }

    fn rewrite(&mut self, retire: bool) -> Result<(), LockError> {
        let GuardInner::Lease {
            dir,
            file,
            path,
            name,
            id,
            counter,
            content,
            ..
        } = &mut self.inner
        else {
            return Ok(());
        };
        let next = *counter + 1;
        let new_content = if retire {
            id.retired_content(next)
        } else {
            id.content(next)
        };
        let tmp_name = id.temp_name(name, next);
        let tmp = path.with_file_name(&tmp_name);
        write_new_file(dir, &tmp_name, new_content.as_bytes())
            .map_err(|e| LockError::io("write", &tmp, e))?;
        let _tmp_guard = RemoveOnDrop(dir, &tmp_name);
        match read_small(dir, file) {
            Ok(current) if current == *content => {}
            Ok(_) => return Err(LockError::LeaseLost { path: path.clone() }),
            Err(e) if is_gone(&e) => return Err(LockError::LeaseLost { path: path.clone() }),
            Err(e) => return Err(LockError::io("read", path, e)),
        }
        dir.rename(&tmp_name, dir, file)
            .map_err(|e| LockError::io("rename", path, e))?;
        *counter = next;
        *content = new_content;
        Ok(())
    }

    /// Releases the lock now, reporting errors that dropping would only log.
    /// A lease is removed only if it is still ours.
    pub fn release(mut self) -> Result<(), LockError> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<(), LockError> {
        let GuardInner::Lease {
            dir,
            file,
            path,
            content,
            released,
            ..
        } = &mut self.inner
        else {
            return Ok(()); // the fcntl lock goes with the file descriptor
        };
        if *released {
            return Ok(());
        }
        *released = true;
        match read_small(dir, file) {
            Ok(current) if current == *content => match dir.unlink(file) {
                Ok(()) => Ok(()),
                Err(e) if is_gone(&e) => Ok(()),
                Err(e) => Err(LockError::io("unlink", path, e)),
            },
            Ok(_) => {
                log::debug!(
                    "xla_pcache: lease {} was taken over before release; leaving it",
                    path.display()
                );
                Ok(())
            }
            Err(e) if is_gone(&e) => Ok(()),
            Err(e) => Err(LockError::io("read", path, e)),
        }
    }

    /// Forgets the guard without touching the lock (a forked child's copy of its
    /// parent's guard: the lock is the parent's).
    pub fn forget_inherited(self) {
        std::mem::forget(self);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Err(e) = self.release_inner() {
            log::debug!("xla_pcache: releasing lock: {e}");
        }
    }
}

// -------------------------------------------------------------------- helpers

/// This machine's host name, or `"unknown"`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname NUL-terminates
    // when the name fits, and we stop at the first NUL or the end of the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    sanitize_host(&name)
}

/// A host name safe to write as one word of a lease line and inside a file name.
fn sanitize_host(host: &str) -> String {
    let cleaned: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_HOST_LEN)
        .collect();
    if cleaned.is_empty() {
        "unknown".to_string()
    } else {
        cleaned
    }
}

fn validate_name(name: &str) -> Result<(), LockError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(LockError::InvalidName {
            name: name.to_string(),
        })
    }
}

/// A 64-bit value unique to this guard: std's randomly keyed hasher over the time,
/// the pid, a process-wide counter and a stack address.
fn new_nonce() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.as_nanos().hash(&mut h);
    Instant::now().hash(&mut h);
    std::process::id().hash(&mut h);
    SEQ.fetch_add(1, Ordering::Relaxed).hash(&mut h);
    let local = 0u8;
    (&local as *const u8 as usize).hash(&mut h);
    thread::current().id().hash(&mut h);
    h.finish()
}

/// Sleeps one poll interval (shortened to the deadline). False if the deadline passed.
fn sleep_until_next_poll(deadline: Instant) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    thread::sleep(POLL_INTERVAL.min(deadline - now));
    true
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn lock_exclusive_nonblocking(file: &File) -> io::Result<()> {
    // SAFETY: `flock` is a plain C struct for which all-zero bytes are valid; OFD
    // locks require l_pid == 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0; // the whole file
    fl.l_pid = 0;
    // SAFETY: valid descriptor owned by `file`, valid pointer to `fl`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Elsewhere, BSD `flock` locks, which also belong to the open file description.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn lock_exclusive_nonblocking(file: &File) -> io::Result<()> {
    // SAFETY: valid descriptor owned by `file`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The lock is held by another open file description.
fn is_busy(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(n) if n == libc::EAGAIN || n == libc::EACCES || n == libc::EWOULDBLOCK)
}

/// Locks do not work on this filesystem (NFS `nolock`, no lock manager, ...).
fn is_unavailable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(n) if n == libc::ENOLCK
        || n == libc::ENOSYS
        || n == libc::EINVAL
        || n == libc::EOPNOTSUPP
        || n == libc::ENOTSUP)
}

/// A lease content written by [`LockGuard::retire`].
fn is_retired(content: &str) -> bool {
    content
        .trim_end()
        .rsplit(' ')
        .next()
        .is_some_and(|w| w == RETIRED)
}

/// The file disappeared under us (removed locally, or by another NFS client).
fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESTALE)
}

/// Creates `dir/name` exclusively with `data` and closes it, checking the close (on NFS
/// the data reaches the server at close). Removes the file on failure.
fn write_new_file(dir: &Dir, name: &str, data: &[u8]) -> io::Result<()> {
    let mut file = dir.open_file(name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o666)?;
    let result = file.write_all(data).and_then(|()| {
        let fd = file.into_raw_fd();
        // SAFETY: we own `fd` (taken from the File) and close it exactly once.
        if unsafe { libc::close(fd) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    });
    if result.is_err() {
        let _ = dir.unlink(name);
    }
    result
}

/// Reads a small text file: never following a link, never waiting on a FIFO, a regular
/// file only, at most `MAX_LEASE_LEN` bytes.
fn read_small(dir: &Dir, name: &str) -> io::Result<String> {
    let (file, _) = open_regular(dir, name)?;
    let buf = read_capped(&file, MAX_LEASE_LEN)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `link(src, dst)` without replacing `dst`: true if `dst` is now `src`'s file, false
/// if `dst` exists already. After a failed link, `src`'s link count decides first:
/// an NFS client may report EEXIST for a retransmitted link that did succeed. Then an
/// existing `dst` means "held" whatever the error: sshfs (SFTP) reports a link onto an
/// existing name as EPERM. Only an error with `dst` absent is returned.
fn link_exclusive(dir: &Dir, src: &str, dst: &str) -> io::Result<bool> {
    let err = match dir.link(src, dir, dst) {
        Ok(()) => return Ok(true),
        Err(e) => e,
    };
    if dir.stat(src)?.nlink() == 2 {
        return Ok(true);
    }
    if err.kind() == io::ErrorKind::AlreadyExists {
        return Ok(false);
    }
    match dir.stat(dst) {
        Ok(_) => Ok(false),
        Err(_) => Err(err),
    }
}

/// The name holds something that is not a lease file (a FIFO, a directory, a symbolic link).
fn is_foreign(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData
        || matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EISDIR))
}

/// Removes what stands under `file` in `dir` if it is not a regular file: moved aside first,
/// and put back if a real lease took its place meanwhile; removed through the handle, never
/// following a link.
fn remove_foreign(dir: &Dir, name: &str, file: &str) {
    let aside = format!(".{name}.foreign.{:016x}", new_nonce());
    if dir.rename(file, dir, &aside).is_err() {
        return;
    }
    match dir.stat(&aside) {
        Ok(m) if m.is_file() => {
            let _ = link_exclusive(dir, &aside, file);
            let _ = dir.unlink(&aside);
        }
        _ => {
            log::warn!(
                "xla_pcache: removed {}: not a lock file (someone with write access to the \
                 cache directory put it there)",
                dir.display(file)
            );
            let _ = dir.remove_any(&aside);
        }
    }
}

/// Removes a file when dropped, ignoring errors (temp and aside files).
struct RemoveOnDrop<'a>(&'a Dir, &'a str);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.unlink(self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::sync::Arc;

    fn opts(mode: LockMode, timeout_ms: u64, lease_ms: u64) -> LockOptions {
        LockOptions {
            mode,
            timeout: Duration::from_millis(timeout_ms),
            lease_time: Duration::from_millis(lease_ms),
            host: "test host".to_string(),
        }
    }

    fn lock_dir(root: &Path, mode: LockMode, timeout_ms: u64, lease_ms: u64) -> LockDir {
        LockDir::new(root.join("locks"), opts(mode, timeout_ms, lease_ms))
    }

    fn lease_content(root: &Path, name: &str) -> Option<String> {
        fs::read_to_string(root.join("locks").join(format!("{name}.lease"))).ok()
    }

    /// Only the lease (and no temp or aside files) remain in the directory.
    fn leftovers(root: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(root.join("locks"))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn mode_parsing() {
        assert_eq!("auto".parse::<LockMode>().unwrap(), LockMode::Auto);
        assert_eq!("fcntl".parse::<LockMode>().unwrap(), LockMode::Fcntl);
        assert_eq!(" Lease\n".parse::<LockMode>().unwrap(), LockMode::Lease);
        for m in [LockMode::Auto, LockMode::Fcntl, LockMode::Lease] {
            assert_eq!(m.to_string().parse::<LockMode>().unwrap(), m);
        }
        for bad in ["flock", "", "nfs"] {
            let err = bad.parse::<LockMode>().unwrap_err();
            assert!(matches!(&err, LockError::InvalidMode { value } if value == bad));
            assert!(
                err.to_string().contains(&format!("{bad:?}")),
                "message should name the bad value: {err}"
            );
        }
    }

    #[test]
    fn invalid_names_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = lock_dir(tmp.path(), LockMode::Fcntl, 0, 1000);
        for bad in ["", ".evict", "a/b", "../x", "a b", &"x".repeat(65)] {
            assert!(
                matches!(dir.try_lock(bad), Err(LockError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert!(dir.try_lock("evict-1.x_y").unwrap().is_some());
    }

    #[test]
    fn fcntl_excludes_second_lockdir_and_releases_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Fcntl, 0, 1000);
        let b = lock_dir(tmp.path(), LockMode::Fcntl, 50, 1000);
        let g = a.try_lock("evict").unwrap().expect("first lock");
        assert_eq!(g.kind(), "fcntl");
        assert!(g.path().ends_with("locks/evict.lock"));
        assert!(b.try_lock("evict").unwrap().is_none(), "other LockDir");
        assert!(a.try_lock("evict").unwrap().is_none(), "same LockDir again");
        assert!(
            b.try_lock("compact").unwrap().is_some(),
            "other name is free"
        );
        drop(g);
        let g2 = b.try_lock("evict").unwrap().expect("released on drop");
        assert!(a.try_lock("evict").unwrap().is_none());
        g2.release().unwrap();
        assert!(a.try_lock("evict").unwrap().is_some());
    }

    #[test]
    fn fcntl_excludes_other_threads() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(lock_dir(tmp.path(), LockMode::Fcntl, 30_000, 1000));
        let inside = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let dir = Arc::clone(&dir);
                let inside = Arc::clone(&inside);
                thread::spawn(move || {
                    for _ in 0..10 {
                        let g = dir.try_lock("evict").unwrap().expect("within 30 s");
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        thread::sleep(Duration::from_millis(2));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(g);
                        thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn timeout_is_honoured() {
        let tmp = tempfile::tempdir().unwrap();
        for mode in [LockMode::Fcntl, LockMode::Lease] {
            let a = lock_dir(tmp.path(), mode, 0, 60_000);
            let b = lock_dir(tmp.path(), mode, 150, 60_000);
            let _g = a.try_lock("evict").unwrap().unwrap();
            let t = Instant::now();
            assert!(b.try_lock("evict").unwrap().is_none());
            let took = t.elapsed();
            assert!(took >= Duration::from_millis(150), "{mode}: {took:?}");
            assert!(took < Duration::from_millis(1000), "{mode}: {took:?}");
        }
    }

    #[test]
    fn try_lock_for_overrides_the_timeout() {
        let tmp = tempfile::tempdir().unwrap();
        for mode in [LockMode::Fcntl, LockMode::Lease] {
            let a = lock_dir(tmp.path(), mode, 0, 60_000);
            let b = lock_dir(tmp.path(), mode, 5_000, 60_000);
            let g = a.try_lock_for("evict", Duration::ZERO).unwrap().unwrap();
            let t = Instant::now();
            assert!(b.try_lock_for("evict", Duration::ZERO).unwrap().is_none());
            assert!(b
                .try_lock_for("evict", Duration::from_millis(60))
                .unwrap()
                .is_none());
            let took = t.elapsed();
            assert!(took >= Duration::from_millis(60), "{mode}: {took:?}");
            assert!(took < Duration::from_millis(1000), "{mode}: {took:?}");
            drop(g);
            assert!(b.try_lock_for("evict", Duration::ZERO).unwrap().is_some());
            // A huge timeout does not overflow.
            assert!(a.try_lock_for("other", Duration::MAX).unwrap().is_some());
        }
    }

    #[test]
    fn creates_missing_lock_dir() {
        let tmp = tempfile::tempdir().unwrap();
        for (i, mode) in [LockMode::Fcntl, LockMode::Lease].into_iter().enumerate() {
            let root = tmp.path().join(i.to_string());
            fs::create_dir(&root).unwrap();
            let d = lock_dir(&root, mode, 0, 1000);
            assert!(d.try_lock("evict").unwrap().is_some());
            assert!(root.join("locks").is_dir());
        }
        let gone = lock_dir(&tmp.path().join("gone"), LockMode::Fcntl, 0, 1000);
        assert!(gone.try_lock("evict").is_err());
        assert!(
            !tmp.path().join("gone").exists(),
            "a missing parent is never created"
        );
    }

    #[test]
    fn peek_sees_a_lease_without_taking_it_and_judges_staleness() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let b = lock_dir(tmp.path(), LockMode::Lease, 0, 80);
        assert_eq!(b.peek("claim").unwrap(), LeaseView::Free);
        let mut g = a.try_lock("claim").unwrap().unwrap();
        assert!(!g.took_over());
        let LeaseView::Held { stale, retired, .. } = b.peek("claim").unwrap() else {
            panic!("held")
        };
        assert!(!stale && !retired, "a first sighting is never stale");
        thread::sleep(Duration::from_millis(120));
        let LeaseView::Held { stale, .. } = b.peek("claim").unwrap() else {
            panic!("held")
        };
        assert!(stale, "unchanged for longer than the lease time");
        g.heartbeat().unwrap();
        let LeaseView::Held { stale, .. } = b.peek("claim").unwrap() else {
            panic!("held")
        };
        assert!(!stale, "a heartbeat is a new content");
        // Peeking never creates files (it is what read-only waiters do).
        assert!(leftovers(tmp.path()).is_empty());
        drop(g);
        assert_eq!(b.peek("claim").unwrap(), LeaseView::Free);
        assert!(b.peek("../x").is_err(), "names are validated");
    }

    #[test]
    fn a_retired_lease_stays_visible_and_is_taken_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let b = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let mut g = a.try_lock("claim").unwrap().unwrap();
        g.retire().unwrap();
        let content = lease_content(tmp.path(), "claim").unwrap();
        assert!(content.trim_end().ends_with(" retired"), "{content:?}");
        assert_eq!(
            b.peek("claim").unwrap(),
            LeaseView::Held {
                content,
                stale: true,
                retired: true
            }
        );
        g.leave();
        assert!(
            lease_content(tmp.path(), "claim").is_some(),
            "leave() keeps the file"
        );
        // Taken over on the first attempt, no lease time to wait out.
        let g2 = b.try_lock("claim").unwrap().expect("retired lease taken");
        assert!(g2.took_over());
        assert!(!lease_content(tmp.path(), "claim")
            .unwrap()
            .contains("retired"));
        drop(g2);
        assert!(lease_content(tmp.path(), "claim").is_none());
        // retire() then drop removes the file.
        let mut g3 = a.try_lock("claim").unwrap().unwrap();
        g3.retire().unwrap();
        drop(g3);
        assert!(lease_content(tmp.path(), "claim").is_none());
        assert!(leftovers(tmp.path()).is_empty());
    }

    #[test]
    fn lease_excludes_and_releases_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let b = lock_dir(tmp.path(), LockMode::Lease, 50, 60_000);
        let g = a.try_lock("evict").unwrap().expect("first lease");
        assert_eq!(g.kind(), "lease");
        let content = lease_content(tmp.path(), "evict").unwrap();
        let fields: Vec<&str> = content.split_whitespace().collect();
        assert_eq!(fields.len(), 4, "{content:?}");
        assert_eq!(fields[0], "test_host");
        assert_eq!(fields[1], std::process::id().to_string());
        assert_eq!(fields[3], "0");
        assert!(content.ends_with('\n'));
        assert!(b.try_lock("evict").unwrap().is_none());
        assert!(a.try_lock("evict").unwrap().is_none(), "same LockDir again");
        assert!(
            leftovers(tmp.path()).is_empty(),
            "{:?}",
            leftovers(tmp.path())
        );
        drop(g);
        assert!(
            lease_content(tmp.path(), "evict").is_none(),
            "removed on drop"
        );
        let g = b.try_lock("evict").unwrap().expect("free after drop");
        g.release().unwrap();
        assert!(lease_content(tmp.path(), "evict").is_none());
        assert!(leftovers(tmp.path()).is_empty());
    }

    #[test]
    fn stale_lease_taken_over_after_lease_time() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 200);
        let b = lock_dir(tmp.path(), LockMode::Lease, 50, 200);
        let ga = a.try_lock("evict").unwrap().unwrap();
        let theirs = lease_content(tmp.path(), "evict").unwrap();
        // First observation is never stale, even of an old file.
        assert!(b.try_lock("evict").unwrap().is_none());
        thread::sleep(Duration::from_millis(250));
        // Watched unchanged for > 200 ms across two calls: stale.
        let gb = b.try_lock("evict").unwrap().expect("takeover");
        let ours = lease_content(tmp.path(), "evict").unwrap();
        assert_ne!(ours, theirs);
        assert!(
            leftovers(tmp.path()).is_empty(),
            "{:?}",
            leftovers(tmp.path())
        );
        // The old holder learns it lost the lease, and its release leaves ours alone.
        let mut ga = ga;
        assert!(matches!(ga.heartbeat(), Err(LockError::LeaseLost { .. })));
        drop(ga);
        assert_eq!(lease_content(tmp.path(), "evict").unwrap(), ours);
        drop(gb);
        assert!(lease_content(tmp.path(), "evict").is_none());

        // Within a single call whose timeout exceeds lease_time.
        let c = lock_dir(tmp.path(), LockMode::Lease, 600, 200);
        let _ga = a.try_lock("evict").unwrap().unwrap();
        let t = Instant::now();
        let _gc = c.try_lock("evict").unwrap().expect("takeover in one call");
        assert!(t.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn heartbeat_prevents_takeover() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 200);
        let b = lock_dir(tmp.path(), LockMode::Lease, 700, 200);
        let mut g = a.try_lock("evict").unwrap().unwrap();
        let beating = thread::spawn(move || {
            for _ in 0..18 {
                thread::sleep(Duration::from_millis(50));
                g.heartbeat().unwrap();
            }
            g
        });
        thread::sleep(Duration::from_millis(20));
        assert!(
            b.try_lock("evict").unwrap().is_none(),
            "taken despite heartbeat"
        );
        let g = beating.join().unwrap();
        let content = lease_content(tmp.path(), "evict").unwrap();
        assert!(content.ends_with(" 18\n"), "{content:?}");
        assert!(
            leftovers(tmp.path()).is_empty(),
            "{:?}",
            leftovers(tmp.path())
        );
        drop(g);
        assert!(lease_content(tmp.path(), "evict").is_none());
    }

    #[test]
    fn heartbeat_is_noop_for_fcntl() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Fcntl, 0, 200);
        let mut g = a.try_lock("evict").unwrap().unwrap();
        g.heartbeat().unwrap();
    }

    #[test]
    fn release_after_takeover_keeps_the_new_lease() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Lease, 0, 60_000);
        let g = a.try_lock("evict").unwrap().unwrap();
        // Someone else replaced the lease (as a takeover would).
        let lease = tmp.path().join("locks/evict.lease");
        fs::write(&lease, "otherhost 1 00000000000000ff 0\n").unwrap();
        g.release().unwrap();
        assert_eq!(
            lease_content(tmp.path(), "evict").unwrap(),
            "otherhost 1 00000000000000ff 0\n"
        );
        // A guard whose lease vanished releases quietly.
        let g = {
            fs::remove_file(&lease).unwrap();
            a.try_lock("evict").unwrap().unwrap()
        };
        fs::remove_file(&lease).unwrap();
        g.release().unwrap();
    }

    #[test]
    fn takeover_puts_back_a_refreshed_lease() {
        let tmp = tempfile::tempdir().unwrap();
        let d = lock_dir(tmp.path(), LockMode::Lease, 0, 200);
        fs::create_dir_all(d.dir()).unwrap();
        let lease = d.dir().join("evict.lease");
        let fresh = "h 7 0000000000000001 5\n";
        fs::write(&lease, fresh).unwrap();
        let id = LeaseId {
            host: "me".into(),
            pid: 1,
            nonce: 2,
        };
        let tmpname = id.temp_name("evict", 0);
        let tmpfile = d.dir().join(&tmpname);
        let dir = Dir::open_path(d.dir(), true).unwrap();
        write_new_file(&dir, &tmpname, id.content(0).as_bytes()).unwrap();
        // We judged an older content stale; the holder refreshed it meanwhile.
        let r = d
            .take_over(
                "evict",
                &dir,
                "h 7 0000000000000001 4\n",
                Duration::from_secs(1),
                &id,
                &tmpname,
            )
            .unwrap();
        assert!(matches!(r, TakeOver::GaveUp));
        assert_eq!(fs::read_to_string(&lease).unwrap(), fresh);
        // The judged content is what is there: we win.
        let r = d
            .take_over("evict", &dir, fresh, Duration::from_secs(1), &id, &tmpname)
            .unwrap();
        assert!(matches!(r, TakeOver::Won));
        assert_eq!(fs::read_to_string(&lease).unwrap(), id.content(0));
        fs::remove_file(&tmpfile).unwrap();
        assert!(
            leftovers(tmp.path()).is_empty(),
            "{:?}",
            leftovers(tmp.path())
        );
    }

    #[test]
    fn a_fifo_directory_or_link_under_a_lock_name_is_removed_not_followed() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), b"x").unwrap();
        for mode in [LockMode::Lease, LockMode::Fcntl] {
            for planted in ["fifo", "dir", "link"] {
                let d = lock_dir(tmp.path(), mode, 100, 60_000);
                fs::create_dir_all(d.dir()).unwrap();
                let ext = if mode == LockMode::Lease {
                    "lease"
                } else {
                    "lock"
                };
                let p = d.dir().join(format!("evict.{ext}"));
                match planted {
                    "fifo" => {
                        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                        // SAFETY: a valid path.
                        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
                    }
                    "dir" => fs::create_dir_all(p.join("inside")).unwrap(),
                    _ => std::os::unix::fs::symlink(outside.path().join("keep"), &p).unwrap(),
                }
                let g = d.try_lock("evict").unwrap();
                assert!(g.is_some(), "{mode} {planted}");
                drop(g);
                assert_eq!(fs::read(outside.path().join("keep")).unwrap(), b"x");
                let _ = fs::remove_file(&p);
            }
        }
    }

    #[test]
    fn auto_uses_fcntl_and_remembers_a_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        let d = lock_dir(tmp.path(), LockMode::Auto, 0, 1000);
        assert_eq!(d.effective_mode(), LockMode::Fcntl);
        assert_eq!(d.try_lock("evict").unwrap().unwrap().kind(), "fcntl");
        let err = io::Error::from_raw_os_error(libc::ENOLCK);
        assert!(is_unavailable(&err));
        d.fall_back_to_lease(Path::new("x"), &err);
        d.fall_back_to_lease(Path::new("x"), &err);
        assert_eq!(d.effective_mode(), LockMode::Lease);
        assert_eq!(d.try_lock("evict").unwrap().unwrap().kind(), "lease");
        assert!(!is_unavailable(&io::Error::from_raw_os_error(libc::EAGAIN)));
        assert!(is_busy(&io::Error::from_raw_os_error(libc::EAGAIN)));
    }

    #[test]
    fn io_errors_are_returned() {
        let tmp = tempfile::tempdir().unwrap();
        // The lock directory path is a regular file.
        let not_dir = tmp.path().join("file");
        fs::write(&not_dir, b"").unwrap();
        for mode in [LockMode::Fcntl, LockMode::Lease] {
            let d = LockDir::new(not_dir.clone(), opts(mode, 0, 1000));
            assert!(
                matches!(d.try_lock("evict"), Err(LockError::Io { .. })),
                "{mode}"
            );
        }
    }

    #[test]
    fn host_is_sanitized() {
        assert_eq!(sanitize_host("a b\tc/d"), "a_b_c_d");
        assert_eq!(sanitize_host(""), "unknown");
        assert!(!hostname().is_empty());
        assert!(!hostname().contains(char::is_whitespace));
    }

    #[test]
    fn nonces_differ() {
        let a: Vec<u64> = (0..100).map(|_| new_nonce()).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(a.len(), b.len());
    }
}
