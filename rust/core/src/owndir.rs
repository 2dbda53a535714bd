//! Directories of this user's own: the records' (`record_place`), and the host-local ones the
//! package keeps (torch_xla's copies and views, the store in front of a bucket path). One
//! rule for all of them: a real directory, opened without following a link, owned by the
//! effective user and writable by nobody else (no group or other write bit); made mode 0700
//! when absent, whatever the umask. Anything else is refused with the reason, never used:
//! whoever else owns or can write such a directory chooses what this user's processes read
//! from it (a verified signature, an executable linked into torch_xla's view). Its parent
//! is the caller's to choose, as a cache root's parent is (docs/reliability.md). The record
//! files kept in such directories (the verified signatures', the binaries' identities) are
//! held to the same rule when opened (`record_file`) and replaced whole (`replace_record`).
//!
//! `open_own` is the rule for the host-local directories, which earlier releases made with
//! the process umask: under `umask 002` such a directory is this user's and writable by the
//! group. It is repaired rather than refused (`Rule::Repair`): made 0700 through the handle
//! it was checked on, and everything in it discarded, since others could have written there
//! (a host copy is fetched again from its store: that is what it is for). A root the user
//! named (`Rule::Named`) is never changed: when others can write it, a directory of this
//! user's own beneath it is used instead. Everything after the check goes through the
//! handle returned, so a directory renamed into its place later is never used.

use crate::dir::{self, Dir, Kind, Name, Stat};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

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

/// How `open_own` treats a directory of this user's that others can write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Refused, as `open` does.
    Refuse,
    /// Made 0700 and emptied (`Found::Repaired`): one this package made, as earlier releases
    /// did under the process umask.
    Repair,
    /// A root the user named: left as it is, and the directory `beneath_name()` beneath it
    /// (under `Rule::Repair`) used instead (`Opened::open_root`).
    Named,
}

/// How `open_own` found the directory it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// This user's own already.
    Own,
    /// Absent: made now, mode 0700.
    Made,
    /// This user's, writable by others with mode `mode` (or a repair that did not finish,
    /// marked by the sticky bit): made 0700, and the `discarded` names it held moved aside
    /// and removed.
    Repaired { mode: u32, discarded: u64 },
}

/// A directory `open_own` checked: `dir` is the handle every later use goes through, `path`
/// where it is (for messages).
#[derive(Debug)]
pub struct Opened {
    pub dir: Dir,
    pub path: PathBuf,
    pub found: Found,
    /// Under `Rule::Named`, the mode of the named root when others can write it (and `dir`
    /// is the directory beneath it); None when the root itself is `dir`.
    pub open_root: Option<u32>,
}

/// The directory this user's processes use beneath a named root that others can write: one
/// per user, so that the users who share a scratch directory keep apart.
pub fn beneath_name() -> String {
    // SAFETY: geteuid cannot fail and touches no memory.
    format!("xla_pcache-{}", unsafe { libc::geteuid() })
}

/// Opens the directory `path` (one component beneath `base` when given, else a path),
/// making it mode 0700 (missing parents too) when absent, and checks it under `rule`. `Err`
/// says why it is refused, naming it.
pub fn open_own(base: Option<&Dir>, path: &Path, rule: Rule) -> Result<Opened, String> {
    let shown = base.map_or_else(|| path.to_path_buf(), |b| b.path().join(path));
    let (d, made) = open_or_make(base, path, &shown)?;
    let st = dir::fstat(&d).map_err(|e| format!("{}: {e}", shown.display()))?;
    if !st.is_dir() {
        return Err(format!("{} is {}", shown.display(), st.kind()));
    }
    let mode = st.mode() & 0o7777;
    let checked = owned_by_us(st.uid(), st.mode());
    let found = if made { Found::Made } else { Found::Own };
    let ours = |dir, found| Opened {
        dir,
        path: shown.clone(),
        found,
        open_root: None,
    };
    match (rule, checked) {
        (_, Ok(())) if rule != Rule::Repair || mode & libc::S_ISVTX == 0 => Ok(ours(d, found)),
        (Rule::Refuse, Err(why)) => Err(format!("{} {why}", shown.display())),
        // Not this user's: refused, whatever the rule.
        (_, Err(why)) if st.uid() != me() => Err(format!("{} {why}", shown.display())),
        (Rule::Named, Err(_)) => {
            let name = beneath_name();
            let mut inner = open_own(Some(&d), Path::new(&name), Rule::Repair)?;
            inner.open_root = Some(mode);
            Ok(inner)
        }
        _ => {
            let found = repair(&d, &shown)?;
            Ok(ours(d, found))
        }
    }
}

