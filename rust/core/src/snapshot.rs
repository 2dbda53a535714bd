//! The index snapshot's on-disk format: a compacted index, laid out so that a process finds
//! one entry, the totals and the journals' offsets without reading the rest.
//!
//! Version 2 (written):
//!
//! ```text
//! block 0 (4096 bytes)  header: magic "XPCS", version 2, entries, total bytes (u128),
//!                       blocks, meta offset and length, fence offset, xxh3-64 of the header
//! blocks 1..=n          entry records sorted by name, 102 per block (name u128, bytes on
//!                       disk u64, last use u64, hits u32, zero u32), zero padding, xxh3-64
//!                       of the block's first 4088 bytes in its last 8
//! meta                  journals (name, offset, counters) and the folded counters, xxh3-64
//! fence                 each block's first name (u128), xxh3-64
//! filter                a Bloom filter of the names (about 10 bits per entry, 7 probes),
//!                       xxh3-64
//! ```
//!
//! A reader loads the header, meta, fence (16 bytes per 102 entries) and filter (1.25 bytes
//! per entry) and reads one 4 KiB block per lookup of a name the filter may hold, checking
//! that block's checksum: a new name (most puts) costs no block. Version 1 (one checksummed body,
//! written before) is still read, in full, when found.

use crate::dir::{Kind, Name};
use crate::hash::checksum;
use crate::lru::{EntryInfo, Lru};
use crate::stats::{
    add_tiers_into, tier_values, valid_tier_name, TierCounters, N_COUNTERS, N_TIER_COUNTERS,
};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

pub const SNAP_MAGIC: &[u8; 4] = b"XPCS";
pub const SNAP_VERSION: u32 = 2;
const SNAP_VERSION_1: u32 = 1;
/// Per-entry hit counts, appended after the version-1 body.
const HITS_TAG: &[u8; 4] = b"HITS";

pub const BLOCK: usize = 4096;
const REC: usize = 40;
/// Records per block: what fits before the block's checksum.
pub const PER_BLOCK: usize = (BLOCK - 8) / REC;
const HEADER_LEN: usize = 80;
/// Bits of the name filter per expected entry, and probes per name: about 1% false
/// positives.
const FILTER_BITS_PER_ENTRY: u64 = 10;
const FILTER_PROBES: u64 = 7;
/// A version-1 snapshot is read whole and decoded into an in-memory LRU: one larger than
/// this is refused (the index is rebuilt from the journals, `verify --repair` reindexes).
/// A version-1 record is 32 bytes and its hit count 20 more, so this holds 320,000 entries
/// with their hits or 520,000 without. Decoding costs about 200 bytes per entry on top of
/// the file: at 64 MiB (two million entries) a fresh process peaked at 489 MiB, at this cap
/// at 113 MiB (`tests/test_untrusted_disk.py` bounds it).
pub const MAX_V1_LEN: u64 = 16 << 20;
/// The meta section (journals and counters) is read whole: bounded like a version-1 file.
const MAX_META_LEN: u64 = 64 << 20;
/// Most journals a snapshot lists. A journal is one process's since the last compaction
/// (which folds those whose owner is gone), so a real list is a cache's live writers plus
/// a day of remote ones; writers never write more than this, and readers refuse more.
/// 65,536 marks of the longest name and every counter are about 34 MB, under
/// `MAX_META_LEN`, so whatever a compaction writes the next reader reads.
pub const MAX_JOURNALS: usize = 1 << 16;
/// Most counters per journal a snapshot may carry (this version writes `N_COUNTERS`).
const MAX_COUNTERS: usize = 1024;
/// The fence is read whole: 16 bytes per block, so this bounds a snapshot to about 1.7
/// billion entries.
const MAX_FENCE_LEN: u64 = 256 << 20;

/// One journal's state as the snapshot's writer had folded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalMark {
    pub name: Name,
    pub offset: u64,
    pub counters: Vec<u64>,
    /// Its counters per remote tier name.
    pub tiers: TierCounters,
}

/// What a snapshot says besides its entries.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    pub journals: Vec<JournalMark>,
    pub base_counters: Vec<u64>,
    /// Counters per remote tier name of journals folded and removed.
    pub base_tiers: TierCounters,
    /// Journal names in the file that are not a journal's (`../x.log`): left out, never
    /// opened or removed.
    pub bad_names: u64,
}

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

