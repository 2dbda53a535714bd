//! The read path: get, the entry file verified before a byte is exposed, corrupt files
//! removed, hit records; contains; an entry's header alone (listings, reports).

use super::{check_key, errno, gate, Key, Store};
use crate::blob::Blob;
use crate::clock::unique_suffix;
use crate::dir::{self as cdir, Kind, Name, Rel, Stat};
use crate::entry::{self, EntryError};
use crate::error::StoreError;
use crate::hash::entry_name;
use crate::journal::JournalRecord;
use crate::layout::{Layout, ENTRIES, TRASH};
use crate::publish::publish_no_replace;
use crate::sign::TrustSet;
use crate::stats::{compile_ms, Counter};
use memmap2::MmapOptions;
use std::fs::File;
use std::io::{self, Read};
use std::time::Instant;

/// Below this size a file is read into memory rather than mapped. It is glibc's default
/// malloc mmap threshold: a buffer this large is usually a fresh anonymous mapping, so a
/// read into it faults in every page, and the first get of an entry in a process pays for
/// that, while a mapping takes the page-cache pages as they are (a few faults with the
/// kernel's fault-around). Below it malloc reuses warm memory, where a read stays a little
/// cheaper than a mapping. Mappings are not pre-faulted: MAP_POPULATE was no faster, and
/// slower for large entries. Figures: docs/benchmarks.md, "Measurements behind the code".
const MMAP_MIN_BYTES: u64 = 128 * 1024;

pub(super) enum ReadError {
    Missing,
    Corrupt(EntryError, u64),
    Io(io::Error),
    /// The entry's shard is not a real directory, or a directory stands where the entry
    /// file belongs: skipped, never followed nor moved.
    Unsafe(String),
    /// A whole, verified file a trusting reader will not serve (its payload unread).
    Untrusted(crate::sign::Untrusted),
    /// A later release's entry (its format version above this one's): a miss, left alone.
    Newer(u16),
}

impl ReadError {
    /// What a failed check `e` of the file of inode `ino` is: damage, or a later format.
    pub(super) fn checked(e: EntryError, ino: u64) -> ReadError {
        match e {
            EntryError::NewerFormat(v) => ReadError::Newer(v),
            e => ReadError::Corrupt(e, ino),
        }
    }
}

impl Store {
    /// The verified entry for `key`, or None. Never fails for cache reasons.
    pub fn get(&self, key: Key<'_>) -> Result<Option<Blob>, StoreError> {
        self.read(key, true)
    }

    /// `get` that counts no lookup (hit, miss, bytes read, compile time saved, an untrusted
    /// entry refused) and records no use of the entry: a read ahead of the lookup it may
    /// serve, which counts itself then (`count_hit`) or, not served, goes through `get` as
    /// if this read had not been. Damage found is still counted (and removed).
    pub fn get_uncounted(&self, key: Key<'_>) -> Result<Option<Blob>, StoreError> {
        self.read(key, false)
    }

    fn read(&self, key: Key<'_>, count: bool) -> Result<Option<Blob>, StoreError> {
        check_key(&key)?;
        let name = entry_name(key.bytes);
        let result = match self.opts.trust.as_deref() {
            None => self.lookup(key, name, None, None).ok().flatten(),
            Some(trust) => {
                let hit = self.get_trusted(key, name, trust, count);
                // The verification record refused (warned about in `verified.rs`): counted
                // with the other paths refused.
                let refused = trust.take_record_problems();
                if refused > 0 {
                    self.counters.add(Counter::UnsafePaths, refused);
                }
                hit
            }
        };
        match result {
            Some((b, at)) if count => {
                self.counters.inc(Counter::Hits);
                self.counters.add(Counter::BytesRead, b.header.payload_len);
                self.counters
                    .add(Counter::CompileSavedMs, compile_ms(&b.header.meta));
                self.note_hit(at, b.header.file_len());
                Ok(Some(b))
            }
            Some((b, at)) => Ok(Some(b.named(at))),
            None => {
                if count {
                    self.counters.inc(Counter::Misses);
                    self.maybe_flush_stats(false);
                }
                Ok(None)
            }
        }
    }