fn me() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Opens `path` (beneath `base`) without following a link, making it 0700 when absent;
/// whether it was made.
fn open_or_make(base: Option<&Dir>, path: &Path, shown: &Path) -> Result<(Dir, bool), String> {
    let refused = |e: io::Error| {
        format!(
            "{} is not a directory that can be opened without following a link ({e})",
            shown.display()
        )
    };
    let cannot_make = |e: io::Error| format!("{} cannot be made ({e})", shown.display());
    match base {
        None => match Dir::open_path(path, true) {
            Ok(d) => Ok((d, false)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(path)
                    .map_err(cannot_make)?;
                Dir::open_path(path, true)
                    .map(|d| (d, true))
                    .map_err(refused)
            }
            Err(e) => Err(refused(e)),
        },
        Some(base) => {
            let name = path
                .to_str()
                .and_then(|s| Name::new(Kind::Listed, s))
                .ok_or_else(|| format!("{} is not one path component", shown.display()))?;
            match base.sub(&name) {
                Ok(d) => Ok((d, false)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match base.mkdir(&name, 0o700) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(cannot_make(e)),
                    }
                    base.sub(&name).map(|d| (d, true)).map_err(refused)
                }
                Err(e) => Err(refused(e)),
            }
        }
    }
}

/// Makes `d` (this user's, writable by others) 0700 and discards what it holds: moved into a
/// fresh directory beneath it, then removed. Others could have written anything there while
/// it was open to them (a file in place of a copy, one of ours renamed to another name), so
/// nothing in it is kept. The sticky bit marks a repair under way, so one a crash
/// interrupted is done again by the next process; an exclusive `flock` keeps two processes
/// from repairing at once, and the one that waited finds it done.
fn repair(d: &Dir, shown: &Path) -> Result<Found, String> {
    let failed = |what: &str, e: io::Error| {
        format!(
            "{} is this user's but writable by others, and {what} failed ({e})",
            shown.display()
        )
    };
    let _lock = d.lock_exclusive();
    let st = dir::fstat(d).map_err(|e| failed("checking it again", e))?;
    let mode = st.mode() & 0o7777;
    if owned_by_us(st.uid(), st.mode()).is_ok() && mode & libc::S_ISVTX == 0 {
        return Ok(Found::Own); // another process repaired it meanwhile
    }
    // From here on no one else can add anything: only what is there now is discarded.
    d.chmod(0o700 | libc::S_ISVTX)
        .map_err(|e| failed("making it 0700", e))?;
    let aside = Name::checked(
        Kind::Made,
        &format!(".discarded.{}", crate::clock::unique_suffix()),
    )
    .map_err(|e| failed("naming the discarded copies", e))?;
    d.mkdir(&aside, 0o700)
        .map_err(|e| failed("discarding what it held", e))?;
    let moved = d.sub(&aside).and_then(|to| d.move_all(&to, &aside));
    let discarded = moved.map_err(|e| failed("discarding what it held", e))?;
    if let Err(e) = d.remove_any(&aside) {
        // Moved aside already, so never read: only the space is lost.
        log::warn!(
            "xla_pcache: removing what {} held (moved aside to {}) failed: {e}",
            shown.display(),
            aside
        );
    }
    d.chmod(0o700).map_err(|e| failed("making it 0700", e))?;
    Ok(Found::Repaired { mode, discarded })
}

