//! Per-process append-only journals of puts, hits, deletes, clears and counters.
//!
//! Exactly one process writes each journal file (O_APPEND is not atomic across NFS
//! clients), with one `write` per record. Every record carries its own checksum, so a
//! reader stops at a torn or not-yet-visible tail and picks up from there next time.
//!
//! ```text
//! record: 0xA5, kind u8, body length u16, body, xxh3-64 of everything before it
//! ```

use crate::dir::{Dir, Kind, Name, Root};
use crate::hash::checksum;
use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;

const MAGIC: u8 = 0xA5;
const MAX_BODY: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalRecord {
    /// An entry was published (`put`) or used (`hit`): it exists with this size on disk.
    Touch {
        name: u128,
        disk_bytes: u64,
        t: u64,
        put: bool,
    },
    /// An entry was removed (deleted, evicted, found corrupt).
    Delete { name: u128, t: u64 },
    /// Every entry last used at or before `t` was removed.
    Clear { t: u64 },
    /// The writer's cumulative counters.
    Stats { counters: Vec<u64> },
    /// The writer's cumulative counters for the remote tier named `tier` (in the order of
    /// `stats::TIER_COUNTER_NAMES`). Readers of versions before it skip the kind.
    TierStats { tier: String, counters: Vec<u64> },
}

const K_PUT: u8 = 1;
const K_HIT: u8 = 2;
const K_DEL: u8 = 3;
const K_CLEAR: u8 = 4;
const K_STATS: u8 = 5;
const K_TIER_STATS: u8 = 6;

