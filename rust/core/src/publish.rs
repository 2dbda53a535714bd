//! Publishing a finished temp file under its final name without ever replacing what is there.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A suffix unique across processes and hosts: host, pid, a per-process counter, time.
pub fn unique_suffix() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{}.{}.{}.{:x}",
        crate::clock::hostname(),
        std::process::id(),
        n,
        crate::clock::unix_ns()
    )
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Moves `tmp` to `dest` unless `dest` exists. Ok(true): published; Ok(false): `dest` was
/// already there (first writer wins) and `tmp` is left for the caller to remove.
///
/// Tries `renameat2(RENAME_NOREPLACE)` (local filesystems), then `link` (atomic on NFS, where
/// a retransmitted link can report EEXIST although it worked, so the link count is checked),
/// and on filesystems with neither, a check-then-rename whose race can only replace one
/// valid entry of a key by another valid entry of the same key.
pub fn publish_no_replace(tmp: &Path, dest: &Path) -> io::Result<bool> {
    let (c_tmp, c_dest) = (cstr(tmp)?, cstr(dest)?);
    // SAFETY: both are valid NUL-terminated paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c_tmp.as_ptr(),
            libc::AT_FDCWD,
            c_dest.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EEXIST) => return Ok(false),
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => {}
        _ => return Err(err),
    }
    match fs::hard_link(tmp, dest) {
        Ok(()) => {
            let _ = fs::remove_file(tmp);
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if fs::metadata(tmp).map(|m| m.nlink() >= 2).unwrap_or(false) {
                let _ = fs::remove_file(tmp);
                return Ok(true);
            }
            Ok(false)
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM) | Some(libc::ENOTSUP) | Some(libc::ENOSYS) | Some(libc::EMLINK)
            ) =>
        {
            if fs::symlink_metadata(dest).is_ok() {
                return Ok(false);
            }
            fs::rename(tmp, dest)?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// fsync of a directory, so a rename in it survives power loss.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_writer_wins() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, dest) = (
            d.path().join("a"),
            d.path().join("b"),
            d.path().join("dest"),
        );
        fs::write(&a, "first").unwrap();
        fs::write(&b, "second").unwrap();
        assert!(publish_no_replace(&a, &dest).unwrap());
        assert!(!publish_no_replace(&b, &dest).unwrap());
        assert_eq!(fs::read_to_string(&dest).unwrap(), "first");
        assert!(!a.exists());
        assert!(
            b.exists(),
            "the loser's temp file is the caller's to remove"
        );
    }

    #[test]
    fn suffixes_are_unique() {
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
