//! The entry file format (version 1): a self-validating header, then the payload.
//!
//! ```text
//! offset size
//!  0      4   magic "XPCE"
//!  4      2   format version (1)
//!  6      2   flags (bit 0: key is UTF-8 text)
//!  8      4   header length (multiple of 64; the payload starts here)
//! 12      4   key length
//! 16      4   metadata length
//! 20      4   reserved, 0
//! 24      8   payload length
//! 32      8   xxh3-64 of the payload
//! 40      8   creation time, unix nanoseconds
//! 48      8   reserved, 0
//! 56      8   xxh3-64 of bytes 0..56 and of everything from 64 to the header length
//! 64      -   key, metadata (u16 name length, name, u32 value length, value; repeated), zero padding
//! ```
//! All integers are little-endian. A file is valid only if its length is exactly header
//! length + payload length and both checksums match, so a truncated, extended, torn or
//! foreign file can never pass for an entry.

use crate::hash::{checksum, MAX_KEY_LEN};

pub const MAGIC: [u8; 4] = *b"XPCE";
pub const ENTRY_VERSION: u16 = 1;
pub const FIXED_HEADER: usize = 64;
/// No file smaller than this is an entry of any format: a fixed header and a key of a byte.
pub const ENTRY_MIN_BYTES: usize = FIXED_HEADER + 1;
pub const MAX_META_LEN: usize = 64 * 1024;
const FLAG_TEXT_KEY: u16 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("file too short for an entry header ({0} bytes)")]
    TooShort(u64),
    #[error("bad magic: not an xla_pcache entry")]
    BadMagic,
    #[error("unsupported entry format version {0}")]
    UnsupportedVersion(u16),
    /// A version above `ENTRY_VERSION`: a later release's entry, which this one cannot
    /// read. Not damage: it is a miss, never removed as corrupt (ARCHITECTURE.md, "Formats
    /// of other releases").
    #[error("entry format version {0}, newer than this release's {ENTRY_VERSION}")]
    NewerFormat(u16),
    #[error("header fields out of range")]
    BadHeader,
    #[error("header checksum mismatch")]
    HeaderChecksum,
    #[error("file length {actual} does not match the header ({expected})")]
    BadLength { expected: u64, actual: u64 },
    #[error("payload checksum mismatch")]
    PayloadChecksum,
    #[error("malformed metadata")]
    BadMeta,
}

/// The decoded, verified header of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub key: Vec<u8>,
    pub key_is_text: bool,
    pub meta: Vec<(String, String)>,
    pub header_len: usize,
    pub payload_len: u64,
    pub payload_checksum: u64,
    pub created_ns: u64,
    /// The signature fields (`sign.rs`), split off `meta`; None for an unsigned entry.
    pub signature: Option<SigFields>,
}

