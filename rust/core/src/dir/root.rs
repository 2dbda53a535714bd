//! The cache root ([`Root`]): resolved once, then everything beneath it opened with no link
//! followed.

use super::handle::Dir;
use super::name::Rel;
use super::open::{open_beneath, openat2, with_safe_flags, DIR_OPEN, OPENAT2};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

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
    use crate::dir::is_unsafe;
    use std::os::unix::fs::symlink;

    /// A path as a caller could have written one before names were checked (tests of what
    /// the handles refuse by themselves).
    fn rel(s: &'static str) -> Rel {
        Rel::forged(s)
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
}
