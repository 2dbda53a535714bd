//! Directory handles: every file of the cache is reached relative to a handle on the cache
//! root, never by a path the kernel resolves through whatever the directory holds now.
//!
//! The cache directory is shared: anyone who can write it can replace `entries/xx`, `tmp/`
//! or `locks/claims` by a symbolic link to somewhere else, or put a FIFO, a directory or a
//! huge sparse file where a file is expected. So:
//!
//! * the root is opened once (following a link there is the user's choice of path), and
//!   every sub-directory is opened beneath it at the time of use, refusing symbolic links in
//!   every component (`openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` on Linux 5.6+, else
//!   one `openat(O_NOFOLLOW | O_DIRECTORY)` per component);
//! * files are opened `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` relative to those handles (a FIFO
//!   opens at once and is then refused by `fstat`), and removed, renamed and linked with the
//!   `*at` calls on the same handles, so a swap after the open cannot redirect them.
//!
//! A component that is not a real directory reads as [`is_unsafe`]: callers skip the
//! operation, count it and warn.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

/// Longest name accepted from a directory, a snapshot or a caller (the usual `NAME_MAX`).
pub const MAX_NAME: usize = 255;

/// What a name must look like, besides being one path component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An entry file: 32 lower-case hex digits.
    Entry,
    /// A shard directory under `entries/`: 2 lower-case hex digits.
    Shard,
    /// A journal: `<host>-<pid>-<start time hex>.log`, the host of `[A-Za-z0-9._-]`.
    Journal,
    /// A name this crate makes (temp files, trash, leases, claims, snapshots): of
    /// `[A-Za-z0-9._-]` only.
    Made,
    /// A name read from a listing, used only in the directory it was listed from (to
    /// stat, sweep or remove what someone left there): any one component.
    Listed,
}

/// One component of a path inside the cache, checked. Every directory-handle operation
/// takes a `Name` (or a [`Rel`] made of them), and a `Name` is only made by [`Name::new`],
/// which checks what every name read from disk, a snapshot or a caller must be: one
/// component (no `/`, no NUL, not `.` or `..`), at most [`MAX_NAME`] bytes, and the shape
/// of its [`Kind`]. The constants (`Name::fixed`) are checked when the crate compiles.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(std::borrow::Cow<'static, str>);

const fn is_made_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'
}

const fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b >= b'a' && b <= b'f')
}

/// Whether `s` is one path component of at most `MAX_NAME` bytes.
const fn is_component(s: &[u8]) -> bool {
    if s.is_empty() || s.len() > MAX_NAME {
        return false;
    }
    if (s.len() == 1 && s[0] == b'.') || (s.len() == 2 && s[0] == b'.' && s[1] == b'.') {
        return false;
    }
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'/' || s[i] == 0 {
            return false;
        }
        i += 1;
    }
    true
}