impl Header {
    pub fn file_len(&self) -> u64 {
        (self.header_len as u64).saturating_add(self.payload_len)
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The header's xxh3, on the portable path whatever `hash::active` says (the same value):
/// a header is a few hundred bytes, where the vector kernels gain nothing, and asking the CPU
/// which of them it has costs a process tens of microseconds in a virtual machine (each
/// CPUID exits to the hypervisor). A trusting reader, which hashes payloads with BLAKE3
/// (whose own CPU probe it pays anyway), would pay for that probe on its first header only.
pub(crate) fn header_checksum(header: &[u8]) -> u64 {
    let mut h = crate::hash::Checksum::with(crate::hash::HashImpl::Portable);
    h.update(&header[..56]);
    h.update(&header[FIXED_HEADER..]);
    h.digest()
}

pub(crate) fn encode_meta(meta: &[(String, String)]) -> Result<Vec<u8>, EntryError> {
    let mut out = Vec::new();
    for (k, v) in meta {
        let k_len = u16::try_from(k.len()).map_err(|_| EntryError::BadMeta)?;
        let v_len = u32::try_from(v.len()).map_err(|_| EntryError::BadMeta)?;
        out.extend_from_slice(&k_len.to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&v_len.to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    if out.len() > MAX_META_LEN {
        return Err(EntryError::BadMeta);
    }
    Ok(out)
}

fn decode_meta(mut b: &[u8]) -> Result<Vec<(String, String)>, EntryError> {
    let mut out = Vec::new();
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, EntryError> {
        if b.len() < n {
            return Err(EntryError::BadMeta);
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head.to_vec())
    };
    while !b.is_empty() {
        let k_len = u16::from_le_bytes(
            take(&mut b, 2)?
                .try_into()
                .map_err(|_| EntryError::BadMeta)?,
        );
        let k = take(&mut b, k_len as usize)?;
        let v_len = u32::from_le_bytes(
            take(&mut b, 4)?
                .try_into()
                .map_err(|_| EntryError::BadMeta)?,
        );
        let v = take(&mut b, v_len as usize)?;
        let k = String::from_utf8(k).map_err(|_| EntryError::BadMeta)?;
        let v = String::from_utf8(v).map_err(|_| EntryError::BadMeta)?;
        out.push((k, v));
    }
    Ok(out)
}

/// Encodes the header for a payload of `payload_len` bytes whose checksum is `payload_checksum`.
pub fn encode_header(
    key: &[u8],
    key_is_text: bool,
    meta: &[(String, String)],
    payload_len: u64,
    payload_checksum: u64,
    created_ns: u64,
) -> Result<Vec<u8>, EntryError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(EntryError::BadHeader);
    }
    let meta_bytes = encode_meta(meta)?;
    let used = FIXED_HEADER + key.len() + meta_bytes.len();
    let header_len = used.div_ceil(64) * 64;
    let mut h = vec![0u8; header_len];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&ENTRY_VERSION.to_le_bytes());
    let flags = if key_is_text { FLAG_TEXT_KEY } else { 0 };
    h[6..8].copy_from_slice(&flags.to_le_bytes());
    h[8..12].copy_from_slice(&(header_len as u32).to_le_bytes());
    h[12..16].copy_from_slice(&(key.len() as u32).to_le_bytes());
    h[16..20].copy_from_slice(&(meta_bytes.len() as u32).to_le_bytes());
    h[24..32].copy_from_slice(&payload_len.to_le_bytes());
    h[32..40].copy_from_slice(&payload_checksum.to_le_bytes());
    h[40..48].copy_from_slice(&created_ns.to_le_bytes());
    h[FIXED_HEADER..FIXED_HEADER + key.len()].copy_from_slice(key);
    h[FIXED_HEADER + key.len()..used].copy_from_slice(&meta_bytes);
    let sum = header_checksum(&h);
    h[56..64].copy_from_slice(&sum.to_le_bytes());
    Ok(h)
}

/// Sets the payload checksum of an encoded header (and its header checksum), for writers
/// that hash the payload as they write it.
pub fn set_payload_checksum(header: &mut [u8], payload_checksum: u64) {
    header[32..40].copy_from_slice(&payload_checksum.to_le_bytes());
    let sum = header_checksum(header);
    header[56..64].copy_from_slice(&sum.to_le_bytes());
}

/// The length of the whole file an entry's first 64 bytes describe (header + payload),
/// after the checks that can be made on them alone: lets a reader refuse a file whose size
/// disagrees before it allocates anything for it.
pub fn expected_file_len(fixed: &[u8]) -> Result<u64, EntryError> {
    let hl = header_len(fixed)? as u64;
    let payload = u64::from_le_bytes(
        fixed[24..32]
            .try_into()
            .map_err(|_| EntryError::BadHeader)?,
    );
    hl.checked_add(payload).ok_or(EntryError::BadHeader)
}

/// Length of the whole header, read from its first 64 bytes, after the checks that can be
/// made on them alone. Lets a reader that only wants the header know how much to read.
pub fn header_len(fixed: &[u8]) -> Result<usize, EntryError> {
    if fixed.len() < FIXED_HEADER {
        return Err(EntryError::TooShort(fixed.len() as u64));
    }
    if fixed[0..4] != MAGIC {
        return Err(EntryError::BadMagic);
    }
    let version = u16_at(fixed, 4);
    if version > ENTRY_VERSION {
        return Err(EntryError::NewerFormat(version));
    }
    if version != ENTRY_VERSION {
        return Err(EntryError::UnsupportedVersion(version));
    }
    let header_len = u32_at(fixed, 8) as usize;
    let key_len = u32_at(fixed, 12) as usize;
    let meta_len = u32_at(fixed, 16) as usize;
    if key_len == 0
        || key_len > MAX_KEY_LEN
        || meta_len > MAX_META_LEN
        || !header_len.is_multiple_of(64)
        || header_len < FIXED_HEADER + key_len + meta_len
        || header_len > (FIXED_HEADER + key_len + meta_len).div_ceil(64) * 64
    {
        return Err(EntryError::BadHeader);
    }
    Ok(header_len)
}

/// The key an entry file's first bytes `head` name, and whether it is text: read from the
/// fixed header's magic, version and key length alone, whatever else the head holds (nothing
/// past them is checked: what a caller fetches under that key is verified whole, and a head
/// forged to name a key leads it to nothing a marker naming that key could not). An error
/// when no key is there: `NewerFormat` for a later release's entry, whose layout this release
/// does not know.
pub fn head_key(head: &[u8]) -> Result<(Vec<u8>, bool), EntryError> {
    if head.len() < FIXED_HEADER {
        return Err(EntryError::TooShort(head.len() as u64));
    }
    if head[0..4] != MAGIC {
        return Err(EntryError::BadMagic);
    }
    match u16_at(head, 4) {
        ENTRY_VERSION => {}
        v if v > ENTRY_VERSION => return Err(EntryError::NewerFormat(v)),
        v => return Err(EntryError::UnsupportedVersion(v)),
    }
    let key_len = u32_at(head, 12) as usize;
    if key_len == 0 || key_len > MAX_KEY_LEN {
        return Err(EntryError::BadHeader);
    }
    let key = head
        .get(FIXED_HEADER..FIXED_HEADER + key_len)
        .ok_or(EntryError::TooShort(head.len() as u64))?;
    Ok((key.to_vec(), u16_at(head, 6) & FLAG_TEXT_KEY != 0))
}

/// Decodes and verifies the header at the start of `buf` (which must hold the whole header;
/// the payload is not looked at).
pub fn decode_header(buf: &[u8]) -> Result<Header, EntryError> {
    let header_len = header_len(buf)?;
    if buf.len() < header_len {
        return Err(EntryError::TooShort(buf.len() as u64));
    }
    let h = &buf[..header_len];
    if header_checksum(h) != u64_at(h, 56) {
        return Err(EntryError::HeaderChecksum);
    }
    let key_len = u32_at(h, 12) as usize;
    let meta_len = u32_at(h, 16) as usize;
    let key_end = FIXED_HEADER + key_len;
    let (meta, signature) = split_meta(decode_meta(&h[key_end..key_end + meta_len])?);
    Ok(Header {
        key: h[FIXED_HEADER..key_end].to_vec(),
        key_is_text: u16_at(h, 6) & FLAG_TEXT_KEY != 0,
        meta,
        signature,
        header_len,
        payload_len: u64_at(h, 24),
        payload_checksum: u64_at(h, 32),
        created_ns: u64_at(h, 40),
    })
}

/// Verifies a whole entry file held in memory: header, exact length, payload checksum.
/// On success the payload is `file[header.header_len..]`.
pub fn verify(file: &[u8]) -> Result<Header, EntryError> {
    let header = decode_header(file)?;
    if header.file_len() != file.len() as u64 {
        return Err(EntryError::BadLength {
            expected: header.file_len(),
            actual: file.len() as u64,
        });
    }
    if checksum(&file[header.header_len..]) != header.payload_checksum {
        return Err(EntryError::PayloadChecksum);
    }
    Ok(header)
}

// ---- Signed entries: the reserved metadata fields (what they sign is in sign.rs).

/// Reserved metadata names (never accepted from a producer).
pub const META_PREFIX: &str = "xla_pcache.sig.";
pub const META_SIGNER: &str = "xla_pcache.sig.signer";
pub const META_DIGEST: &str = "xla_pcache.sig.blake3";
pub const META_SIGNATURE: &str = "xla_pcache.sig.ed25519";

/// The signature fields of an entry, as they were read (possibly malformed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigFields {
    pub signer: String,
    pub digest: Option<[u8; 32]>,
    pub signature: Option<[u8; 64]>,
}

