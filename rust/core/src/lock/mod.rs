//! Named, exclusive locks under a directory (normally `<root>/locks`), taken with a
//! timeout so that they never hang a job. The cache holds one for eviction and compaction
//! ("evict") and leases one per key being compiled (claims).
//!
//! This module is the common interface, [`LockDir`] and [`LockGuard`], and the choice of
//! mechanism ([`LockMode`]); each mechanism has its own file:
//!
//! * [`fcntl`](self::fcntl): open-file-description locks on `<dir>/<name>.lock`, polled
//!   until the timeout. They exclude every other open file description, including other
//!   threads and other [`LockDir`]s of the same process, and the kernel (or the NFS lock
//!   manager) drops them when the holder dies.
//! * [`lease`](self::lease): a file `<dir>/<name>.lease` holding one line
//!   `host pid nonce counter`, created atomically with `link()`, judged stale only by how
//!   long *this process* has watched it unchanged on its own monotonic clock. Where locks
//!   are unavailable (`ENOLCK` on an NFS `nolock` mount, ...) [`LockMode::Auto`] falls back
//!   to it. The holder must call [`LockGuard::heartbeat`] more often than `lease_time`.
//!
//! The cache's correctness never rests on these locks (ARCHITECTURE.md, "Rules"): the
//! evictor lock only saves duplicated eviction and compaction work. On `local_lock` NFS
//! mounts and FUSE network filesystems a lock may exclude only the processes of one host,
//! and a lease can in rare races be held twice. Hence the priorities: never block longer
//! than the timeout, never panic, and report errors instead of printing them.

mod fcntl;
mod lease;
#[cfg(test)]
pub(crate) use lease::ticket_name;

use fcntl::FcntlOutcome;
pub use lease::LeaseView;
use lease::{LeaseId, Observation};

use crate::clock::sanitize_host;

use crate::dir::{Dir, Kind, Name, Rel, Root};
use crate::forksafe::ForkMutex;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::hash::{BuildHasher, Hash, Hasher};
use std::io;
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
            host: crate::clock::hostname().to_string(),
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

impl From<LockError> for crate::error::StoreError {
    fn from(e: LockError) -> Self {
        crate::error::StoreError::Lock(Box::new(e))
    }
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

/// A directory of named locks (normally `<root>/locks`).
///
/// It remembers, per lock name, the lease content it last saw and since when, so a
/// stale lease is recognised across several [`try_lock`](LockDir::try_lock) calls, even
/// when each call's timeout is shorter than `lease_time`. It is `Send + Sync`.
pub struct LockDir {
    dir: PathBuf,
    /// Where the directory is reached from: by its path, or beneath a cache root without
    /// following any link (see `dir/`), at each use.
    beneath: Option<(Arc<Root>, Rel)>,
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
    pub fn beneath(root: Arc<Root>, rel: Rel, opts: LockOptions) -> Self {
        let mut d = LockDir::new(root.path().join(rel.as_str()), opts);
        d.beneath = Some((root, rel));
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
                    Some((root, rel)) => match rel.split_last() {
                        (Some(parent), last) => root.sub(&parent)?.mkdir(&last, 0o777),
                        (None, last) => root.dir()?.mkdir(&last, 0o777),
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
        file: Name,
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
    /// Releases the lock now, reporting errors that dropping would only log.
    /// A lease is removed only if it is still ours.
    pub fn release(mut self) -> Result<(), LockError> {
        self.release_inner()
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

/// A file name the lock code makes from a lock name, a host and numbers.
fn made(s: &str) -> io::Result<Name> {
    Name::checked(Kind::Made, s)
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

/// `link(src, dst)` without replacing `dst`: true if `dst` is now `src`'s file, false
/// if `dst` exists already. After a failed link, `src`'s link count decides first:
/// an NFS client may report EEXIST for a retransmitted link that did succeed. Then an
/// existing `dst` means "held" whatever the error: sshfs (SFTP) reports a link onto an
/// existing name as EPERM. Only an error with `dst` absent is returned.
fn link_exclusive(dir: &Dir, src: &Name, dst: &Name) -> io::Result<bool> {
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

/// Removes what stands under `file` in `dir` if it is not a regular file: moved aside first,
/// and put back if a real lease took its place meanwhile; removed through the handle, never
/// following a link.
fn remove_foreign(dir: &Dir, name: &str, file: &Name) {
    let Ok(aside) = made(&format!(".{name}.foreign.{:016x}", new_nonce())) else {
        return;
    };
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
                dir.display(file.as_str())
            );
            let _ = dir.remove_any(&aside);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    pub(super) fn opts(mode: LockMode, timeout_ms: u64, lease_ms: u64) -> LockOptions {
        LockOptions {
            mode,
            timeout: Duration::from_millis(timeout_ms),
            lease_time: Duration::from_millis(lease_ms),
            host: "test host".to_string(),
        }
    }

    pub(super) fn lock_dir(root: &Path, mode: LockMode, timeout_ms: u64, lease_ms: u64) -> LockDir {
        LockDir::new(root.join("locks"), opts(mode, timeout_ms, lease_ms))
    }

    pub(super) fn lease_content(root: &Path, name: &str) -> Option<String> {
        fs::read_to_string(root.join("locks").join(format!("{name}.lease"))).ok()
    }

    /// Asserts that no temp or aside file is left beside the leases, naming any that are.
    pub(super) fn assert_no_leftovers(root: &Path) {
        let left = leftovers(root);
        assert!(left.is_empty(), "{left:?}");
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
    fn timeout_is_honoured() {
        let tmp = tempfile::tempdir().unwrap();
        for mode in [LockMode::Fcntl, LockMode::Lease] {
            let a = lock_dir(tmp.path(), mode, 0, 60_000);
            let b = lock_dir(tmp.path(), mode, 150, 60_000);
            let _g = a.try_lock("evict").unwrap().unwrap();
            let t = Instant::now();
            assert!(b.try_lock("evict").unwrap().is_none());
            let took = t.elapsed();
            // A lower bound: it waited its timeout out (a slow machine only waits longer).
            assert!(took >= Duration::from_millis(150), "{mode}: {took:?}");
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
        d.fall_back_to_lease(Path::new("x"), &err);
        d.fall_back_to_lease(Path::new("x"), &err);
        assert_eq!(d.effective_mode(), LockMode::Lease);
        assert_eq!(d.try_lock("evict").unwrap().unwrap().kind(), "lease");
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
    fn nonces_differ() {
        let a: Vec<u64> = (0..100).map(|_| new_nonce()).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(a.len(), b.len());
    }
}
