//! The per-user record of signatures already verified: a trusting reader that finds an
//! entry's (public key, signature, signed message) here skips the Ed25519 check it made in an
//! earlier process, and hashes the payload only (the payload's BLAKE3 is still compared with
//! the signed digest: the record vouches for the signature, never for the bytes).
//!
//! The record holds no names and no bytes of the cache, only 32-byte ids: the BLAKE3 (in
//! derive-key mode) of the public key, the signature and the message. An id is found only
//! when a process of this user verified that exact triple, or when someone who can write
//! the record put it there: the file and its directory must belong to this user and be
//! writable by no one else, so that is this user (or root), who can already change what
//! this user's processes run. Anything else there (a link, a FIFO, another owner, group or
//! other write, a truncated, huge or garbled file) is not read: one warning, one count
//! (`take_problems`), and signatures are verified as if there were no record. A garbled
//! file of ours is replaced by the next process that records an id; a hostile one is left
//! alone.
//!
//! Layout of `record` (little-endian): 8 bytes of magic, the version (u32), the number of
//! sorted ids `n` (u32), 256 cumulative counts by first byte (u32 each: `fan[b]` ids start
//! with a byte at most `b`), the `n` sorted ids, then ids appended since (at most
//! `TAIL_READ` are read). A process reads a record of up to 64 KiB (about 2,000 ids) whole,
//! with one `read`, and looks ids up in memory; a larger one's header and appended ids once
//! (two `pread`s), then one `pread` of one first-byte bucket per lookup: its cost does not
//! grow with the record. Nothing is mapped (a home directory on NFS may be replaced under a
//! mapping). A new id is appended with one `write` on an `O_APPEND` handle; once
//! `TAIL_MAX` have been appended, the next writer merges them into a new sorted file,
//! written beside it and renamed over it (readers see the old record or the new, whole).
//! Appends lost to a concurrent rewrite cost a verification later, nothing else. Past
//! `MAX_IDS` the record starts over from the ids appended last.

use crate::dir::{self, Dir, Name};
use crate::owndir;
use crate::record_place::{Found, Place};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

const MAGIC: &[u8; 8] = b"xpcvrec\0";
const VERSION: u32 = 1;
const FIXED: usize = 16;
const HEADER: usize = FIXED + 256 * 4;
const ID: usize = 32;
/// Ids kept sorted; past it the record starts over.
const MAX_IDS: usize = 1 << 16;
/// Ids appended before the next writer merges them into the sorted part.
const TAIL_MAX: usize = 256;
/// Ids read from the appended part: a few more than `TAIL_MAX` (writers racing past it).
const TAIL_READ: usize = 4 * TAIL_MAX;
/// The most ids one first-byte bucket may hold (about 256 on average when full): a bucket
/// read costs at most 64 KiB.
const BUCKET_MAX: usize = 2048;
/// Records up to this size are read whole when opened.
const WHOLE_MAX: u64 = 64 << 10;
/// No record is larger; a larger file is garbled, never read.
const MAX_LEN: u64 = (HEADER + ID * (MAX_IDS + TAIL_READ)) as u64;
const DIR_NAME: &str = "xla_pcache-verified";
const FILE: Name = Name::fixed("record");
const DERIVE_CONTEXT: &str = "xla_pcache 2026 verified Ed25519 signature v1";

pub type Id = [u8; ID];

/// The id of a verified signature: binds the public key, the signature and the message.
pub fn id(public: &[u8; 32], signature: &[u8; 64], message: &[u8]) -> Id {
    let mut h = blake3::Hasher::new_derive_key(DERIVE_CONTEXT);
    h.update(public);
    h.update(signature);
    h.update(message);
    *h.finalize().as_bytes()
}

/// Where the record lives unless told otherwise: `$XDG_CACHE_HOME/xla_pcache-verified`
/// (an absolute `XDG_CACHE_HOME` only, as the XDG spec says), else `$HOME/.cache/...`, and
/// where that cannot be written a directory of this user's own on this host
/// (`record_place`). A directory of its own, beside the default cache
/// (`$XDG_CACHE_HOME/xla_pcache`), not in it: that one may be shared.
pub fn default_place() -> Place {
    Place::default_for(DIR_NAME)
}