/// What `open` found.
pub enum Opened {
    V2(Base, Meta),
    /// A version-1 snapshot, decoded whole.
    V1(Lru, Meta),
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

/// Writes a version-2 snapshot to `out` from entries given in strictly increasing name
/// order, holding one block and the fence in memory.
pub struct Writer {
    out: io::BufWriter<File>,
    filter: Filter,
    block: Vec<u8>,
    in_block: usize,
    fence: Vec<u128>,
    entries: u64,
    total: u128,
    last: Option<u128>,
    /// The filesystem's size: records past it are left out (see `push`).
    room: u128,
}

impl Writer {
    /// A writer of about `expected` entries (sizes the name filter; any number may come).
    pub fn new(file: File, expected: u64) -> io::Result<Self> {
        let room = filesystem_bytes(&file);
        let mut out = io::BufWriter::with_capacity(1 << 20, file);
        // The header goes in last, when the counts are known.
        out.write_all(&[0u8; BLOCK])?;
        Ok(Writer {
            out,
            filter: Filter::sized(expected),
            block: Vec::with_capacity(BLOCK),
            in_block: 0,
            fence: Vec::new(),
            entries: 0,
            total: 0,
            last: None,
            room,
        })
    }

    pub fn push(&mut self, name: u128, info: EntryInfo) -> io::Result<()> {
        if self.last.is_some_and(|l| l >= name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "snapshot entries out of order",
            ));
        }
        self.last = Some(name);
        // Journals are untrusted: a record claiming more bytes than the filesystem holds
        // (with those written so far) is no file's. Left out, so that every snapshot written
        // passes the readers' check of its total; a real file it names is found again by
        // `verify --repair` or an explicit evict.
        let total = self.total.saturating_add(u128::from(info.disk_bytes));
        if total > self.room {
            log::debug!("xla_pcache: snapshot leaves out {name:032x}: {total} bytes claimed");
            return Ok(());
        }
        self.filter.add(name);
        if self.in_block == 0 {
            self.fence.push(name);
        }
        self.block.extend_from_slice(&name.to_le_bytes());
        self.block.extend_from_slice(&info.disk_bytes.to_le_bytes());
        self.block.extend_from_slice(&info.last_use.to_le_bytes());
        self.block.extend_from_slice(&info.hits.to_le_bytes());
        self.block.extend_from_slice(&0u32.to_le_bytes());
        self.in_block += 1;
        self.entries += 1;
        self.total = total;
        if self.in_block == PER_BLOCK {
            self.end_block()?;
        }
        Ok(())
    }

    fn end_block(&mut self) -> io::Result<()> {
        self.block.resize(BLOCK - 8, 0);
        let sum = checksum(&self.block);
        self.block.extend_from_slice(&sum.to_le_bytes());
        self.out.write_all(&self.block)?;
        self.block.clear();
        self.in_block = 0;
        Ok(())
    }

    /// Writes the meta, the fence and the header; returns the file's length.
    pub fn finish(mut self, meta: &Meta) -> io::Result<(File, u64)> {
        if self.in_block > 0 {
            self.end_block()?;
        }
        let blocks = self.fence.len() as u64;
        let meta_at = (blocks + 1) * BLOCK as u64;
        let meta_bytes = encode_meta(meta);
        self.out.write_all(&meta_bytes)?;
        let fence_at = meta_at + meta_bytes.len() as u64;
        let mut fence = Vec::with_capacity(self.fence.len() * 16 + 8);
        for n in &self.fence {
            fence.extend_from_slice(&n.to_le_bytes());
        }
        let sum = checksum(&fence);
        fence.extend_from_slice(&sum.to_le_bytes());
        self.out.write_all(&fence)?;
        let mut filter: Vec<u8> = self
            .filter
            .words
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let filter_len = filter.len() as u64;
        let sum = checksum(&filter);
        filter.extend_from_slice(&sum.to_le_bytes());
        self.out.write_all(&filter)?;
        let mut h = Vec::with_capacity(HEADER_LEN);
        h.extend_from_slice(SNAP_MAGIC);
        h.extend_from_slice(&SNAP_VERSION.to_le_bytes());
        h.extend_from_slice(&self.entries.to_le_bytes());
        h.extend_from_slice(&self.total.to_le_bytes());
        h.extend_from_slice(&blocks.to_le_bytes());
        h.extend_from_slice(&meta_at.to_le_bytes());
        h.extend_from_slice(&(meta_bytes.len() as u64).to_le_bytes());
        h.extend_from_slice(&fence_at.to_le_bytes());
        h.extend_from_slice(&filter_len.to_le_bytes());
        let sum = checksum(&h);
        h.extend_from_slice(&sum.to_le_bytes());
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.write_all_at(&h, 0)?;
        Ok((file, fence_at + fence.len() as u64 + filter.len() as u64))
    }
}

