//! Publishing a finished temp file under its final name without ever replacing what is there.

#[cfg(test)]
use crate::clock::unique_suffix;
use crate::dir::{Dir, Name};
use std::io;

/// Moves `from/name` to `to/to_name` unless `to_name` exists. Ok(true): published;
/// Ok(false): `to_name` was already there (first writer wins) and `name` is left for the
/// caller to remove. Both names are taken relative to directory handles (see `dir/`).
///
/// Tries `renameat2(RENAME_NOREPLACE)` (local filesystems), then `linkat` (atomic on NFS,
/// where a retransmitted link can report EEXIST although it worked, so the link count is
/// checked), and on filesystems with neither, a check-then-rename whose race can only
/// replace one valid entry of a key by another valid entry of the same key.
pub fn publish_no_replace(from: &Dir, name: &Name, to: &Dir, to_name: &Name) -> io::Result<bool> {
    let err = match from.rename_noreplace(name, to, to_name) {
        Ok(()) => return Ok(true),
        Err(e) => e,
    };
    match err.raw_os_error() {
        Some(libc::EEXIST) => return Ok(false),
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => {}
        _ => return Err(err),
    }
    match from.link(name, to, to_name) {
        Ok(()) => {
            let _ = from.unlink(name);
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if from.stat(name).map(|m| m.nlink() >= 2).unwrap_or(false) {
                let _ = from.unlink(name);
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
            if to.stat(to_name).is_ok() {
                return Ok(false);
            }
            from.rename(name, to, to_name)?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_writer_wins() {
        use std::fs;
        let d = tempfile::tempdir().unwrap();
        let (a, b, dest) = (
            d.path().join("a"),
            d.path().join("b"),
            d.path().join("dest"),
        );
        fs::write(&a, "first").unwrap();
        fs::write(&b, "second").unwrap();
        let dir = Dir::open_path(d.path(), true).unwrap();
        let (na, nb, nd) = (Name::fixed("a"), Name::fixed("b"), Name::fixed("dest"));
        assert!(publish_no_replace(&dir, &na, &dir, &nd).unwrap());
        assert!(!publish_no_replace(&dir, &nb, &dir, &nd).unwrap());
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