    /// A trusting reader's get: the first of the key's candidate names (`gate::candidates`:
    /// the plain file, then each trusted key's own file for this key) holding an entry the
    /// gate admits. An entry that is not trusted is counted, once per get, and its payload
    /// never read.
    fn get_trusted(
        &self,
        key: Key<'_>,
        name: u128,
        trust: &TrustSet,
        count: bool,
    ) -> Option<(Blob, u128)> {
        let mut refused = false;
        for (at, signer) in gate::candidates(key.bytes, Some(trust)) {
            debug_assert!(signer.is_some() || at == name);
            match self.lookup(key, at, Some(trust), signer) {
                Ok(Some(hit)) => return Some(hit),
                Ok(None) => {}
                Err(why) => {
                    refused = true;
                    log::debug!(
                        "xla_pcache: {} for this key is {why}; not served",
                        self.layout.entry_path(at).display()
                    );
                }
            }
        }
        if refused && count {
            self.counters.inc(Counter::Untrusted);
        }
        None
    }

    /// The entry file `name` when it verifies (under `trust` when given) and holds `key`
    /// (signed by `signer` when given): `Err` when it is whole but not trusted.
    fn lookup(
        &self,
        key: Key<'_>,
        name: u128,
        trust: Option<&TrustSet>,
        signer: Option<&str>,
    ) -> Result<Option<(Blob, u128)>, crate::sign::Untrusted> {
        // For messages only: not built on the hit path.
        let path = || self.layout.entry_path(name);
        let rel = Layout::entry_rel(name);
        let mut retried = false;
        let result = loop {
            match self.read_entry(&rel, trust) {
                Ok(blob) => break Some(blob),
                Err(ReadError::Missing) => break None,
                Err(ReadError::Untrusted(why)) => return Err(why),
                Err(ReadError::Newer(v)) => {
                    // Never removed: the release that wrote it reads it (ARCHITECTURE.md,
                    // "Formats of other releases").
                    self.newer_format(v, "an entry");
                    break None;
                }
                Err(ReadError::Unsafe(why)) => {
                    self.unsafe_path(rel.as_str(), &why);
                    break None;
                }
                Err(ReadError::Corrupt(why, _))
                    if !self.fs.local
                        && matches!(
                            why,
                            EntryError::BadLength { .. } | EntryError::TooShort(_)
                        ) =>
                {
                    // Entries are never written in place, so on a network filesystem a length
                    // that disagrees with the header is far more likely this client's stale
                    // view of a file another host replaced (cached size, clamped reads) than
                    // damage. Removing it would destroy a good entry for every host: miss only.
                    self.counters.inc(Counter::Errors);
                    self.warn("stale", || {
                        format!(
                            "incomplete view of cache entry {} ({why}), likely a stale network \
                             filesystem cache; treated as a miss",
                            path().display()
                        )
                    });
                    break None;
                }
                Err(ReadError::Corrupt(why, ino)) => {
                    self.counters.inc(Counter::Corrupt);
                    self.warn("corrupt", || {
                        format!(
                            "corrupt cache entry {} ({why}); treated as a miss",
                            path().display()
                        )
                    });
                    if !self.opts.read_only {
                        self.remove_corrupt(ino, name);
                    }
                    break None;
                }
                Err(ReadError::Io(e)) if !retried && errno(&e) == Some(libc::ESTALE) => {
                    retried = true;
                }
                Err(ReadError::Io(e)) => {
                    self.counters.inc(Counter::Errors);
                    self.warn("read", || {
                        format!("cannot read {}: {e}; treated as a miss", path().display())
                    });
                    break None;
                }
            }
        };
        let Some(b) = result else {
            return Ok(None);
        };
        match gate::belongs(&b.header, key.bytes, signer) {
            Ok(()) => Ok(Some((b, name))),
            Err(gate::Refusal::Untrusted(why)) => Err(why),
            Err(_) => {
                self.warn("collision", || {
                    format!(
                        "{} holds a different key; treated as a miss",
                        path().display()
                    )
                });
                Ok(None)
            }
        }
    }

    pub fn contains(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        Ok(self.names_of(key).any(|n| self.entry_exists(n)))
    }

