//! Whole entry files as bytes: what a remote tier or a bundle carries between caches.

use super::gate::Refusal;
use super::write::Signing;
use super::{check_key, gate, read, Key, Store};
use crate::blob::Blob;
use crate::dir as cdir;
use crate::entry;
use crate::error::{io_err, StoreError};
use crate::hash::parse_name_hex;
use crate::layout::{Layout, TMP};
use crate::sign;
use crate::stats::Counter;
use std::fs::File;
use std::io;

impl Store {
    /// The verified entry file (header, key, metadata, payload) for `key`, or None when it is
    /// missing, corrupt or filed under another key. Does not count as a use. A store with
    /// trusted keys (or a signer) hands out only an entry they trust: the plain file, or a
    /// trusted signer's own file for the key.
    pub fn get_entry_file(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(&key)?;
        let trust = self.opts.trust.as_deref().or(self.write_trust.as_ref());
        for (at, signer) in gate::candidates(key.bytes, trust) {
            let Some(file) = self.entry_file_at(at) else {
                continue;
            };
            if gate::admit(&file, trust, key.bytes, signer).is_ok() {
                return Ok(Some(file));
            }
        }
        Ok(None)
    }

    /// The entry file under the name `name` (32 hex digits, as `entries()` lists it) when
    /// it holds an entry of `key` this store would hand out (as `get_entry_file`) filed
    /// correctly there: under its key's plain name or its signer's own name for the key.
    /// What a bundle exports, file by file, so that two entries of one key (a squatter's
    /// plain file and a trusted signer's own) travel under two names.
    pub fn entry_file_named(
        &self,
        key: Key<'_>,
        name: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(&key)?;
        let Some(at) = parse_name_hex(name) else {
            return Err(StoreError::Invalid(format!(
                "name {name:?} is not an entry name (32 hex digits)"
            )));
        };
        let trust = self.opts.trust.as_deref().or(self.write_trust.as_ref());
        let Some(file) = self.entry_file_at(at) else {
            return Ok(None);
        };
        Ok(gate::admit(&file, trust, key.bytes, None)
            .is_ok_and(|h| gate::filed_under(&h, at))
            .then_some(file))
    }

    /// The bytes of the entry file `name` (unverified), or None.
    fn entry_file_at(&self, name: u128) -> Option<Vec<u8>> {
        let rel = Layout::entry_rel(name);
        let read = self
            .root
            .open_file(&rel, libc::O_RDONLY, 0)
            .and_then(|f| Ok((cdir::fstat(&f)?, f)));
        match read {
            Ok((m, f)) if m.is_file() => read::read_entry_bytes(&f, m.len(), self.fs.local).ok(),
            _ => None,
        }
    }

    /// Verifies an entry file received whole: header, exact length, payload checksum, filed
    /// under `key`, and for a store with trusted keys, signed by one of them (an untrusted
    /// one is counted `untrusted`, its payload unread; a later release's is counted
    /// `newer_format`). The header, or the verdict on it.
    fn check_received(&self, key: Key<'_>, file: &[u8]) -> Result<entry::Header, Refusal> {
        gate::admit(file, self.opts.trust.as_deref(), key.bytes, None).inspect_err(|why| {
            match why {
                Refusal::Untrusted(_) => self.counters.inc(Counter::Untrusted),
                Refusal::NewerFormat(v) => self.newer_format(*v, "a received entry"),
                _ => {}
            }
            log::debug!("xla_pcache: a received entry is {why}; refused");
        })
    }

    /// Verifies an entry file received as bytes (header, exact length, payload checksum, filed
    /// under `key`, trusted when the store has trusted keys) and hands its payload back as a
    /// Blob without writing anything: what a read-only store does with a remote value. The
    /// core's verdict when it does not verify.
    pub fn verify_entry_file(
        &self,
        key: Key<'_>,
        file: Vec<u8>,
    ) -> Result<Result<Blob, Refusal>, StoreError> {
        check_key(&key)?;
        Ok(self
            .check_received(key, &file)
            .map(|h| Blob::owned(file, h)))
    }

