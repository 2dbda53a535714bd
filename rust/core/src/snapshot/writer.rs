//! A version-2 snapshot written ([`Writer`]): entries pushed in name order, a block and the
//! fence in memory, then the meta, the fence, the filter and, last, the header.

use super::filter::Filter;
use super::meta::encode_meta;
use super::{filesystem_bytes, Meta, BLOCK, HEADER_LEN, PER_BLOCK, SNAP_MAGIC, SNAP_VERSION};
use crate::hash::checksum;
use crate::lru::EntryInfo;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::info;

    #[test]
    fn out_of_order_entries_are_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut w = Writer::new(f.reopen().unwrap(), 100).unwrap();
        w.push(5, info(1, 1, 0)).unwrap();
        assert!(w.push(5, info(1, 1, 0)).is_err());
        assert!(w.push(4, info(1, 1, 0)).is_err());
    }
}
