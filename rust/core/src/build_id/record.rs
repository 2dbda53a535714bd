//! The record's file: its format, read and written as a file of this user's own (`owndir`:
//! mode 0600, in a directory no one else may write, opened with no link followed, bounded,
//! replaced whole).
//!
//! Layout of `record` (little-endian): 8 bytes of magic, the version (u32), the number of
//! slots (u32), the slots (`SLOT` bytes each: device, inode, size, mtime ns, ctime ns as
//! u64, the kind (u8), the id's length (u8), 6 bytes of padding, the id in 64 bytes), then
//! the xxh3-64 of everything before it. At most `MAX_SLOTS`; the oldest go first.

use super::{FileId, IdKind, Loaded, StatKey, ID_MAX};
use crate::dir::{self, Dir, Name};
use crate::owndir;
use std::fs::File;
use std::io;

const MAGIC: &[u8; 8] = b"xpcbrec\0";
const VERSION: u32 = 1;
pub(super) const HEAD: usize = 16;
pub(super) const SLOT: usize = 5 * 8 + 8 + ID_MAX;
/// Files remembered: a few dozen per installed framework, a few frameworks per user.
pub(super) const MAX_SLOTS: usize = 1024;
const MAX_LEN: u64 = (HEAD + SLOT * MAX_SLOTS + 8) as u64;
const FILE: Name = Name::fixed("record");

#[derive(Clone)]
pub(super) struct Slot {
    pub(super) key: StatKey,
    pub(super) kind: IdKind,
    pub(super) id: Vec<u8>,
}

impl Slot {
    /// The identity this slot remembers, for the file it was found for (`key`, its stat).
    pub(super) fn remembered(&self, key: &StatKey, loaded: Loaded) -> FileId {
        FileId {
            kind: self.kind,
            id: self.id.clone(),
            changed_ns: key[4],
            size: key[2],
            computed: false,
            loaded,
        }
    }
}

impl IdKind {
    /// The kind as the record writes it.
    fn code(self) -> u8 {
        match self {
            IdKind::BuildId => 1,
            IdKind::Blake3 => 2,
        }
    }

    /// The kind the record wrote, if it is one.
    fn from_code(c: u8) -> Option<IdKind> {
        match c {
            1 => Some(IdKind::BuildId),
            2 => Some(IdKind::Blake3),
            _ => None,
        }
    }
}

/// Why a record was not read.
pub(super) enum Refused {
    /// Someone else may control it: never read nor written.
    Hostile(String),
    /// Ours, but not a record: not read; rewritten.
    Garbled(String),
}

/// Whether `dir` holds something at the record's name.
pub(super) fn has_record(dir: &Dir) -> bool {
    dir.stat(&FILE).is_ok()
}

/// Whether the record at the name may be read or replaced: Ok when absent or ours.
pub(super) fn check_file(dir: &Dir) -> Result<(), Refused> {
    match open_record(dir) {
        Ok(_) => Ok(()),
        Err(Refused::Garbled(_)) => Ok(()),
        Err(h) => Err(h),
    }
}

/// The record's file, checked to be a regular file of ours that only we may write; None
/// when there is none.
fn open_record(dir: &Dir) -> Result<Option<(File, u64)>, Refused> {
    let opened = dir.open_file(&FILE, libc::O_RDONLY, 0);
    Ok(owndir::record_file(dir, &FILE, opened)
        .map_err(Refused::Hostile)?
        .map(|(f, st)| (f, st.len())))
}

/// The slots of the record in `dir`: empty when there is none.
pub(super) fn read(dir: &Dir) -> Result<Vec<Slot>, Refused> {
    let Some((f, len)) = open_record(dir)? else {
        return Ok(Vec::new());
    };
    let garbled = |why: &str| Refused::Garbled(format!("{} {why}", dir.display(FILE.as_str())));
    if len > MAX_LEN {
        return Err(garbled(&format!(
            "is {len} bytes, more than a record holds"
        )));
    }
    let bytes = dir::read_capped(&f, MAX_LEN).map_err(|e| garbled(&e.to_string()))?;
    decode(&bytes).map_err(garbled)
}

