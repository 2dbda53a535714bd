//! Signed entries: Ed25519 signatures over a BLAKE3 digest of the payload, trusted key sets,
//! and the verification a trusting reader makes before it exposes a byte.
//!
//! A signed entry is an ordinary entry (format 1) whose metadata carries three reserved
//! fields: the signer's key name, the BLAKE3 digest of the payload (hex) and the Ed25519
//! signature (hex). Readers of this version strip them from the metadata they hand out; older
//! readers see three more metadata fields and serve the entry as before (its xxh3 checksum is
//! kept valid). What is signed is `message()`: a domain tag, the cache key, the payload's
//! length and digest, the producer's metadata, and the signer's name.
//!
//! A trusted writer whose key's plain file is held by an entry it would not trust publishes
//! under a second name, `signed_name(key, signer)`: one per key name, so only entries of
//! distinct trusted keys sit side by side, and they are bounded by the trusted set.

// The signed-entry metadata format is the entry format's (entry.rs); signing uses it.
#[cfg(test)]
use crate::entry::split_meta;
use crate::entry::{self, hex, EntryError, Header};
pub use crate::entry::{
    fields_signer, SigFields, META_DIGEST, META_PREFIX, META_SIGNATURE, META_SIGNER,
};
use crate::verified::{self, VerificationRecord};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use std::collections::HashSet;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const DOMAIN: &[u8] = b"xla_pcache signed entry v1\0";
/// Payloads at least this large are hashed by all cores (blake3's rayon back-end, on the
/// store's own pool): below it waking the threads costs more than it saves.
const PARALLEL_MIN: usize = 1 << 20;
/// Verified messages remembered per trusted set; past it the memory starts over.
const VERIFIED_MAX: usize = 1 << 16;

/// Why a trusting reader would not serve an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untrusted {
    Unsigned,
    /// Signed by a key name outside the trusted set.
    NotTrusted(String),
    /// Signed under a trusted name, but the signature does not verify (forged, or copied
    /// onto another key or metadata).
    BadSignature(String),
    /// Under a signer's second name, but not signed by that name.
    Misfiled(String),
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Untrusted::Unsigned => f.write_str("unsigned"),
            Untrusted::NotTrusted(n) => write!(f, "signed by {n}, not trusted"),
            Untrusted::BadSignature(n) => {
                write!(f, "signed as {n}, but the signature does not verify")
            }
            Untrusted::Misfiled(n) => write!(f, "filed as {n}'s entry, but not signed by {n}"),
        }
    }
}

/// A key name: letters, digits, `.`, `_`, `-`, at most 64 bytes, ending in `-<version>`
/// (`ci-1`, then `ci-2`), so that keys can be rotated and revoked by name.
pub fn check_key_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    let versioned = name.rsplit_once('-').is_some_and(|(base, v)| {
        !base.is_empty() && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())
    });
    if name.is_empty() || name.len() > 64 || !ok_chars || !versioned {
        return Err(format!(
            "key name {name:?} must be letters, digits, '.', '_' or '-' (at most 64) ending in \
             a version, like 'ci-1'"
        ));
    }
    Ok(())
}

/// BLAKE3 of a payload, on every core for large ones.
pub fn digest(payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let pool = if payload.len() >= PARALLEL_MIN {
        hash_pool()
    } else {
        None
    };
    match pool {
        Some(pool) => pool.install(|| h.update_rayon(payload)),
        None => h.update(payload),
    };
    *h.finalize().as_bytes()
}