impl JournalRecord {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let mut body = Vec::with_capacity(32);
        let kind = match self {
            JournalRecord::Touch {
                name,
                disk_bytes,
                t,
                put,
            } => {
                body.extend_from_slice(&name.to_le_bytes());
                body.extend_from_slice(&disk_bytes.to_le_bytes());
                body.extend_from_slice(&t.to_le_bytes());
                if *put {
                    K_PUT
                } else {
                    K_HIT
                }
            }
            JournalRecord::Delete { name, t } => {
                body.extend_from_slice(&name.to_le_bytes());
                body.extend_from_slice(&t.to_le_bytes());
                K_DEL
            }
            JournalRecord::Clear { t } => {
                body.extend_from_slice(&t.to_le_bytes());
                K_CLEAR
            }
            JournalRecord::Stats { counters } => {
                for c in counters.iter().take(MAX_BODY / 8) {
                    body.extend_from_slice(&c.to_le_bytes());
                }
                K_STATS
            }
            JournalRecord::TierStats { tier, counters } => {
                // Names are at most MAX_TIER_NAME bytes (stats::valid_tier_name).
                let name = &tier.as_bytes()[..tier.len().min(u8::MAX as usize)];
                body.push(name.len() as u8);
                body.extend_from_slice(name);
                for c in counters.iter().take((MAX_BODY - 256) / 8) {
                    body.extend_from_slice(&c.to_le_bytes());
                }
                K_TIER_STATS
            }
        };
        out.push(MAGIC);
        out.push(kind);
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(&body);
        let sum = checksum(&out[start..]);
        out.extend_from_slice(&sum.to_le_bytes());
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u128_at(b: &[u8], at: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    u128::from_le_bytes(a)
}

/// A `TierStats` body: name length, name, counters. A name the core would not keep itself
/// (`stats::valid_tier_name`) makes the record unreadable: it is skipped like an unknown one.
fn tier_stats(body: &[u8]) -> Option<JournalRecord> {
    let len = body[0] as usize;
    let rest = body.len().checked_sub(1 + len)?;
    if rest % 8 != 0 {
        return None;
    }
    let tier = std::str::from_utf8(&body[1..1 + len]).ok()?;
    if !crate::stats::valid_tier_name(tier) {
        return None;
    }
    let counters = (0..rest / 8)
        .map(|i| u64_at(body, 1 + len + i * 8))
        .collect();
    Some(JournalRecord::TierStats {
        tier: tier.to_string(),
        counters,
    })
}

/// Decodes records from `buf`; returns them and how many bytes they used. Stops at the
/// first incomplete or invalid record. Unknown kinds with a valid checksum are skipped, so
/// older readers can follow newer writers (what the readers use: `read_pieces`).
#[cfg(test)]
pub fn decode(buf: &[u8]) -> (Vec<JournalRecord>, usize) {
    let (out, at, _) = decode_noting(buf);
    (out, at)
}

/// `decode`, and whether it skipped a whole record of a kind this release does not know (a
/// later release's).
fn decode_noting(buf: &[u8]) -> (Vec<JournalRecord>, usize, bool) {
    let mut unknown = false;
    let mut out = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 4 {
        if buf[at] != MAGIC {
            break;
        }
        let kind = buf[at + 1];
        let len = u16::from_le_bytes([buf[at + 2], buf[at + 3]]) as usize;
        let end = at + 4 + len;
        if len > MAX_BODY || buf.len() < end + 8 || checksum(&buf[at..end]) != u64_at(buf, end) {
            break;
        }
        let body = &buf[at + 4..end];
        let rec = match (kind, len) {
            (K_PUT | K_HIT, 32) => Some(JournalRecord::Touch {
                name: u128_at(body, 0),
                disk_bytes: u64_at(body, 16),
                t: u64_at(body, 24),
                put: kind == K_PUT,
            }),
            (K_DEL, 24) => Some(JournalRecord::Delete {
                name: u128_at(body, 0),
                t: u64_at(body, 16),
            }),
            (K_CLEAR, 8) => Some(JournalRecord::Clear { t: u64_at(body, 0) }),
            (K_STATS, n) if n % 8 == 0 => Some(JournalRecord::Stats {
                counters: (0..n / 8).map(|i| u64_at(body, i * 8)).collect(),
            }),
            (K_TIER_STATS, n) if n > 0 => tier_stats(body),
            (K_PUT..=K_TIER_STATS, _) => None,
            _ => {
                unknown = true;
                None
            }
        };
        out.extend(rec);
        at = end + 8;
    }
    (out, at, unknown)
}

/// Longest encoded record: a reader holding fewer unread bytes than this may be looking at
/// a tail still being written; holding more, at bytes that are not records.
pub const MAX_RECORD: usize = 4 + MAX_BODY + 8;
/// Journals are read in pieces of this size: memory is bounded whatever the file's length.
const READ_CHUNK: usize = 256 << 10;

/// Reads the records of an open journal from byte `offset` up to `len` (its length as the
/// caller saw it). Returns the records and the offset just past the last whole record.
/// Reads in chunks, and stops at the first bytes that cannot be a record or the start of
/// one: a journal extended with zeros or garbage (`truncate -s 1T`) costs one chunk.
pub fn read_from(f: &File, offset: u64, len: u64) -> io::Result<(Vec<JournalRecord>, u64)> {
    let mut out = Vec::new();
    let at = read_pieces(f, offset, len, |recs, _| {
        out.extend(recs);
        true
    })?;
    Ok((out, at))
}

/// Whether the journal `f`, read up to `len` bytes (as `read_from` reads it), holds a whole
/// record of a kind this release does not know: a later release's, which that release's
/// compaction folds into its own snapshot, and an older one's would lose.
pub fn holds_later_kinds(f: &File, len: u64) -> io::Result<bool> {
    let mut later = false;
    read_pieces(f, 0, len, |_, unknown| {
        later |= unknown;
        !later
    })?;
    Ok(later)
}

/// Reads `f` from `offset` up to `len` a chunk at a time, handing each chunk's whole records,
/// and whether it skipped one of a kind this release does not know, to `each` (which says
/// whether to go on); the offset just past the last whole record read.
fn read_pieces(
    f: &File,
    offset: u64,
    len: u64,
    mut each: impl FnMut(Vec<JournalRecord>, bool) -> bool,
) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    if len <= offset {
        return Ok(offset.min(len));
    }
    let mut at = offset;
    let mut buf: Vec<u8> = Vec::new();
    // No larger than what there is to read (most reads are a few new records).
    let mut chunk = vec![0u8; (len - offset).min(READ_CHUNK as u64) as usize];
    loop {
        let want = (len - at - buf.len() as u64).min(READ_CHUNK as u64) as usize;
        if want == 0 {
            break;
        }
        let n = loop {
            match f.read_at(&mut chunk[..want], at + buf.len() as u64) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let (recs, used, unknown) = decode_noting(&buf);
        at += used as u64;
        buf.drain(..used);
        if !each(recs, unknown) || buf.len() >= MAX_RECORD {
            // Enough, or not a tail being written: bytes that are no record. Stop here.
            break;
        }
    }
    Ok(at)
}

/// The journal file name of a process: `<host>-<pid>-<start time hex>.log`.
pub fn file_name(host: &str, pid: u32, start_ns: u64) -> String {
    format!("{host}-{pid}-{start_ns:x}.log")
}

/// Host and pid from a journal file name.
pub fn parse_file_name(name: &str) -> Option<(&str, u32)> {
    let stem = name.strip_suffix(".log")?;
    let mut parts = stem.rsplitn(3, '-');
    let _start = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    let host = parts.next()?;
    Some((host, pid))
}

/// This process's journal: created on first write, reopened under a new name if another
/// process removed it (compaction of a journal whose owner looked gone), or if this is a
/// forked child of the process that opened it (one writer per journal).
pub struct JournalWriter {
    root: Arc<Root>,
    host: String,
    /// The open journal, its file name, and the pid that opened it.
    file: Option<(File, Name, u32)>,
    buf: Vec<u8>,
}

impl JournalWriter {
    pub fn new(root: Arc<Root>, host: String) -> Self {
        Self {
            root,
            host,
            file: None,
            buf: Vec::with_capacity(64),
        }
    }

