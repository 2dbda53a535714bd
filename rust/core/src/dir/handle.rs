//! An open directory of the cache ([`Dir`]): every operation through its handle with the
//! `*at` calls, and the reads of a cache file through it.

use super::name::{Kind, Name};
use super::open::{check, cstr, open_beneath, retry_fd, DIR_OPEN};
use super::stat::{fstat, Stat};
use std::ffi::{CStr, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Depth up to which a stray directory tree inside the cache is removed.
const MAX_REMOVE_DEPTH: usize = 16;

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

/// An open directory of the cache. Its path is kept for messages only.
#[derive(Debug)]
pub struct Dir {
    pub(super) fd: OwnedFd,
    pub(super) path: PathBuf,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dir::Root;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::symlink;

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
}
