//! An opened version-2 snapshot ([`Base`]): its header, meta, fence and filter read and
//! checked when opened, its entries left on disk and read a block at a time.

use super::filter::Filter;
use super::meta::decode_meta;
use super::read::{read_at_most, read_exact, Reader};
use super::v1::{decode_v1, MAX_V1_LEN, SNAP_VERSION_1};
use super::{
    filesystem_bytes, Opened, BLOCK, HEADER_LEN, MAX_FENCE_LEN, MAX_META_LEN, PER_BLOCK, REC,
    SNAP_MAGIC, SNAP_VERSION,
};
use crate::hash::checksum;
use crate::lru::EntryInfo;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// An opened version-2 snapshot: its totals and fence in memory, its entries on disk.
#[derive(Debug)]
pub struct Base {
    file: File,
    pub entries: u64,
    pub total: u128,
    fence: Vec<u128>,
    filter: Filter,
    /// Blocks read since opened (a measure of what lookups cost, for tests and benches).
    pub blocks_read: std::cell::Cell<u64>,
}

impl Base {
    /// Reads the header, meta and fence of the snapshot open as `file` (of length `len`).
    /// A version-1 file is decoded whole. Anything else is an error naming what is wrong.
    pub fn open(file: File, len: u64) -> Result<Opened, String> {
        let mut head = [0u8; HEADER_LEN];
        let n = read_at_most(&file, &mut head, 0).map_err(|e| e.to_string())?;
        if n < 8 || &head[..4] != SNAP_MAGIC {
            return Err("bad magic".into());
        }
        let version = u32::from_le_bytes(head[4..8].try_into().map_err(|_| "short")?);
        if version == SNAP_VERSION_1 {
            if len > MAX_V1_LEN {
                return Err(format!("it is larger than {MAX_V1_LEN} bytes"));
            }
            let bytes = crate::dir::read_capped(&file, MAX_V1_LEN).map_err(|e| e.to_string())?;
            let (lru, meta) = decode_v1(&bytes)?;
            return Ok(Opened::V1(lru, meta));
        }
        if version != SNAP_VERSION {
            return Err("unknown version".into());
        }
        if n < HEADER_LEN {
            return Err("truncated header".into());
        }
        let mut r = Reader { b: &head, at: 8 };
        let entries = r.u64()?;
        let total = r.u128()?;
        let blocks = r.u64()?;
        let meta_at = r.u64()?;
        let meta_len = r.u64()?;
        let fence_at = r.u64()?;
        let filter_len = r.u64()?;
        if checksum(&head[..72]) != r.u64()? {
            return Err("header checksum mismatch".into());
        }
        let want_blocks = entries.div_ceil(PER_BLOCK as u64);
        let fence_len = blocks.checked_mul(16).ok_or("overflow")?;
        let blocks_end = (blocks + 1).checked_mul(BLOCK as u64).ok_or("overflow")?;
        if blocks != want_blocks
            || meta_at != blocks_end
            || meta_len > MAX_META_LEN
            || fence_len > MAX_FENCE_LEN
            || fence_at != meta_at + meta_len
            || filter_len > MAX_FENCE_LEN
            || filter_len > 2 * Filter::bits_for(entries) / 8
            || !(filter_len / 8).is_power_of_two()
            || filter_len % 8 != 0
            || len != fence_at + fence_len + 8 + filter_len + 8
        {
            return Err("inconsistent header".into());
        }
        let meta_bytes = read_exact(&file, meta_at, meta_len as usize)?;
        let meta = decode_meta(&meta_bytes)?;
        let fence_bytes = read_exact(&file, fence_at, fence_len as usize + 8)?;
        let (body, sum) = fence_bytes.split_at(fence_len as usize);
        if checksum(body) != u64::from_le_bytes(sum.try_into().map_err(|_| "short")?) {
            return Err("fence checksum mismatch".into());
        }
        let fence: Vec<u128> = body
            .chunks_exact(16)
            .map(|c| u128::from_le_bytes(c.try_into().unwrap_or([0; 16])))
            .collect();
        if fence.windows(2).any(|w| w[0] >= w[1]) {
            return Err("fence out of order".into());
        }
        let filter_at = fence_at + fence_len + 8;
        let filter_bytes = read_exact(&file, filter_at, filter_len as usize + 8)?;
        let (body, sum) = filter_bytes.split_at(filter_len as usize);
        if checksum(body) != u64::from_le_bytes(sum.try_into().map_err(|_| "short")?) {
            return Err("filter checksum mismatch".into());
        }
        let filter = Filter {
            words: body
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
        };
        let mut base = Base {
            file,
            entries,
            total,
            fence,
            filter,
            blocks_read: std::cell::Cell::new(0),
        };
        // The header's total is what eviction and admission compare with the budget: one
        // no filesystem could hold is recomputed from the records (one pass over the
        // blocks, a block in memory at a time), and refused if they say the same.
        let room = filesystem_bytes(&base.file);
        if base.total > room {
            let mut sum = 0u128;
            for i in 0..base.blocks() {
                for (_, info) in base.block(i).map_err(|e| e.to_string())? {
                    sum = sum.saturating_add(u128::from(info.disk_bytes));
                }
            }
            if sum > room {
                return Err(format!(
                    "its entries claim {sum} bytes, more than the filesystem's {room}"
                ));
            }
            base.total = sum;
            base.blocks_read.set(0);
        }
        Ok(Opened::V2(base, meta))
    }

