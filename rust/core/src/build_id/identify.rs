//! One file's identity: from the record where the file's stat still matches, else
//! computed (its build-id note, else the BLAKE3 of its content) and given a slot to remember.

use super::elf::build_id;
use super::maps::{loaded, Mapped};
use super::record::Slot;
use super::{FileId, IdKind, StatKey};
use crate::dir;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Hashed in pieces of this size, each on every core.
const PIECE: usize = 16 << 20;

/// One file: its identity, and a slot to remember when it was computed now.
pub(super) fn identify_one(
    path: &Path,
    slots: &[Slot],
    mapped: &[Mapped],
) -> io::Result<(FileId, Option<Slot>)> {
    // The install's own path, links and all: a framework found through a link is the
    // user's setup. A remembered file costs this one `stat`.
    let known = std::fs::metadata(path).ok().and_then(|m| {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| (s.max(0) as u64) * 1_000_000_000 + n.max(0) as u64;
        let key: StatKey = [
            m.dev(),
            m.ino(),
            m.len(),
            ns(m.mtime(), m.mtime_nsec()),
            ns(m.ctime(), m.ctime_nsec()),
        ];
        let slot = slots.iter().find(|s| s.key == key && m.is_file())?;
        Some((key, slot))
    });
    if let Some((key, s)) = known {
        return Ok((s.remembered(&key, loaded(path, &key, mapped)), None));
    }
    // Not blocking on a FIFO; a non-file is an error.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(path)?;
    let st = dir::fstat(&f)?;
    if !st.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is {}, not a regular file", path.display(), st.kind()),
        ));
    }
    let key: StatKey = [st.dev(), st.ino(), st.len(), st.mtime_ns(), st.ctime_ns()];
    let loaded = loaded(path, &key, mapped);
    if let Some(s) = slots.iter().find(|s| s.key == key) {
        return Ok((s.remembered(&key, loaded), None));
    }
    let (kind, id) = match build_id(&f) {
        Some(id) => (IdKind::BuildId, id),
        None => (IdKind::Blake3, content_digest(&f, key[2])?.to_vec()),
    };
    // Changed while it was read: the identity is this process's, not remembered.
    let after = dir::fstat(&f)?;
    let same = [
        after.dev(),
        after.ino(),
        after.len(),
        after.mtime_ns(),
        after.ctime_ns(),
    ] == key;
    let slot = same.then(|| Slot {
        key,
        kind,
        id: id.clone(),
    });
    let id = FileId {
        kind,
        id,
        changed_ns: key[4],
        size: key[2],
        computed: true,
        loaded,
    };
    Ok((id, slot))
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

/// The BLAKE3 of `len` bytes of `f`, a piece at a time, each piece on every core.
fn content_digest(f: &File, len: u64) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; PIECE.min(len as usize).max(1)];
    let mut at = 0u64;
    loop {
        let n = f.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        h.update_rayon(&buf[..n]);
        at += n as u64;
    }
    Ok(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build_id::{mapped_objects, one, BuildIdRecord, Loaded};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_real_shared_object_is_read() {
        // The test binary's own libc: whatever it holds, a result and no panic.
        let libc_path = mapped_objects()
            .into_iter()
            .find(|m| {
                m.path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
            })
            .map(|m| m.path);
        if let Some(p) = libc_path {
            let got = BuildIdRecord::at(None)
                .identify(&[p], &mapped_objects())
                .remove(0)
                .unwrap();
            assert!(!got.id.is_empty());
            assert_eq!(got.loaded, Loaded::Same);
        }
    }

    #[test]
    fn appended_bytes_make_another_digest_and_the_record_spares_the_second_hash() {
        let t = tempfile::tempdir().unwrap();
        let rec_dir = t.path().join("rec");
        let p = t.path().join("lib.so");
        let big: Vec<u8> = (0..(PIECE + 12345)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &big).unwrap();
        let rec = BuildIdRecord::at(Some(rec_dir.clone()));
        let first = one(&rec, &p);
        assert!(first.computed);
        assert_eq!(first.id, blake3::hash(&big).as_bytes().to_vec());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&rec_dir), 0o700);
        assert_eq!(mode(&rec_dir.join("record")), 0o600);
        // A later process: from the record.
        let later = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
        assert_eq!((later.computed, &later.id), (false, &first.id));
        // The same size and mtime, other bytes (a reinstall that kept both): the ctime
        // moved, so the file is hashed again.
        let st = std::fs::metadata(&p).unwrap();
        let mut other = big.clone();
        other[10] ^= 1;
        std::fs::write(&p, &other).unwrap();
        let f = File::options().write(true).open(&p).unwrap();
        f.set_times(std::fs::FileTimes::new().set_modified(st.modified().unwrap()))
            .unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().modified().unwrap(),
            st.modified().unwrap()
        );
        let again = one(&BuildIdRecord::at(Some(rec_dir.clone())), &p);
        assert!(again.computed);
        assert_eq!(again.id, blake3::hash(&other).as_bytes().to_vec());
        // Bytes appended after the image: another digest.
        let mut longer = other.clone();
        longer.extend_from_slice(b"appended");
        std::fs::write(&p, &longer).unwrap();
        assert_ne!(one(&rec, &p).id, again.id);
    }
}
