//! Directories of this user's own: the verification record's, and the host-local ones the
//! package keeps (torch_xla's copies and views, the store in front of a bucket path). One
//! rule for all of them: a real directory, opened without following a link, owned by the
//! effective user and writable by nobody else (no group or other write bit); made mode 0700
//! when absent, whatever the umask. Anything else is refused with the reason, never used:
//! whoever else owns or can write such a directory chooses what this user's processes read
//! from it (a verified signature, an executable linked into torch_xla's view). Its parent
//! is the caller's to choose, as a cache root's parent is (docs/reliability.md). The record
//! files kept in such directories (the verified signatures', the binaries' identities) are
//! held to the same rule when opened (`record_file`) and replaced whole (`replace_record`).

use crate::dir::{self, Dir, Kind, Name, Stat};
use std::fs::File;
use std::io::{self, Write};
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

/// A record file `name` kept in a directory of this user's own, as the caller `opened` it
/// beneath `dir` (read-only, or read-write to append), held to the same rule: a regular
/// file, owned by the effective user and writable by nobody else. `Ok(None)`: there is
/// none. `Err`: why someone else may control it (a symbolic link, a file that cannot be
/// opened, not a regular file, another user's or writable by others), naming it: never to
/// be read nor written.
pub fn record_file(
    dir: &Dir,
    name: &Name,
    opened: io::Result<File>,
) -> Result<Option<(File, Stat)>, String> {
    let path = || dir.display(name.as_str());
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(format!("{} is a symbolic link", path()))
        }
        Err(e) => return Err(format!("{} cannot be opened ({e})", path())),
    };
    let st = dir::fstat(&f).map_err(|e| format!("{}: {e}", path()))?;
    if !st.is_file() {
        return Err(format!("{} is {}", path(), st.kind()));
    }
    owned_by_us(st.uid(), st.mode()).map_err(|why| format!("{} {why}", path()))?;
    Ok(Some((f, st)))
}

/// Replaces the record file `name` in `dir` with `bytes`: written beside it (mode 0600) and
/// renamed over it, so that a reader sees the old record or the new, whole.
pub fn replace_record(dir: &Dir, name: &Name, bytes: &[u8]) -> io::Result<()> {
    let tmp = Name::checked(
        Kind::Made,
        &format!("{name}.{}.tmp", crate::clock::unique_suffix()),
    )?;
    let f = dir.open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
    let written = (&f)
        .write_all(bytes)
        .and_then(|_| dir.rename(&tmp, dir, name));
    if written.is_err() {
        let _ = dir.unlink(&tmp);
    }
    written
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

/// The ways a record kept in a directory of this user's own (`<dir>/record`: the verified
/// signatures', the binaries' identities) is found spoiled, for the tests of both: hostile
/// ones (another user's doing: refused, and left as they are) and garbled ones (ours: the
/// next writer rebuilds the record).
#[cfg(test)]
pub(crate) mod spoiled {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    /// Spoils the record in the directory it is given.
    pub(crate) type Spoil = fn(&Path);

    /// What every such record meets: (what, how, garbled rather than hostile).
    pub(crate) fn records() -> Vec<(&'static str, Spoil, bool)> {
        vec![
            (
                "a link to a good record",
                |d| {
                    std::fs::rename(d.join("record"), d.join("elsewhere")).unwrap();
                    std::os::unix::fs::symlink(d.join("elsewhere"), d.join("record")).unwrap();
                },
                false,
            ),
            (
                "a FIFO",
                |d| {
                    std::fs::remove_file(d.join("record")).unwrap();
                    let c = std::ffi::CString::new(d.join("record").as_os_str().as_encoded_bytes())
                        .unwrap();
                    // SAFETY: a NUL-terminated path.
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                },
                false,
            ),
            (
                "a group-writable file",
                |d| {
                    let p = d.join("record");
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
                },
                false,
            ),
            (
                "a group-writable directory",
                |d| std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o770)).unwrap(),
                false,
            ),
            (
                "a directory that is a link",
                |d| {
                    let real = d.with_file_name("real");
                    std::fs::rename(d, &real).unwrap();
                    std::os::unix::fs::symlink(&real, d).unwrap();
                },
                false,
            ),
            ("huge (sparse)", |d| set_len(d, 1 << 40), true),
            (
                "garbage",
                |d| std::fs::write(d.join("record"), vec![0xa5u8; 5000]).unwrap(),
                true,
            ),
        ]
    }

    /// The record cut (or extended, sparse) to `len` bytes.
    pub(crate) fn set_len(d: &Path, len: u64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.join("record"));
        f.unwrap().set_len(len).unwrap();
    }

    /// The record's bytes changed by `change`, in place.
    pub(crate) fn patch(d: &Path, change: impl FnOnce(&mut Vec<u8>)) {
        let p = d.join("record");
        let mut b = std::fs::read(&p).unwrap();
        change(&mut b);
        std::fs::write(&p, b).unwrap();
    }
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