pub(crate) fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

pub(crate) fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Splits the reserved signature fields off an entry's metadata.
pub fn split_meta(meta: Vec<(String, String)>) -> (Vec<(String, String)>, Option<SigFields>) {
    if !meta.iter().any(|(k, _)| k.starts_with(META_PREFIX)) {
        return (meta, None);
    }
    let mut producer = Vec::with_capacity(meta.len());
    let mut sig = SigFields {
        signer: String::new(),
        digest: None,
        signature: None,
    };
    for (k, v) in meta {
        match k.as_str() {
            META_SIGNER => sig.signer = v,
            META_DIGEST => sig.digest = unhex(&v),
            META_SIGNATURE => sig.signature = unhex(&v),
            k if k.starts_with(META_PREFIX) => {}
            _ => producer.push((k, v)),
        }
    }
    (producer, Some(sig))
}

/// The signer's name in a list of signature fields.
pub fn fields_signer(fields: &[(String, String)]) -> Option<String> {
    fields
        .iter()
        .find(|(k, _)| k == META_SIGNER)
        .map(|(_, v)| v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &[u8], payload: &[u8]) -> Vec<u8> {
        let meta = vec![
            ("framework".to_string(), "jax".to_string()),
            ("v".into(), "0.10.2".into()),
        ];
        let mut f = encode_header(
            key,
            true,
            &meta,
            payload.len() as u64,
            checksum(payload),
            42,
        )
        .unwrap();
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn round_trip() {
        let f = entry(b"my key", b"hello world");
        let h = verify(&f).unwrap();
        assert_eq!(h.key, b"my key");
        assert!(h.key_is_text);
        assert_eq!(h.created_ns, 42);
        assert_eq!(h.meta[0], ("framework".into(), "jax".into()));
        assert_eq!(&f[h.header_len..], b"hello world");
        assert_eq!(h.header_len % 64, 0);
    }

    #[test]
    fn checksum_set_after_encoding_verifies() {
        let payload = b"streamed payload";
        let mut h = encode_header(b"k", false, &[], payload.len() as u64, 0, 7).unwrap();
        set_payload_checksum(&mut h, checksum(payload));
        h.extend_from_slice(payload);
        assert_eq!(verify(&h).unwrap().payload_checksum, checksum(payload));
    }

    #[test]
    fn empty_payload_is_valid() {
        let f = entry(b"k", b"");
        assert_eq!(verify(&f).unwrap().payload_len, 0);
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let f = entry(b"key", &[7u8; 300]);
        for i in 0..f.len() {
            for bit in [0x01u8, 0x80] {
                let mut g = f.clone();
                g[i] ^= bit;
                assert!(
                    verify(&g).is_err(),
                    "flip of bit {bit:#x} at byte {i} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_caught() {
        let f = entry(b"key", &[9u8; 200]);
        for n in 0..f.len() {
            assert!(
                verify(&f[..n]).is_err(),
                "truncation to {n} bytes went unnoticed"
            );
        }
    }

    #[test]
    fn extension_is_caught() {
        let mut f = entry(b"key", b"payload");
        f.push(0);
        assert!(matches!(verify(&f), Err(EntryError::BadLength { .. })));
    }

    #[test]
    fn empty_and_garbage_files_are_rejected() {
        assert_eq!(verify(b""), Err(EntryError::TooShort(0)));
        assert_eq!(verify(&[0xAB; 4096]), Err(EntryError::BadMagic));
        let mut g = vec![0u8; 200];
        g[..4].copy_from_slice(&MAGIC);
        assert!(verify(&g).is_err());
    }

    #[test]
    fn a_newer_version_is_told_from_damage() {
        let mut f = entry(b"key", b"x");
        f[4] = 2;
        assert_eq!(verify(&f), Err(EntryError::NewerFormat(2)));
        // Told from the first 64 bytes alone, whatever follows them.
        assert_eq!(
            header_len(&f[..FIXED_HEADER]),
            Err(EntryError::NewerFormat(2))
        );
        f[4] = 0;
        assert_eq!(verify(&f), Err(EntryError::UnsupportedVersion(0)));
    }

    #[test]
    fn a_heads_key_is_read_from_its_first_bytes() {
        let f = entry(b"the key", &[1u8; 9000]);
        assert_eq!(head_key(&f[..100]), Ok((b"the key".to_vec(), true)));
        // The key cut off by the head's end: no key.
        assert!(head_key(&f[..FIXED_HEADER + 3]).is_err());
        let mut newer = f.clone();
        newer[4] = 7;
        assert_eq!(head_key(&newer), Err(EntryError::NewerFormat(7)));
        assert_eq!(head_key(b"garbage"), Err(EntryError::TooShort(7)));
    }

    #[test]
    fn bad_keys_cannot_be_encoded() {
        assert!(encode_header(b"", false, &[], 0, 0, 0).is_err());
        assert!(encode_header(&vec![1u8; MAX_KEY_LEN + 1], false, &[], 0, 0, 0).is_err());
        assert!(encode_header(&vec![1u8; MAX_KEY_LEN], false, &[], 0, 0, 0).is_ok());
    }

    #[test]
    fn meta_round_trips_with_unicode() {
        let meta = vec![("é".to_string(), "ü\n\0".to_string())];
        let h = encode_header(b"k", false, &meta, 0, checksum(b""), 1).unwrap();
        assert_eq!(decode_header(&h).unwrap().meta, meta);
    }
}
