//! The evictor lock between processes: several processes take the lock in turn (lease
//! and fcntl modes) and record when they hold it; no two holds may overlap. A holder
//! killed with SIGKILL loses an fcntl lock at once, and its lease is taken over by
//! another process once that process has watched it unchanged for `lease_time`.
//!
//! The processes are this test binary itself, re-executed with `XLA_PCACHE_LOCK_ROLE`
//! set: the `child_entry` test then acts the role and exits (without the variable it
//! does nothing).

use std::env;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use xla_pcache_core::{LockDir, LockMode, LockOptions};

const ROLE: &str = "XLA_PCACHE_LOCK_ROLE";
const LOCK: &str = "evict";

// ------------------------------------------------------------------ child side

fn env_u64(key: &str, default: u64) -> u64 {
    env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn child_lock_dir() -> LockDir {
    let dir = PathBuf::from(env::var("XPC_DIR").expect("XPC_DIR"));
    let mode: LockMode = env::var("XPC_MODE")
        .expect("XPC_MODE")
        .parse()
        .expect("mode");
    LockDir::new(
        dir,
        LockOptions {
            mode,
            timeout: Duration::from_millis(env_u64("XPC_TIMEOUT_MS", 10_000)),
            lease_time: Duration::from_millis(env_u64("XPC_LEASE_MS", 5_000)),
            host: "testhost".to_string(),
        },
    )
}

/// Nanoseconds on CLOCK_MONOTONIC, which all processes of the machine share.
fn mono_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// Takes the lock `XPC_ITERS` times, appending `enter`/`exit` lines to `XPC_LOG`.
fn contend() -> i32 {
    let dir = child_lock_dir();
    let iters = env_u64("XPC_ITERS", 20);
    let pid = std::process::id();
    let mut log = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(env::var("XPC_LOG").expect("XPC_LOG"))
        .expect("open log");
    let (mut acquired, mut missed) = (0, 0);
    for i in 0..iters {
        match dir.try_lock(LOCK) {
            Ok(Some(mut guard)) => {
                acquired += 1;
                log.write_all(format!("enter {pid} {}\n", mono_ns()).as_bytes())
                    .expect("log");
                thread::sleep(Duration::from_millis(2));
                if let Err(e) = guard.heartbeat() {
                    eprintln!("child {pid}: heartbeat: {e}");
                    return 2;
                }
                thread::sleep(Duration::from_millis(2));
                log.write_all(format!("exit {pid} {}\n", mono_ns()).as_bytes())
                    .expect("log");
                if let Err(e) = guard.release() {
                    eprintln!("child {pid}: release: {e}");
                    return 2;
                }
            }
            Ok(None) => missed += 1,
            Err(e) => {
                eprintln!("child {pid}: try_lock: {e}");
                return 2;
            }
        }
        // Let the others in: vary the pause by process and iteration.
        thread::sleep(Duration::from_micros(
            500 + (u64::from(pid) * 7 + i * 13) % 2500,
        ));
    }
    // A leading newline: the harness has printed "test child_entry ... " already.
    println!("\nacquired={acquired} missed={missed}");
    0
}

/// Takes the lock, says so on stdout, and holds it (heartbeating) until killed.
fn hold() -> i32 {
    let dir = child_lock_dir();
    let mut guard = match dir.try_lock(LOCK) {
        Ok(Some(g)) => g,
        other => {
            eprintln!("holder: could not lock: {other:?}");
            return 2;
        }
    };
    println!("\nheld {}", guard.kind());
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        thread::sleep(Duration::from_millis(50));
        if let Err(e) = guard.heartbeat() {
            eprintln!("holder: heartbeat: {e}");
            return 3;
        }
    }
    4 // never killed
}