    /// Verifies an entry file received as bytes once, publishes it when `publish` (as
    /// `put_entry_file`, without verifying it a second time) and hands its payload back as a
    /// Blob: a remote hit in one pass over the bytes. The verdict when it does not verify
    /// (nothing is written): what the fetch that received it is told. What is published is
    /// exactly what was verified: the same bytes, in memory this call owns, with its
    /// signature.
    pub fn take_entry_file(
        &self,
        key: Key<'_>,
        file: Vec<u8>,
        publish: bool,
    ) -> Result<Result<Blob, Refusal>, StoreError> {
        check_key(&key)?;
        let h = match self.check_received(key, &file) {
            Ok(h) => h,
            Err(why) => return Ok(Err(why)),
        };
        if publish {
            // Not publishing (exists, over budget, a write error) is a skipped write the put
            // counted; the verified payload is served all the same.
            self.put_received(key, &file, &h)?;
        }
        Ok(Ok(Blob::owned(file, h)))
    }

    /// As `take_entry_file`, for an entry file a tier spooled to `file` (a large object
    /// streamed to disk rather than held in memory): read once into memory allocated
    /// fallibly, after its first bytes' length agrees with the file's size. A file that
    /// cannot be read (or is larger than memory allows) is `Ok(None)`: a miss that proves
    /// nothing of the object, never an abort.
    pub fn take_entry_from_file(
        &self,
        key: Key<'_>,
        file: &File,
        publish: bool,
    ) -> Result<Option<Result<Blob, Refusal>>, StoreError> {
        check_key(&key)?;
        let len = match cdir::fstat(file) {
            Ok(m) if m.is_file() => m.len(),
            _ => return Ok(None),
        };
        // Read from the start, whatever the descriptor's offset (the writer may have left
        // it at the end).
        if io::Seek::seek(&mut &*file, io::SeekFrom::Start(0)).is_err() {
            return Ok(None);
        }
        match read::read_entry_bytes(file, len, true) {
            Ok(bytes) => self.take_entry_file(key, bytes, publish).map(Some),
            Err(read::ReadError::Corrupt(e, _)) => Ok(Some(Err(Refusal::of(e)))),
            Err(read::ReadError::Newer(v)) => {
                self.newer_format(v, "a received entry");
                Ok(Some(Err(Refusal::NewerFormat(v))))
            }
            Err(_) => Ok(None),
        }
    }

    /// A new unnamed file under the cache's tmp/ (`Dir::tmpfile`), reached through the
    /// root's handles with no link followed in any component, for a tier to stream a large
    /// entry file into before `take_entry_from_file`. A tmp/ that is not a real directory
    /// inside the cache is counted and warned of (`unsafe_paths`) and refused: the caller
    /// holds the value in memory instead.
    pub fn spool_file(&self) -> Result<File, StoreError> {
        let tmp = self
            .dir(&TMP)
            .map_err(|e| io_err("spool under", &self.layout.tmp(), e))?;
        tmp.tmpfile("remote")
            .map_err(|e| io_err("spool under", &self.layout.tmp(), e))
    }

    /// Publishes an entry received as a whole file, after verifying it as
    /// `verify_entry_file` does: whether it published it (what `put` returns; its signature
    /// is kept), or the verdict when it does not verify (nothing is written).
    pub fn put_entry_file(
        &self,
        key: Key<'_>,
        file: &[u8],
    ) -> Result<Result<bool, Refusal>, StoreError> {
        check_key(&key)?;
        match self.check_received(key, file) {
            Ok(h) => self.put_received(key, file, &h).map(Ok),
            Err(why) => Ok(Err(why)),
        }
    }

    /// Publishes the verified entry file `file` (header `h`), never signed by this store.
    fn put_received(
        &self,
        key: Key<'_>,
        file: &[u8],
        h: &entry::Header,
    ) -> Result<bool, StoreError> {
        let signing = self.received_signing(file, h);
        let res = self
            .put_entry(key, &file[h.header_len..], &h.meta, signing)
            .map(|p| p.is_some());
        self.release_claim_after_put(&key);
        res
    }