fn is_journal(s: &str) -> bool {
    let Some(stem) = s.strip_suffix(".log") else {
        return false;
    };
    let mut parts = stem.rsplitn(3, '-');
    let (Some(start), Some(pid), Some(host)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    !start.is_empty()
        && start.len() <= 16
        && start.bytes().all(is_lower_hex)
        && !pid.is_empty()
        && pid.len() <= 10
        && pid.bytes().all(|b| b.is_ascii_digit())
        && !host.is_empty()
        && host.bytes().all(is_made_byte)
}

impl Name {
    /// `s` as a name of `kind`, or `None` when it is not one.
    pub fn new(kind: Kind, s: &str) -> Option<Name> {
        let b = s.as_bytes();
        if !is_component(b) {
            return None;
        }
        let ok = match kind {
            Kind::Entry => b.len() == 32 && b.iter().all(|&c| is_lower_hex(c)),
            Kind::Shard => b.len() == 2 && b.iter().all(|&c| is_lower_hex(c)),
            Kind::Journal => is_journal(s),
            Kind::Made => b.iter().all(|&c| is_made_byte(c)),
            Kind::Listed => true,
        };
        ok.then(|| Name(std::borrow::Cow::Owned(s.to_string())))
    }

    /// `new`, with an `InvalidInput` error naming what is wrong (for names this crate
    /// makes, and names a caller passes).
    pub fn checked(kind: Kind, s: &str) -> io::Result<Name> {
        Name::new(kind, s).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{s:?} is not a valid {kind:?} file name"),
            )
        })
    }

    /// A constant name; used in a `const` it fails the build if it is not a plain name.
    pub const fn fixed(s: &'static str) -> Name {
        let b = s.as_bytes();
        assert!(is_component(b));
        let mut i = 0;
        while i < b.len() {
            assert!(is_made_byte(b[i]));
            i += 1;
        }
        Name(std::borrow::Cow::Borrowed(s))
    }

    /// Any string as a name, unchecked: only the tests have it, to forge what a hostile
    /// writer would leave on disk (a snapshot listing `../x.log`) with the real encoders.
    #[cfg(test)]
    pub fn forged(s: &str) -> Name {
        Name(std::borrow::Cow::Owned(s.to_string()))
    }

    /// The file name of entry `name` (32 hex digits: valid by construction).
    pub fn entry(name: u128) -> Name {
        Name(std::borrow::Cow::Owned(crate::hash::name_hex(name)))
    }

    /// The name of shard directory `shard` (2 hex digits).
    pub fn shard(shard: u8) -> Name {
        Name(std::borrow::Cow::Owned(format!("{shard:02x}")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A path beneath the cache root made of [`Name`]s (`entries/0a/<32 hex>`): what
/// [`Root`] opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rel(std::borrow::Cow<'static, str>);

impl Rel {
    /// A constant path of plain components separated by `/`; checked at build time in a
    /// `const`.
    pub const fn fixed(s: &'static str) -> Rel {
        let b = s.as_bytes();
        assert!(!b.is_empty() && b[0] != b'/' && b[b.len() - 1] != b'/');
        let mut i = 0;
        let start = 0;
        while i <= b.len() {
            if i == b.len() || b[i] == b'/' {
                assert!(i > start);
                assert!(!(i - start == 1 && b[start] == b'.'));
                assert!(!(i - start == 2 && b[start] == b'.' && b[start + 1] == b'.'));
            } else {
                assert!(is_made_byte(b[i]));
            }
            i += 1;
        }
        Rel(std::borrow::Cow::Borrowed(s))
    }

    /// `entries/xx`, the shard directory of entry `name` (valid by construction).
    pub fn shard_of(name: u128) -> Rel {
        Rel(std::borrow::Cow::Owned(format!(
            "entries/{:02x}",
            (name >> 120) as u8
        )))
    }

    /// `entries/xx/<32 hex>`, the file of entry `name` (valid by construction).
    pub fn entry(name: u128) -> Rel {
        Rel(std::borrow::Cow::Owned(format!(
            "entries/{:02x}/{name:032x}",
            (name >> 120) as u8
        )))
    }

    /// One name, as a path.
    pub fn of(name: &Name) -> Rel {
        Rel(std::borrow::Cow::Owned(name.0.to_string()))
    }

    /// This path with `name` under it.
    pub fn join(&self, name: &Name) -> Rel {
        Rel(std::borrow::Cow::Owned(format!("{}/{}", self.0, name.0)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path above the last component (None at the top) and that component.
    pub fn split_last(&self) -> (Option<Rel>, Name) {
        match self.0.rsplit_once('/') {
            Some((parent, last)) => (
                Some(Rel(std::borrow::Cow::Owned(parent.to_string()))),
                Name(std::borrow::Cow::Owned(last.to_string())),
            ),
            None => (None, Name(std::borrow::Cow::Owned(self.0.to_string()))),
        }
    }
}

impl std::fmt::Display for Rel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Flags every open of a cache file gets: no link followed, no FIFO waited on, not inherited.
pub const SAFE_OPEN: libc::c_int = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
/// Directory handles are `O_PATH`: lookups and the `*at` calls work through them, and no
/// filesystem open is made (on FUSE or NFS an open of a directory is a round trip to the
/// server; only listing and fsync open one for reading, through the handle).
const DIR_OPEN: libc::c_int = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
/// Depth up to which a stray directory tree inside the cache is removed.
const MAX_REMOVE_DEPTH: usize = 16;

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn retry_fd(mut f: impl FnMut() -> libc::c_long) -> io::Result<RawFd> {
    loop {
        let fd = f();
        if fd >= 0 {
            return Ok(fd as RawFd);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether an error says a path component was not a real directory (a symbolic link, a
/// file, a FIFO) or tried to leave the root: a hostile or broken layout, not a missing file.
pub fn is_unsafe(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV)
    )
}

/// What a directory entry is (from `fstatat(AT_SYMLINK_NOFOLLOW)`).
#[derive(Clone, Copy)]
pub struct Stat(libc::stat);

impl std::fmt::Debug for Stat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stat({}, {} bytes)", self.kind(), self.len())
    }
}

impl Stat {
    pub fn is_file(&self) -> bool {
        self.0.st_mode & libc::S_IFMT == libc::S_IFREG
    }
    pub fn is_dir(&self) -> bool {
        self.0.st_mode & libc::S_IFMT == libc::S_IFDIR
    }
    /// The file's type bits (`S_IFMT` of its mode: `S_IFDIR`, `S_IFIFO`, `S_IFLNK`, ...).
    pub fn file_type(&self) -> libc::mode_t {
        self.0.st_mode & libc::S_IFMT
    }
    pub fn len(&self) -> u64 {
        self.0.st_size.max(0) as u64
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn blocks(&self) -> u64 {
        self.0.st_blocks.max(0) as u64
    }
    // The stat field types differ between architectures (st_nlink is u32 on aarch64).
    #[allow(clippy::unnecessary_cast)]
    pub fn ino(&self) -> u64 {
        self.0.st_ino as u64
    }
    #[allow(clippy::unnecessary_cast)]
    pub fn nlink(&self) -> u64 {
        self.0.st_nlink as u64
    }
    pub fn uid(&self) -> u32 {
        self.0.st_uid
    }
    // st_dev's type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    pub fn dev(&self) -> u64 {
        self.0.st_dev as u64
    }
    /// The permission bits and file type (`st_mode`).
    pub fn mode(&self) -> u32 {
        self.0.st_mode
    }
    /// Whether only this process's own user (and root) can change the file's bytes: owned
    /// by the effective user, with no write bit for group or others.
    pub fn writable_only_by_us(&self) -> bool {
        // SAFETY: geteuid cannot fail and touches no memory.
        self.0.st_uid == unsafe { libc::geteuid() }
            && self.0.st_mode & (libc::S_IWGRP | libc::S_IWOTH) == 0
    }
    pub fn mtime_ns(&self) -> u64 {
        (self.0.st_mtime.max(0) as u64) * 1_000_000_000 + self.0.st_mtime_nsec.max(0) as u64
    }
    pub fn ctime_ns(&self) -> u64 {
        (self.0.st_ctime.max(0) as u64) * 1_000_000_000 + self.0.st_ctime_nsec.max(0) as u64
    }
    /// Identity of a file version, to notice a replacement.
    pub fn id(&self) -> (u64, u64, u64, u64) {
        (self.0.st_dev, self.ino(), self.mtime_ns(), self.len())
    }
    /// "a regular file", "a directory", "a FIFO", ... for messages.
    pub fn kind(&self) -> &'static str {
        kind_of(self.0.st_mode)
    }
}

fn kind_of(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "not a regular file",
    }
}

/// `fstat` of an open file.
pub fn fstat(f: &impl AsRawFd) -> io::Result<Stat> {
    // SAFETY: stat is plain data; zeroed is valid, and the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a live stat.
    check(unsafe { libc::fstat(f.as_raw_fd(), &mut st) })?;
    Ok(Stat(st))
}

/// Opens a file for reading as a cache file must be opened: no link followed, no FIFO
/// waited on, and only a regular file accepted (anything else is `InvalidData`, with what
/// it is in the message). Returns the file and its `fstat`.
pub fn open_regular(dir: &Dir, name: &Name) -> io::Result<(File, Stat)> {
    let f = dir.open_file(name, libc::O_RDONLY, 0)?;
    let st = fstat(&f)?;
    if !st.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {}, not a regular file",
                dir.display(name.as_str()),
                st.kind()
            ),
        ));
    }
    Ok((f, st))
}

