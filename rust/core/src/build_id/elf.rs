//! The GNU build-id note of an ELF file, read from its program headers and note segments
//! (a few small reads; anything unusual reads as no note, and the content is hashed).

use super::ID_MAX;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// ELF headers read to find the build-id note: more program headers or a larger note
/// segment than this is no ordinary shared object, and its content is hashed instead.
const MAX_PHDRS_BYTES: u64 = 64 << 10;
const MAX_NOTES_BYTES: u64 = 64 << 10;
const PT_NOTE: u32 = 4;
const NT_GNU_BUILD_ID: u32 = 3;

/// The GNU build-id of an ELF file, from its note segments; None when it has none, or
/// is no ELF file this reads (its content is then hashed).
pub(super) fn build_id(f: &File) -> Option<Vec<u8>> {
    let mut ident = [0u8; 64];
    f.read_exact_at(&mut ident, 0).ok()?;
    if &ident[..4] != b"\x7fELF" {
        return None;
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return None,
    };
    let rd = Reader { little };
    let (phoff, phentsize, phnum) = if wide {
        (rd.u64(&ident, 32), rd.u16(&ident, 54), rd.u16(&ident, 56))
    } else {
        (
            u64::from(rd.u32(&ident, 28)),
            rd.u16(&ident, 42),
            rd.u16(&ident, 44),
        )
    };
    let entsize = u64::from(phentsize);
    let need = if wide { 56 } else { 32 };
    let total = entsize * u64::from(phnum);
    if entsize < need || total > MAX_PHDRS_BYTES {
        return None;
    }
    let mut phdrs = vec![0u8; total as usize];
    f.read_exact_at(&mut phdrs, phoff).ok()?;
    for ph in phdrs.chunks_exact(entsize as usize) {
        if rd.u32(ph, 0) != PT_NOTE {
            continue;
        }
        let (offset, size, align) = if wide {
            (rd.u64(ph, 8), rd.u64(ph, 32), rd.u64(ph, 48))
        } else {
            (
                u64::from(rd.u32(ph, 4)),
                u64::from(rd.u32(ph, 16)),
                u64::from(rd.u32(ph, 28)),
            )
        };
        if size > MAX_NOTES_BYTES {
            continue;
        }
        let mut notes = vec![0u8; size as usize];
        if f.read_exact_at(&mut notes, offset).is_err() {
            continue;
        }
        if let Some(id) = find_build_id(&notes, rd, if align == 8 { 8 } else { 4 }) {
            return Some(id);
        }
    }
    None
}

fn find_build_id(notes: &[u8], rd: Reader, align: usize) -> Option<Vec<u8>> {
    let pad = |n: usize| n.checked_add(align - 1).map(|v| v / align * align);
    let mut at = 0usize;
    while at.checked_add(12)? <= notes.len() {
        let namesz = rd.u32(notes, at) as usize;
        let descsz = rd.u32(notes, at + 4) as usize;
        let kind = rd.u32(notes, at + 8);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(pad(namesz)?)?;
        let end = desc_at.checked_add(pad(descsz)?)?;
        if desc_at.checked_add(descsz)? > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID
            && notes.get(name_at..name_at + namesz) == Some(b"GNU\0")
            && (1..=ID_MAX).contains(&descsz)
        {
            return Some(notes[desc_at..desc_at + descsz].to_vec());
        }
        at = end;
    }
    None
}

#[derive(Clone, Copy)]
struct Reader {
    little: bool,
}

impl Reader {
    fn bytes<const N: usize>(self, b: &[u8], at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(s) = b.get(at..at + N) {
            out.copy_from_slice(s);
        }
        if !self.little {
            out.reverse();
        }
        out
    }
    fn u16(self, b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(self.bytes(b, at))
    }
    fn u32(self, b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(self.bytes(b, at))
    }
    fn u64(self, b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(self.bytes(b, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build_id::{one, BuildIdRecord, IdKind};

    /// A little-endian ELF64 file with a PT_NOTE segment holding `notes`, then `tail`.
    fn elf(notes: &[u8], tail: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let ph = 64;
        b[ph..ph + 4].copy_from_slice(&PT_NOTE.to_le_bytes());
        b[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes()); // p_offset
        b[ph + 32..ph + 40].copy_from_slice(&(notes.len() as u64).to_le_bytes()); // p_filesz
        b[ph + 48..ph + 56].copy_from_slice(&4u64.to_le_bytes()); // p_align
        b.extend_from_slice(notes);
        b.extend_from_slice(tail);
        b
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend_from_slice(&(name.len() as u32).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(name);
        n.resize(n.len().div_ceil(4) * 4, 0);
        n.extend_from_slice(desc);
        n.resize(n.len().div_ceil(4) * 4, 0);
        n
    }

    #[test]
    fn a_build_id_note_is_the_identity_and_other_bytes_are_not() {
        let t = tempfile::tempdir().unwrap();
        let id = [7u8; 20];
        let notes = [note(b"GNU\0", 5, &[1, 2, 3, 4]), note(b"GNU\0", 3, &id)].concat();
        let p = t.path().join("a.so");
        std::fs::write(&p, elf(&notes, b"code")).unwrap();
        let rec = BuildIdRecord::at(None);
        let a = one(&rec, &p);
        assert_eq!((a.kind, a.id.as_slice()), (IdKind::BuildId, &id[..]));
        // Other bytes, same note: the same build, as the linker named it.
        std::fs::write(&p, elf(&notes, b"other code, appended bytes")).unwrap();
        assert_eq!(one(&rec, &p).id, id.to_vec());
        // No note, a truncated one, a note of another owner, no ELF: the content's BLAKE3.
        let cases: Vec<Vec<u8>> = vec![
            elf(&note(b"GNU\0", 1, &[0; 16]), b"x"),
            elf(&note(b"Go\0\0", 3, &id), b"x"),
            elf(&notes[..notes.len() - 4], b""),
            b"\x7fELF short".to_vec(),
            b"not an ELF file at all".to_vec(),
            Vec::new(),
        ];
        for bytes in cases {
            std::fs::write(&p, &bytes).unwrap();
            let got = one(&rec, &p);
            assert_eq!(got.kind, IdKind::Blake3, "{bytes:?}");
            assert_eq!(got.id, blake3::hash(&bytes).as_bytes().to_vec());
        }
    }
}