/// Why a record was not used.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// Someone else may control it: never read nor written.
    Hostile(String),
    /// Ours, but not a record: not read; replaced by the next write.
    Garbled(String),
}

/// The record of one place, opened on first use.
pub struct VerificationRecord {
    place: Place,
    /// `try_lock` only: a lock held by another thread (or by a thread of the parent at a
    /// fork) means one more verification, never a wait.
    state: Mutex<State>,
    problems: AtomicU64,
    /// A refusal was warned of: a record kept nowhere then goes without another warning.
    warned: AtomicBool,
}

impl std::fmt::Debug for VerificationRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerificationRecord({:?})", self.place.candidates())
    }
}

enum State {
    Unopened,
    Open(Box<Opened>),
}

struct Opened {
    /// The record's directory: the first of the place this user can write. None: there is
    /// none (nothing is recorded; `skipped` says why).
    dir: Option<Found>,
    /// None: no record yet, or a garbled one that the next write replaces.
    file: Option<Loaded>,
    /// `file` is a read-only record of ours outside `dir` (an image's): the first write
    /// carries its ids into `dir`.
    from_image: bool,
    /// Directories refused as someone else's (or holding someone else's record): never
    /// read nor written.
    refused: Vec<PathBuf>,
    /// Why each candidate before `dir` could not be used.
    skipped: Vec<String>,
}

struct Loaded {
    file: File,
    writable: bool,
    /// (device, inode): a rewrite by another process shows as another inode at the name.
    ident: (u64, u64),
    sorted: usize,
    fan: Box<[u32; 256]>,
    /// The appended ids read at open, sorted.
    tail: Vec<Id>,
    /// The file's header and sorted ids, when it was small enough to read whole.
    whole: Option<Vec<u8>>,
    scratch: Vec<u8>,
}

impl VerificationRecord {
    /// The record in `dir` and nowhere else (created, mode 0700, when the first id is
    /// recorded).
    pub fn at(dir: PathBuf) -> VerificationRecord {
        VerificationRecord::in_place(Place::only(dir))
    }