/// Tries once (within XPC_TIMEOUT_MS) and reports how long it took.
fn take() -> i32 {
    let dir = child_lock_dir();
    let start = Instant::now();
    match dir.try_lock(LOCK) {
        Ok(Some(g)) => {
            println!("\ntook {} {}", g.kind(), start.elapsed().as_millis());
            0
        }
        Ok(None) => {
            println!("\nbusy {}", start.elapsed().as_millis());
            1
        }
        Err(e) => {
            eprintln!("taker: {e}");
            2
        }
    }
}

#[test]
fn child_entry() {
    let Ok(role) = env::var(ROLE) else {
        return; // an ordinary test run: nothing to do
    };
    let code = match role.as_str() {
        "contend" => contend(),
        "hold" => hold(),
        "take" => take(),
        other => {
            eprintln!("unknown role {other}");
            9
        }
    };
    std::process::exit(code);
}

// ----------------------------------------------------------------- parent side

/// Kills the child on drop so that a failing test leaves no process behind.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(role: &str, dir: &Path, mode: &str, vars: &[(&str, String)]) -> Kid {
    let mut cmd = Command::new(env::current_exe().expect("current_exe"));
    cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("XPC_DIR", dir)
        .env("XPC_MODE", mode)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    Kid(cmd.spawn().expect("spawn child"))
}

/// The first line starting with `prefix` on the child's stdout, within `within`.
fn wait_for_line(stdout: ChildStdout, prefix: &'static str, within: Duration) -> String {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with(prefix) {
                let _ = tx.send(line);
                break;
            }
        }
    });
    rx.recv_timeout(within)
        .unwrap_or_else(|_| panic!("child printed no {prefix:?} line within {within:?}"))
}

/// Waits for the child to exit within `within`; returns its exit code and stdout.
fn finish(mut kid: Kid, within: Duration) -> (i32, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = kid.0.try_wait().expect("wait") {
            let mut out = String::new();
            if let Some(mut so) = kid.0.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut so, &mut out);
            }
            return (status.code().unwrap_or(-1), out);
        }
        assert!(
            start.elapsed() < within,
            "child still running after {within:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

fn parent_lock_dir(dir: &Path, mode: LockMode, timeout_ms: u64, lease_ms: u64) -> LockDir {
    LockDir::new(
        dir.to_path_buf(),
        LockOptions {
            mode,
            timeout: Duration::from_millis(timeout_ms),
            lease_time: Duration::from_millis(lease_ms),
            host: "parent".to_string(),
        },
    )
}

fn contend_in_processes(mode: &str) {
    const PROCS: usize = 4;
    const ITERS: usize = 25;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("locks");
    let log = tmp.path().join("intervals.log");
    fs::write(&log, b"").expect("create log");
    let kids: Vec<Kid> = (0..PROCS)
        .map(|_| {
            spawn(
                "contend",
                &dir,
                mode,
                &[
                    ("XPC_LOG", log.display().to_string()),
                    ("XPC_ITERS", ITERS.to_string()),
                    ("XPC_TIMEOUT_MS", "20000".to_string()),
                    ("XPC_LEASE_MS", "10000".to_string()),
                ],
            )
        })
        .collect();
    let mut acquired = 0;
    for kid in kids {
        let (code, out) = finish(kid, Duration::from_secs(120));
        assert_eq!(code, 0, "child failed; stdout: {out}");
        let n: usize = out
            .lines()
            .find_map(|l| l.strip_prefix("acquired="))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no report in {out:?}"));
        acquired += n;
    }
    // Every attempt succeeded within its (generous) timeout.
    assert_eq!(acquired, PROCS * ITERS, "{mode}");

    let text = fs::read_to_string(&log).expect("read log");
    let lines: Vec<(&str, u32, u128)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 3, "bad log line {l:?}");
            (
                f[0],
                f[1].parse().expect("pid"),
                f[2].parse().expect("time"),
            )
        })
        .collect();
    assert_eq!(lines.len(), 2 * PROCS * ITERS, "{mode}");
    // In append order, holds never interleave ...
    let mut intervals = Vec::new();
    for pair in lines.chunks(2) {
        let (enter, exit) = (pair[0], pair[1]);
        assert_eq!(enter.0, "enter", "{mode}: overlapping holds near {pair:?}");
        assert_eq!(exit.0, "exit", "{mode}: overlapping holds near {pair:?}");
        assert_eq!(enter.1, exit.1, "{mode}: overlapping holds near {pair:?}");
        assert!(enter.2 <= exit.2);
        intervals.push((enter.2, exit.2, enter.1));
    }
    // ... and by the shared monotonic clock, no two overlap.
    intervals.sort_unstable();
    for w in intervals.windows(2) {
        assert!(
            w[1].0 > w[0].1,
            "{mode}: holds overlap: {:?} and {:?}",
            w[0],
            w[1]
        );
    }
    let pids: std::collections::HashSet<u32> = intervals.iter().map(|i| i.2).collect();
    assert_eq!(pids.len(), PROCS);
    // Only the lock file (fcntl) or nothing (lease) remains: no temp files.
    let left: Vec<String> = fs::read_dir(&dir)
        .expect("read locks dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    match mode {
        "fcntl" => assert_eq!(left, vec!["evict.lock".to_string()]),
        _ => assert!(left.is_empty(), "{left:?}"),
    }
}

