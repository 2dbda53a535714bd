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
//!
//! Each part has its own file: this one the format's constants and what a snapshot says
//! besides its entries ([`Meta`]); `base.rs` an opened version-2 snapshot ([`Base`]), its
//! blocks read one at a time; `writer.rs` a version-2 snapshot written ([`Writer`]);
//! `filter.rs` the name filter; `meta.rs` the journals and counters encoded and read back;
//! `v1.rs` the version-1 format, read when found; `read.rs` the bounded reads and the
//! little-endian fields every reader uses.

mod base;
mod filter;
mod meta;
mod read;
mod v1;
mod writer;

use crate::dir::Name;
use crate::lru::Lru;
use crate::stats::TierCounters;

pub use base::Base;
#[cfg(test)]
pub use v1::{decode_v1, encode_v1};
pub use writer::Writer;

pub const SNAP_MAGIC: &[u8; 4] = b"XPCS";
pub const SNAP_VERSION: u32 = 2;

pub const BLOCK: usize = 4096;
const REC: usize = 40;
/// Records per block: what fits before the block's checksum.
pub const PER_BLOCK: usize = (BLOCK - 8) / REC;
const HEADER_LEN: usize = 80;
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

/// What `open` found.
pub enum Opened {
    V2(Base, Meta),
    /// A version-1 snapshot, decoded whole.
    V1(Lru, Meta),
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

#[cfg(test)]
fn info(b: u64, t: u64, h: u32) -> crate::lru::EntryInfo {
    crate::lru::EntryInfo {
        disk_bytes: b,
        last_use: t,
        hits: h,
    }
}