    /// The record in the first usable directory of `place`.
    pub fn in_place(place: Place) -> VerificationRecord {
        VerificationRecord {
            place,
            state: Mutex::new(State::Unopened),
            problems: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    pub fn place(&self) -> &Place {
        &self.place
    }

    /// How many times a record was refused since the last call.
    pub fn take_problems(&self) -> u64 {
        self.problems.swap(0, Ordering::Relaxed)
    }

    /// Opens the record now rather than at the first lookup (a trusting store opens it
    /// with the store: its first get then does not wait for it).
    pub fn open_now(&self) {
        if let Ok(mut st) = self.state.try_lock() {
            self.ensure_open(&mut st);
        }
    }

    /// Whether `id` was recorded. False whenever the record is busy, absent or refused.
    pub fn contains(&self, id: &Id) -> bool {
        let Ok(mut st) = self.state.try_lock() else {
            return false;
        };
        self.ensure_open(&mut st);
        match &mut *st {
            State::Open(o) => o.file.as_mut().is_some_and(|l| l.contains(id)),
            _ => false,
        }
    }

    /// Records `id` (a signature this process just verified). Failures are silent: a
    /// missing id is a verification more, later.
    pub fn add(&self, id: Id) {
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        self.ensure_open(&mut st);
        let State::Open(o) = &mut *st else {
            return;
        };
        match self.add_to(o, id) {
            Ok(()) => {}
            Err(Refused::Hostile(why)) => {
                // Planted since it was opened: that directory is left alone from now on.
                if let Some(found) = o.dir.take() {
                    self.refused(&found.path, &why);
                    o.refused.push(found.path);
                }
                o.file = None;
            }
            Err(Refused::Garbled(e)) => log::debug!(
                "xla_pcache: could not add to the verification record in {:?}: {e}",
                o.dir.as_ref().map(|d| &d.path)
            ),
        }
    }

    /// The record of the place, in the first directory of it this user can write
    /// (`Place::open`; a directory or record someone else may control is refused, and the
    /// next tried). Where that one has no record yet, a read-only one of ours before it (an
    /// image's) is read instead, and carried over by the first write.
    fn ensure_open(&self, st: &mut State) {
        if !matches!(st, State::Unopened) {
            return;
        }
        let mut o = Opened {
            dir: None,
            file: None,
            from_image: false,
            refused: Vec::new(),
            skipped: Vec::new(),
        };
        loop {
            let seen = self.place.open(&o.refused);
            o.skipped = seen.skipped;
            for (at, why) in seen.refused {
                self.refused(&at, &why);
                o.refused.push(at);
            }
            let image = seen.read_only.and_then(|i| match load(&i.dir) {
                Ok(file) => file,
                Err(Refused::Hostile(why) | Refused::Garbled(why)) => {
                    self.refused(&i.path, &why);
                    None
                }
            });
            let Some(found) = seen.found else {
                o.from_image = image.is_some();
                o.file = image;
                break;
            };
            match load(&found.dir) {
                Ok(file) => {
                    o.from_image = file.is_none() && image.is_some();
                    o.file = file.or(image);
                    o.dir = Some(found);
                    break;
                }
                Err(Refused::Hostile(why)) => {
                    self.refused(&found.path, &why);
                    o.refused.push(found.path);
                }
                Err(Refused::Garbled(why)) => {
                    self.refused(&found.path, &why);
                    o.dir = Some(found);
                    break;
                }
            }
        }
        *st = State::Open(Box::new(o));
    }

    fn refused(&self, at: &Path, why: &str) {
        self.problems.fetch_add(1, Ordering::Relaxed);
        self.warned.store(true, Ordering::Relaxed);
        let mut rest = self.place.candidates().iter().skip_while(|c| *c != at);
        let what = match rest.nth(1) {
            Some(next) => format!("the next place is tried ({})", next.display()),
            None => "signatures are verified as if it were absent".to_string(),
        };
        log::warn!(
            "xla_pcache: the verification record in {} is not used: {why}; {what}",
            at.display()
        );
    }

    /// No directory of the place can hold the record: one warning per process (none after
    /// a refusal, which said so).
    fn kept_nowhere(&self, why: &[String]) {
        // Once per process: every trusting store of it would say the same.
        static WARNED: AtomicBool = AtomicBool::new(false);
        if self.warned.load(Ordering::Relaxed) || WARNED.swap(true, Ordering::Relaxed) {
            return;
        }
        log::warn!(
            "xla_pcache: the signatures this process verifies cannot be remembered ({}): \
             every process verifies each entry's signature again (xla-pcache doctor says \
             where the record is looked for)",
            if why.is_empty() {
                "every directory it may be kept in was refused".to_string()
            } else {
                why.join("; ")
            }
        );
    }

    fn add_to(&self, o: &mut Opened, id: Id) -> Result<(), Refused> {
        let io = |e: io::Error| Refused::Garbled(e.to_string());
        let Some(Found { dir, .. }) = &o.dir else {
            self.kept_nowhere(&o.skipped);
            return Ok(());
        };
        if o.from_image {
            // An image's record, read-only: carried over into this directory's, unless
            // another process made one there since.
            o.from_image = false;
            if let (Some(l), Err(_)) = (o.file.take(), dir.stat(&FILE)) {
                let ids = l.all_ids().map_err(io)?;
                rewrite(dir, ids, 0, id).map_err(io)?;
                o.file = load(dir).ok().flatten();
                return Ok(());
            }
        }
        // Another process may have rewritten the record since: append to the file at the
        // name now, not to the one this process opened.
        let current = dir.stat(&FILE).ok();
        let fresh = match (&o.file, &current) {
            (Some(l), Some(s)) => l.ident == (s.dev(), s.ino()),
            (None, None) => true,
            _ => false,
        };
        if !fresh {
            o.file = match load(dir) {
                Ok(l) => l,
                Err(Refused::Garbled(_)) => None,
                Err(hostile) => return Err(hostile),
            };
        }
        if let Some(l) = &o.file {
            if !l.writable {
                return Ok(());
            }
            let len = dir::fstat(&l.file).map_err(io)?.len();
            let tail_bytes = len.saturating_sub((HEADER + ID * l.sorted) as u64);
            if tail_bytes % ID as u64 == 0 && tail_bytes < (ID * TAIL_MAX) as u64 {
                // One write of 32 bytes on an O_APPEND handle: whole or not at all on a
                // local filesystem; a short write leaves a length the next writer notices
                // (not a multiple of 32) and rewrites.
                return (&l.file).write_all(&id).map_err(io);
            }
        }
        let (ids, sorted) = match &o.file {
            Some(l) => (l.all_ids().map_err(io)?, l.sorted),
            None => (Vec::new(), 0),
        };
        rewrite(dir, ids, sorted, id).map_err(io)?;
        o.file = load(dir).ok().flatten();
        Ok(())
    }
}

/// Writes a new sorted record of `ids` (the first `sorted` of them from the sorted part)
/// and `id` beside the old one, and renames it over.
fn rewrite(dir: &Dir, mut ids: Vec<Id>, sorted: usize, id: Id) -> io::Result<()> {
    if ids.len() >= MAX_IDS {
        // Start over from what was appended since the last rewrite.
        ids.drain(..sorted.min(ids.len()));
    }
    ids.push(id);
    owndir::replace_record(dir, &FILE, &encode(ids))
}

impl Loaded {
    fn contains(&mut self, id: &Id) -> bool {
        if self.tail.binary_search(id).is_ok() {
            return true;
        }
        let b = id[0] as usize;
        let lo = if b == 0 { 0 } else { self.fan[b - 1] as usize };
        let hi = self.fan[b] as usize;
        if hi <= lo {
            return false;
        }
        let n = (hi - lo) * ID;
        let at = HEADER + lo * ID;
        let bucket = match &self.whole {
            Some(b) => &b[at..at + n],
            None => {
                self.scratch.resize(n, 0);
                if self
                    .file
                    .read_exact_at(&mut self.scratch, at as u64)
                    .is_err()
                {
                    return false;
                }
                &self.scratch[..n]
            }
        };
        let (mut a, mut z) = (0, hi - lo);
        while a < z {
            let m = (a + z) / 2;
            match bucket[m * ID..(m + 1) * ID].cmp(&id[..]) {
                std::cmp::Ordering::Equal => return true,
                std::cmp::Ordering::Less => a = m + 1,
                std::cmp::Ordering::Greater => z = m,
            }
        }
        false
    }

    /// Every id of the file as it is now: the sorted part, then the appended ids (those
    /// appended since it was opened too; a torn last one left out).
    fn all_ids(&self) -> io::Result<Vec<Id>> {
        let len = dir::fstat(&self.file)?.len().min(MAX_LEN) as usize;
        let whole = HEADER + (len.saturating_sub(HEADER) / ID).min(self.sorted + TAIL_READ) * ID;
        let mut raw = vec![0u8; whole - HEADER];
        self.file.read_exact_at(&mut raw, HEADER as u64)?;
        Ok(raw
            .chunks_exact(ID)
            .filter_map(|c| c.try_into().ok())
            .collect())
    }
}

/// Opens and checks the record in `dir`: Ok(None) when there is none.
fn load(dir: &Dir) -> Result<Option<Loaded>, Refused> {
    let path = || dir.display(FILE.as_str());
    // Read-write to append; read-only where this user may not write (a read-only home).
    let mut writable = true;
    let opened = match dir.open_file(&FILE, libc::O_RDWR | libc::O_APPEND, 0) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS)) => {
            writable = false;
            dir.open_file(&FILE, libc::O_RDONLY, 0)
        }
        other => other,
    };
    let Some((file, st)) = owndir::record_file(dir, &FILE, opened).map_err(Refused::Hostile)?
    else {
        return Ok(None);
    };
    let garbled = |why: &str| Refused::Garbled(format!("{} {why}", path()));
    let len = st.len();
    if len > MAX_LEN {
        return Err(garbled(&format!(
            "is {len} bytes, more than a record holds"
        )));
    }
    if len < HEADER as u64 {
        return Err(garbled("is truncated"));
    }
    // A small record (most are) is read whole, with one read: its lookups then make no
    // system call. A larger one is read a header and a bucket at a time.
    let mut whole = (len <= WHOLE_MAX).then(|| vec![0u8; len as usize]);
    let mut head = [0u8; HEADER];
    let first = match &mut whole {
        Some(b) => file
            .read_exact_at(b, 0)
            .map(|_| head.copy_from_slice(&b[..HEADER])),
        None => file.read_exact_at(&mut head, 0),
    };
    if first.is_err() {
        return Err(garbled("is truncated"));
    }
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    if &head[..8] != MAGIC || u32_at(8) != VERSION {
        return Err(garbled("is not a verification record of this version"));
    }
    let sorted = u32_at(12) as usize;
    let mut fan = [0u32; 256];
    let mut prev = 0usize;
    for (b, f) in fan.iter_mut().enumerate() {
        *f = u32_at(FIXED + 4 * b);
        let v = *f as usize;
        if v < prev || v - prev > BUCKET_MAX {
            return Err(garbled("has an inconsistent index"));
        }
        prev = v;
    }
    if sorted > MAX_IDS || prev != sorted || len < (HEADER + ID * sorted) as u64 {
        return Err(garbled("is truncated"));
    }
    let tail_bytes = ((len - (HEADER + ID * sorted) as u64) as usize / ID).min(TAIL_READ) * ID;
    let at = HEADER + ID * sorted;
    let raw = match &whole {
        Some(b) => b[at..at + tail_bytes].to_vec(),
        None => {
            let mut raw = vec![0u8; tail_bytes];
            if file.read_exact_at(&mut raw, at as u64).is_err() {
                return Err(garbled("is truncated"));
            }
            raw
        }
    };
    if let Some(b) = &mut whole {
        b.truncate(at);
    }
    let mut tail: Vec<Id> = raw
        .chunks_exact(ID)
        .filter_map(|c| c.try_into().ok())
        .collect();
    tail.sort_unstable();
    Ok(Some(Loaded {
        file,
        writable,
        ident: (st.dev(), st.ino()),
        sorted,
        fan: Box::new(fan),
        tail,
        whole,
        scratch: Vec::new(),
    }))
}

