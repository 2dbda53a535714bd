//! fcntl locks: `F_OFD_SETLK` open-file-description locks (BSD `flock` elsewhere) on
//! `<dir>/<name>.lock`, polled until the timeout. The lock file stays when the lock is
//! released: removing it would let two processes lock two different inodes of one name.

use super::{
    made, remove_foreign, sleep_until_next_poll, GuardInner, LockDir, LockError, LockGuard,
};
use crate::dir::Dir;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

impl LockDir {
    pub(super) fn try_fcntl(
        &self,
        name: &str,
        deadline: Instant,
    ) -> Result<FcntlOutcome, LockError> {
        let path = self.dir.join(format!("{name}.lock"));
        let fname = made(&format!("{name}.lock")).map_err(|e| LockError::io("open", &path, e))?;
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
}

pub(super) enum FcntlOutcome {
    Taken(LockGuard),
    Busy,
    Unavailable(PathBuf, io::Error),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::tests::lock_dir;
    use crate::lock::LockMode;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

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
    fn heartbeat_is_noop_for_fcntl() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lock_dir(tmp.path(), LockMode::Fcntl, 0, 200);
        let mut g = a.try_lock("evict").unwrap().unwrap();
        g.heartbeat().unwrap();
    }

    #[test]
    fn errors_tell_a_held_lock_from_unavailable_locks() {
        assert!(is_unavailable(&io::Error::from_raw_os_error(libc::ENOLCK)));
        assert!(!is_unavailable(&io::Error::from_raw_os_error(libc::EAGAIN)));
        assert!(is_busy(&io::Error::from_raw_os_error(libc::EAGAIN)));
    }
}