/// The thread pool that hashes large payloads, one per process.
///
/// Not rayon's global pool: a forked child inherits a pool whose threads stayed in the
/// parent, and every job it sends there waits for ever (Python's multiprocessing and data
/// loader workers fork). The pool is tagged with the pid that built it, and a process that
/// finds its parent's builds its own; the parent's is left as it is (leaked), since freeing
/// it would signal threads that do not exist here. No lock is taken, so a fork while
/// another thread is in here leaves nothing locked. None if no thread can be started: the
/// payload is then hashed on the calling thread.
fn hash_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: AtomicPtr<(u32, rayon::ThreadPool)> = AtomicPtr::new(std::ptr::null_mut());
    let pid = std::process::id();
    let current = POOL.load(Ordering::Acquire);
    // SAFETY: a non-null pointer was published by `Box::into_raw` below and is never freed.
    if let Some((owner, pool)) = unsafe { current.as_ref() } {
        if *owner == pid {
            return Some(pool);
        }
    }
    // The core count, read once (it reads cgroup files): an atomic, not a OnceLock, whose
    // initialisation under way in another thread at a fork would wait for ever in the child.
    static THREADS: AtomicUsize = AtomicUsize::new(0);
    let threads = match THREADS.load(Ordering::Relaxed) {
        0 => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            THREADS.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    };
    if threads < 2 {
        return None;
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("xla_pcache-hash-{i}"))
        .build()
        .ok()?;
    let mine = Box::into_raw(Box::new((pid, pool)));
    match POOL.compare_exchange(current, mine, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just published; never freed.
        Ok(_) => unsafe { mine.as_ref() }.map(|(_, p)| p),
        Err(other) => {
            // Another thread of this process built one first: use it, drop ours (its
            // threads are this process's own).
            // SAFETY: `mine` was never published, so this is its only owner.
            drop(unsafe { Box::from_raw(mine) });
            // SAFETY: as above, published and never freed.
            unsafe { other.as_ref() }
                .filter(|(owner, _)| *owner == pid)
                .map(|(_, p)| p)
        }
    }
}

/// The bytes a signature covers.
pub fn message(
    key: &[u8],
    key_is_text: bool,
    payload_len: u64,
    digest: &[u8; 32],
    meta: &[(String, String)],
    signer: &str,
) -> Result<Vec<u8>, EntryError> {
    let meta = entry::encode_meta(meta)?;
    let mut m = Vec::with_capacity(DOMAIN.len() + key.len() + meta.len() + signer.len() + 64);
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(&(key.len() as u32).to_le_bytes());
    m.extend_from_slice(key);
    m.push(key_is_text as u8);
    m.extend_from_slice(&payload_len.to_le_bytes());
    m.extend_from_slice(digest);
    m.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    m.extend_from_slice(&meta);
    m.extend_from_slice(&(signer.len() as u16).to_le_bytes());
    m.extend_from_slice(signer.as_bytes());
    Ok(m)
}

/// The name of a signer's own file for `key`, beside the plain one (`entry_name(key)`).
pub fn signed_name(key: &[u8], signer: &str) -> u128 {
    let mut b = Vec::with_capacity(key.len() + signer.len() + 24);
    b.extend_from_slice(b"xla_pcache signed by\0");
    b.extend_from_slice(signer.as_bytes());
    b.push(0);
    b.extend_from_slice(key);
    crate::hash::entry_name(&b)
}

/// The metadata fields that carry a signature read from an entry, to write it again
/// elsewhere unchanged (None when they were malformed: such an entry is unsigned there).
pub fn carried_fields(sig: &SigFields) -> Option<Vec<(String, String)>> {
    let (d, s) = (sig.digest?, sig.signature?);
    check_key_name(&sig.signer).ok()?;
    Some(vec![
        (META_SIGNER.to_string(), sig.signer.clone()),
        (META_DIGEST.to_string(), hex(&d)),
        (META_SIGNATURE.to_string(), hex(&s)),
    ])
}

/// A private key and its name: every put of a store holding one is signed.
pub struct Signer {
    name: String,
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({})", self.name)
    }
}

