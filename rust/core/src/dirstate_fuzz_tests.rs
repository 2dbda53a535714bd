//! A stateful property test of the store against a hostile cache directory: random sequences
//! of real operations (put, get, evict, verify with and without repair, several store
//! instances putting at once so that the index is compacted) with hostile state planted
//! between them, written by the crate's own encoders (`snapshot::Writer`,
//! `snapshot::encode_v1`, `journal::JournalRecord::encode`) with random fields: version 1 and 2
//! snapshots whose journal names lead out of the cache (`../`, absolute paths, a planted
//! directory to traverse), whose counts lie and whose totals reach 2^100 and more; journals
//! of random names and records; links into a sibling tree, FIFOs and sparse files of
//! terabytes under legitimate names in every directory.
//!
//! After every step: no file of the sibling tree changed (its targets are the planted links
//! and `../` names); the step returned (a deadline: a hang fails) without a panic; a snapshot
//! the store wrote is one the store can read back; after `verify(repair)` the total is no
//! longer an implausible one.
//!
//! `cargo test -p xla_pcache_core dirstate_` runs a few cases; more and larger with, e.g.,
//! `DIRSTATE_CASES=2000 DIRSTATE_SCALE=20 cargo test --release -p xla_pcache_core dirstate_`.
//! `tests/dirstate_fuzz.py` drives the CLI and the tiers the same way.

use crate::hash::{checksum, entry_name};
use crate::journal::{self, JournalRecord};
use crate::lru::Lru;
use crate::snapshot::{self, JournalMark, Meta};
use crate::store::{Key, Store, StoreOptions};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

/// How long one step may take before it counts as a hang (seconds; `DIRSTATE_DEADLINE`).
fn step_deadline() -> Duration {
    Duration::from_secs(env_num("DIRSTATE_DEADLINE", 60))
}
const DAY: u64 = 86_400;