    /// How a received entry is published. Its signature is kept when this store's keys
    /// vouch for it: a trusting store's (`check_received` served only a trusted entry), or,
    /// for a signer without trusted keys, its own key. Otherwise it is written unsigned,
    /// whatever key the store holds: a store signs only what its own process produced. A
    /// store with no key at all keeps what the entry carries: it can check nothing, claims
    /// nothing, and every trusting reader checks the signature itself.
    fn received_signing(&self, file: &[u8], h: &entry::Header) -> Signing {
        let Some(fields) = h.signature.as_ref().and_then(sign::carried_fields) else {
            return Signing::Unsigned;
        };
        let vouched = match (self.opts.trust.as_deref(), self.write_trust.as_ref()) {
            (Some(_), _) | (None, None) => true,
            (None, Some(own)) => gate::judge(file, Some(own)).is_ok(),
        };
        if vouched {
            Signing::Carried(fields)
        } else {
            Signing::Unsigned
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{entry_name, name_hex};
    use crate::store::StoreOptions;
    use std::path::Path;
    use std::sync::Arc;

    fn key(s: &str) -> Key<'_> {
        Key {
            bytes: s.as_bytes(),
            is_text: true,
        }
    }

    fn store(dir: &Path) -> Store {
        Store::open(dir, StoreOptions::default()).unwrap()
    }

    #[test]
    fn entry_file_round_trip_and_in_memory_verify() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = store(a.path());
        let meta = vec![("m".to_string(), "1".to_string())];
        assert!(src.put(key("k"), &[7u8; 5000], &meta).unwrap());
        let file = src.get_entry_file(key("k")).unwrap().unwrap();
        assert!(src.get_entry_file(key("missing")).unwrap().is_none());

        let dst = store(b.path());
        let blob = dst
            .verify_entry_file(key("k"), file.clone())
            .unwrap()
            .unwrap();
        assert_eq!(blob.payload(), &[7u8; 5000][..]);
        assert_eq!(blob.header.meta, meta);
        assert!(!dst.contains(key("k")).unwrap()); // verifying writes nothing

        assert_eq!(dst.put_entry_file(key("k"), &file).unwrap(), Ok(true));
        assert_eq!(
            dst.get(key("k")).unwrap().unwrap().payload(),
            &[7u8; 5000][..]
        );
        assert_eq!(dst.put_entry_file(key("k"), &file).unwrap(), Ok(false));

        let c = tempfile::tempdir().unwrap();
        let third = store(c.path());
        let blob = third
            .take_entry_file(key("k"), file.clone(), false)
            .unwrap()
            .unwrap();
        assert_eq!(blob.payload(), &[7u8; 5000][..]);
        assert!(!third.contains(key("k")).unwrap()); // not asked to publish
        let blob = third
            .take_entry_file(key("k"), file.clone(), true)
            .unwrap()
            .unwrap();
        assert_eq!(blob.header.meta, meta);
        assert_eq!(
            third.get(key("k")).unwrap().unwrap().payload(),
            &[7u8; 5000][..]
        );
    }

    #[test]
    fn entry_file_damage_is_rejected_and_never_written() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = store(a.path());
        src.put(key("k"), &[3u8; 4000], &[]).unwrap();
        let file = src.get_entry_file(key("k")).unwrap().unwrap();
        let header_len = entry::verify(&file).unwrap().header_len;