    /// Records a use of `key`'s entry, as a hit does, and counts nothing: for an entry no
    /// lookup reads while the entries it belongs with are used (the JAX adapter's module
    /// records, read only when those are gone), so that it ages with them rather than first.
    /// The first of the key's names with a regular file there is the one touched; its content
    /// is not read (eviction order is all a use changes). False when there is none, or the
    /// store is read-only (it records no use).
    pub fn touch(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        if self.opts.read_only {
            return Ok(false);
        }
        for name in self.names_of(key) {
            let found = self
                .dir(&Layout::shard_rel(name))
                .and_then(|d| d.stat(&Name::entry(name)));
            if let Ok(st) = found {
                if st.is_file() {
                    self.note_hit(name, st.len());
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The files an entry of `key` may be under (`gate::candidates`): the plain name, and
    /// with trusted keys (or a signer) each trusted signer's own name.
    pub(super) fn names_of<'a>(&'a self, key: Key<'a>) -> impl Iterator<Item = u128> + 'a {
        let trust = self.opts.trust.as_deref().or(self.write_trust.as_ref());
        gate::candidates(key.bytes, trust).map(|(n, _)| n)
    }

    /// Whether a file stands under `name`'s entry name (in a real shard directory).
    pub(super) fn entry_exists(&self, name: u128) -> bool {
        self.dir(&Layout::shard_rel(name))
            .and_then(|d| d.stat(&Name::entry(name)))
            .is_ok()
    }

    /// Counts a lookup served by `blob`, an entry read earlier with `get_uncounted` (a read
    /// ahead): a hit, its payload bytes and the compile time its producer recorded, and a
    /// use of its entry file, as `get` would have.
    pub fn count_hit(&self, blob: &Blob) {
        if let Some(at) = blob.name() {
            self.note_hit(at, blob.header.file_len());
        }
        self.counters.inc(Counter::Hits);
        self.counters
            .add(Counter::BytesRead, blob.header.payload_len);
        self.counters
            .add(Counter::CompileSavedMs, compile_ms(&blob.header.meta));
        self.maybe_flush_stats(false);
    }

    /// Opens and verifies the entry file at `rel` (beneath the root, no link followed in any
    /// component, no FIFO waited on).
    /// With `trust`, the entry must be signed by one of its keys: its BLAKE3 digest is the
    /// payload's check (one pass), and an entry not trusted is `Untrusted`, payload unread.
    pub(super) fn read_entry(
        &self,
        rel: &Rel,
        trust: Option<&TrustSet>,
    ) -> Result<Blob, ReadError> {
        let f = match self.root.open_file(rel, libc::O_RDONLY, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) if cdir::is_unsafe(&e) => return Err(self.why_unsafe(rel, e)),
            Err(e) => return Err(ReadError::Io(e)),
        };
        let meta = cdir::fstat(&f).map_err(ReadError::Io)?;
        let len = meta.len();
        if meta.is_dir() {
            return Err(ReadError::Unsafe(
                "a directory stands where an entry file belongs".into(),
            ));
        }
        if !meta.is_file() {
            return Err(ReadError::Corrupt(EntryError::BadMagic, meta.ino()));
        }
        if len < entry::FIXED_HEADER as u64 {
            return Err(ReadError::Corrupt(EntryError::TooShort(len), meta.ino()));
        }
        // A trusting reader maps only a file no one else can write: a mapping shows the
        // file's bytes as they are now, so another user who can write the file in place
        // (its owner, or a member of a group it is writable by) could change code after it
        // was verified. Any other file is read into this process's memory and checked there.
        let mappable = trust.is_none() || meta.writable_only_by_us();
        if self.mmap && len >= MMAP_MIN_BYTES && mappable {
            // SAFETY: entry files are immutable once published (never written in place), and
            // mapping is used only on local filesystems where a removed file stays readable.
            // A mapping refused (a process holding vm.max_map_count mappings) is a read.
            if let Ok(map) = unsafe { MmapOptions::new().map(&f) } {
                let header = check_entry(&map, trust, meta.ino())?;
                return Ok(Blob::mapped(map, header));
            }
        }
        if let Some(t) = trust {
            // Read into memory, so judged by its header first: a file anyone can plant, of
            // any size, costs a trusting reader a header's read unless a trusted key signed
            // it. The whole file is judged again once read (it may change in between).
            if let Some(header) = header_at(&f, len)? {
                if let Err(why) = t.check_header(&header) {
                    return Err(ReadError::Untrusted(why));
                }
            }
        }
        let buf = read_entry_bytes(&f, len, self.fs.local)?;
        let header = check_entry(&buf, trust, meta.ino())?;
        Ok(Blob::owned(buf, header))
    }

    /// Why opening `rel` met a link or a non-directory: its shard is not a real directory
    /// (skipped), or the entry file itself is a symbolic link (a foreign file, removed as
    /// corrupt).
    fn why_unsafe(&self, rel: &Rel, e: io::Error) -> ReadError {
        let shard = rel.split_last().0.unwrap_or(ENTRIES);
        match self.root.sub(&shard) {
            Ok(_) if e.raw_os_error() == Some(libc::ELOOP) => {
                ReadError::Corrupt(EntryError::BadMagic, 0)
            }
            Err(e) if cdir::is_unsafe(&e) => ReadError::Unsafe(e.to_string()),
            _ => ReadError::Unsafe(e.to_string()),
        }
    }

    pub(super) fn read_header(&self, rel: &Rel) -> Result<(entry::Header, Stat), ReadError> {
        let mut f = match self.root.open_file(rel, libc::O_RDONLY, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) if cdir::is_unsafe(&e) => return Err(ReadError::Unsafe(e.to_string())),
            Err(e) => return Err(ReadError::Io(e)),
        };
        let m = cdir::fstat(&f).map_err(ReadError::Io)?;
        if !m.is_file() {
            return Err(ReadError::Corrupt(EntryError::BadMagic, m.ino()));
        }
        let mut fixed = [0u8; entry::FIXED_HEADER];
        f.read_exact(&mut fixed)
            .map_err(|_| ReadError::Corrupt(EntryError::TooShort(m.len()), m.ino()))?;
        let hl = entry::header_len(&fixed).map_err(|e| ReadError::checked(e, m.ino()))?;
        let mut h = fixed.to_vec();
        h.resize(hl, 0);
        f.read_exact(&mut h[entry::FIXED_HEADER..])
            .map_err(|_| ReadError::Corrupt(EntryError::TooShort(m.len()), m.ino()))?;
        let header = entry::decode_header(&h).map_err(|e| ReadError::checked(e, m.ino()))?;
        if header.file_len() != m.len() {
            return Err(ReadError::Corrupt(
                EntryError::BadLength {
                    expected: header.file_len(),
                    actual: m.len(),
                },
                m.ino(),
            ));
        }
        Ok((header, m))
    }

    /// The format version of the entry file at `rel` when it is a later release's (its
    /// first 64 bytes say so), else None: what a delete, a clear or a repair leaves alone.
    /// Opened as every entry file is (no link followed, no FIFO waited on), and only its
    /// first bytes read.
    pub(super) fn newer_at(&self, rel: &Rel) -> Option<u16> {
        use std::os::unix::fs::FileExt;
        let f = self.root.open_file(rel, libc::O_RDONLY, 0).ok()?;
        if !cdir::fstat(&f).is_ok_and(|m| m.is_file()) {
            return None;
        }
        let mut fixed = [0u8; entry::FIXED_HEADER];
        f.read_exact_at(&mut fixed, 0).ok()?;
        match entry::header_len(&fixed) {
            Err(EntryError::NewerFormat(v)) => Some(v),
            _ => None,
        }
    }

    /// Removes a corrupt file, taking care not to remove a good entry that replaced it since
    /// it was read: move it aside, check it is the same inode, put it back if not.
    pub(super) fn remove_corrupt(&self, ino: u64, name: u128) {
        // Deletes are stamped before they happen and puts after, so a racing re-put always
        // wins in the index: it may err toward a record of a missing file (harmless, dropped
        // when eviction meets it), never toward an unindexed file that escapes the budget.
        let t = crate::clock::unix_ns();
        let (Ok(shard), Ok(trash)) = (self.dir(&Layout::shard_rel(name)), self.dir(&TRASH)) else {
            return;
        };
        let file = Name::entry(name);
        let Some(aside) = Name::new(Kind::Made, &format!("{file}.corrupt.{}", unique_suffix()))
        else {
            return;
        };
        if shard.rename(&file, &trash, &aside).is_err() {
            return;
        }
        match trash.stat(&aside) {
            Ok(m) if m.is_dir() => {
                // Raced with a directory put there: give it back, it is not ours to remove.
                let _ = publish_no_replace(&trash, &aside, &shard, &file);
            }
            Ok(m) if ino == 0 || m.ino() == ino => {
                let _ = trash.unlink(&aside);
                self.append(&[JournalRecord::Delete { name, t }]);
            }
            _ => {
                let _ = publish_no_replace(&trash, &aside, &shard, &file);
                let _ = trash.unlink(&aside);
            }
        }
    }

    pub(super) fn note_hit(&self, name: u128, file_len: u64) {
        if self.opts.read_only {
            return;
        }
        // A hit never waits behind an eviction in another thread: if the state is busy the
        // recency record is skipped (recency is approximate by design).
        let Some(mut st) = self.try_state() else {
            return;
        };
        let now = Instant::now();
        let due = st
            .hits_logged
            .get(&name)
            .is_none_or(|t| now.duration_since(*t) >= self.opts.hit_interval);
        if due {
            st.hits_logged.insert(name, now);
            let disk = file_len.div_ceil(4096) * 4096;
            // Buffered, not written: a hit costs no journal write (nor, for the first hit of
            // a process, a journal creation). It goes out with the next put or counters flush.
            st.pending.push(JournalRecord::Touch {
                name,
                disk_bytes: disk,
                t: crate::clock::unix_ns(),
                put: false,
            });
        }
        self.flush_stats_locked(&mut st, false);
    }
}

/// A whole entry file's check (`gate::judge`): xxh3 for an untrusting reader, the signature
/// and BLAKE3 for a trusting one.
pub(super) fn check_entry(
    file: &[u8],
    trust: Option<&TrustSet>,
    ino: u64,
) -> Result<entry::Header, ReadError> {
    gate::judge(file, trust).map_err(|r| match r {
        gate::Refusal::Untrusted(why) => ReadError::Untrusted(why),
        gate::Refusal::Corrupt(e) => ReadError::Corrupt(e, ino),
        gate::Refusal::OtherKey => ReadError::Corrupt(EntryError::BadMagic, ino),
        gate::Refusal::NewerFormat(v) => ReadError::Newer(v),
    })
}

/// The header of the entry file `f` of `fstat` size `len`, read at its start without moving
/// the file's offset; None when it is no whole header of a file of that length (the whole
/// file's check then says what is wrong, as without this look ahead), and `Newer` for a
/// later release's entry, of which nothing more is read.
fn header_at(f: &File, len: u64) -> Result<Option<entry::Header>, ReadError> {
    use std::os::unix::fs::FileExt;
    let mut fixed = [0u8; entry::FIXED_HEADER];
    if f.read_exact_at(&mut fixed, 0).is_err() {
        return Ok(None);
    }
    let hl = match entry::header_len(&fixed) {
        Ok(hl) => hl,
        Err(EntryError::NewerFormat(v)) => return Err(ReadError::Newer(v)),
        Err(_) => return Ok(None),
    };
    let mut h = vec![0u8; hl];
    if f.read_exact_at(&mut h, 0).is_err() {
        return Ok(None);
    }
    Ok(entry::decode_header(&h)
        .ok()
        .filter(|header| header.file_len() == len))
}

/// Above this size, an entry read into memory has its header checked against the file's
/// length before the buffer is allocated: a sparse `truncate -s 1T` file is a corrupt entry,
/// not an allocation that aborts the process.
const CHECK_BEFORE_ALLOC: u64 = 64 << 20;

/// Reads a whole entry file of `fstat` size `len` into memory: the size is checked against
/// the entry's own header first when it is large, and the allocation may fail (a miss),
/// never abort.
pub(super) fn read_entry_bytes(f: &File, len: u64, local: bool) -> Result<Vec<u8>, ReadError> {
    if len > CHECK_BEFORE_ALLOC {
        use std::os::unix::fs::FileExt;
        let mut fixed = [0u8; entry::FIXED_HEADER];
        f.read_exact_at(&mut fixed, 0).map_err(ReadError::Io)?;
        let expected = entry::expected_file_len(&fixed).map_err(|e| ReadError::checked(e, 0))?;
        if expected != len {
            return Err(ReadError::Corrupt(
                EntryError::BadLength {
                    expected,
                    actual: len,
                },
                0,
            ));
        }
    }
    read_whole(f, len, local).map_err(ReadError::Io)
}

/// Reads a whole file whose fstat size was `len`, with one `read` where it can: asks for one
/// byte more than `len`, and on a local filesystem takes a short read as the end of the file
/// (std's read_to_end costs a second fstat, an lseek and a final empty read). Elsewhere it
/// reads on to an empty read: on a network filesystem the size fstat gave may be a cached
/// one from before another host replaced the file.
pub(super) fn read_whole(f: &File, len: u64, local: bool) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::new();
    let first = usize::try_from(len).ok().and_then(|n| n.checked_add(1));
    first
        .and_then(|n| buf.try_reserve_exact(n).ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "entry too large to read"))?;
    loop {
        if buf.len() == buf.capacity() {
            buf.try_reserve(64 << 10)
                .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "entry too large"))?;
        }
        let spare = buf.spare_capacity_mut();
        // SAFETY: the destination is the vector's unused capacity, `spare.len()` bytes that
        // nothing else references; read(2) writes at most that many and reports how many.
        let n = unsafe { libc::read(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        let asked = spare.len();
        // SAFETY: read(2) initialized the first n bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        if n == 0 || (local && n < asked) {
            return Ok(buf);
        }
    }
}