fn decode(b: &[u8]) -> Result<Vec<Slot>, &'static str> {
    if b.len() < HEAD + 8 {
        return Err("is truncated");
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if crate::hash::checksum(body).to_le_bytes() != sum {
        return Err("does not match its checksum");
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if &b[..8] != MAGIC || u32_at(8) != VERSION {
        return Err("is not a record of this version");
    }
    let n = u32_at(12) as usize;
    if n > MAX_SLOTS || body.len() != HEAD + n * SLOT {
        return Err("is truncated");
    }
    let mut out = Vec::with_capacity(n);
    for s in body[HEAD..].chunks_exact(SLOT) {
        let mut key = [0u64; 5];
        for (i, k) in key.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&s[8 * i..8 * i + 8]);
            *k = u64::from_le_bytes(w);
        }
        let kind = IdKind::from_code(s[40]).ok_or("holds an unknown kind of identity")?;
        let len = s[41] as usize;
        if len == 0 || len > ID_MAX || (kind == IdKind::Blake3 && len != 32) {
            return Err("holds an identity of a bad length");
        }
        out.push(Slot {
            key,
            kind,
            id: s[48..48 + len].to_vec(),
        });
    }
    Ok(out)
}

fn encode(slots: &[Slot]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + SLOT * slots.len() + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
    for s in slots {
        for k in s.key {
            out.extend_from_slice(&k.to_le_bytes());
        }
        out.push(s.kind.code());
        out.push(s.id.len() as u8);
        out.extend_from_slice(&[0u8; 6]);
        let mut id = [0u8; ID_MAX];
        id[..s.id.len()].copy_from_slice(&s.id);
        out.extend_from_slice(&id);
    }
    let sum = crate::hash::checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Writes the record beside the old one and renames it over: readers see one or the
/// other, whole.
pub(super) fn write(dir: &Dir, slots: &[Slot]) -> io::Result<()> {
    owndir::replace_record(dir, &FILE, &encode(slots))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build_id::{one, BuildIdRecord};
    use crate::owndir::spoiled;

    /// Every hostile or garbled record: never trusted (the file is hashed, whatever the
    /// record claims), counted once; a garbled one of ours is rebuilt, a hostile one left.
    #[test]
    fn hostile_or_garbled_records_are_refused_counted_and_never_trusted() {
        let mut cases = spoiled::records();
        cases.extend([
            (
                "truncated",
                (|d| spoiled::set_len(d, 40)) as spoiled::Spoil,
                true,
            ),
            (
                "a slot changed under its checksum",
                |d| spoiled::patch(d, |b| b[HEAD + 48] ^= 0xff),
                true,
            ),
        ]);
        for (what, spoil, rebuilt) in cases {
            let t = tempfile::tempdir().unwrap();
            let rec_dir = t.path().join("rec");
            let p = t.path().join("lib.so");
            std::fs::write(&p, b"the real bytes").unwrap();
            let truth = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p).id;
            // Plant a lie for the file's stat in the record, then spoil the record.
            let st = dir::fstat(&File::open(&p).unwrap()).unwrap();
            let lie = Slot {
                key: [st.dev(), st.ino(), st.len(), st.mtime_ns(), st.ctime_ns()],
                kind: IdKind::Blake3,
                id: vec![0u8; 32],
            };
            let rd = Dir::open_path(&rec_dir, true).unwrap();
            write(&rd, &[lie]).unwrap();
            drop(rd);
            let lied = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
            assert_eq!(
                lied.id,
                vec![0u8; 32],
                "{what}: the user's own record is used"
            );
            spoil(&rec_dir);
            let rec = BuildIdRecord::at(Some(rec_dir.clone()));
            let got = one(&rec, &p);
            assert_eq!(
                (got.id.clone(), got.computed),
                (truth.clone(), true),
                "{what}"
            );
            assert_eq!(rec.take_problems(), 1, "{what}");
            // The next process: a rebuilt record serves it, a hostile one is still refused.
            let next = BuildIdRecord::at(Some(rec_dir.clone()));
            let got = one(&next, &p);
            assert_eq!(got.id, truth, "{what}");
            assert_eq!(
                (got.computed, next.take_problems()),
                (!rebuilt, u64::from(!rebuilt)),
                "{what}"
            );
        }
    }

    #[test]
    fn another_owner_is_refused() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // only root can hand a file to someone else
        }
        let t = tempfile::tempdir().unwrap();
        let rec_dir = t.path().join("rec");
        let p = t.path().join("lib.so");
        std::fs::write(&p, b"bytes").unwrap();
        one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
        for target in [rec_dir.join("record"), rec_dir.clone()] {
            std::os::unix::fs::chown(&target, Some(4242), None).unwrap();
            let rec = BuildIdRecord::at(Some(rec_dir.clone()));
            assert!(one(&rec, &p).computed);
            assert_eq!(rec.take_problems(), 1);
            std::os::unix::fs::chown(&target, Some(0), None).unwrap();
        }
    }
}