/// A record of `ids` (sorted and deduplicated here; a bucket past `BUCKET_MAX` is cut).
fn encode(mut ids: Vec<Id>) -> Vec<u8> {
    ids.sort_unstable();
    ids.dedup();
    let mut counts = [0usize; 256];
    ids.retain(|i| {
        let c = &mut counts[i[0] as usize];
        *c += 1;
        *c <= BUCKET_MAX
    });
    let mut out = Vec::with_capacity(HEADER + ID * ids.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    let mut total = 0u32;
    for c in counts {
        total += c.min(BUCKET_MAX) as u32;
        out.extend_from_slice(&total.to_le_bytes());
    }
    for i in &ids {
        out.extend_from_slice(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owndir::spoiled;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

    fn ids(n: usize, seed: u8) -> Vec<Id> {
        (0..n)
            .map(|i| *blake3::hash(&[seed, (i >> 8) as u8, i as u8]).as_bytes())
            .collect()
    }

    /// A record dir with `ids` recorded through the API, and its path.
    fn filled(root: &Path, ids: &[Id]) -> PathBuf {
        let dir = root.join("rec");
        let r = VerificationRecord::at(dir.clone());
        for i in ids {
            r.add(*i);
        }
        dir
    }

    /// A record dir holding `ids` all in the sorted part.
    fn written(root: &Path, ids: &[Id]) -> PathBuf {
        let dir = root.join("rec");
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let p = dir.join("record");
        std::fs::write(&p, encode(ids.to_vec())).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        dir
    }

    /// What a new process sees: (how many of `ids` it finds, problems counted).
    fn seen(dir: &Path, ids: &[Id]) -> (usize, u64) {
        let r = VerificationRecord::at(dir.to_path_buf());
        let n = ids.iter().filter(|i| r.contains(i)).count();
        (n, r.take_problems())
    }

    #[test]
    fn ids_recorded_are_found_by_a_later_process_and_no_other() {
        let t = tempfile::tempdir().unwrap();
        // More than TAIL_MAX: appends, then a rewrite into the sorted part, then appends.
        let mine = ids(TAIL_MAX + 40, 1);
        let dir = filled(t.path(), &mine);
        assert_eq!(seen(&dir, &mine), (mine.len(), 0));
        assert_eq!(seen(&dir, &ids(50, 2)), (0, 0));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("record")), 0o600);
        let len = std::fs::metadata(dir.join("record")).unwrap().len() as usize;
        assert!(len >= HEADER + ID * mine.len(), "{len}");
        // One process's handle and another's, interleaved: each appends to the current file.
        let a = VerificationRecord::at(dir.clone());
        let b = VerificationRecord::at(dir.clone());
        let more = ids(2 * TAIL_MAX, 3);
        for pair in more.chunks(2) {
            a.add(pair[0]);
            b.add(pair[1]);
        }
        let (found, problems) = seen(&dir, &more);
        assert_eq!(problems, 0);
        // Appends that raced a rewrite may be lost (a verification more), never garbled.
        assert!(found >= more.len() - 2, "{found}");
        assert_eq!(seen(&dir, &mine).0, mine.len());
    }

    #[test]
    fn a_missing_record_is_silent_and_a_missing_home_records_nothing() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(seen(&t.path().join("none"), &ids(3, 1)), (0, 0));
        // A parent that is a file: nothing made, nothing warned.
        std::fs::write(t.path().join("f"), b"x").unwrap();
        let r = VerificationRecord::at(t.path().join("f/rec"));
        r.add(ids(1, 1)[0]);
        assert!(!r.contains(&ids(1, 1)[0]));
    }

    /// Every hostile or garbled state: a recorded id is not found (as without a record),
    /// the refusal is counted once, and a write neither follows nor trusts it.
    #[test]
    fn hostile_or_garbled_records_are_ignored_warned_and_counted() {
        let mine = ids(20, 7);
        let mut cases = spoiled::records();
        cases.extend([
            (
                "truncated",
                (|d| spoiled::set_len(d, (HEADER + ID) as u64)) as spoiled::Spoil,
                true,
            ),
            (
                "truncated inside the header",
                |d| spoiled::set_len(d, 100),
                true,
            ),
            (
                "an inconsistent index",
                |d| {
                    spoiled::patch(d, |b| {
                        b[FIXED..FIXED + 4].copy_from_slice(&u32::MAX.to_le_bytes())
                    })
                },
                true,
            ),
            ("another version", |d| spoiled::patch(d, |b| b[8] = 9), true),
        ]);
        for (what, spoil, replaced) in cases {
            let t = tempfile::tempdir().unwrap();
            let dir = written(t.path(), &mine);
            assert_eq!(seen(&dir, &mine), (mine.len(), 0), "{what}");
            spoil(&dir);
            assert_eq!(seen(&dir, &mine), (0, 1), "{what}");
            // A process that verifies and records: a garbled record of ours is replaced by
            // one that holds the new id; a hostile one is left as it is, and not trusted.
            let r = VerificationRecord::at(dir.clone());
            let new = ids(1, 8)[0];
            assert!(!r.contains(&new));
            r.add(new);
            assert_eq!(r.take_problems(), 1, "{what}");
            let (found, problems) = seen(&dir, &[new]);
            assert_eq!(
                (found == 1, problems),
                (replaced, u64::from(!replaced)),
                "{what}"
            );
        }
    }

    #[test]
    fn a_home_that_cannot_be_written_keeps_the_record_in_the_next_place() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"x").unwrap();
        let next = t.path().join("tmp/xla_pcache-verified-1");
        let place = || Place::of(vec![t.path().join("f/rec"), next.clone()]);
        let mine = ids(5, 3);
        let r = VerificationRecord::in_place(place());
        for id in &mine {
            r.add(*id);
        }
        assert!(next.join("record").is_file());
        let later = VerificationRecord::in_place(place());
        assert!(mine.iter().all(|id| later.contains(id)));
        assert_eq!(later.take_problems(), 0);
    }

    #[test]
    fn a_hostile_record_in_the_first_place_is_left_and_the_next_used() {
        let t = tempfile::tempdir().unwrap();
        let mine = ids(5, 4);
        let first = written(t.path(), &mine);
        std::fs::set_permissions(first.join("record"), std::fs::Permissions::from_mode(0o622))
            .unwrap();
        let planted = std::fs::read(first.join("record")).unwrap();
        let second = t.path().join("second");
        let place = || Place::of(vec![first.clone(), second.clone()]);
        let r = VerificationRecord::in_place(place());
        assert!(
            !r.contains(&mine[0]),
            "a record others may write is never read"
        );
        r.add(mine[1]);
        assert_eq!(r.take_problems(), 1);
        assert_eq!(std::fs::read(first.join("record")).unwrap(), planted);
        let later = VerificationRecord::in_place(place());
        assert!(later.contains(&mine[1]) && !later.contains(&mine[0]));
        assert_eq!(later.take_problems(), 1);
    }

    #[test]
    fn another_owner_is_refused() {
        // The rule itself is owndir's, tested there (`the_rule`); here, the record keeps it.
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if me == 0 {
            // Root can hand the file to someone else: the real check on a real file.
            let t = tempfile::tempdir().unwrap();
            let mine = ids(3, 1);
            let dir = filled(t.path(), &mine);
            std::os::unix::fs::chown(dir.join("record"), Some(4242), None).unwrap();
            assert_eq!(seen(&dir, &mine), (0, 1));
            std::os::unix::fs::chown(dir.join("record"), Some(0), None).unwrap();
            std::os::unix::fs::chown(&dir, Some(4242), None).unwrap();
            assert_eq!(seen(&dir, &mine), (0, 1));
        }
    }

    #[test]
    fn a_torn_append_is_repaired_by_the_next_writer() {
        let t = tempfile::tempdir().unwrap();
        let mine = ids(5, 1);
        let dir = filled(t.path(), &mine);
        let p = dir.join("record");
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&[1u8; 13]).unwrap();
        // The torn id is not an id; the whole ones are read.
        assert_eq!(seen(&dir, &mine), (5, 0));
        let new = ids(1, 9)[0];
        VerificationRecord::at(dir.clone()).add(new);
        assert_eq!(seen(&dir, &mine), (5, 0));
        assert_eq!(seen(&dir, &[new]), (1, 0));
        assert_eq!(
            std::fs::metadata(&p).unwrap().len() as usize % ID,
            HEADER % ID
        );
    }

    #[test]
    fn a_full_record_starts_over() {
        let mut many = ids(MAX_IDS, 1);
        let t = tempfile::tempdir().unwrap();
        let dir = written(t.path(), &many);
        many.sort_unstable();
        assert_eq!(seen(&dir, &many[..100]), (100, 0));
        let extra = ids(TAIL_MAX + 1, 2);
        let r = VerificationRecord::at(dir.clone());
        for i in &extra {
            r.add(*i);
        }
        assert_eq!(seen(&dir, &extra), (extra.len(), 0));
        let len = std::fs::metadata(dir.join("record")).unwrap().len();
        assert_eq!(len as usize, HEADER + ID * extra.len());
        assert_eq!(seen(&dir, &many[..100]), (0, 0));
    }
}