        let mut flipped_payload = file.clone();
        *flipped_payload.last_mut().unwrap() ^= 0xFF;
        let mut flipped_header = file.clone();
        flipped_header[header_len / 2] ^= 0x01;
        let mut longer = file.clone();
        longer.push(0);
        let cases: Vec<(&str, Key<'_>, Vec<u8>)> = vec![
            ("wrong key", key("other"), file.clone()),
            ("truncated", key("k"), file[..file.len() - 1].to_vec()),
            ("header only", key("k"), file[..header_len].to_vec()),
            ("trailing byte", key("k"), longer),
            ("payload byte", key("k"), flipped_payload),
            ("header byte", key("k"), flipped_header),
            ("empty", key("k"), Vec::new()),
        ];
        let dst = store(b.path());
        for (what, k, bytes) in cases {
            assert!(
                dst.verify_entry_file(k, bytes.clone()).unwrap().is_err(),
                "{what}: verified"
            );
            assert!(
                dst.put_entry_file(k, &bytes).unwrap().is_err(),
                "{what}: published"
            );
            assert!(
                dst.take_entry_file(k, bytes.clone(), true)
                    .unwrap()
                    .is_err(),
                "{what}: taken"
            );
        }
        assert!(dst.entries().unwrap().is_empty());
    }

    #[test]
    fn an_entry_head_tells_its_length_only_when_it_verifies_and_is_filed_under_the_name() {
        let a = tempfile::tempdir().unwrap();
        let src = store(a.path());
        src.put(key("k"), &[5u8; 3000], &[]).unwrap();
        let file = src.get_entry_file(key("k")).unwrap().unwrap();
        let name = name_hex(entry_name(b"k"));
        let header_len = entry::verify(&file).unwrap().header_len;
        let size = file.len() as u64;
        let told = |head: &[u8], name: &str| gate::judge_head(head, name, size).is_ok();
        assert!(told(&file[..header_len], &name));
        assert!(told(&file, &name));
        assert!(!told(&file, &name_hex(entry_name(b"other"))));
        assert!(!told(&file[..header_len - 1], &name));
        assert!(!told(&[0u8; 4096], &name));
        let mut flipped = file.clone();
        flipped[20] ^= 1;
        assert!(!told(&flipped, &name));
        // Nor for an object of another size than its header gives.
        assert!(gate::judge_head(&file, &name, size + 1).is_err());
    }

    #[test]
    fn a_signed_entry_head_is_also_filed_under_its_signers_own_name() {
        let a = tempfile::tempdir().unwrap();
        let signer = Arc::new(sign::Signer::new("ci-1", &[4u8; 32]).unwrap());
        let opts = StoreOptions {
            signer: Some(signer),
            ..StoreOptions::default()
        };
        let src = Store::open(a.path(), opts).unwrap();
        src.put(key("k"), &[6u8; 2000], &[]).unwrap();
        let file = src.get_entry_file(key("k")).unwrap().unwrap();
        let size = file.len() as u64;
        let told = |file: &[u8], name: &str| gate::judge_head(file, name, size).is_ok();
        let own = |k: &[u8], s: &str| name_hex(sign::signed_name(k, s));
        assert!(told(&file, &name_hex(entry_name(b"k"))));
        assert!(told(&file, &own(b"k", "ci-1")));
        // Not under another signer's name, nor another key's.
        assert!(!told(&file, &own(b"k", "ci-2")));
        assert!(!told(&file, &own(b"j", "ci-1")));
        // An unsigned entry has no signer's name.
        let b = tempfile::tempdir().unwrap();
        let plain = store(b.path());
        plain.put(key("k"), &[6u8; 2000], &[]).unwrap();
        let file = plain.get_entry_file(key("k")).unwrap().unwrap();
        assert!(gate::judge_head(&file, &own(b"k", "ci-1"), file.len() as u64).is_err());
    }

    #[test]
    fn an_entry_spooled_to_a_file_is_taken_once_and_garbage_is_a_miss() {
        use std::io::Write as _;
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = store(a.path());
        src.put(key("k"), &[9u8; 70_000], &[]).unwrap();
        let file = src.get_entry_file(key("k")).unwrap().unwrap();
        let dst = store(b.path());

        let mut spooled = tempfile::tempfile().unwrap();
        spooled.write_all(&file).unwrap();
        let blob = dst
            .take_entry_from_file(key("k"), &spooled, true)
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(blob.payload(), &[9u8; 70_000][..]);
        assert!(dst.contains(key("k")).unwrap());

        let mut junk = tempfile::tempfile().unwrap();
        junk.write_all(&[0u8; 200_000]).unwrap();
        assert!(dst
            .take_entry_from_file(key("j"), &junk, true)
            .unwrap()
            .is_none_or(|taken| taken.is_err()));
        assert!(!dst.contains(key("j")).unwrap());
    }
}
