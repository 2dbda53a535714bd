//! A verified entry handed to the caller: the payload mapped or read into memory.

use crate::entry::Header;
use memmap2::Mmap;

#[derive(Debug)]
enum Data {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

/// An entry whose header and payload checksum were verified before it was built. It owns
/// its bytes (a private mapping or a buffer), so it stays valid after the entry is deleted.
#[derive(Debug)]
pub struct Blob {
    data: Data,
    pub header: Header,
    /// The entry file it was read from, when a read ahead kept it (`Store::get_uncounted`)
    /// for the use `Store::count_hit` records later.
    name: Option<u128>,
}

impl Blob {
    pub(crate) fn mapped(map: Mmap, header: Header) -> Self {
        Self {
            data: Data::Mapped(map),
            header,
            name: None,
        }
    }
    pub(crate) fn owned(buf: Vec<u8>, header: Header) -> Self {
        Self {
            data: Data::Owned(buf),
            header,
            name: None,
        }
    }
    pub(crate) fn named(mut self, name: u128) -> Self {
        self.name = Some(name);
        self
    }
    pub(crate) fn name(&self) -> Option<u128> {
        self.name
    }
    fn file(&self) -> &[u8] {
        match &self.data {
            Data::Mapped(m) => m,
            Data::Owned(v) => v,
        }
    }
    pub fn payload(&self) -> &[u8] {
        &self.file()[self.header.header_len..]
    }
    pub fn is_mapped(&self) -> bool {
        matches!(self.data, Data::Mapped(_))
    }
}