    /// The file name of this process's journal, once created.
    pub fn name(&self) -> Option<&Name> {
        self.file.as_ref().map(|(_, n, _)| n)
    }

    #[cfg(test)]
    pub fn path(&self) -> Option<std::path::PathBuf> {
        self.name()
            .map(|n| self.root.path().join("journal").join(n.as_str()))
    }

    fn open(&mut self) -> io::Result<&mut File> {
        let pid = std::process::id();
        if self.file.as_ref().is_some_and(|(_, _, p)| *p != pid) {
            // A forked child: the journal is its parent's.
            self.file = None;
        }
        if self.file.is_none() {
            let name = Name::checked(
                Kind::Journal,
                &file_name(&self.host, pid, crate::clock::unix_ns()),
            )?;
            let f = self.root.open_file(
                &crate::layout::JOURNAL.join(&name),
                libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL,
                0o666,
            )?;
            self.file = Some((f, name, pid));
        }
        match self.file.as_mut() {
            Some((f, _, _)) => Ok(f),
            None => Err(io::Error::other("journal not open")),
        }
    }

    /// Appends records with one write. On failure the journal is dropped and the next
    /// append starts a new file, so a stale NFS handle does not poison the process.
    pub fn append(&mut self, recs: &[JournalRecord]) -> io::Result<()> {
        self.buf.clear();
        for r in recs {
            r.encode(&mut self.buf);
        }
        let buf = std::mem::take(&mut self.buf);
        let res = self.open().and_then(|f| f.write_all(&buf));
        self.buf = buf;
        if res.is_err() {
            self.file = None;
        }
        res
    }