impl Signer {
    pub fn new(name: &str, seed: &[u8]) -> Result<Signer, String> {
        check_key_name(name)?;
        let seed: [u8; 32] = seed
            .try_into()
            .map_err(|_| format!("a private key is 32 bytes, got {}", seed.len()))?;
        Ok(Signer {
            name: name.to_string(),
            key: SigningKey::from_bytes(&seed),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn public_key(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }

    /// The reserved metadata fields that sign an entry of `key` with this payload and
    /// producer metadata.
    pub fn sign(
        &self,
        key: &[u8],
        key_is_text: bool,
        payload: &[u8],
        meta: &[(String, String)],
    ) -> Result<Vec<(String, String)>, EntryError> {
        let d = digest(payload);
        let m = message(key, key_is_text, payload.len() as u64, &d, meta, &self.name)?;
        let sig = self.key.sign(&m);
        Ok(vec![
            (META_SIGNER.to_string(), self.name.clone()),
            (META_DIGEST.to_string(), hex(&d)),
            (META_SIGNATURE.to_string(), hex(&sig.to_bytes())),
        ])
    }
}

/// A new private key (32 random bytes from the operating system).
pub fn generate_seed() -> Result<[u8; 32], String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("no randomness from the system: {e}"))?;
    Ok(seed)
}

/// The public key of a private key.
pub fn public_key(seed: &[u8]) -> Result<[u8; 32], String> {
    let seed: [u8; 32] = seed
        .try_into()
        .map_err(|_| format!("a private key is 32 bytes, got {}", seed.len()))?;
    Ok(SigningKey::from_bytes(&seed).verifying_key().to_bytes())
}

/// The keys a reader trusts, by name, and the messages it has verified already (each
/// entry's signature is checked once per process, and once per user with a record).
pub struct TrustSet {
    keys: Vec<(String, VerifyingKey)>,
    verified: Mutex<HashSet<[u8; 32]>>,
    /// The signatures this user's processes verified before (`verified.rs`).
    record: Option<Arc<VerificationRecord>>,
}

impl std::fmt::Debug for TrustSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.keys.iter().map(|(n, _)| n.as_str()).collect();
        write!(f, "TrustSet({names:?})")
    }
}

impl TrustSet {
    pub fn new(keys: &[(String, Vec<u8>)]) -> Result<TrustSet, String> {
        let mut out: Vec<(String, VerifyingKey)> = Vec::new();
        for (name, public) in keys {
            check_key_name(name)?;
            if out.iter().any(|(n, _)| n == name) {
                return Err(format!("key name {name:?} is given twice"));
            }
            let b: [u8; 32] = public
                .as_slice()
                .try_into()
                .map_err(|_| format!("public key {name:?} is {} bytes, not 32", public.len()))?;
            let k = VerifyingKey::from_bytes(&b)
                .map_err(|_| format!("public key {name:?} is not an Ed25519 key"))?;
            out.push((name.clone(), k));
        }
        Ok(TrustSet {
            keys: out,
            verified: Mutex::new(HashSet::new()),
            record: None,
        })
    }

    /// This set, looking signatures up in `record` before verifying them, and adding to it
    /// those it verifies.
    pub fn with_record(mut self, record: Option<Arc<VerificationRecord>>) -> TrustSet {
        self.record = record;
        self
    }

    /// Opens the verification record now (`Store::open` does), not at the first lookup.
    pub fn open_record(&self) {
        if let Some(r) = &self.record {
            r.open_now();
        }
    }

    /// How many times the verification record was refused (not used) since the last call.
    pub fn take_record_problems(&self) -> u64 {
        self.record.as_ref().map_or(0, |r| r.take_problems())
    }