fn env_num(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn scale() -> u64 {
    env_num("DIRSTATE_SCALE", 1).max(1)
}

/// Where a planted journal name in a snapshot's meta points.
#[derive(Debug, Clone)]
enum JName {
    /// `<host>-<dead pid>-x/../../../outside/<target>`, with that directory planted.
    Traverse(u8),
    /// `../../outside/<target>`: no directory needed.
    Up(u8),
    /// An absolute path to `outside/<target>`.
    Absolute(u8),
    /// A journal of a process that is gone, never written.
    Dead(u32),
    /// Anything: escapes, slashes, dots.
    Odd(String),
}

#[derive(Debug, Clone)]
enum Place {
    Root,
    Entries,
    Shard,
    Journal,
    Index,
    Locks,
    Claims,
    Tmp,
    Trash,
}

#[derive(Debug, Clone)]
enum Step {
    Put {
        keys: Vec<(u8, u32)>,
        budget: Option<u32>,
    },
    Get(Vec<u8>),
    Evict(u32),
    Verify(bool),
    /// Several store instances (each its own journal) put in turn.
    Compact {
        writers: u8,
        puts: u8,
        budget: Option<()>,
    },
    PlantV2 {
        entries: Vec<(u128, u64, u64, u32)>,
        journals: Vec<(JName, bool)>,
        pad_journals: u32,
        total: Option<u128>,
    },
    PlantV1 {
        entries: Vec<(u128, u64, u64)>,
        journals: Vec<(JName, bool)>,
        count_lie: Option<u64>,
        hits: bool,
    },
    PlantJournal {
        name: Option<String>,
        records: Vec<(u8, u128, u64, u64)>,
        old: bool,
    },
    Link {
        place: Place,
        legit: bool,
        target: u8,
    },
    Fifo {
        place: Place,
    },
    Sparse {
        place: Place,
        size: u64,
        magic: u8,
    },
}

const TARGETS: &[&str] = &[
    "precious.log",
    "old.log",
    "victim/precious.log",
    "victim/sub/deep.log",
    "victim/snapshot",
    "victim",
];

fn place() -> impl Strategy<Value = Place> {
    prop_oneof![
        Just(Place::Root),
        Just(Place::Entries),
        Just(Place::Shard),
        Just(Place::Journal),
        Just(Place::Index),
        Just(Place::Locks),
        Just(Place::Claims),
        Just(Place::Tmp),
        Just(Place::Trash),
    ]
}

fn jname() -> impl Strategy<Value = JName> {
    let t = 0..TARGETS.len() as u8;
    prop_oneof![
        3 => t.clone().prop_map(JName::Traverse),
        2 => t.clone().prop_map(JName::Up),
        1 => t.prop_map(JName::Absolute),
        2 => any::<u32>().prop_map(JName::Dead),
        2 => prop_oneof![
            Just("\u{1b}]0;pwned\u{7}h-1-1.log".to_string()),
            Just("\u{1b}[2J".to_string()),
            Just("..".to_string()),
            Just(".".to_string()),
            Just("/".to_string()),
            Just(String::new()),
            "\\PC{0,60}",
            "[a-z./-]{0,40}",
        ]
        .prop_map(JName::Odd),
    ]
}

fn big_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..(1u64 << 20),
        Just(0),
        Just(u64::MAX),
        Just(1 << 62),
        any::<u64>()
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let s = scale() as usize;
    prop_oneof![
        4 => (prop::collection::vec((0u8..24, 1u32..200_000), 1..8), prop::option::of(50_000u32..2_000_000))
            .prop_map(|(keys, budget)| Step::Put { keys, budget }),
        2 => prop::collection::vec(0u8..24, 1..6).prop_map(Step::Get),
        1 => (0u32..1_000_000).prop_map(Step::Evict),
        1 => any::<bool>().prop_map(Step::Verify),
        1 => (2u8..4, 10u8..40, prop::option::of(Just(())))
            .prop_map(|(writers, puts, budget)| Step::Compact { writers, puts, budget }),
        3 => (
            prop::collection::vec((any::<u128>(), big_u64(), any::<u64>(), any::<u32>()), 0..300 * s),
            prop::collection::vec((jname(), any::<bool>()), 0..8),
            prop_oneof![3 => Just(0u32), 1 => 60u32..(200 * s as u32)],
            prop::option::of(prop_oneof![
                Just(1u128 << 100),
                Just(u128::MAX),
                Just(u64::MAX as u128),
                any::<u128>()
            ]),
        )
            .prop_map(|(entries, journals, pad_journals, total)| Step::PlantV2 {
                entries,
                journals,
                pad_journals,
                total,
            }),
        2 => (
            prop::collection::vec((any::<u128>(), big_u64(), any::<u64>()), 0..300 * s),
            prop::collection::vec((jname(), any::<bool>()), 0..8),
            prop::option::of(prop_oneof![Just(u64::MAX), Just(1u64 << 40), 0u64..1000]),
            any::<bool>(),
        )
            .prop_map(|(entries, journals, count_lie, hits)| Step::PlantV1 {
                entries,
                journals,
                count_lie,
                hits,
            }),
        3 => (
            prop::option::of(prop_oneof!["\\PC{1,40}", "[a-z0-9-]{1,20}\\.log"]),
            prop::collection::vec((0u8..6, any::<u128>(), big_u64(), any::<u64>()), 0..60),
            any::<bool>(),
        )
            .prop_map(|(name, records, old)| Step::PlantJournal { name, records, old }),
        2 => (place(), any::<bool>(), 0..TARGETS.len() as u8)
            .prop_map(|(place, legit, target)| Step::Link { place, legit, target }),
        1 => place().prop_map(|place| Step::Fifo { place }),
        1 => (
            place(),
            prop_oneof![Just(1u64 << 40), Just(4u64 << 40), Just(65u64 << 20), Just(1u64 << 30)],
            0u8..4
        )
            .prop_map(|(place, size, magic)| Step::Sparse { place, size, magic }),
    ]
}

struct World {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    outside: PathBuf,
    host: String,
    dead_pid: u32,
    keys: Vec<Vec<u8>>,
    before: BTreeMap<String, String>,
    /// The inode of the snapshot this test planted last (a different one the store wrote).
    planted_snapshot: Option<u64>,
}

