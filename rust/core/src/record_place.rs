//! Where this user's records beside the caches are kept (the verified signatures',
//! `verified.rs`; the runtime binaries' identities, `build_id/`): the first of a few
//! candidate directories that is this user's own and can be written.
//!
//! The home's comes first: `$XDG_CACHE_HOME/<name>` (an absolute value only, as the XDG spec
//! says), else `$HOME/.cache/<name>`. Where it cannot be made or written (a container with a
//! read-only root filesystem, a user with no home, a home others own), a record kept nowhere
//! would cost every process what it saves (the hash of a framework's 350 MB of binaries), so
//! it is kept on this host instead: in `$XDG_RUNTIME_DIR/<name>-<uid>`, then in
//! `<temp dir>/<name>-<uid>` (`$TMPDIR`, an absolute value only, else `/tmp`). The uid is in
//! the name because those directories may be shared by every user of the host.
//!
//! Each candidate is held to the one rule of a directory of this user's own
//! (`owndir::owned_by_us`): a real directory, opened without following a link, owned by the
//! effective user and writable by nobody else; made mode 0700 where absent. In a shared
//! temp directory another user can make the name first, or put a link there: that one is
//! refused (never read nor written, one warning) and the next candidate tried, so another
//! user can cost this one the hash, never choose what it reads. What such a directory holds
//! was written by this user's own processes, as in the home. The cache directory is never a
//! candidate: others write it.
//!
//! A record is read from and written to the first candidate that is ours and can be written,
//! made where absent and possible: a later candidate is used only while the earlier ones
//! cannot be, so a record left in the temp dir by a process without a home never hides the
//! home's. Where that one holds no record yet, one of ours before it that cannot be written
//! (an image's, in a read-only home) is read instead. Where none can be written, nothing is
//! kept and the caller says so.

use crate::dir::{self, Dir};
use crate::owndir;
use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The candidate directories of one record, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    candidates: Vec<PathBuf>,
}

/// A candidate as it was found.
#[derive(Debug)]
enum Look {
    /// This user's own, writable or not.
    Ours(Dir, bool),
    /// Not there, or not reachable (a parent missing, a file, not searchable): nothing to
    /// read; why it was not made when asked to.
    Absent(String),
    /// Someone else may control it: never read nor written.
    Refused(String),
}

/// A directory of the place, checked: `dir` is the handle every later use goes through.
#[derive(Debug)]
pub struct Found {
    pub dir: Dir,
    pub path: PathBuf,
    pub writable: bool,
}

/// What `Place::open` saw: the directory of the record (None: no candidate can be written),
/// the first of this user's own before it that cannot be written, and each candidate refused
/// as someone else's on the way (`(path, why)`: to warn of).
#[derive(Debug, Default)]
pub struct Seen {
    pub found: Option<Found>,
    pub read_only: Option<Found>,
    pub refused: Vec<(PathBuf, String)>,
    /// Candidates before the one found that could not be used, with why (for `doctor`).
    pub skipped: Vec<String>,
}

impl Place {
    /// The default place of the record `name` (`xla_pcache-builds`, `xla_pcache-verified`),
    /// from this process's environment.
    pub fn default_for(name: &str) -> Place {
        Place::from_env(name, |var| std::env::var_os(var))
    }

