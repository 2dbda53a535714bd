//! Every xxh3 of the project: payload checksums (written and verified), header, journal and
//! snapshot checksums, entry file names, and the key hasher behind `hash_key` / `Hasher`.
//!
//! The vector unit is chosen at run time, because an abi3 wheel is built for baseline
//! x86-64 and cannot be compiled for the user's CPU. Two layers:
//! - inputs past 240 bytes (the only vectorised part of xxh3) on a CPU with AVX-512F take
//!   the AVX-512 loop in `hash/long.rs`, one-shot and streaming. No maintained crate has
//!   one chosen at run time (twox-hash stops at AVX2, xxhash-rust chooses at compile time),
//!   and it is what closes the gap to the C library on cached data (docs/benchmarks.md);
//! - everything else goes to `twox-hash` (2.x), which compiles its stripe loop for AVX2,
//!   SSE2 (x86-64) and NEON (aarch64) and picks one per call from the cached CPU feature
//!   bits.
//!
//! Both give the reference xxHash values, so the on-disk format is unchanged (xxh3-64
//! checksums, xxh3-128 names). The previous implementation, `xxhash-rust` built for the
//! baseline target (SSE2 on x86-64, NEON on aarch64), stays as the `portable` path:
//! `XLA_PCACHE_HASH_IMPL=portable` forces it, as an escape hatch and as a baseline;
//! `XLA_PCACHE_HASH_IMPL=twox` leaves out the AVX-512 loop.

use std::hash::Hasher as _;
use std::sync::OnceLock;
use twox_hash::xxhash3_128::RawHasher as Raw128;
use twox_hash::xxhash3_64::{RawHasher as Raw64, SecretBuffer, DEFAULT_SECRET_LENGTH};
use twox_hash::{XxHash3_128, XxHash3_64};

// A path relative to this file: `rust/hash-paths` builds this module on its own.
#[path = "hash/long.rs"]
mod long;

/// The AVX-512 kernel where the CPU has it (the feature bits are cached by std).
#[cfg(target_arch = "x86_64")]
fn avx512() -> Option<long::Avx512> {
    long::Avx512::detect()
}

/// The default secret, owned by the hasher. Owned rather than borrowed from a static: with a
/// borrowed secret the compiler cannot prove that the accumulators do not alias it, keeps
/// them in memory across stripes, and streams at a fraction of the speed (docs/benchmarks.md, "Measurements behind the code").
type Secret = [u8; DEFAULT_SECRET_LENGTH];

fn secret_buffer() -> SecretBuffer<Secret> {
    // Seed 0 keeps the default secret as it is: the values of plain xxh3.
    match SecretBuffer::with_seed(0, [0; DEFAULT_SECRET_LENGTH]) {
        Ok(b) => b,
        // with_seed refuses only a secret of another length; the array type fixes it.
        Err(_) => unreachable!("a DEFAULT_SECRET_LENGTH array is what with_seed takes"),
    }
}

/// Longest key the store accepts. Keys are kept whole in the entry header, so this bounds
/// the header a reader must take in before it can verify anything.
pub const MAX_KEY_LEN: usize = 4096;

/// Environment variable that forces an implementation: `auto` (default), `twox` or
/// `portable`.
pub const IMPL_ENV: &str = "XLA_PCACHE_HASH_IMPL";

/// Which xxh3 implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashImpl {
    /// The AVX-512 loop for long inputs where the CPU has it, twox-hash for the rest.
    Dispatch,
    /// twox-hash alone: AVX2 / SSE2 / NEON chosen at run time.
    Twox,
    /// xxhash-rust as compiled for the build target (no run-time choice).
    Portable,
}

impl HashImpl {
    /// Every implementation, for tests and benchmarks.
    pub const ALL: [HashImpl; 3] = [HashImpl::Dispatch, HashImpl::Twox, HashImpl::Portable];