    pub fn blocks(&self) -> usize {
        self.fence.len()
    }

    /// The records of block `i`, in name order, checked against the block's checksum.
    pub fn block(&self, i: usize) -> io::Result<Vec<(u128, EntryInfo)>> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        let mut buf = vec![0u8; BLOCK];
        self.file
            .read_exact_at(&mut buf, (i as u64 + 1) * BLOCK as u64)?;
        self.blocks_read.set(self.blocks_read.get() + 1);
        let sum = u64::from_le_bytes(buf[BLOCK - 8..].try_into().map_err(|_| bad("short"))?);
        if checksum(&buf[..BLOCK - 8]) != sum {
            return Err(bad("snapshot block checksum mismatch"));
        }
        let before = i as u64 * PER_BLOCK as u64;
        let n = (self.entries.saturating_sub(before)).min(PER_BLOCK as u64) as usize;
        let mut out = Vec::with_capacity(n);
        for rec in buf[..n * REC].chunks_exact(REC) {
            let mut r = Reader { b: rec, at: 0 };
            let name = r.u128().map_err(bad)?;
            let disk_bytes = r.u64().map_err(bad)?;
            let last_use = r.u64().map_err(bad)?;
            let hits = r.u32().map_err(bad)?;
            out.push((
                name,
                EntryInfo {
                    disk_bytes,
                    last_use,
                    hits,
                },
            ));
        }
        if out.first().map(|r| r.0) != self.fence.get(i).copied()
            || out.windows(2).any(|w| w[0].0 >= w[1].0)
        {
            return Err(bad("snapshot block out of order"));
        }
        Ok(out)
    }

    /// The block that would hold `name`, if any: none when the filter says it is not in
    /// the snapshot.
    pub fn block_of(&self, name: u128) -> Option<usize> {
        if !self.filter.may_hold(name) {
            return None;
        }
        match self.fence.binary_search(&name) {
            Ok(i) => Some(i),
            Err(0) => None,
            Err(i) => Some(i - 1),
        }
    }

    /// `name`'s record, reading one block.
    pub fn lookup(&self, name: u128) -> io::Result<Option<EntryInfo>> {
        let Some(i) = self.block_of(name) else {
            return Ok(None);
        };
        let recs = self.block(i)?;
        Ok(recs
            .binary_search_by_key(&name, |r| r.0)
            .ok()
            .map(|at| recs[at].1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dir::{Kind, Name};
    use crate::snapshot::{info, JournalMark, Meta, Writer};
    use crate::stats::{TierCounters, N_TIER_COUNTERS};

    fn write(n: u128) -> (tempfile::NamedTempFile, Meta) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut w = Writer::new(f.reopen().unwrap(), n as u64).unwrap();
        for i in 0..n {
            w.push(i * 7 + 3, info(i as u64 + 1, i as u64, i as u32 % 3))
                .unwrap();
        }
        let meta = Meta {
            journals: vec![JournalMark {
                name: Name::new(Kind::Journal, "h-1-2.log").unwrap(),
                offset: 99,
                counters: vec![1, 2, 3],
                tiers: TierCounters::from([("s3".to_string(), [1; N_TIER_COUNTERS])]),
            }],
            base_counters: vec![4, 5],
            base_tiers: TierCounters::from([
                ("redis".to_string(), [2; N_TIER_COUNTERS]),
                ("gs".to_string(), [3; N_TIER_COUNTERS]),
            ]),
            bad_names: 0,
        };
        w.finish(&meta).unwrap();
        (f, meta)
    }

    fn open(f: &tempfile::NamedTempFile) -> (Base, Meta) {
        let file = f.reopen().unwrap();
        let len = file.metadata().unwrap().len();
        match Base::open(file, len).unwrap() {
            Opened::V2(b, m) => (b, m),
            Opened::V1(..) => panic!("v1"),
        }
    }

    #[test]
    fn lookups_read_one_block() {
        for n in [0u128, 1, 101, 102, 103, 1000] {
            let (f, meta) = write(n);
            let (base, m) = open(&f);
            assert_eq!(base.entries, n as u64);
            assert_eq!(base.total, (1..=n).sum::<u128>());
            assert_eq!(m.journals[0].name, meta.journals[0].name);
            assert_eq!(m.journals[0].offset, 99);
            assert_eq!(m.journals[0].counters[..4], [1, 2, 3, 0]);
            assert_eq!(m.base_counters[..2], [4, 5]);
            assert_eq!(m.journals[0].tiers, meta.journals[0].tiers);
            assert_eq!(m.base_tiers, meta.base_tiers);
            for i in 0..n {
                let got = base.lookup(i * 7 + 3).unwrap().unwrap();
                assert_eq!(got, info(i as u64 + 1, i as u64, i as u32 % 3));
                assert!(base.lookup(i * 7 + 4).unwrap().is_none());
            }
            assert!(base.lookup(0).unwrap().is_none());
            // One block per present name; the filter spares almost every absent one.
            let reads = base.blocks_read.get();
            assert!(
                reads >= n as u64 && reads <= n as u64 + n as u64 / 10 + 1,
                "{reads}"
            );
        }
    }

    #[test]
    fn damage_is_an_error_never_a_wrong_answer() {
        let (f, _) = write(500);
        let mut bytes = std::fs::read(f.path()).unwrap();
        // A flipped byte in a block: that block's lookups fail, the others work.
        bytes[BLOCK + 100] ^= 1;
        std::fs::write(f.path(), &bytes).unwrap();
        let (base, _) = open(&f);
        assert!(base.lookup(3).is_err());
        assert!(base.lookup(499 * 7 + 3).unwrap().is_some());
        // A flipped header byte: not opened.
        bytes[10] ^= 1;
        std::fs::write(f.path(), &bytes).unwrap();
        let file = f.reopen().unwrap();
        assert!(Base::open(file, bytes.len() as u64).is_err());
        // Truncated: not opened.
        bytes[10] ^= 1;
        bytes.truncate(bytes.len() - 1);
        std::fs::write(f.path(), &bytes).unwrap();
        let file = f.reopen().unwrap();
        assert!(Base::open(file, bytes.len() as u64).is_err());
    }
}