    fn from_env(name: &str, var: impl Fn(&str) -> Option<OsString>) -> Place {
        let absolute = |v: &str| var(v).map(PathBuf::from).filter(|p| p.is_absolute());
        let mine = format!("{name}-{}", me());
        let mut candidates = Vec::new();
        if let Some(home) =
            absolute("XDG_CACHE_HOME").or_else(|| absolute("HOME").map(|h| h.join(".cache")))
        {
            candidates.push(home.join(name));
        }
        if let Some(run) = absolute("XDG_RUNTIME_DIR") {
            candidates.push(run.join(&mine));
        }
        let tmp = absolute("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
        candidates.push(tmp.join(&mine));
        candidates.dedup();
        Place { candidates }
    }

    /// One directory the caller named: no other is tried.
    pub fn only(dir: PathBuf) -> Place {
        Place {
            candidates: vec![dir],
        }
    }

    /// These directories, in order (the tests' places).
    #[cfg(test)]
    pub fn of(candidates: Vec<PathBuf>) -> Place {
        Place { candidates }
    }

    /// No directory: nothing is read or kept.
    pub fn nowhere() -> Place {
        Place {
            candidates: Vec::new(),
        }
    }

    pub fn candidates(&self) -> &[PathBuf] {
        &self.candidates
    }

    /// The first candidate, for messages.
    pub fn first(&self) -> &Path {
        self.candidates
            .first()
            .map_or(Path::new("?"), PathBuf::as_path)
    }

    /// The directory of the record: the first candidate, leaving out those in `skip`
    /// (refused already), that is ours and can be written, made (mode 0700, parents too)
    /// where absent and possible; and the first of ours before it that cannot be written
    /// (an image's, read-only: what it holds may be read, never written).
    pub fn open(&self, skip: &[PathBuf]) -> Seen {
        let mut seen = Seen::default();
        for path in self.candidates.iter().filter(|p| !skip.contains(p)) {
            let why = match look(path, true) {
                Look::Ours(dir, true) => {
                    seen.found = Some(Found {
                        dir,
                        path: path.clone(),
                        writable: true,
                    });
                    return seen;
                }
                Look::Ours(dir, false) => {
                    if seen.read_only.is_none() {
                        seen.read_only = Some(Found {
                            dir,
                            path: path.clone(),
                            writable: false,
                        });
                    }
                    format!("{}: this user cannot write it", path.display())
                }
                Look::Absent(why) => why,
                Look::Refused(why) => {
                    seen.refused.push((path.clone(), why.clone()));
                    why
                }
            };
            seen.skipped.push(why);
        }
        seen
    }
}

fn me() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The candidate `path`: opened without following a link at its last component and
/// checked as a directory of this user's own; with `create`, made (missing parents too,
/// each mode 0700) when absent.
fn look(path: &Path, create: bool) -> Look {
    let mut opened = Dir::open_path(path, true);
    let mut made = None;
    if create && opened.is_err() && std::fs::symlink_metadata(path).is_err() {
        // A failure (a read-only home, no home) shows in the open that follows; a process
        // making it at the same time is no failure.
        made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .err();
        opened = Dir::open_path(path, true);
    }
    let d = match opened {
        Ok(d) => d,
        Err(e) => return not_opened(path, e, made),
    };
    let st = match dir::fstat(&d) {
        Ok(st) => st,
        Err(e) => return Look::Refused(format!("{}: {e}", path.display())),
    };
    if let Err(why) = owndir::owned_by_us(st.uid(), st.mode()) {
        return Look::Refused(format!("{} {why}", path.display()));
    }
    let writable = writable(&d);
    Look::Ours(d, writable)
}

/// Why `path` could not be opened as a directory: something there that is not one (a
/// link, a file: refused), or nothing reachable there (absent).
fn not_opened(path: &Path, e: io::Error, made: Option<io::Error>) -> Look {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            Look::Refused(format!("{} is a symbolic link", path.display()))
        }
        Ok(m) if !m.is_dir() => Look::Refused(format!("{} is not a directory", path.display())),
        Ok(_) => Look::Refused(format!("{} cannot be opened ({e})", path.display())),
        Err(_) => Look::Absent(match made {
            Some(m) => format!("{} cannot be made ({m})", path.display()),
            None => format!("{} is absent ({e})", path.display()),
        }),
    }
}