    fn from_env_value(v: &str) -> Result<Self, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" | "dispatch" => Ok(HashImpl::Dispatch),
            "twox" => Ok(HashImpl::Twox),
            "portable" => Ok(HashImpl::Portable),
            other => Err(format!(
                "{IMPL_ENV}={other:?} is not 'auto', 'twox' or 'portable'; using 'auto'"
            )),
        }
    }

    /// The vector path this implementation takes on this CPU for long inputs, e.g.
    /// `avx512`, `avx2` or `portable-sse2`.
    pub fn path(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            HashImpl::Dispatch if avx512().is_some() => "avx512",
            HashImpl::Dispatch | HashImpl::Twox => dispatch_path(),
            HashImpl::Portable => portable_path(),
        }
    }
}

/// Mirrors the choice twox-hash makes for inputs past 240 bytes (shorter ones are scalar on
/// every path).
fn dispatch_path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            return "avx2";
        }
        "sse2"
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return "neon";
        }
        "scalar"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    "scalar"
}

fn portable_path() -> &'static str {
    if cfg!(target_feature = "avx512f") {
        "portable-avx512"
    } else if cfg!(target_feature = "avx2") {
        "portable-avx2"
    } else if cfg!(target_feature = "sse2") {
        "portable-sse2"
    } else if cfg!(target_feature = "neon") {
        "portable-neon"
    } else {
        "portable-scalar"
    }
}

/// The implementation in use: read once from [`IMPL_ENV`]; an unknown value is logged and
/// ignored (a hash setting never stops the program).
pub fn active() -> HashImpl {
    static ACTIVE: OnceLock<HashImpl> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let v = std::env::var(IMPL_ENV).unwrap_or_default();
        HashImpl::from_env_value(&v).unwrap_or_else(|msg| {
            log::warn!("xla_pcache: {msg}");
            HashImpl::Dispatch
        })
    })
}

/// The AVX-512 kernel, where `imp` and the CPU allow it and `len` is past xxh3's short paths.
#[cfg(target_arch = "x86_64")]
fn long_kernel(imp: HashImpl, len: usize) -> Option<long::Avx512> {
    if imp == HashImpl::Dispatch && len > long::CUTOFF {
        avx512()
    } else {
        None
    }
}

/// xxh3-64 of `data` with `imp`.
pub fn xxh3_64_with(imp: HashImpl, data: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = long_kernel(imp, data.len()) {
        return long::oneshot64(k, data);
    }
    match imp {
        HashImpl::Dispatch | HashImpl::Twox => XxHash3_64::oneshot(data),
        HashImpl::Portable => xxhash_rust::xxh3::xxh3_64(data),
    }
}

/// xxh3-128 of `data` with `imp`.
pub fn xxh3_128_with(imp: HashImpl, data: &[u8]) -> u128 {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = long_kernel(imp, data.len()) {
        return long::oneshot128(k, data);
    }
    match imp {
        HashImpl::Dispatch | HashImpl::Twox => XxHash3_128::oneshot(data),
        HashImpl::Portable => xxhash_rust::xxh3::xxh3_128(data),
    }
}

/// Checksum of an entry payload, a journal record or an index snapshot (xxh3-64).
pub fn checksum(data: &[u8]) -> u64 {
    xxh3_64_with(active(), data)
}

/// The 128-bit name under which an entry is filed. Every key goes through the hash, so
/// file names are uniform, safe on every filesystem and never case-folded into each other;
/// the full key is kept in the header and compared on read, so equal names cannot alias.
pub fn entry_name(key: &[u8]) -> u128 {
    xxh3_128_with(active(), key)
}

/// Streaming xxh3-64: the same value as [`checksum`] of the concatenated parts. Allocates
/// nothing on the default path.
#[derive(Clone)]
pub struct Checksum(Stream64);

// Unboxed on purpose: a checksum lives on the stack of a put or a header check, and boxing
// it would cost an allocation each time.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Stream64 {
    #[cfg(target_arch = "x86_64")]
    Avx512(long::Stream<long::Avx512>),
    Twox(Raw64<Secret>),
    Portable(Box<xxhash_rust::xxh3::Xxh3>),
}

impl Checksum {
    pub fn new() -> Self {
        Self::with(active())
    }

