//! Opens that follow no link: `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` where the
//! kernel has it, else one `openat(O_NOFOLLOW | O_DIRECTORY)` per component; and the small
//! wrappers of the system calls the handles share.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

/// Flags every open of a cache file gets: no link followed, no FIFO waited on, not inherited.
pub const SAFE_OPEN: libc::c_int = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
/// Directory handles are `O_PATH`: lookups and the `*at` calls work through them, and no
/// filesystem open is made (on FUSE or NFS an open of a directory is a round trip to the
/// server; only listing and fsync open one for reading, through the handle).
pub(super) const DIR_OPEN: libc::c_int =
    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

pub(super) fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

pub(super) fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(super) fn retry_fd(mut f: impl FnMut() -> libc::c_long) -> io::Result<RawFd> {
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

/// `Dir::open_beneath` on a raw directory descriptor.
pub(super) fn open_beneath(
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

/// `openat2` with no link followed in any component (and, with `beneath`, nothing
/// resolved outside `base`). Remembers whether the call exists here.
pub(super) fn openat2(
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
pub(super) fn with_safe_flags(flags: libc::c_int) -> libc::c_int {
    if flags & libc::O_PATH != 0 {
        flags | libc::O_NOFOLLOW | libc::O_CLOEXEC
    } else {
        flags | SAFE_OPEN
    }
}

/// Whether `openat2` works here (0 unknown, 1 yes, 2 no: fall back to one `openat` per
/// component).
pub(super) static OPENAT2: AtomicU8 = AtomicU8::new(0);