/// Reads at most `cap` bytes of an open file, in pieces: memory grows with what is really
/// there, never with what `fstat` claims (a sparse `truncate -s 1T` file).
pub fn read_capped(f: &File, cap: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    let r = f;
    r.take(cap).read_to_end(&mut out)?;
    Ok(out)
}

/// `Dir::open_beneath` on a raw directory descriptor.
fn open_beneath(
    base: RawFd,
    rel: &str,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<RawFd> {
    let flags = with_safe_flags(flags);
    if OPENAT2.load(Ordering::Relaxed) != 2 {
        match openat2(base, Path::new(rel), flags, mode, true) {
            Err(_) if OPENAT2.load(Ordering::Relaxed) == 2 => {}
            other => return other,
        }
    }
    let mut parts = rel.split('/').filter(|p| !p.is_empty()).peekable();
    let mut owned: Option<OwnedFd> = None;
    while let Some(part) = parts.next() {
        if part == ".." {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        let at = owned.as_ref().map_or(base, |f| f.as_raw_fd());
        let c = cstr(OsStr::new(part))?;
        let last = parts.peek().is_none();
        let fl = if last { flags } else { DIR_OPEN };
        // SAFETY: valid descriptor and NUL-terminated name.
        let fd = retry_fd(|| {
            let fd = unsafe { libc::openat(at, c.as_ptr(), fl, mode as libc::c_uint) };
            fd as libc::c_long
        })?;
        if last {
            return Ok(fd);
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        owned = Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    Err(io::Error::from(io::ErrorKind::InvalidInput))
}

/// The login name of `uid` ("uid 1234" when it has none), for messages.
pub fn user_name(uid: u32) -> String {
    // SAFETY: passwd is plain data; zeroed is valid.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to live memory of the size passed.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc == 0 && !out.is_null() && !pw.pw_name.is_null() {
        // SAFETY: getpwuid_r filled pw_name with a NUL-terminated string inside buf.
        let name = unsafe { CStr::from_ptr(pw.pw_name) };
        return format!("{} (uid {uid})", name.to_string_lossy());
    }
    format!("uid {uid}")
}

/// `openat2` with no link followed in any component (and, with `beneath`, nothing
/// resolved outside `base`). Remembers whether the call exists here.
fn openat2(
    base: RawFd,
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
    beneath: bool,
) -> io::Result<RawFd> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: open_how is plain data; zeroed is valid (and what the kernel wants in fields
    // it does not know).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    if flags & libc::O_CREAT != 0 {
        how.mode = mode as u64;
    }
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    if beneath {
        how.resolve |= libc::RESOLVE_BENEATH;
    }
    let res = retry_fd(|| {
        // SAFETY: valid descriptor (or AT_FDCWD), NUL-terminated path, a live open_how of
        // the size passed.
        unsafe {
            libc::syscall(
                libc::SYS_openat2,
                base,
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        }
    });
    match &res {
        Ok(_) => OPENAT2.store(1, Ordering::Relaxed),
        // No openat2 (a kernel before 5.6) or a seccomp filter that refuses it: the
        // per-component walk does the same job.
        Err(e)
            if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM))
                && OPENAT2.load(Ordering::Relaxed) == 0 =>
        {
            OPENAT2.store(2, Ordering::Relaxed);
        }
        Err(_) => {}
    }
    res
}

/// `flags` with `SAFE_OPEN`; an `O_PATH` handle takes only `O_NOFOLLOW | O_CLOEXEC` of it
/// (nothing is opened, so there is nothing to wait on; openat2 refuses other flags there).
fn with_safe_flags(flags: libc::c_int) -> libc::c_int {
    if flags & libc::O_PATH != 0 {
        flags | libc::O_NOFOLLOW | libc::O_CLOEXEC
    } else {
        flags | SAFE_OPEN
    }
}

/// Whether `openat2` works here (0 unknown, 1 yes, 2 no: fall back to one `openat` per
/// component).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// An open directory of the cache. Its path is kept for messages only.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl AsRawFd for Dir {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Dir {
    /// Opens a directory by path (the root of a cache, or a directory a caller named).
    /// `nofollow`: refuse a symbolic link as the last component.
    pub fn open_path(path: &Path, nofollow: bool) -> io::Result<Dir> {
        let c = cstr(path.as_os_str())?;
        let flags = if nofollow {
            DIR_OPEN
        } else {
            DIR_OPEN & !libc::O_NOFOLLOW
        };
        // SAFETY: a valid NUL-terminated path.
        let fd = retry_fd(|| unsafe { libc::open(c.as_ptr(), flags) } as libc::c_long)?;
        Ok(Dir {
            // SAFETY: fd was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `dir/name` for messages.
    pub fn display(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    /// Opens `rel` (one or more components separated by '/') beneath this directory with
    /// `flags | SAFE_OPEN`, refusing a symbolic link anywhere (ELOOP) and a non-directory
    /// in the middle (ENOTDIR).
    fn open_beneath(
        &self,
        name: &Name,
        flags: libc::c_int,
        mode: libc::mode_t,
    ) -> io::Result<RawFd> {
        open_beneath(self.fd.as_raw_fd(), name.as_str(), flags, mode)
    }

    /// The sub-directory `name`, a real directory.
    pub fn sub(&self, name: &Name) -> io::Result<Dir> {
        let fd = self.open_beneath(name, DIR_OPEN, 0)?;
        Ok(Dir {
            // SAFETY: fd was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: self.path.join(name.as_str()),
        })
    }

    /// Opens the file `name` in this directory with `flags | SAFE_OPEN`.
    pub fn open_file(
        &self,
        name: &Name,
        flags: libc::c_int,
        mode: libc::mode_t,
    ) -> io::Result<File> {
        let fd = self.open_beneath(name, flags, mode)?;
        // SAFETY: fd was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// A new unnamed file in this directory (`O_TMPFILE`, mode 0600), read and write:
    /// nothing is left if the process dies. Where the filesystem has no `O_TMPFILE`, a file
    /// under a fresh name made with `O_EXCL`, unlinked at once (the sweep of a temp
    /// directory removes what a crash between the two leaves).
    pub fn tmpfile(&self, prefix: &str) -> io::Result<File> {
        let dot = cstr(OsStr::new("."))?;
        let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
        // SAFETY: valid descriptor (O_PATH directories serve as the base of *at calls) and a
        // NUL-terminated name.
        let made = retry_fd(|| unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                dot.as_ptr(),
                flags,
                0o600 as libc::c_uint,
            ) as libc::c_long
        });
        match made {
            // SAFETY: fd was just opened and is owned by nobody else.
            Ok(fd) => return Ok(unsafe { File::from_raw_fd(fd) }),
            Err(e)
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
                ) =>
            {
                return Err(e)
            }
            Err(_) => {}
        }
        let name = Name::checked(
            Kind::Made,
            &format!("{prefix}.{}.tmp", crate::clock::unique_suffix()),
        )?;
        let f = self.open_file(&name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600)?;
        self.unlink(&name)?;
        Ok(f)
    }

    /// `fstatat(AT_SYMLINK_NOFOLLOW)` of a name in this directory.
    pub fn stat(&self, name: &Name) -> io::Result<Stat> {
        let c = cstr(OsStr::new(name.as_str()))?;
        // SAFETY: stat is plain data; zeroed is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor, NUL-terminated name, pointer to a live stat.
        check(unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(Stat(st))
    }

    /// The length of `name` as the file server has it now, not as this client cached it
    /// (`statx` with `AT_STATX_FORCE_SYNC` makes FUSE ask the filesystem and NFS revalidate
    /// with the server: one round trip, where `stat` may serve attributes up to the
    /// attribute cache time old), and whether it is a regular file (a link is not followed).
    pub fn len_from_server(&self, name: &Name) -> io::Result<(u64, bool)> {
        let c = cstr(OsStr::new(name.as_str()))?;
        // SAFETY: statx is plain data; zeroed is a valid value for every field.
        let mut buf: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor, NUL-terminated name, buf outlives the call.
        check(unsafe {
            libc::statx(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::AT_STATX_FORCE_SYNC | libc::AT_SYMLINK_NOFOLLOW,
                libc::STATX_SIZE | libc::STATX_TYPE,
                &mut buf,
            )
        })?;
        let regular = u32::from(buf.stx_mode) & libc::S_IFMT == libc::S_IFREG;
        Ok((buf.stx_size, regular))
    }

    pub fn unlink(&self, name: &Name) -> io::Result<()> {
        let c = cstr(OsStr::new(name.as_str()))?;
        // SAFETY: valid descriptor and NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) })
    }

    pub fn rmdir(&self, name: &Name) -> io::Result<()> {
        let c = cstr(OsStr::new(name.as_str()))?;
        // SAFETY: valid descriptor and NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
    }

    pub fn mkdir(&self, name: &Name, mode: libc::mode_t) -> io::Result<()> {
        let c = cstr(OsStr::new(name.as_str()))?;
        // SAFETY: valid descriptor and NUL-terminated name.
        check(unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), mode) })
    }

    /// `renameat(self/name, to/to_name)`: replaces `to_name` if it exists.
    pub fn rename(&self, name: &Name, to: &Dir, to_name: &Name) -> io::Result<()> {
        let (a, b) = (
            cstr(OsStr::new(name.as_str()))?,
            cstr(OsStr::new(to_name.as_str()))?,
        );
        // SAFETY: valid descriptors and NUL-terminated names.
        check(unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                a.as_ptr(),
                to.fd.as_raw_fd(),
                b.as_ptr(),
            )
        })
    }

    /// `renameat2(RENAME_NOREPLACE)`.
    pub fn rename_noreplace(&self, name: &Name, to: &Dir, to_name: &Name) -> io::Result<()> {
        let (a, b) = (
            cstr(OsStr::new(name.as_str()))?,
            cstr(OsStr::new(to_name.as_str()))?,
        );
        // SAFETY: valid descriptors and NUL-terminated names.
        check(unsafe {
            libc::renameat2(
                self.fd.as_raw_fd(),
                a.as_ptr(),
                to.fd.as_raw_fd(),
                b.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        })
    }

    /// `linkat(self/name, to/to_name)`, never following a link.
    pub fn link(&self, name: &Name, to: &Dir, to_name: &Name) -> io::Result<()> {
        let (a, b) = (
            cstr(OsStr::new(name.as_str()))?,
            cstr(OsStr::new(to_name.as_str()))?,
        );
        // SAFETY: valid descriptors and NUL-terminated names.
        check(unsafe {
            libc::linkat(
                self.fd.as_raw_fd(),
                a.as_ptr(),
                to.fd.as_raw_fd(),
                b.as_ptr(),
                0,
            )
        })
    }

    /// Renames every name in this directory but `keep` into `to`, under the same name, as
    /// the directory lists it (a name that is not UTF-8 too), never following a link; a name
    /// gone meanwhile is skipped. Returns how many it moved.
    pub fn move_all(&self, to: &Dir, keep: &Name) -> io::Result<u64> {
        let mut moved = 0;
        for raw in self.list_raw()? {
            if raw.as_os_str() == OsStr::new(keep.as_str()) {
                continue;
            }
            let c = cstr(&raw)?;
            // SAFETY: valid descriptors and a NUL-terminated name.
            let rc = unsafe {
                libc::renameat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    to.fd.as_raw_fd(),
                    c.as_ptr(),
                )
            };
            match check(rc) {
                Ok(()) => moved += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }

    /// `fchmod` of the directory itself, through the handle.
    pub fn chmod(&self, mode: libc::mode_t) -> io::Result<()> {
        let f = self.readable()?;
        // SAFETY: valid descriptor.
        check(unsafe { libc::fchmod(f.as_raw_fd(), mode) })
    }

    /// An exclusive `flock` on the directory, held until the handle returned is dropped
    /// (None where the filesystem has no such locks: the caller goes on without).
    pub fn lock_exclusive(&self) -> Option<OwnedFd> {
        let f = self.readable().ok()?;
        loop {
            // SAFETY: valid descriptor.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Some(f);
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return None;
            }
        }
    }

    /// Another handle on the same directory (`F_DUPFD_CLOEXEC`).
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    /// A handle on the directory `fd` refers to (the caller's descriptor stays the
    /// caller's: it is duplicated), `path` for messages only.
    pub fn from_borrowed(fd: std::os::fd::BorrowedFd<'_>, path: &Path) -> io::Result<Dir> {
        Ok(Dir {
            fd: fd.try_clone_to_owned()?,
            path: path.to_path_buf(),
        })
    }

    /// The handle itself, for a caller outside the crate.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// The directory opened for reading (a new descriptor, the caller's).
    pub fn reopen_readable(&self) -> io::Result<OwnedFd> {
        self.readable()
    }

    /// fsync of the directory, so a rename in it survives power loss.
    pub fn sync(&self) -> io::Result<()> {
        let f = self.readable()?;
        // SAFETY: valid descriptor.
        check(unsafe { libc::fsync(f.as_raw_fd()) })
    }

    /// The directory itself opened for reading, through the handle.
    fn readable(&self) -> io::Result<OwnedFd> {
        let fd = retry_fd(|| {
            // SAFETY: valid descriptor and a NUL-terminated name.
            let fd = unsafe {
                libc::openat(
                    self.fd.as_raw_fd(),
                    c".".as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            fd as libc::c_long
        })?;
        // SAFETY: fd was just opened and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The names in this directory of `kind` (not "." and ".."), read through this handle,
    /// and how many others were skipped (not UTF-8, or not of that shape).
    pub fn list_of(&self, kind: Kind) -> io::Result<(Vec<Name>, u64)> {
        let mut skipped = 0;
        let mut out = Vec::new();
        for n in self.list_raw()? {
            match n.to_str().and_then(|s| Name::new(kind, s)) {
                Some(n) => out.push(n),
                None => skipped += 1,
            }
        }
        Ok((out, skipped))
    }

    /// Every name in this directory as a [`Kind::Listed`] name (one a listing returns is
    /// one component; a name that is not UTF-8 is left out).
    pub fn list(&self) -> io::Result<Vec<Name>> {
        self.list_of(Kind::Listed).map(|(v, _)| v)
    }

    fn list_raw(&self) -> io::Result<Vec<OsString>> {
        // fdopendir takes ownership of its descriptor.
        let dup = std::os::fd::IntoRawFd::into_raw_fd(self.readable()?);
        // SAFETY: dup is an open directory descriptor we own; it is closed by closedir.
        let dirp = unsafe { libc::fdopendir(dup) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so dup is still ours to close.
            unsafe { libc::close(dup) };
            return Err(e);
        }
        let mut out = Vec::new();
        let res = loop {
            // SAFETY: errno is thread-local; cleared to tell end of stream from an error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: dirp is a valid directory stream.
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                break if e.raw_os_error().unwrap_or(0) == 0 {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // SAFETY: d_name of a returned entry is a NUL-terminated string.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                out.push(OsString::from_vec(name.to_vec()));
            }
        };
        // SAFETY: dirp is valid and closed once.
        unsafe { libc::closedir(dirp) };
        res.map(|()| out)
    }

    /// Removes `name` whatever it is: a file or link is unlinked, a directory is emptied
    /// through handles (never following a link) and removed, down to a bounded depth.
    /// Returns how many names it removed.
    pub fn remove_any(&self, name: &Name) -> io::Result<u64> {
        self.remove_any_at(name, 0)
    }

    fn remove_any_at(&self, name: &Name, depth: usize) -> io::Result<u64> {
        match self.unlink(name) {
            Ok(()) => return Ok(1),
            Err(e) if !matches!(e.raw_os_error(), Some(libc::EISDIR) | Some(libc::EPERM)) => {
                return Err(e)
            }
            Err(_) => {}
        }
        if depth >= MAX_REMOVE_DEPTH {
            return Err(io::Error::other(format!(
                "{}: directory tree deeper than {MAX_REMOVE_DEPTH}",
                self.display(name.as_str())
            )));
        }
        let sub = self.sub(name)?;
        let mut n = 0;
        for child in sub.list()? {
            n += sub.remove_any_at(&child, depth + 1)?;
        }
        self.rmdir(name)?;
        Ok(n + 1)
    }
}

/// The cache root. Its path is resolved once, when the store opens it (a link there is the
/// user's choice of path), into a path without links; each operation then opens that path
/// and what is beneath it with no link followed anywhere (`openat2(RESOLVE_NO_SYMLINKS)`, or
/// the root by path and one `openat(O_NOFOLLOW)` per component below it), and works through
/// the handles it opened, so a swap after the open cannot redirect it. A root moved away or
/// deleted reads as gone, and a directory put in its place is used.
///
/// A root opened on a handle (`Root::pinned`: a directory of this user's own, whose parent
/// others may write) is never resolved by path again: everything is opened beneath that
/// handle, so a directory renamed into its place is never used.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    real: PathBuf,
    pinned: Option<Dir>,
}

impl Root {
    /// Resolves `path`, which must be a directory.
    pub fn open(path: &Path) -> io::Result<Root> {
        let real = std::fs::canonicalize(path)?;
        Dir::open_path(&real, true)?;
        Ok(Root {
            path: path.to_path_buf(),
            real,
            pinned: None,
        })
    }

    /// The root `dir`, a handle already opened and checked (`path` for messages).
    pub fn pinned(path: &Path, dir: Dir) -> Root {
        Root {
            path: path.to_path_buf(),
            real: path.to_path_buf(),
            pinned: Some(dir),
        }
    }

    /// The path the store was given (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_at(&self, rel: &str, flags: libc::c_int, mode: libc::mode_t) -> io::Result<RawFd> {
        let top = rel == ".";
        if rel.starts_with('/') || rel.split('/').any(|p| p == "..") {
            // Never outside the root.
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        if let Some(dir) = &self.pinned {
            if top {
                return Ok(std::os::fd::IntoRawFd::into_raw_fd(dir.fd.try_clone()?));
            }
            return open_beneath(dir.fd.as_raw_fd(), rel, flags, mode);
        }
        if OPENAT2.load(Ordering::Relaxed) != 2 {
            let full = if top {
                self.real.clone()
            } else {
                self.real.join(rel)
            };
            match openat2(libc::AT_FDCWD, &full, with_safe_flags(flags), mode, false) {
                Err(_) if OPENAT2.load(Ordering::Relaxed) == 2 => {}
                other => return other,
            }
        }
        let root = Dir::open_path(&self.real, true)?;
        if top {
            return Ok(std::os::fd::IntoRawFd::into_raw_fd(root.fd));
        }
        open_beneath(root.fd.as_raw_fd(), rel, flags, mode)
    }

    /// The sub-directory `rel`, every component a real directory.
    pub fn sub(&self, rel: &Rel) -> io::Result<Dir> {
        let fd = self.open_at(rel.as_str(), DIR_OPEN, 0)?;
        Ok(Dir {
            // SAFETY: fd was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: self.path.join(rel.as_str()),
        })
    }

    /// Opens the file `rel` beneath the root with `flags | SAFE_OPEN`.
    pub fn open_file(&self, rel: &Rel, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
        let fd = self.open_at(rel.as_str(), flags, mode)?;
        // SAFETY: fd was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// A handle on the root directory itself.
    pub fn dir(&self) -> io::Result<Dir> {
        let fd = self.open_at(".", DIR_OPEN, 0)?;
        Ok(Dir {
            // SAFETY: fd was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: self.path.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A path as a caller could have written one before names were checked (tests of what
    /// the handles refuse by themselves).
    fn rel(s: &'static str) -> Rel {
        Rel(std::borrow::Cow::Borrowed(s))
    }

    #[test]
    fn refuses_links_and_files_in_every_component() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/f"), b"x").unwrap();
        std::fs::write(outside.path().join("f"), b"y").unwrap();
        symlink(outside.path(), d.path().join("link")).unwrap();
        std::fs::create_dir(d.path().join("c")).unwrap();
        symlink(outside.path(), d.path().join("c/b")).unwrap();
        std::fs::write(d.path().join("file"), b"").unwrap();
        let root = Root::open(d.path()).unwrap();
        assert!(root.sub(&rel("a/b")).is_ok());
        assert!(root.open_file(&rel("a/b/f"), libc::O_RDONLY, 0).is_ok());
        for r in ["link", "c/b", "link/f", "c/b/f", "file/x", "../x"] {
            let e = root.open_file(&rel(r), libc::O_RDONLY, 0).unwrap_err();
            assert!(is_unsafe(&e), "{r}: {e}");
        }
        for r in ["link", "c/b", "file"] {
            let e = root.sub(&rel(r)).unwrap_err();
            assert!(is_unsafe(&e), "{r}: {e}");
        }
        // The fallback walk refuses the same.
        OPENAT2.store(2, Ordering::Relaxed);
        for r in ["link", "c/b", "link/f", "c/b/f", "file/x", "../x"] {
            let e = root.open_file(&rel(r), libc::O_RDONLY, 0).unwrap_err();
            assert!(is_unsafe(&e), "walk {r}: {e}");
        }
        assert!(root.open_file(&rel("a/b/f"), libc::O_RDONLY, 0).is_ok());
        OPENAT2.store(0, Ordering::Relaxed);
    }

    #[test]
    fn fifo_opens_without_waiting_and_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = CString::new(d.path().join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: valid path.
        assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o644) }, 0);
        let root = Root::open(d.path()).unwrap();
        let dir = root.dir().unwrap();
        let e = open_regular(&dir, &Name::fixed("fifo")).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn remove_any_stays_inside() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        std::fs::create_dir_all(d.path().join("t/x/y")).unwrap();
        std::fs::write(d.path().join("t/x/y/f"), b"x").unwrap();
        symlink(outside.path(), d.path().join("t/x/l")).unwrap();
        let dir = Dir::open_path(d.path(), true).unwrap();
        assert_eq!(dir.remove_any(&Name::fixed("t")).unwrap(), 5);
        assert!(!d.path().join("t").exists());
        assert!(outside.path().join("keep").exists());
        let names = dir.list().unwrap();
        assert!(names.is_empty(), "{names:?}");
    }

    #[test]
    fn names_are_one_component_of_their_kind() {
        let hex = "0123456789abcdef0123456789abcdef";
        assert!(Name::new(Kind::Entry, hex).is_some());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a\0b",
            &hex.to_uppercase(),
            &hex[1..],
        ] {
            assert!(Name::new(Kind::Entry, bad).is_none(), "{bad:?}");
            assert!(Name::new(Kind::Shard, bad).is_none(), "{bad:?}");
            assert!(Name::new(Kind::Journal, bad).is_none(), "{bad:?}");
        }
        for bad in ["", ".", "..", "a/b", "../x", "a\0b"] {
            assert!(Name::new(Kind::Listed, bad).is_none(), "{bad:?}");
            assert!(Name::new(Kind::Made, bad).is_none(), "{bad:?}");
        }
        assert!(Name::new(Kind::Listed, &"x".repeat(MAX_NAME + 1)).is_none());
        assert!(Name::new(Kind::Listed, "\x1b]0;title\x07").is_some());
        assert!(Name::new(Kind::Made, "\x1b]0;title\x07").is_none());
        assert!(Name::new(Kind::Shard, "0a").is_some());
        assert!(Name::new(Kind::Shard, "0g").is_none());
        // As `journal::file_name` makes them.
        assert!(Name::new(Kind::Journal, "host-a.example-1234-abc.log").is_some());
        for bad in [
            "h-1-x/../../../victim/precious.log",
            "../../x/f.log",
            "h-1-.log",
            "h-x-1.log",
            "-1-1.log",
            "h-1-1.txt",
            "h h-1-1.log",
        ] {
            assert!(Name::new(Kind::Journal, bad).is_none(), "{bad:?}");
        }
    }
}