/// Whether this user may write in `d` (a read-only filesystem says no, whoever asks).
fn writable(d: &Dir) -> bool {
    // SAFETY: a directory descriptor and a NUL-terminated path.
    unsafe { libc::faccessat(d.as_raw_fd(), c".".as_ptr(), libc::W_OK, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// The environment `vars` describes: `NAME=value` pairs between spaces.
    fn env(vars: &str) -> impl Fn(&str) -> Option<OsString> + '_ {
        move |v| {
            vars.split_whitespace()
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| *k == v)
                .map(|(_, x)| OsString::from(x))
        }
    }

    /// A directory at `path` (and its parents) with `mode`.
    fn dir_with_mode(path: &Path, mode: u32) {
        fs::create_dir_all(path).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_candidates_in_order() {
        let me = me();
        // The environment; the candidates it gives, in order (`{me}`: this user's id).
        let cases = [
            (
                "XDG_CACHE_HOME=/x HOME=/h XDG_RUNTIME_DIR=/run/user/7 TMPDIR=/scratch",
                "/x/rec /run/user/7/rec-{me} /scratch/rec-{me}",
            ),
            // Relative values are no values (the XDG spec); the temp dir is /tmp by default.
            (
                "XDG_CACHE_HOME=rel HOME=/h XDG_RUNTIME_DIR=run TMPDIR=tmp",
                "/h/.cache/rec /tmp/rec-{me}",
            ),
            // No home at all: the temp dir only.
            ("", "/tmp/rec-{me}"),
        ];
        for (vars, want) in cases {
            let want: Vec<PathBuf> = want
                .split_whitespace()
                .map(|c| PathBuf::from(c.replace("{me}", &me.to_string())))
                .collect();
            assert_eq!(
                Place::from_env("rec", env(vars)).candidates(),
                want,
                "{vars}"
            );
        }
    }

    #[test]
    fn an_unusable_home_falls_through_to_the_next() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("file");
        fs::write(&file, b"").unwrap();
        let fallback = t.path().join("tmp/rec-1");
        let place = Place {
            candidates: vec![file.join("rec"), fallback.clone()],
        };
        let seen = place.open(&[]);
        assert_eq!(seen.found.unwrap().path, fallback);
        assert!(seen.refused.is_empty() && seen.read_only.is_none());
        assert!(
            seen.skipped[0].contains("cannot be made"),
            "{:?}",
            seen.skipped
        );
        assert_eq!(mode_of(&fallback), 0o700);
    }

    #[test]
    fn a_fallback_left_from_before_never_hides_the_home() {
        // A process with no home made the temp dir's; the home can be made: it is used.
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home/.cache/rec");
        let fallback = t.path().join("tmp/rec-1");
        dir_with_mode(&fallback, 0o700);
        let place = Place {
            candidates: vec![home.clone(), fallback],
        };
        assert_eq!(place.open(&[]).found.unwrap().path, home);
        assert!(home.is_dir());
    }

    #[test]
    fn hostile_candidates_are_refused_and_skipped() {
        let t = tempfile::tempdir().unwrap();
        let good = t.path().join("good");
        let target = t.path().join("target");
        fs::create_dir(&target).unwrap();
        let link = t.path().join("link");
        symlink(&target, &link).unwrap();
        let open = t.path().join("open");
        dir_with_mode(&open, 0o777);
        let file = t.path().join("plain");
        fs::write(&file, b"").unwrap();
        let place = Place {
            candidates: vec![link.clone(), open.clone(), file.clone(), good.clone()],
        };
        let seen = place.open(&[]);
        assert_eq!(seen.found.unwrap().path, good);
        let refused: Vec<_> = seen.refused.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(refused, [link.clone(), open.clone(), file.clone()]);
        assert!(seen.refused[0].1.contains("symbolic link"));
        assert!(seen.refused[1].1.contains("writable by others"));
        assert!(seen.refused[2].1.contains("not a directory"));
        assert_eq!(seen.skipped.len(), 3);
        // Left as they were.
        assert_eq!(mode_of(&open), 0o777);
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        // Skipped when refused already.
        let seen = place.open(&[link.clone(), open.clone(), file.clone()]);
        assert!(seen.refused.is_empty() && seen.found.is_some());
        if me() == 0 {
            let theirs = t.path().join("theirs");
            dir_with_mode(&theirs, 0o700);
            std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
            let seen = Place::only(theirs).open(&[]);
            assert!(seen.found.is_none());
            assert!(seen.refused[0].1.contains("belongs to"), "{seen:?}");
        }
    }

    #[test]
    fn nowhere_to_write_says_why_for_each() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("file");
        fs::write(&file, b"").unwrap();
        let place = Place {
            candidates: vec![file.join("a"), PathBuf::from("/proc/xla_pcache-absent")],
        };
        let seen = place.open(&[]);
        assert!(seen.found.is_none());
        assert_eq!(seen.skipped.len(), 2);
        assert!(
            seen.skipped.iter().all(|w| w.contains("cannot be made")),
            "{seen:?}"
        );
        assert!(Place::nowhere().open(&[]).found.is_none());
    }
}
