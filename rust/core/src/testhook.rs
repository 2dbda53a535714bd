//! Points a test can wait on, so that a test which signals or kills a process reaches the
//! state it tests because the process said it is there, never because the machine was slow
//! (or fast) enough.
//!
//! Off unless `XLA_PCACHE_TEST_HOOKS` names a directory when the process first reaches a
//! point: the only variable besides `XLA_PCACHE_HASH_IMPL` that the core reads, and only
//! for tests. At a point the process creates `<dir>/<point>.<pid>` (empty); a test waits
//! for that file. At a point that holds, the process then waits until the test creates
//! `<dir>/<point>.go` (or a condition of the store's own, such as an interrupt, is met).
//! Nothing else is written, and a failure to write is ignored: a hook never changes what
//! the store does, only when it does it.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const VAR: &str = "XLA_PCACHE_TEST_HOOKS";
/// How long a paused walk waits for the test before going on by itself: a test that never
/// signals must not hang the suite.
const PAUSE_MAX: Duration = Duration::from_secs(120);

fn dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os(VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

/// Says that this process reached `point` (a file `<dir>/<point>.<pid>`).
pub fn reached(point: &str) {
    if let Some(d) = dir() {
        let _ = std::fs::File::create(d.join(format!("{point}.{}", std::process::id())));
    }
}

/// Says that this process reached `point` and waits there until `go()` is true (polled
/// every millisecond, at most `PAUSE_MAX`). Without hooks, returns at once.
pub fn pause(point: &str, go: impl Fn() -> bool) {
    if dir().is_none() {
        return;
    }
    reached(point);
    let start = Instant::now();
    while !go() && start.elapsed() < PAUSE_MAX {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Says that this process reached `point` and waits there until the test creates
/// `<dir>/<point>.go`.
pub fn hold(point: &str) {
    if let Some(d) = dir() {
        let go = d.join(format!("{point}.go"));
        pause(point, || go.exists());
    }
}