/// A Bloom filter of names (double hashing over the name's two halves, each mixed: names
/// are hashes, but what a snapshot holds is whatever its writer put there).
#[derive(Debug, Clone)]
struct Filter {
    /// A power of two of words.
    words: Vec<u64>,
}

impl Filter {
    /// The filter's size in bits for `expected` entries.
    fn bits_for(expected: u64) -> u64 {
        expected
            .saturating_mul(FILTER_BITS_PER_ENTRY)
            .clamp(64, MAX_FENCE_LEN * 8)
            .next_power_of_two()
    }

    fn sized(expected: u64) -> Filter {
        Filter {
            words: vec![0; (Filter::bits_for(expected) / 64) as usize],
        }
    }

    fn probes(&self, name: u128) -> impl Iterator<Item = (usize, u64)> {
        let mask = (self.words.len() as u64 * 64).wrapping_sub(1);
        let (lo, hi) = (name as u64, (name >> 64) as u64);
        let h1 = mix(lo ^ mix(hi));
        let h2 = mix(h1 ^ hi ^ 0x9e37_79b9_7f4a_7c15) | 1;
        (0..FILTER_PROBES).map(move |i| {
            let bit = h1.wrapping_add(i.wrapping_mul(h2)) & mask;
            ((bit / 64) as usize, 1u64 << (bit % 64))
        })
    }

    fn add(&mut self, name: u128) {
        for (w, b) in self.probes(name) {
            self.words[w] |= b;
        }
    }

    fn may_hold(&self, name: u128) -> bool {
        self.words.is_empty() || self.probes(name).all(|(w, b)| self.words[w] & b != 0)
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fixed(v: &[u64]) -> impl Iterator<Item = u64> + '_ {
    (0..N_COUNTERS).map(|i| v.get(i).copied().unwrap_or(0))
}

/// Each journal's name, folded offset and counters, then the counters of the journals folded
/// and removed: the same in both versions of the snapshot.
fn encode_journals(b: &mut Vec<u8>, meta: &Meta) {
    for j in &meta.journals {
        b.extend_from_slice(&(j.name.as_str().len() as u16).to_le_bytes());
        b.extend_from_slice(j.name.as_str().as_bytes());
        b.extend_from_slice(&j.offset.to_le_bytes());
        for c in fixed(&j.counters) {
            b.extend_from_slice(&c.to_le_bytes());
        }
    }
    for c in fixed(&meta.base_counters) {
        b.extend_from_slice(&c.to_le_bytes());
    }
}

fn encode_meta(meta: &Meta) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(meta.journals.len() as u32).to_le_bytes());
    b.extend_from_slice(&(N_COUNTERS as u32).to_le_bytes());
    encode_journals(&mut b, meta);
    // The counters per tier name, after what readers of versions before them read (they
    // stop at the base counters): each journal's, in the order above, then the base's.
    b.extend_from_slice(TIERS_TAG);
    b.extend_from_slice(&(N_TIER_COUNTERS as u32).to_le_bytes());
    for tiers in meta
        .journals
        .iter()
        .map(|j| &j.tiers)
        .chain([&meta.base_tiers])
    {
        b.extend_from_slice(&(tiers.len() as u32).to_le_bytes());
        for (name, values) in tiers {
            b.push(name.len() as u8);
            b.extend_from_slice(name.as_bytes());
            for c in values {
                b.extend_from_slice(&c.to_le_bytes());
            }
        }
    }
    let sum = checksum(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

const TIERS_TAG: &[u8; 4] = b"TIER";

/// The counters per tier a snapshot's meta holds after its base counters (none in one
/// written before them). Untrusted like the rest: names are checked, counts bounded.
fn read_tiers(r: &mut Reader<'_>, meta: &mut Meta) -> Result<(), &'static str> {
    if r.at == r.b.len() {
        return Ok(());
    }
    if r.take(4)? != TIERS_TAG {
        return Err("bad tier counters");
    }
    let n_counters = r.u32()? as usize;
    let n_lists = meta.journals.len() + 1;
    for i in 0..n_lists {
        let n_tiers = r.u32()? as usize;
        let mut tiers = TierCounters::new();
        for _ in 0..n_tiers {
            let len = r.take(1)?[0] as usize;
            let name = std::str::from_utf8(r.take(len)?)
                .map_err(|_| "bad tier name")?
                .to_string();
            if !valid_tier_name(&name) {
                return Err("bad tier name");
            }
            let values = read_counters(r, n_counters)?;
            // add_tiers_into leaves out tiers past MAX_TIERS.
            add_tiers_into(
                &mut tiers,
                &TierCounters::from([(name, tier_values(&values))]),
            );
        }
        match meta.journals.get_mut(i) {
            Some(j) => j.tiers = tiers,
            None => meta.base_tiers = tiers,
        }
    }
    Ok(())
}

fn decode_meta(b: &[u8]) -> Result<Meta, String> {
    if b.len() < 16 {
        return Err("truncated meta".into());
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if checksum(body) != u64::from_le_bytes(sum.try_into().map_err(|_| "short")?) {
        return Err("meta checksum mismatch".into());
    }
    let mut r = Reader { b: body, at: 0 };
    let n_journals = r.u32()?;
    let n_counters = r.u32()? as usize;
    check_counts(n_journals, n_counters)?;
    let mut meta = Meta::default();
    read_journals(&mut r, n_journals, n_counters, &mut meta)?;
    meta.base_counters = read_counters(&mut r, n_counters)?;
    read_tiers(&mut r, &mut meta)?;
    Ok(meta)
}

/// Refuses a journal list longer than any writer makes, or more counters than any has.
fn check_counts(n_journals: u32, n_counters: usize) -> Result<(), &'static str> {
    if n_journals as usize > MAX_JOURNALS {
        return Err("too many journals");
    }
    if n_counters > MAX_COUNTERS {
        return Err("too many counters");
    }
    Ok(())
}

/// Reads `n` journal marks into `meta`, keeping those whose name is a journal's.
fn read_journals(
    r: &mut Reader<'_>,
    n: u32,
    n_counters: usize,
    meta: &mut Meta,
) -> Result<(), &'static str> {
    for _ in 0..n {
        match read_journal(r, n_counters)? {
            Some(j) => meta.journals.push(j),
            None => meta.bad_names += 1,
        }
    }
    Ok(())
}

/// One journal mark; `None` when its name is not a journal's (read past all the same).
fn read_journal(
    r: &mut Reader<'_>,
    n_counters: usize,
) -> Result<Option<JournalMark>, &'static str> {
    let len = r.u16()? as usize;
    let name = std::str::from_utf8(r.take(len)?)
        .ok()
        .and_then(|s| Name::new(Kind::Journal, s));
    let offset = r.u64()?;
    let counters = read_counters(r, n_counters)?;
    Ok(name.map(|name| JournalMark {
        name,
        offset,
        counters,
        tiers: TierCounters::new(),
    }))
}