    pub fn with(imp: HashImpl) -> Self {
        // The CPU is asked only on the path that uses the answer: asking costs a process
        // tens of microseconds in a virtual machine (`long::has_avx512f`).
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = (imp == HashImpl::Dispatch).then(avx512).flatten() {
            return Self(Stream64::Avx512(long::Stream::new(k)));
        }
        Self(match imp {
            HashImpl::Dispatch | HashImpl::Twox => Stream64::Twox(Raw64::new(secret_buffer())),
            HashImpl::Portable => Stream64::Portable(Box::default()),
        })
    }

    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            #[cfg(target_arch = "x86_64")]
            Stream64::Avx512(h) => h.update(data),
            Stream64::Twox(h) => h.write(data),
            Stream64::Portable(h) => h.update(data),
        }
    }

    pub fn digest(&self) -> u64 {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Stream64::Avx512(h) => h.digest64(),
            Stream64::Twox(h) => h.finish(),
            Stream64::Portable(h) => h.digest(),
        }
    }
}

impl Default for Checksum {
    fn default() -> Self {
        Self::new()
    }
}

/// Lower-case hex of a 128-bit name, 32 characters.
pub fn name_hex(name: u128) -> String {
    format!("{name:032x}")
}

/// Parses a 32-character lower-case hex file name back into a name.
pub fn parse_name_hex(s: &str) -> Option<u128> {
    if s.len() != 32
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// Streaming xxh3-128 over parts. Each part is length-prefixed so that
/// `("ab", "c")` and `("a", "bc")` hash differently.
#[derive(Clone)]
pub struct KeyHasher(Stream128);

#[derive(Clone)]
enum Stream128 {
    #[cfg(target_arch = "x86_64")]
    Avx512(Box<long::Stream<long::Avx512>>),
    Twox(Box<Raw128<Secret>>),
    Portable(Box<xxhash_rust::xxh3::Xxh3>),
}

impl Default for KeyHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyHasher {
    pub fn new() -> Self {
        Self::with(active())
    }

    pub fn with(imp: HashImpl) -> Self {
        #[cfg(target_arch = "x86_64")]
        if let (HashImpl::Dispatch, Some(k)) = (imp, avx512()) {
            return Self(Stream128::Avx512(Box::new(long::Stream::new(k))));
        }
        Self(match imp {
            HashImpl::Dispatch | HashImpl::Twox => {
                Stream128::Twox(Box::new(Raw128::new(secret_buffer())))
            }
            HashImpl::Portable => Stream128::Portable(Box::default()),
        })
    }

    fn write(&mut self, data: &[u8]) {
        match &mut self.0 {
            #[cfg(target_arch = "x86_64")]
            Stream128::Avx512(h) => h.update(data),
            Stream128::Twox(h) => h.write(data),
            Stream128::Portable(h) => h.update(data),
        }
    }

    pub fn update(&mut self, part: &[u8]) {
        self.write(&(part.len() as u64).to_le_bytes());
        self.write(part);
    }

    pub fn digest128(&self) -> u128 {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Stream128::Avx512(h) => h.digest128(),
            Stream128::Twox(h) => h.finish_128(),
            Stream128::Portable(h) => h.digest128(),
        }
    }

    pub fn hexdigest(&self) -> String {
        name_hex(self.digest128())
    }
}

