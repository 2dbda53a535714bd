//! Directories of this user's own: the verification record's, and the host-local ones the
//! package keeps (torch_xla's copies and views, the store in front of a bucket path). One
//! rule for all of them: a real directory, opened without following a link, owned by the
//! effective user and writable by nobody else (no group or other write bit); made mode 0700
//! when absent, whatever the umask. Anything else is refused with the reason, never used:
//! whoever else owns or can write such a directory chooses what this user's processes read
//! from it (a verified signature, an executable linked into torch_xla's view). Its parent
//! is the caller's to choose, as a cache root's parent is (docs/reliability.md).

use crate::dir::{self, Dir};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Whether a file or directory of this uid and mode is one only this user (or root) can
/// change: `Err` says why not.
pub fn owned_by_us(uid: u32, mode: u32) -> Result<(), String> {
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if uid != me {
        return Err(format!(
            "belongs to {}, not to {}",
            dir::user_name(uid),
            dir::user_name(me)
        ));
    }
    if mode & (libc::S_IWGRP | libc::S_IWOTH) != 0 {
        return Err(format!("is writable by others (mode {:o})", mode & 0o7777));
    }
    Ok(())
}

/// Opens `path` as a directory of this user's own. With `create`, an absent one is made
/// first (missing parents too, each mode 0700). `Ok(None)`: absent (and not made). `Err`:
/// why it is refused, naming it.
pub fn open(path: &Path, create: bool) -> Result<Option<Dir>, String> {
    let mut opened = Dir::open_path(path, true);
    if create && matches!(&opened, Err(e) if e.kind() == io::ErrorKind::NotFound) {
        // A failure (a read-only home, a race with another process making it) shows in the
        // open that follows.
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path);
        opened = Dir::open_path(path, true);
    }
    let d = match opened {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "{} is not a directory that can be opened without following a link ({e})",
                path.display()
            ))
        }
    };
    let st = dir::fstat(&d).map_err(|e| format!("{}: {e}", path.display()))?;
    if !st.is_dir() {
        return Err(format!("{} is {}", path.display(), st.kind()));
    }
    owned_by_us(st.uid(), st.mode()).map_err(|why| format!("{} {why}", path.display()))?;
    Ok(Some(d))
}

/// `open` with `create`, for a directory the caller cannot go on without: one that could
/// not be made is an `Err` saying why (a read-only disk, a parent of another user's).
pub fn make(path: &Path) -> Result<Dir, String> {
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
    {
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(format!("{} cannot be made ({e})", path.display()));
        }
    }
    open(path, false)?.ok_or_else(|| format!("{} cannot be made", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    #[test]
    fn the_rule() {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        assert!(owned_by_us(me, 0o100600).is_ok());
        assert!(owned_by_us(me, 0o100644).is_ok());
        assert!(owned_by_us(me, 0o40700).is_ok());
        assert!(owned_by_us(me.wrapping_add(1), 0o100600).is_err());
        assert!(owned_by_us(me, 0o100602).is_err());
        assert!(owned_by_us(me, 0o40770).is_err());
    }

    #[test]
    fn made_private_and_refused_when_open_to_others() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b/c");
        // 0700 whatever the umask: a umask only ever takes bits away.
        assert!(open(&path, true).unwrap().is_some());
        for p in [tmp.path().join("a"), tmp.path().join("a/b"), path.clone()] {
            assert_eq!(
                fs::metadata(&p).unwrap().mode() & 0o777,
                0o700,
                "{}",
                p.display()
            );
        }
        assert!(open(&tmp.path().join("absent"), false).unwrap().is_none());
        assert!(!tmp.path().join("absent").exists());

        fs::set_permissions(&path, fs::Permissions::from_mode(0o770)).unwrap();
        let why = open(&path, true).unwrap_err();
        assert!(
            why.contains("writable by others") && why.contains("a/b/c"),
            "{why}"
        );

        let link = tmp.path().join("link");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
        symlink(&path, &link).unwrap();
        let why = open(&link, true).unwrap_err();
        assert!(why.contains("without following a link"), "{why}");

        let file = tmp.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(open(&file, true).is_err());
        assert!(make(&file).is_err());
        let why = make(&file.join("below")).unwrap_err();
        assert!(why.contains("cannot be made"), "{why}");
        assert!(make(&tmp.path().join("new")).is_ok());
    }
}
