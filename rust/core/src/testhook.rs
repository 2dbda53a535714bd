//! Points a test can wait on, so that a test which signals or kills a process reaches the
//! state it tests because the process said it is there, never because the machine was slow
//! (or fast) enough.
//!
//! Compiled in only by a test build: the crate's own tests and a build with the
//! `test-hooks` feature (the test suite's editable install turns it on; the wheel users
//! install has it off). Without it every function here is a constant and `VAR` is read by
//! nobody, so a release build neither waits nor writes, whatever the environment says.
//!
//! With it, hooks are off unless `XLA_PCACHE_TEST_HOOKS` names a directory when the
//! process first reaches a point: besides `XLA_PCACHE_HASH_IMPL` the only variable the core
//! reads, and only for tests. At a point the process creates `<dir>/<point>.<pid>` (empty),
//! exclusively and beneath a handle on the directory opened without following a link, so a
//! link or a file already at that name is never followed, truncated or written; a test
//! waits for that file. At a point that holds, the process then waits until the test
//! creates `<dir>/<point>.go` (or a condition of the store's own, such as an interrupt, is
//! met). Nothing else is written, and a failure to write is no error: a hook never changes
//! what the store does, only when it does it.

/// The variable naming the hooks' directory; its one definition (Python reads it from
/// `_core`).
pub const VAR: &str = "XLA_PCACHE_TEST_HOOKS";

/// Whether this build has the hooks at all.
pub const COMPILED: bool = cfg!(any(test, feature = "test-hooks"));

#[cfg(any(test, feature = "test-hooks"))]
mod on {
    use crate::dir::{Dir, Kind, Name};
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// How long a paused walk waits for the test before going on by itself: a test that
    /// never signals must not hang the suite.
    const PAUSE_MAX: Duration = Duration::from_secs(120);

    fn dir() -> Option<&'static PathBuf> {
        static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
        DIR.get_or_init(|| {
            std::env::var_os(super::VAR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .as_ref()
    }

    /// Creates the empty file `<dir>/<point>.<pid>`: `O_CREAT | O_EXCL | O_NOFOLLOW`
    /// beneath `dir`, itself opened with `O_DIRECTORY | O_NOFOLLOW`. Whatever is already at
    /// the name (a link included) is an `AlreadyExists` error and is left untouched.
    pub(super) fn mark(dir: &Path, point: &str, pid: u32) -> io::Result<()> {
        let d = Dir::open_path(dir, true)?;
        let name = Name::checked(Kind::Made, &format!("{point}.{pid}"))?;
        d.open_file(&name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)
            .map(drop)
    }

    /// Says that this process reached `point`: true when its mark is in the directory now
    /// (made by this call, or left by an earlier visit of the same point).
    pub fn reached(point: &str) -> bool {
        let Some(d) = dir() else {
            return false;
        };
        match mark(d, point, std::process::id()) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::AlreadyExists,
        }
    }

    /// Whether the test created `<dir>/<point>.go` (looked at without following a link).
    pub fn released(point: &str) -> bool {
        let Some(d) = dir() else {
            return false;
        };
        let Ok(go) = Name::checked(Kind::Made, &format!("{point}.go")) else {
            return false;
        };
        Dir::open_path(d, true).and_then(|d| d.stat(&go)).is_ok()
    }

    /// Says that this process reached `point` and waits there until `go()` is true (polled
    /// every millisecond, at most `PAUSE_MAX`). Without hooks, returns at once.
    pub fn pause(point: &str, go: impl Fn() -> bool) {
        if !reached(point) {
            return;
        }
        let start = Instant::now();
        while !go() && start.elapsed() < PAUSE_MAX {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Says that this process reached `point` and waits there until the test creates
    /// `<dir>/<point>.go`.
    pub fn hold(point: &str) {
        pause(point, || released(point));
    }
}

#[cfg(any(test, feature = "test-hooks"))]
pub use on::{hold, pause, reached, released};

#[cfg(not(any(test, feature = "test-hooks")))]
mod off {
    /// Without the feature: no point is ever reached.
    #[inline(always)]
    pub fn reached(_point: &str) -> bool {
        false
    }

    #[inline(always)]
    pub fn released(_point: &str) -> bool {
        false
    }

    #[inline(always)]
    pub fn pause(_point: &str, _go: impl Fn() -> bool) {}

    #[inline(always)]
    pub fn hold(_point: &str) {}
}

#[cfg(not(any(test, feature = "test-hooks")))]
pub use off::{hold, pause, reached, released};

#[cfg(test)]
mod tests {
    use super::on::mark;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_mark_is_created_once_and_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let hooks = tmp.path().join("hooks");
        fs::create_dir(&hooks).unwrap();
        mark(&hooks, "walk", 7).unwrap();
        assert_eq!(fs::read(hooks.join("walk.7")).unwrap(), b"");

        // A link planted at the name: neither followed nor its target truncated.
        let victim = tmp.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        symlink(&victim, hooks.join("claimed.8")).unwrap();
        let e = mark(&hooks, "claimed", 8).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        // A dangling link: nothing is created at its target.
        let absent = tmp.path().join("absent");
        symlink(&absent, hooks.join("export.9")).unwrap();
        assert!(mark(&hooks, "export", 9).is_err());
        assert!(!absent.exists());
        // A regular file already there (another process, or a planted one): left as it is.
        fs::write(hooks.join("walk.10"), b"kept").unwrap();
        assert!(mark(&hooks, "walk", 10).is_err());
        assert_eq!(fs::read(hooks.join("walk.10")).unwrap(), b"kept");
    }

    #[test]
    fn a_hooks_directory_that_is_a_link_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = tmp.path().join("hooks");
        symlink(&real, &link).unwrap();
        assert!(mark(&link, "walk", 7).is_err());
        assert_eq!(fs::read_dir(&real).unwrap().count(), 0);
        // Names that are not one plain component are refused, not resolved.
        assert!(mark(&real, "../walk", 7).is_err());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 2);
    }
}