#[test]
fn lock_lease_excludes_other_processes() {
    contend_in_processes("lease");
}

#[test]
fn lock_fcntl_excludes_other_processes() {
    contend_in_processes("fcntl");
}

#[test]
fn lock_killed_lease_holder_is_taken_over_after_lease_time() {
    const LEASE_MS: u64 = 300;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("locks");
    let mut holder = spawn("hold", &dir, "lease", &[]);
    let line = wait_for_line(
        holder.0.stdout.take().expect("stdout"),
        "held",
        Duration::from_secs(20),
    );
    assert_eq!(line, "held lease");

    // A live holder heartbeats (every 50 ms), so it is never judged stale.
    let watcher = parent_lock_dir(&dir, LockMode::Lease, 3 * LEASE_MS, LEASE_MS);
    assert!(watcher.try_lock(LOCK).expect("try_lock").is_none());

    holder.0.kill().expect("SIGKILL");
    holder.0.wait().expect("reap");
    let lease = dir.join("evict.lease");
    assert!(lease.exists(), "a killed holder leaves its lease behind");

    let taker = spawn(
        "take",
        &dir,
        "lease",
        &[
            ("XPC_LEASE_MS", LEASE_MS.to_string()),
            ("XPC_TIMEOUT_MS", "5000".to_string()),
        ],
    );
    let (code, out) = finish(taker, Duration::from_secs(30));
    assert_eq!(code, 0, "taker did not get the lease: {out}");
    let ms: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("took lease "))
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("unexpected report {out:?}"));
    assert!(ms >= LEASE_MS, "taken over after {ms} ms < lease_time");
    assert!(ms < 5000, "took {ms} ms");
    assert!(!lease.exists(), "the taker released its lease on exit");
}

#[test]
fn lock_killed_fcntl_holder_releases_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("locks");
    let mut holder = spawn("hold", &dir, "fcntl", &[]);
    let line = wait_for_line(
        holder.0.stdout.take().expect("stdout"),
        "held",
        Duration::from_secs(20),
    );
    assert_eq!(line, "held fcntl");
    let other = parent_lock_dir(&dir, LockMode::Fcntl, 100, 1000);
    assert!(other.try_lock(LOCK).expect("try_lock").is_none());
    holder.0.kill().expect("SIGKILL");
    holder.0.wait().expect("reap");
    // Free at the first look once the holder is dead: the kernel dropped its lock.
    let other = parent_lock_dir(&dir, LockMode::Fcntl, 2000, 1000);
    let g = other
        .try_lock_for(LOCK, Duration::ZERO)
        .expect("try_lock")
        .expect("free after kill");
    assert_eq!(g.kind(), "fcntl");
}