fn read_counters(r: &mut Reader<'_>, n: usize) -> Result<Vec<u64>, &'static str> {
    // Checked against what is left before allocating: a count is whatever the file says.
    if n.checked_mul(8).is_none_or(|b| b > r.b.len() - r.at) {
        return Err("truncated");
    }
    (0..n).map(|_| r.u64()).collect()
}

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

fn read_at_most(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads `len` bytes at `at`, allocating only as the bytes arrive (a length is whatever
/// the file claims).
fn read_exact(f: &File, at: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut chunk = vec![0u8; len.min(256 << 10)];
    while out.len() < len {
        let want = (len - out.len()).min(chunk.len());
        let n = read_at_most(f, &mut chunk[..want], at + out.len() as u64)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("truncated".into());
        }
        // Memory refused (a limit on the address space) is an unreadable snapshot, not an
        // abort.
        out.try_reserve(n).map_err(|e| e.to_string())?;
        out.extend_from_slice(&chunk[..n]);
    }
    Ok(out)
}

/// The size of the filesystem holding `f`, in bytes (no limit if it cannot be read): no
/// total of entries on it can be larger.
pub(crate) fn filesystem_bytes(f: &impl std::os::fd::AsRawFd) -> u128 {
    // SAFETY: statvfs is plain data; zeroed is valid, and the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a live statvfs.
    if unsafe { libc::fstatvfs(f.as_raw_fd(), &mut st) } != 0 || st.f_blocks == 0 {
        return u128::MAX;
    }
    #[allow(clippy::unnecessary_cast)]
    let bytes = u128::from(st.f_blocks as u64) * u128::from(st.f_frsize.max(1) as u64);
    bytes
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("overflow")?;
        if end > self.b.len() {
            return Err("truncated");
        }
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u128(&mut self) -> Result<u128, &'static str> {
        Ok(u128::from_le_bytes(
            self.take(16)?.try_into().map_err(|_| "short")?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(b: u64, t: u64, h: u32) -> EntryInfo {
        EntryInfo {
            disk_bytes: b,
            last_use: t,
            hits: h,
        }
    }

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

    #[test]
    fn out_of_order_entries_are_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut w = Writer::new(f.reopen().unwrap(), 100).unwrap();
        w.push(5, info(1, 1, 0)).unwrap();
        assert!(w.push(5, info(1, 1, 0)).is_err());
        assert!(w.push(4, info(1, 1, 0)).is_err());
    }
}