fn digest(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = fs::symlink_metadata(&p) else {
                continue;
            };
            let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            let content = if m.is_file() {
                format!("{:x}", checksum(&fs::read(&p).unwrap_or_default()))
            } else if m.file_type().is_symlink() {
                fs::read_link(&p)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            out.insert(
                rel,
                format!("{:o}:{}:{}:{content}", m.mode(), m.len(), m.mtime_nsec()),
            );
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn set_old(p: &Path, days: u64) {
    if let Ok(f) = fs::File::options().write(true).open(p) {
        let _ = f.set_modified(SystemTime::now() - Duration::from_secs(days * DAY));
    }
}

fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    child.wait().expect("wait true");
    child.id()
}

impl World {
    fn new() -> World {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().to_path_buf();
        let root = base.join("cache");
        let outside = base.join("outside");
        fs::create_dir_all(outside.join("victim/sub")).expect("outside");
        for (rel, data) in [
            ("precious.log", &b"precious\n"[..]),
            ("old.log", b"old\n"),
            ("victim/precious.log", b"victim's data\n"),
            ("victim/sub/deep.log", b"deep\n"),
            ("victim/snapshot", b"XPCS not ours"),
        ] {
            fs::write(outside.join(rel), data).expect("outside file");
            set_old(&outside.join(rel), 3);
        }
        let s = Store::open(&root, StoreOptions::default()).expect("open");
        s.put(key(b"seed"), b"v", &[]).expect("put");
        drop(s);
        let before = digest(&outside);
        World {
            _tmp: tmp,
            base,
            root,
            outside,
            host: crate::clock::hostname().to_string(),
            dead_pid: dead_pid(),
            keys: (0..24u8).map(|i| format!("key-{i}").into_bytes()).collect(),
            before,
            planted_snapshot: None,
        }
    }

    fn dir(&self, place: &Place, pick: u128) -> PathBuf {
        let r = &self.root;
        match place {
            Place::Root => r.clone(),
            Place::Entries => r.join("entries"),
            Place::Shard => r
                .join("entries")
                .join(&crate::hash::name_hex(entry_name(&self.keys[pick as usize % 24]))[..2]),
            Place::Journal => r.join("journal"),
            Place::Index => r.join("index"),
            Place::Locks => r.join("locks"),
            Place::Claims => r.join("locks/claims"),
            Place::Tmp => r.join("tmp"),
            Place::Trash => r.join("trash"),
        }
    }

    /// A name the cache itself would use there.
    fn legit_name(&self, place: &Place, pick: u128) -> String {
        let hex = crate::hash::name_hex(entry_name(&self.keys[pick as usize % 24]));
        match place {
            Place::Root => ["misses.log", "FORMAT.tmp", "misses.log.1"][pick as usize % 3].into(),
            Place::Entries => hex[..2].to_string(),
            Place::Shard => hex,
            Place::Journal => journal::file_name(&self.host, self.dead_pid, pick as u64),
            Place::Index => "snapshot".into(),
            Place::Locks => ["evict.lease", "evict.lock"][pick as usize % 2].into(),
            Place::Claims => format!("{hex}.lease"),
            Place::Tmp | Place::Trash => format!(".{hex}.tmp"),
        }
    }

    /// Whether `dir` is reached from the root through real directories only: the test never
    /// plants through a link it planted (that would change the sibling tree itself).
    fn inside(&self, dir: &Path) -> bool {
        let Ok(rel) = dir.strip_prefix(&self.root) else {
            return false;
        };
        let mut p = self.root.clone();
        for c in rel.components() {
            p.push(c);
            match fs::symlink_metadata(&p) {
                Ok(m) if !m.is_dir() => return false,
                _ => {}
            }
        }
        true
    }

    fn place_file(&self, dir: &Path, name: &str, make: impl FnOnce(&Path) -> std::io::Result<()>) {
        if !self.inside(dir) {
            return;
        }
        let _ = fs::create_dir_all(dir);
        let p = dir.join(name);
        if let Ok(m) = fs::symlink_metadata(&p) {
            if m.is_dir() {
                return;
            }
            let _ = fs::remove_file(&p);
        }
        let _ = make(&p);
    }

    fn journal_name(&self, n: &JName) -> (String, Option<PathBuf>) {
        match n {
            JName::Traverse(t) => {
                let stem = format!("{}-{}-x", self.host, self.dead_pid);
                if self.inside(&self.root.join("journal")) {
                    let _ = fs::create_dir_all(self.root.join("journal").join(&stem));
                }
                let target = TARGETS[*t as usize];
                (
                    format!("{stem}/../../../outside/{target}"),
                    Some(self.outside.join(target)),
                )
            }
            JName::Up(t) => {
                let target = TARGETS[*t as usize];
                (
                    format!("../../outside/{target}"),
                    Some(self.outside.join(target)),
                )
            }
            JName::Absolute(t) => {
                let p = self.outside.join(TARGETS[*t as usize]);
                (p.display().to_string(), Some(p))
            }
            JName::Dead(x) => (
                journal::file_name(&self.host, self.dead_pid, *x as u64),
                None,
            ),
            JName::Odd(s) => (s.clone(), None),
        }
    }

    fn marks(&self, journals: &[(JName, bool)], pad: u32) -> Meta {
        let mut meta = Meta::default();
        for (n, exact) in journals {
            let (name, target) = self.journal_name(n);
            // The offset a reader compares with the file's length: equal, so that a
            // compaction takes the journal as fully read.
            let offset = match (&target, exact) {
                (Some(t), true) => fs::symlink_metadata(t).map(|m| m.len()).unwrap_or(0),
                _ => 4,
            };
            meta.journals.push(mark(name, offset));
        }
        for i in 0..pad {
            let name = journal::file_name(&self.host, self.dead_pid, 1_000_000 + i as u64);
            meta.journals.push(mark(name, 0));
        }
        meta
    }

    fn write_snapshot(&mut self, bytes: &[u8]) {
        let p = self.root.join("index/snapshot");
        let tmp = self.root.join("index/.fuzz-snapshot");
        if !self.inside(&self.root.join("index")) {
            return;
        }
        if fs::write(&tmp, bytes).is_ok() && fs::rename(&tmp, &p).is_ok() {
            self.planted_snapshot = fs::symlink_metadata(&p).ok().map(|m| m.ino());
        }
    }

    fn plant(&mut self, step: &Step) {
        match step {
            Step::PlantV2 {
                entries,
                journals,
                pad_journals,
                total,
            } => {
                let meta = self.marks(journals, *pad_journals);
                let mut sorted: Vec<_> = entries.clone();
                for (i, k) in self.keys.iter().enumerate().step_by(3) {
                    sorted.push((entry_name(k), 100 + i as u64, 1, 0));
                }
                sorted.sort_by_key(|e| e.0);
                sorted.dedup_by_key(|e| e.0);
                let tmp = self.base.join("v2.tmp");
                let Ok(f) = fs::File::create(&tmp) else {
                    return;
                };
                let Ok(mut w) = snapshot::Writer::new(f, sorted.len() as u64) else {
                    return;
                };
                for (name, disk_bytes, last_use, hits) in sorted {
                    let info = crate::lru::EntryInfo {
                        disk_bytes,
                        last_use,
                        hits,
                    };
                    if w.push(name, info).is_err() {
                        return;
                    }
                }
                if w.finish(&meta).is_err() {
                    return;
                }
                let Ok(mut bytes) = fs::read(&tmp) else {
                    return;
                };
                if let Some(t) = total {
                    // The header's total lies; its checksum is made to match.
                    bytes[16..32].copy_from_slice(&t.to_le_bytes());
                    let sum = checksum(&bytes[..72]);
                    bytes[72..80].copy_from_slice(&sum.to_le_bytes());
                }
                self.write_snapshot(&bytes);
            }
            Step::PlantV1 {
                entries,
                journals,
                count_lie,
                hits,
            } => {
                let meta = self.marks(journals, 0);
                let mut lru = Lru::default();
                for (name, disk, t) in entries {
                    lru.touch(*name, *disk, *t);
                    if *hits {
                        lru.add_hits(*name, (*t % 7) as u32);
                    }
                }
                let mut bytes = snapshot::encode_v1(&lru, &meta, *hits);
                if let Some(n) = count_lie {
                    // A count that is not the number of records; the checksum matches.
                    bytes[8..16].copy_from_slice(&n.to_le_bytes());
                    let end = bytes.len() - 8;
                    let sum = checksum(&bytes[..end]);
                    bytes[end..].copy_from_slice(&sum.to_le_bytes());
                }
                self.write_snapshot(&bytes);
            }
            Step::PlantJournal { name, records, old } => {
                let name = name
                    .clone()
                    .unwrap_or_else(|| journal::file_name(&self.host, self.dead_pid, 7))
                    .replace(['/', '\0'], "_");
                if name == "." || name == ".." {
                    return;
                }
                let mut buf = Vec::new();
                for (kind, n, a, t) in records {
                    let name = if n % 2 == 0 {
                        entry_name(&self.keys[(*n as usize / 2) % 24])
                    } else {
                        *n
                    };
                    let rec = match kind {
                        0 | 1 => JournalRecord::Touch {
                            name,
                            disk_bytes: *a,
                            t: *t,
                            put: *kind == 0,
                        },
                        2 => JournalRecord::Delete { name, t: *t },
                        3 => JournalRecord::Clear { t: *t },
                        4 => JournalRecord::Stats {
                            counters: vec![*a; (*t % 200) as usize],
                        },
                        _ => {
                            buf.extend_from_slice(&a.to_le_bytes());
                            continue;
                        }
                    };
                    rec.encode(&mut buf);
                }
                let dir = self.root.join("journal");
                self.place_file(&dir, &name, |p| fs::write(p, &buf));
                if *old && self.inside(&dir) {
                    set_old(&dir.join(&name), 2);
                }
            }
            Step::Link {
                place,
                legit,
                target,
            } => {
                let pick = *target as u128 * 7;
                let dir = self.dir(place, pick);
                let name = if *legit {
                    self.legit_name(place, pick)
                } else {
                    "\u{1b}]0;x\u{7}.log".into()
                };
                let t = self.outside.join(TARGETS[*target as usize]);
                self.place_file(&dir, &name, |p| std::os::unix::fs::symlink(&t, p));
            }
            Step::Fifo { place } => {
                let dir = self.dir(place, 5);
                let name = self.legit_name(place, 5);
                self.place_file(&dir, &name, |p| {
                    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
                    // SAFETY: a valid NUL-terminated path.
                    if unsafe { libc::mkfifo(c.as_ptr(), 0o644) } == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
            Step::Sparse { place, size, magic } => {
                let dir = self.dir(place, 11);
                let name = self.legit_name(place, 11);
                self.place_file(&dir, &name, |p| {
                    let f = fs::File::create(p)?;
                    let head: &[u8] = match magic {
                        0 => b"XPCS\x02\0\0\0",
                        1 => b"XPCE",
                        2 => &[0xA5],
                        _ => b"",
                    };
                    std::io::Write::write_all(&mut &f, head)?;
                    f.set_len(*size)
                });
            }
            _ => {}
        }
    }
}

fn mark(name: String, offset: u64) -> JournalMark {
    JournalMark {
        name: crate::dir::Name::forged(&name),
        offset,
        counters: vec![1, 2, 3],
        tiers: Default::default(),
    }
}

fn key(b: &[u8]) -> Key<'_> {
    Key {
        bytes: b,
        is_text: true,
    }
}

fn opts(budget: Option<u32>) -> StoreOptions {
    StoreOptions {
        max_size: budget.map(u64::from),
        // Several stores of one thread put in turn: none evicts while another waits, so a
        // put over the budget would wait the whole timeout for nothing.
        lock_timeout: Duration::from_millis(100),
        ..Default::default()
    }
}

/// Runs one operation on a thread of its own, with a deadline. Errors are allowed (a
/// refused open, a failed write): a panic or a hang is not. Returns what it reports.
fn operate(root: &Path, keys: &[Vec<u8>], step: &Step) -> Result<Option<u64>, String> {
    let (root, keys, step) = (root.to_path_buf(), keys.to_vec(), step.clone());
    let (tx, rx) = mpsc::channel();
    let what: String = format!("{step:?}").chars().take(300).collect();
    std::thread::spawn(move || {
        let n = match &step {
            Step::Compact { writers, .. } => *writers as usize,
            _ => 1,
        };
        let budget = match &step {
            Step::Put { budget, .. } => *budget,
            Step::Compact { budget, .. } => budget.map(|_| 400_000),
            _ => None,
        };
        // Opened first and dropped last, outside the panic guard: a panic inside an
        // operation is reported as one, and then whether dropping the store still returns.
        let stores: Vec<Store> = (0..n)
            .filter_map(|_| Store::open(&root, opts(budget)).ok())
            .collect();
        let body = || -> Option<u64> {
            let s = stores.first()?;
            match &step {
                Step::Put { keys: ks, .. } => {
                    for (k, size) in ks {
                        let v = vec![*k; *size as usize];
                        let _ = s.put(key(&keys[*k as usize % 24]), &v, &[]);
                    }
                    Some(0)
                }
                Step::Get(ks) => Some(
                    ks.iter()
                        .filter(|k| matches!(s.get(key(&keys[**k as usize % 24])), Ok(Some(_))))
                        .count() as u64,
                ),
                Step::Evict(target) => s
                    .evict(Some(u64::from(*target)), None)
                    .ok()
                    .map(|r| r.removed),
                Step::Verify(repair) => {
                    s.verify(*repair, &mut |_, _| {}).ok()?;
                    // What the index says afterwards: after a repair, the files' total.
                    s.stats().ok().map(|st| st.bytes)
                }
                Step::Compact { puts, .. } => {
                    for i in 0..*puts as usize {
                        for (w, s) in stores.iter().enumerate() {
                            let k = &keys[(i * 3 + w) % 24];
                            let _ = s.put(key(k), &vec![w as u8; 1000 + i * 997], &[]);
                        }
                    }
                    Some(stores.len() as u64)
                }
                _ => None,
            }
        };
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).map_err(|p| {
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default()
        });
        let _ = tx.send(Some(out));
        drop(stores);
        let _ = tx.send(None);
    });
    let deadline = step_deadline();
    let out = match rx.recv_timeout(deadline) {
        Ok(Some(Ok(out))) => out,
        Ok(Some(Err(panic))) => {
            let dropped = match rx.recv_timeout(deadline) {
                Ok(_) => "",
                Err(_) => "; then dropping the store hung",
            };
            return Err(format!("panic: {panic}{dropped}: {what}"));
        }
        Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            return Err(format!("panic: {what}"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => return Err(format!("hang: {what}")),
    };
    match rx.recv_timeout(deadline) {
        Ok(_) => Ok(out),
        Err(_) => Err(format!("hang when the store was dropped: {what}")),
    }
}

/// Runs the steps; returns every broken promise (all of them, so that one run names every
/// finding it reaches).
fn run(steps: &[Step]) -> Vec<String> {
    let mut w = World::new();
    let mut broken = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if let Err(e) = run_step(&mut w, i, step) {
            broken.push(e);
        }
    }
    broken
}

fn run_step(w: &mut World, i: usize, step: &Step) -> Result<(), String> {
    {
        let op = matches!(
            step,
            Step::Put { .. }
                | Step::Get(_)
                | Step::Evict(_)
                | Step::Verify(_)
                | Step::Compact { .. }
        );
        if op {
            let out = operate(&w.root, &w.keys, step).map_err(|e| format!("step {i}: {e}"))?;
            if let (Step::Verify(true), Some(bytes)) = (step, out) {
                // Repaired from the files, which total a few MB at most here.
                if bytes > 1 << 40 {
                    return Err(format!(
                        "step {i}: after verify --repair the index says {bytes} bytes"
                    ));
                }
            }
            // A snapshot the store wrote must be one it can read.
            let snap = w.root.join("index/snapshot");
            if let Ok(m) = fs::symlink_metadata(&snap) {
                if m.is_file() && Some(m.ino()) != w.planted_snapshot {
                    let f = fs::File::open(&snap).map_err(|e| e.to_string())?;
                    if let Err(e) = snapshot::Base::open(f, m.len()) {
                        return Err(format!(
                            "step {i} ({step:?}): the store wrote a snapshot of {} bytes \
                             it cannot read: {e}",
                            m.len()
                        ));
                    }
                }
            }
        } else {
            w.plant(step);
            // Whatever is at the snapshot's name now was put there by this test.
            w.planted_snapshot = fs::symlink_metadata(w.root.join("index/snapshot"))
                .ok()
                .map(|m| m.ino());
        }
        let now = digest(&w.outside);
        if now != w.before {
            let changed: Vec<_> = now
                .keys()
                .chain(w.before.keys())
                .filter(|k| now.get(*k) != w.before.get(*k))
                .collect();
            let e = format!(
                "step {i} ({}): files outside the cache changed: {changed:?}",
                format!("{step:?}").chars().take(300).collect::<String>()
            );
            w.before = now;
            return Err(e);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: env_num("DIRSTATE_CASES", 12) as u32,
        failure_persistence: None,
        // Deterministic: a run is reproduced by its seed (`DIRSTATE_SEED`).
        rng_seed: proptest::test_runner::RngSeed::Fixed(env_num("DIRSTATE_SEED", 29)),
        // No shrinking by default: a hang costs a deadline per try (`DIRSTATE_SHRINK=N`).
        max_shrink_iters: env_num("DIRSTATE_SHRINK", 0) as u32,
        ..ProptestConfig::default()
    })]

    #[test]
    fn dirstate_hostile_directory_keeps_the_promises(
        steps in prop::collection::vec(step(), 4..(24 * scale() as usize))
    ) {
        let broken = run(&steps);
        prop_assert!(broken.is_empty(), "{} broken promises:\n{}", broken.len(), broken.join("\n"));
    }
}
