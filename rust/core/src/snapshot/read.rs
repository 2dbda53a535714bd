//! Bounded reads of a snapshot's bytes (allocating as they arrive, never what a length
//! claims) and the little-endian fields of untrusted bytes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub(super) fn read_at_most(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
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
pub(super) fn read_exact(f: &File, at: u64, len: usize) -> Result<Vec<u8>, String> {
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

pub(super) struct Reader<'a> {
    pub(super) b: &'a [u8],
    pub(super) at: usize,
}

impl Reader<'_> {
    pub(super) fn take(&mut self, n: usize) -> Result<&[u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("overflow")?;
        if end > self.b.len() {
            return Err("truncated");
        }
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(super) fn u16(&mut self) -> Result<u16, &'static str> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| "short")?,
        ))
    }
    pub(super) fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| "short")?,
        ))
    }
    pub(super) fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "short")?,
        ))
    }
    pub(super) fn u128(&mut self) -> Result<u128, &'static str> {
        Ok(u128::from_le_bytes(
            self.take(16)?.try_into().map_err(|_| "short")?,
        ))
    }
}