/// `open_own` for a caller outside the crate (the binding): `base` a descriptor of a
/// directory this rule checked, with its path for messages; the result a new descriptor of
/// the directory opened for reading.
pub fn open_own_fd(
    base: Option<(std::os::fd::BorrowedFd<'_>, &Path)>,
    path: &Path,
    rule: Rule,
) -> Result<(std::os::fd::OwnedFd, Opened), String> {
    let base = match base {
        Some((fd, p)) => {
            Some(Dir::from_borrowed(fd, p).map_err(|e| format!("{}: {e}", p.display()))?)
        }
        None => None,
    };
    let opened = open_own(base.as_ref(), path, rule)?;
    let fd = opened
        .dir
        .reopen_readable()
        .map_err(|e| format!("{}: {e}", opened.path.display()))?;
    Ok((fd, opened))
}

/// Whether the directory `fd` refers to is this user's own (`Err` says why not): the check
/// of a handle the caller was given.
pub fn check_fd(fd: std::os::fd::BorrowedFd<'_>) -> Result<(), String> {
    let st = dir::fstat(&fd).map_err(|e| e.to_string())?;
    if !st.is_dir() {
        return Err(format!("is {}", st.kind()));
    }
    owned_by_us(st.uid(), st.mode())
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
        assert_eq!(
            open_own(None, &path, Rule::Refuse).unwrap().found,
            Found::Made
        );
        for p in [tmp.path().join("a"), tmp.path().join("a/b"), path.clone()] {
            assert_eq!(
                fs::metadata(&p).unwrap().mode() & 0o777,
                0o700,
                "{}",
                p.display()
            );
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o770)).unwrap();
        let why = open_own(None, &path, Rule::Refuse).unwrap_err();
        assert!(
            why.contains("writable by others") && why.contains("a/b/c"),
            "{why}"
        );

        let link = tmp.path().join("link");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
        symlink(&path, &link).unwrap();
        let why = open_own(None, &link, Rule::Refuse).unwrap_err();
        assert!(why.contains("without following a link"), "{why}");

        let file = tmp.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(open_own(None, &file, Rule::Refuse).is_err());
        let why = open_own(None, &file.join("below"), Rule::Refuse).unwrap_err();
        assert!(why.contains("file/below"), "{why}");
        // Absent, and nowhere it could be made.
        let why = open_own(None, Path::new("/proc/xla_pcache-absent"), Rule::Refuse).unwrap_err();
        assert!(why.contains("cannot be made"), "{why}");
        let new = open_own(None, &tmp.path().join("new"), Rule::Refuse).unwrap();
        assert_eq!(new.found, Found::Made);
    }

    fn mode_of(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn an_earlier_releases_directory_is_repaired_and_emptied() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("pool");
        fs::create_dir(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o775)).unwrap();
        fs::write(path.join("123"), b"a group member's file").unwrap();
        fs::create_dir_all(path.join("sub/deeper")).unwrap();
        fs::write(path.join("sub/deeper/x"), b"x").unwrap();
        symlink("/etc/passwd", path.join("link")).unwrap();
        let o = open_own(None, &path, Rule::Repair).unwrap();
        assert_eq!(
            o.found,
            Found::Repaired {
                mode: 0o775,
                discarded: 3
            }
        );
        assert_eq!(mode_of(&path), 0o700);
        assert_eq!(fs::read_dir(&path).unwrap().count(), 0);
        assert!(fs::metadata("/etc/passwd").is_ok());
        // The handle is the directory's: a name made through it is there.
        o.dir.mkdir(&Name::fixed("fresh"), 0o700).unwrap();
        assert!(path.join("fresh").is_dir());
        // Now its own: opened again as it is.
        assert_eq!(
            open_own(None, &path, Rule::Repair).unwrap().found,
            Found::Own
        );
        // The same beneath a handle on its parent; and absent: made 0700.
        let parent = Dir::open_path(tmp.path(), true).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o770)).unwrap();
        let o = open_own(Some(&parent), Path::new("pool"), Rule::Repair).unwrap();
        assert!(matches!(o.found, Found::Repaired { mode: 0o770, .. }));
        assert_eq!(o.path, path);
        let o = open_own(Some(&parent), Path::new("new"), Rule::Repair).unwrap();
        assert_eq!(o.found, Found::Made);
        assert_eq!(mode_of(&tmp.path().join("new")), 0o700);
        assert!(open_own(Some(&parent), Path::new("a/b"), Rule::Repair).is_err());
    }

    #[test]
    fn an_interrupted_repair_is_done_again() {
        // A process killed between making it 0700 (sticky: under way) and removing what it
        // held: the next one discards it all again, whatever is there.
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("views");
        fs::create_dir(&path).unwrap();
        fs::create_dir(path.join(".discarded.x")).unwrap();
        fs::write(path.join("left"), b"").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o1700)).unwrap();
        let o = open_own(None, &path, Rule::Repair).unwrap();
        assert!(matches!(o.found, Found::Repaired { discarded: 2, .. }));
        assert_eq!(mode_of(&path), 0o700);
        assert_eq!(fs::read_dir(&path).unwrap().count(), 0);
    }

    #[test]
    fn refused_whatever_the_rule() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::create_dir(&target).unwrap();
        let link = tmp.path().join("link");
        symlink(&target, &link).unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, b"").unwrap();
        for rule in [Rule::Refuse, Rule::Repair, Rule::Named] {
            let why = open_own(None, &link, rule).unwrap_err();
            assert!(why.contains("without following a link"), "{why}");
            assert!(open_own(None, &file, rule).is_err());
        }
        fs::set_permissions(&target, fs::Permissions::from_mode(0o775)).unwrap();
        let why = open_own(None, &target, Rule::Refuse).unwrap_err();
        assert!(why.contains("writable by others"), "{why}");
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            fs::write(target.join("theirs"), b"").unwrap();
            std::os::unix::fs::chown(&target, Some(4242), Some(4242)).unwrap();
            for rule in [Rule::Refuse, Rule::Repair, Rule::Named] {
                let why = open_own(None, &target, rule).unwrap_err();
                assert!(why.contains("belongs to"), "{why}");
            }
            assert!(target.join("theirs").exists());
            assert_eq!(mode_of(&target), 0o775);
        }
    }

    #[test]
    fn a_named_root_others_can_write_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("scratch");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("the team's"), b"").unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o2775)).unwrap();
        let o = open_own(None, &root, Rule::Named).unwrap();
        assert_eq!(o.open_root, Some(0o2775));
        assert_eq!(o.path, root.join(beneath_name()));
        assert_eq!(o.found, Found::Made);
        assert_eq!(mode_of(&root), 0o2775);
        assert!(root.join("the team's").exists());
        // (The setgid bit a shared directory passes on to new ones is no one's write.)
        assert_eq!(mode_of(&o.path) & 0o777, 0o700);
        // Private already: the root itself.
        let mine = tmp.path().join("mine");
        fs::create_dir(&mine).unwrap();
        fs::set_permissions(&mine, fs::Permissions::from_mode(0o755)).unwrap();
        let o = open_own(None, &mine, Rule::Named).unwrap();
        assert_eq!((o.path, o.open_root, o.found), (mine, None, Found::Own));
    }

    #[test]
    fn two_at_once_repair_once() {
        // Processes of one host starting together after an upgrade: one repairs, the other
        // waits on the lock and finds it done; nothing it made since is discarded.
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("pool");
        fs::create_dir(&path).unwrap();
        for i in 0..200 {
            fs::write(path.join(i.to_string()), b"planted").unwrap();
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o775)).unwrap();
        let found: Vec<Found> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| open_own(None, &path, Rule::Repair).unwrap().found))
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let repaired = found
            .iter()
            .filter(|f| matches!(f, Found::Repaired { discarded: 200, .. }))
            .count();
        assert_eq!(repaired, 1, "{found:?}");
        assert_eq!(found.iter().filter(|f| **f == Found::Own).count(), 3);
        assert_eq!(fs::read_dir(&path).unwrap().count(), 0);
        assert_eq!(mode_of(&path), 0o700);
    }
}