/// xxh3-128 hex over length-prefixed parts; the one-shot form of [`KeyHasher`].
pub fn hash_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = KeyHasher::new();
    for p in parts {
        h.update(p);
    }
    h.hexdigest()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use xxhash_rust::xxh3 as reference;

    /// Deterministic pseudo-random bytes (splitmix64), so a failure names a reproducible input.
    pub(crate) fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n as u64;
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        out.truncate(n);
        out
    }

    /// Each length hashed one-shot, streamed in uneven chunks, and as a key (length-prefixed),
    /// on `imp`, against the reference implementation.
    fn check(imp: HashImpl, data: &[u8]) {
        let n = data.len();
        assert_eq!(
            xxh3_64_with(imp, data),
            reference::xxh3_64(data),
            "{imp:?} 64 len {n}"
        );
        assert_eq!(
            xxh3_128_with(imp, data),
            reference::xxh3_128(data),
            "{imp:?} 128 len {n}"
        );
        for step in [1usize, 7, 64, 255, 256, 257, 1024, 1025, 4099] {
            if step > n.max(1) * 2 {
                continue;
            }
            let mut c = Checksum::with(imp);
            for chunk in data.chunks(step) {
                c.update(chunk);
            }
            assert_eq!(
                c.digest(),
                reference::xxh3_64(data),
                "{imp:?} stream {step} len {n}"
            );
        }
        let mut k = KeyHasher::with(imp);
        k.update(data);
        let mut prefixed = (n as u64).to_le_bytes().to_vec();
        prefixed.extend_from_slice(data);
        assert_eq!(
            k.digest128(),
            reference::xxh3_128(&prefixed),
            "{imp:?} key len {n}"
        );
    }

    #[test]
    fn every_length_to_4096_matches_the_reference() {
        for imp in HashImpl::ALL {
            for n in 0..=4096 {
                check(imp, &bytes(n, 1));
            }
        }
    }

    #[test]
    fn large_inputs_match_the_reference() {
        let big = bytes((64 << 20) + 255, 2);
        for imp in HashImpl::ALL {
            for n in [1 << 20, (1 << 20) + 1, 550_000, 64 << 20, (64 << 20) + 255] {
                let d = &big[..n];
                assert_eq!(xxh3_64_with(imp, d), reference::xxh3_64(d), "{imp:?} {n}");
                assert_eq!(xxh3_128_with(imp, d), reference::xxh3_128(d), "{imp:?} {n}");
            }
            // The write path hashes in 256 KiB chunks; odd chunk sizes cross stripe borders.
            for step in [256 << 10, 1_000_003] {
                let mut c = Checksum::with(imp);
                for chunk in big.chunks(step) {
                    c.update(chunk);
                }
                assert_eq!(
                    c.digest(),
                    reference::xxh3_64(&big),
                    "{imp:?} stream {step}"
                );
            }
        }
    }

    #[test]
    fn known_values() {
        // From the xxHash reference: XXH3_64bits("") and XXH3_128bits("").
        for imp in HashImpl::ALL {
            assert_eq!(xxh3_64_with(imp, b""), 0x2D06_8005_38D3_94C2);
            assert_eq!(
                xxh3_128_with(imp, b""),
                0x99AA_06D3_0147_98D8_6001_C324_468D_497F
            );
        }
    }

    #[test]
    fn env_values_parse() {
        assert_eq!(HashImpl::from_env_value(""), Ok(HashImpl::Dispatch));
        assert_eq!(HashImpl::from_env_value(" Auto "), Ok(HashImpl::Dispatch));
        assert_eq!(HashImpl::from_env_value("portable"), Ok(HashImpl::Portable));
        assert_eq!(HashImpl::from_env_value("twox"), Ok(HashImpl::Twox));
        assert!(HashImpl::from_env_value("avx9").is_err());
        assert!(!HashImpl::Dispatch.path().is_empty());
        assert!(HashImpl::Portable.path().starts_with("portable-"));
    }

    #[test]
    fn name_hex_round_trips() {
        for key in [&b"a"[..], b"", b"some/unsafe key\0with nul", &[0xff; 5000]] {
            let n = entry_name(key);
            let s = name_hex(n);
            assert_eq!(s.len(), 32);
            assert_eq!(parse_name_hex(&s), Some(n));
        }
    }

    #[test]
    fn parse_rejects_foreign_names() {
        assert_eq!(parse_name_hex("abc"), None);
        assert_eq!(parse_name_hex(&"G".repeat(32)), None);
        assert_eq!(
            parse_name_hex(&"A".repeat(32)),
            None,
            "upper case is not ours"
        );
        assert_eq!(parse_name_hex(&"0".repeat(33)), None);
    }

    #[test]
    fn parts_are_length_prefixed() {
        assert_ne!(
            hash_parts([&b"ab"[..], b"c"]),
            hash_parts([&b"a"[..], b"bc"])
        );
        assert_eq!(
            hash_parts([&b"ab"[..], b"c"]),
            hash_parts([&b"ab"[..], b"c"])
        );
    }

    #[test]
    fn streaming_equals_one_shot() {
        let mut h = KeyHasher::new();
        h.update(b"x");
        h.update(b"yz");
        assert_eq!(h.hexdigest(), hash_parts([&b"x"[..], b"yz"]));
        assert_eq!(h.hexdigest().len(), 32);
    }

    #[test]
    fn distinct_keys_get_distinct_names() {
        assert_ne!(entry_name(b"key1"), entry_name(b"key2"));
    }
}