    /// Starts a new journal if the current one was unlinked by someone else.
    pub fn check_alive(&mut self) {
        if let Some((f, _, _)) = &self.file {
            if crate::dir::fstat(f).map(|m| m.nlink() == 0).unwrap_or(true) {
                self.file = None;
            }
        }
    }
}

/// Whether the process that owns a journal is known to be gone. Only same-host owners can
/// be checked; for other hosts the caller decides by age.
pub fn owner_gone(name: &str, this_host: &str) -> Option<bool> {
    let (host, pid) = parse_file_name(name)?;
    if host != this_host {
        return None;
    }
    if pid == std::process::id() {
        return Some(false);
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    Some(rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
}

/// The journals in `dir`, in name order, and how many `*.log` names were skipped for not
/// having a journal's shape (someone else's files: never read, never removed).
pub fn list(dir: &Dir) -> io::Result<(Vec<Name>, u64)> {
    let (names, _) = dir.list_of(Kind::Listed)?;
    let mut out = Vec::new();
    let mut skipped = 0;
    for n in names {
        if !n.as_str().ends_with(".log") {
            continue;
        }
        match Name::new(Kind::Journal, n.as_str()) {
            Some(j) => out.push(j),
            None => skipped += 1,
        }
    }
    out.sort();
    Ok((out, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn sample() -> Vec<JournalRecord> {
        vec![
            JournalRecord::Touch {
                name: 7,
                disk_bytes: 4096,
                t: 1,
                put: true,
            },
            JournalRecord::Touch {
                name: u128::MAX,
                disk_bytes: 1,
                t: 2,
                put: false,
            },
            JournalRecord::Delete { name: 7, t: 3 },
            JournalRecord::Clear { t: 4 },
            JournalRecord::Stats {
                counters: vec![1, 2, 3],
            },
            JournalRecord::TierStats {
                tier: "s3".into(),
                counters: vec![4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
            },
        ]
    }

    #[test]
    fn tier_stats_with_a_name_the_core_would_not_keep_are_skipped() {
        let mut buf = Vec::new();
        for tier in ["S3", "a/b", ""] {
            JournalRecord::TierStats {
                tier: tier.into(),
                counters: vec![1],
            }
            .encode(&mut buf);
        }
        JournalRecord::Clear { t: 9 }.encode(&mut buf);
        let (recs, used) = decode(&buf);
        assert_eq!(recs, vec![JournalRecord::Clear { t: 9 }]);
        assert_eq!(used, buf.len());
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        for r in sample() {
            r.encode(&mut buf);
        }
        let (recs, used) = decode(&buf);
        assert_eq!(recs, sample());
        assert_eq!(used, buf.len());
    }

    #[test]
    fn torn_tail_stops_the_reader() {
        let mut buf = Vec::new();
        for r in sample() {
            r.encode(&mut buf);
        }
        let whole = buf.len();
        JournalRecord::Touch {
            name: 9,
            disk_bytes: 1,
            t: 5,
            put: true,
        }
        .encode(&mut buf);
        for cut in whole..buf.len() {
            let (recs, used) = decode(&buf[..cut]);
            assert_eq!(recs.len(), sample().len());
            assert_eq!(used, whole);
        }
        let mut flipped = buf.clone();
        flipped[whole + 10] ^= 1;
        assert_eq!(decode(&flipped).1, whole);
    }

    fn root() -> (tempfile::TempDir, Arc<Root>) {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("journal")).unwrap();
        let r = Arc::new(Root::open(d.path()).unwrap());
        (d, r)
    }

    fn read_path(p: &std::path::Path, offset: u64) -> (Vec<JournalRecord>, u64) {
        let f = File::open(p).unwrap();
        let len = f.metadata().unwrap().len();
        read_from(&f, offset, len).unwrap()
    }

    #[test]
    fn writer_appends_and_reader_tails() {
        let (_d, r) = root();
        let mut w = JournalWriter::new(r, "h".into());
        w.append(&sample()[..2]).unwrap();
        let p = w.path().unwrap();
        let (a, off) = read_path(&p, 0);
        assert_eq!(a.len(), 2);
        w.append(&sample()[2..]).unwrap();
        let (b, off2) = read_path(&p, off);
        assert_eq!(b, sample()[2..].to_vec());
        assert_eq!(off2, fs::metadata(&p).unwrap().len());
        let (c, off3) = read_path(&p, off2);
        assert!(c.is_empty());
        assert_eq!(off3, off2);
    }

    #[test]
    fn a_huge_sparse_journal_is_read_in_one_chunk() {
        let (_d, r) = root();
        let mut w = JournalWriter::new(r, "h".into());
        w.append(&sample()).unwrap();
        let p = w.path().unwrap();
        let good = fs::metadata(&p).unwrap().len();
        let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(1 << 40).unwrap();
        let (recs, end) = read_path(&p, 0);
        assert_eq!(recs, sample());
        assert_eq!(end, good);
    }

    #[test]
    fn records_across_chunk_boundaries_are_read() {
        let (_d, r) = root();
        let mut w = JournalWriter::new(r, "h".into());
        let many: Vec<JournalRecord> = (0..20_000u64)
            .map(|i| JournalRecord::Touch {
                name: i as u128,
                disk_bytes: i,
                t: i,
                put: true,
            })
            .collect();
        w.append(&many).unwrap();
        let p = w.path().unwrap();
        let (recs, end) = read_path(&p, 0);
        assert_eq!(recs, many);
        assert_eq!(end, fs::metadata(&p).unwrap().len());
    }

    #[test]
    fn writer_reopens_after_unlink() {
        let (_d, r) = root();
        let mut w = JournalWriter::new(r, "h".into());
        w.append(&sample()[..1]).unwrap();
        let p = w.path().unwrap();
        fs::remove_file(&p).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        w.check_alive();
        w.append(&sample()[..1]).unwrap();
        assert_ne!(w.path().unwrap(), p);
        assert!(w.path().unwrap().exists());
    }

    #[test]
    fn names_parse() {
        let n = file_name("host-a.example", 1234, 0xabc);
        assert_eq!(parse_file_name(&n), Some(("host-a.example", 1234)));
        let host = crate::clock::hostname();
        for t in [0, 1, u64::MAX] {
            let n = file_name(host, u32::MAX, t);
            assert!(Name::new(Kind::Journal, &n).is_some(), "{n}");
        }
        assert_eq!(parse_file_name("junk"), None);
        assert_eq!(owner_gone(&file_name("other", 1, 1), "me"), None);
        assert_eq!(
            owner_gone(&file_name("me", std::process::id(), 1), "me"),
            Some(false)
        );
    }
}
