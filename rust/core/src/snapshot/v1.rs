//! The version-1 format (one checksummed body, entries in no order, optional hit counts
//! after it), written before version 2: read, whole, when found.

#[cfg(test)]
use super::meta::encode_journals;
use super::meta::{check_counts, read_counters, read_journals};
use super::read::Reader;
use super::{Meta, SNAP_MAGIC};
use crate::hash::checksum;
use crate::lru::Lru;
#[cfg(test)]
use crate::stats::N_COUNTERS;

pub(super) const SNAP_VERSION_1: u32 = 1;
/// Per-entry hit counts, appended after the version-1 body.
const HITS_TAG: &[u8; 4] = b"HITS";
/// A version-1 snapshot is read whole and decoded into an in-memory LRU: one larger than
/// this is refused (the index is rebuilt from the journals, `verify --repair` reindexes).
/// A version-1 record is 32 bytes and its hit count 20 more, so this holds 320,000 entries
/// with their hits or 520,000 without. Decoding costs about 200 bytes per entry on top of
/// the file: at 64 MiB (two million entries) a fresh process peaked at 489 MiB, at this cap
/// at 113 MiB (`tests/test_untrusted_disk.py` bounds it).
pub const MAX_V1_LEN: u64 = 16 << 20;

/// Decodes a version-1 snapshot (one checksummed body, entries in no order, optional hit
/// counts after it).
pub fn decode_v1(b: &[u8]) -> Result<(Lru, Meta), String> {
    if b.len() < 32 || &b[..4] != SNAP_MAGIC {
        return Err("bad magic".into());
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if checksum(body) != u64::from_le_bytes(sum.try_into().map_err(|_| "short")?) {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader { b: body, at: 4 };
    if r.u32()? != SNAP_VERSION_1 {
        return Err("unknown version".into());
    }
    let n_entries = r.u64()?;
    let n_journals = r.u32()?;
    let n_counters = r.u32()? as usize;
    check_counts(n_journals, n_counters)?;
    // Checked against what is left before the loop: a count is whatever the file says.
    if n_entries
        .checked_mul(32)
        .is_none_or(|b| b > (r.b.len() - r.at) as u64)
    {
        return Err("truncated".into());
    }
    // Sized once: growing the table by doubling would hold the old and the new one at once.
    // The count was checked against the bytes above, so it is at most MAX_V1_LEN / 32.
    let mut lru = Lru::with_capacity(usize::try_from(n_entries).map_err(|_| "too many entries")?);
    for _ in 0..n_entries {
        let name = r.u128()?;
        let disk_bytes = r.u64()?;
        let last_use = r.u64()?;
        lru.touch(name, disk_bytes, last_use);
    }
    let mut meta = Meta::default();
    read_journals(&mut r, n_journals, n_counters, &mut meta)?;
    meta.base_counters = read_counters(&mut r, n_counters)?;
    if r.at < r.b.len() {
        if r.take(4)? != HITS_TAG {
            return Err("unknown trailing section".into());
        }
        let n = r.u64()?;
        if n.checked_mul(20)
            .is_none_or(|b| b > (r.b.len() - r.at) as u64)
        {
            return Err("truncated".into());
        }
        for _ in 0..n {
            let name = r.u128()?;
            let hits = r.u32()?;
            lru.add_hits(name, hits);
        }
    }
    Ok((lru, meta))
}

/// Encodes a version-1 snapshot, as writers before version 2 did (tests of reading one).
#[cfg(test)]
pub fn encode_v1(lru: &Lru, meta: &Meta, with_hits: bool) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(SNAP_MAGIC);
    b.extend_from_slice(&SNAP_VERSION_1.to_le_bytes());
    b.extend_from_slice(&(lru.len() as u64).to_le_bytes());
    b.extend_from_slice(&(meta.journals.len() as u32).to_le_bytes());
    b.extend_from_slice(&(N_COUNTERS as u32).to_le_bytes());
    for (name, info) in lru.iter() {
        b.extend_from_slice(&name.to_le_bytes());
        b.extend_from_slice(&info.disk_bytes.to_le_bytes());
        b.extend_from_slice(&info.last_use.to_le_bytes());
    }
    encode_journals(&mut b, meta);
    if with_hits {
        let hits: Vec<(u128, u32)> = lru
            .iter()
            .filter(|(_, i)| i.hits > 0)
            .map(|(n, i)| (n, i.hits))
            .collect();
        b.extend_from_slice(HITS_TAG);
        b.extend_from_slice(&(hits.len() as u64).to_le_bytes());
        for (name, n) in hits {
            b.extend_from_slice(&name.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
    }
    let sum = checksum(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}