    /// `base`'s keys (all but one named as `signer`) and `signer`'s own public key.
    pub fn with_signer(base: Option<&TrustSet>, signer: &Signer) -> TrustSet {
        let mut keys: Vec<(String, VerifyingKey)> = base
            .map(|b| {
                b.keys
                    .iter()
                    .filter(|(n, _)| n != signer.name())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        keys.push((signer.name.clone(), signer.key.verifying_key()));
        TrustSet {
            keys,
            verified: Mutex::new(HashSet::new()),
            record: base.and_then(|b| b.record.clone()),
        }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(n, _)| n.as_str())
    }

    /// Each key's name and public key, in the set's order.
    pub fn public_keys(&self) -> impl Iterator<Item = (&str, [u8; 32])> {
        self.keys.iter().map(|(n, k)| (n.as_str(), k.to_bytes()))
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn key(&self, name: &str) -> Option<&VerifyingKey> {
        self.keys.iter().find(|(n, _)| n == name).map(|(_, k)| k)
    }

    /// Whether a header's signature would be accepted before the payload is looked at:
    /// the signer trusted and the signature valid over the digest the header claims. The
    /// payload must still hash to that digest (`verify_entry`).
    pub fn check_header(&self, h: &Header) -> Result<[u8; 32], Untrusted> {
        let Some(sig) = &h.signature else {
            return Err(Untrusted::Unsigned);
        };
        let Some(key) = self.key(&sig.signer) else {
            return Err(Untrusted::NotTrusted(sig.signer.clone()));
        };
        let bad = || Untrusted::BadSignature(sig.signer.clone());
        let (Some(d), Some(s)) = (sig.digest, sig.signature) else {
            return Err(bad());
        };
        let m = message(
            &h.key,
            h.key_is_text,
            h.payload_len,
            &d,
            &h.meta,
            &sig.signer,
        )
        .map_err(|_| bad())?;
        let id = *blake3::hash(&m).as_bytes();
        // try_lock: a lock another thread held when this process was forked stays locked in
        // the child; a busy memory is only a verification more.
        if self.verified.try_lock().is_ok_and(|v| v.contains(&id)) {
            return Ok(d);
        }
        let recorded = self
            .record
            .as_ref()
            .map(|r| (r, verified::id(key.as_bytes(), &s, &m)));
        match &recorded {
            Some((r, rid)) if r.contains(rid) => {}
            _ => {
                key.verify_strict(&m, &Signature::from_bytes(&s))
                    .map_err(|_| bad())?;
                if let Some((r, rid)) = recorded {
                    r.add(rid);
                }
            }
        }
        if let Ok(mut v) = self.verified.try_lock() {
            if v.len() >= VERIFIED_MAX {
                v.clear();
            }
            v.insert(id);
        }
        Ok(d)
    }
}

/// What a trusting reader concluded about a whole entry file.
#[derive(Debug)]
pub enum Verdict {
    Trusted(Header),
    Untrusted(Untrusted),
}

/// Verifies a whole entry file for a trusting reader, in one pass over the payload: the
/// header, the exact length, the signature (once per process), and the payload's BLAKE3,
/// which stands in for the xxh3 checksum. An unsigned or untrusted entry's payload is never
/// read. A payload that does not hash to its signed digest is corrupt.
pub fn verify_entry(file: &[u8], trust: &TrustSet) -> Result<Verdict, EntryError> {
    let header = entry::decode_header(file)?;
    if header.file_len() != file.len() as u64 {
        return Err(EntryError::BadLength {
            expected: header.file_len(),
            actual: file.len() as u64,
        });
    }
    match trust.check_header(&header) {
        Err(why) => Ok(Verdict::Untrusted(why)),
        Ok(d) => {
            if digest(&file[header.header_len..]) != d {
                return Err(EntryError::PayloadChecksum);
            }
            Ok(Verdict::Trusted(header))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::checksum;

    fn signer(name: &str, byte: u8) -> Signer {
        Signer::new(name, &[byte; 32]).unwrap()
    }

    fn trust(signers: &[&Signer]) -> TrustSet {
        let keys: Vec<(String, Vec<u8>)> = signers
            .iter()
            .map(|s| (s.name().to_string(), s.public_key().to_vec()))
            .collect();
        TrustSet::new(&keys).unwrap()
    }

    fn signed(s: &Signer, key: &[u8], payload: &[u8]) -> Vec<u8> {
        let producer = vec![("framework".to_string(), "jax".to_string())];
        let mut meta = producer.clone();
        meta.extend(s.sign(key, true, payload, &producer).unwrap());
        let mut f =
            entry::encode_header(key, true, &meta, payload.len() as u64, checksum(payload), 1)
                .unwrap();
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn signed_entry_verifies_and_hides_its_fields() {
        let ci = signer("ci-1", 1);
        let f = signed(&ci, b"k", b"payload");
        // An older reader's check still passes: the xxh3 checksum is kept.
        let plain = entry::verify(&f).unwrap();
        assert_eq!(
            plain.meta,
            vec![("framework".to_string(), "jax".to_string())]
        );
        assert_eq!(plain.signature.as_ref().unwrap().signer, "ci-1");
        match verify_entry(&f, &trust(&[&ci])).unwrap() {
            Verdict::Trusted(h) => assert_eq!(&f[h.header_len..], b"payload"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn untrusted_signers_and_unsigned_entries_are_named() {
        let ci = signer("ci-1", 1);
        let mallory = signer("mallory-1", 2);
        let t = trust(&[&ci]);
        let f = signed(&mallory, b"k", b"x");
        let Verdict::Untrusted(why) = verify_entry(&f, &t).unwrap() else {
            panic!()
        };
        assert_eq!(why.to_string(), "signed by mallory-1, not trusted");
        let mut u = entry::encode_header(b"k", true, &[], 1, checksum(b"x"), 1).unwrap();
        u.push(b'x');
        let Verdict::Untrusted(why) = verify_entry(&u, &t).unwrap() else {
            panic!()
        };
        assert_eq!(why, Untrusted::Unsigned);
    }

    #[test]
    fn a_forger_using_a_trusted_name_is_refused() {
        let ci = signer("ci-1", 1);
        let forger = signer("ci-1", 9);
        let f = signed(&forger, b"k", b"x");
        let Verdict::Untrusted(why) = verify_entry(&f, &trust(&[&ci])).unwrap() else {
            panic!()
        };
        assert_eq!(why, Untrusted::BadSignature("ci-1".into()));
    }

    #[test]
    fn a_signature_copied_onto_other_bytes_is_refused() {
        let ci = signer("ci-1", 1);
        let t = trust(&[&ci]);
        let good = signed(&ci, b"k", b"the real executable");
        let h = entry::decode_header(&good).unwrap();
        // The same signature fields over other bytes of the same length, with a fresh xxh3.
        let mut meta = h.meta.clone();
        let sig = h.signature.clone().unwrap();
        meta.push((META_SIGNER.into(), sig.signer.clone()));
        meta.push((META_DIGEST.into(), hex(&sig.digest.unwrap())));
        meta.push((META_SIGNATURE.into(), hex(&sig.signature.unwrap())));
        let evil = b"an evil executable!";
        let mut f =
            entry::encode_header(b"k", true, &meta, evil.len() as u64, checksum(evil), 1).unwrap();
        f.extend_from_slice(evil);
        assert!(entry::verify(&f).is_ok(), "the xxh3 layer alone is fooled");
        assert_eq!(
            verify_entry(&f, &t).unwrap_err(),
            EntryError::PayloadChecksum
        );
        // Onto another key: the signature does not cover it.
        let mut f = entry::encode_header(
            b"other",
            true,
            &meta,
            19,
            checksum(b"the real executable"),
            1,
        )
        .unwrap();
        f.extend_from_slice(b"the real executable");
        assert!(matches!(
            verify_entry(&f, &t).unwrap(),
            Verdict::Untrusted(Untrusted::BadSignature(_))
        ));
    }

    #[test]
    fn every_flipped_payload_or_signature_byte_is_refused() {
        let ci = signer("ci-1", 1);
        let t = trust(&[&ci]);
        let f = signed(&ci, b"key", &[5u8; 100]);
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x01;
            let trusted = matches!(verify_entry(&g, &t), Ok(Verdict::Trusted(_)));
            assert!(!trusted, "flip at byte {i} still trusted");
        }
    }

    /// A trust set with a record in `dir`, as a new process would open it.
    fn recording(signers: &[&Signer], dir: &std::path::Path) -> TrustSet {
        trust(signers).with_record(Some(Arc::new(VerificationRecord::at(dir.to_path_buf()))))
    }

    #[test]
    fn a_recorded_signature_is_not_verified_again_and_binds_the_key() {
        let t = tempfile::tempdir().unwrap();
        let rec = t.path().join("rec");
        let ci = signer("ci-1", 1);
        let f = signed(&ci, b"k", b"payload");
        assert!(matches!(
            verify_entry(&f, &recording(&[&ci], &rec)).unwrap(),
            Verdict::Trusted(_)
        ));
        let h = entry::decode_header(&f).unwrap();
        let sig = h.signature.clone().unwrap();
        let m = message(b"k", true, 7, &sig.digest.unwrap(), &h.meta, "ci-1").unwrap();
        let id = verified::id(&ci.public_key(), &sig.signature.unwrap(), &m);
        assert!(VerificationRecord::at(rec.clone()).contains(&id));

        // The same name, another key: what its trust set recorded does not vouch for an
        // entry of that key before a set trusting the real one.
        let forger = signer("ci-1", 9);
        let forged = signed(&forger, b"k", b"payload");
        assert!(matches!(
            verify_entry(&forged, &recording(&[&forger], &rec)).unwrap(),
            Verdict::Trusted(_)
        ));
        assert!(matches!(
            verify_entry(&forged, &recording(&[&ci], &rec)).unwrap(),
            Verdict::Untrusted(Untrusted::BadSignature(_))
        ));

        // Whoever can write the record vouches for a signature that does not verify: the
        // record must be this user's alone. In a record others can write it counts for
        // nothing.
        let h = entry::decode_header(&forged).unwrap();
        let fs = h.signature.clone().unwrap();
        let m = message(b"k", true, 7, &fs.digest.unwrap(), &h.meta, "ci-1").unwrap();
        let planted = verified::id(&ci.public_key(), &fs.signature.unwrap(), &m);
        VerificationRecord::at(rec.clone()).add(planted);
        assert!(matches!(
            verify_entry(&forged, &recording(&[&ci], &rec)).unwrap(),
            Verdict::Trusted(_)
        ));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(rec.join("record"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let ts = recording(&[&ci], &rec);
        assert!(matches!(
            verify_entry(&forged, &ts).unwrap(),
            Verdict::Untrusted(Untrusted::BadSignature(_))
        ));
        assert_eq!(ts.take_record_problems(), 1);
        // The payload is still checked against the signed digest on a recorded signature.
        let mut other = f.clone();
        let n = other.len();
        other[n - 1] ^= 1;
        assert_eq!(
            verify_entry(&other, &recording(&[&ci], &t.path().join("rec2"))).unwrap_err(),
            EntryError::PayloadChecksum
        );
    }

    #[test]
    fn names_carry_a_version() {
        for ok in ["ci-1", "cache.example.org-12", "a_b-0"] {
            assert!(check_key_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "ci",
            "ci-",
            "-1",
            "ci-1a",
            "ci 1-1",
            "a:b-1",
            &"x".repeat(70),
        ] {
            assert!(check_key_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn trust_sets_refuse_bad_keys() {
        assert!(TrustSet::new(&[("ci-1".into(), vec![0u8; 31])]).is_err());
        let k = signer("ci-1", 1).public_key().to_vec();
        assert!(TrustSet::new(&[("ci-1".into(), k.clone()), ("ci-1".into(), k)]).is_err());
        assert!(Signer::new("ci-1", &[0u8; 31]).is_err());
    }

    #[test]
    fn signed_names_differ_by_signer_and_key() {
        assert_ne!(signed_name(b"k", "ci-1"), signed_name(b"k", "ci-2"));
        assert_ne!(signed_name(b"k", "ci-1"), signed_name(b"j", "ci-1"));
        assert_ne!(signed_name(b"k", "ci-1"), crate::hash::entry_name(b"k"));
    }

    #[test]
    fn producer_meta_cannot_use_the_reserved_names() {
        let (producer, sig) = split_meta(vec![("a".into(), "1".into())]);
        assert_eq!(producer.len(), 1);
        assert!(sig.is_none());
    }
}
