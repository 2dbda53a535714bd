//! xxh3 of inputs longer than 240 bytes with an AVX-512 stripe loop, one-shot and streaming.
//!
//! Why it exists: twox-hash stops at AVX2, and on a CPU with AVX-512 this loop hashes cached
//! data markedly faster than twox-hash's AVX2 one, which takes `hash_key` past the C library
//! (docs/benchmarks.md, "Checksum throughput" and "Measurements behind the code"). A
//! straight translation of the reference AVX-512 loop was no faster than AVX2: see `stripe`
//! for what made the difference. Only the long-input path is vectorised in xxh3, so only it
//! is here: inputs of 240 bytes or less, and the hashers' digests of such totals, go to
//! twox-hash. The values are xxh3's (64 and 128 bits, default secret, seed 0); the tests
//! compare every length against the reference implementation.
//!
//! The loop is generic over a [`Kernel`] (accumulate stripes, scramble), so the block and
//! streaming logic is tested with a plain scalar kernel on any machine, and the AVX-512
//! kernel wherever the CPU has it. All `unsafe` is the AVX-512 kernel's and its detection
//! (CPUID, XGETBV): intrinsics called only through an [`Avx512`] token, which exists only
//! once the CPU is known to have the feature, on arrays and slices of checked lengths.

// Outside x86-64 only the tests' scalar kernel drives this code.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use std::sync::OnceLock;
use twox_hash::xxhash3_64::{SecretBuffer, DEFAULT_SECRET_LENGTH};

const STRIPE: usize = 64;
const SECRET_LEN: usize = DEFAULT_SECRET_LENGTH;
/// Each stripe of a block takes the secret 8 bytes further on.
const STRIPES_PER_BLOCK: usize = (SECRET_LEN - STRIPE) / 8;
const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;
/// Inputs up to this length take xxh3's short paths (no stripes).
pub(super) const CUTOFF: usize = 240;
/// The streaming buffer: a multiple of the stripe, so a full one is consumed whole.
const BUFFER: usize = 4 * STRIPE;
// Offsets into the secret, as the xxh3 specification fixes them.
const LAST_STRIPE_SECRET: usize = SECRET_LEN - STRIPE - 7;
const MERGE_SECRET_LOW: usize = 11;
const MERGE_SECRET_HIGH: usize = SECRET_LEN - STRIPE - 11;

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;
const PRIME_MX1: u64 = 0x1656_6791_9E37_79F9;

type Secret = [u8; SECRET_LEN];
type Acc = [u64; 8];

const INIT_ACC: Acc = [
    PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
];

/// xxh3's default secret, taken from twox-hash (seed 0 leaves it as it is) rather than
/// spelled out a second time.
fn secret() -> &'static Secret {
    static SECRET: OnceLock<Secret> = OnceLock::new();
    SECRET.get_or_init(|| match SecretBuffer::with_seed(0, [0; SECRET_LEN]) {
        Ok(b) => b.into_secret(),
        Err(_) => unreachable!("a DEFAULT_SECRET_LENGTH array is what with_seed takes"),
    })
}

fn read64(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The vector part of xxh3: everything else is shared scalar code.
pub(super) trait Kernel: Copy {
    /// Accumulates the stripes of `data` (a whole number of them), stripe `i` keyed by the
    /// 64 bytes of `secret` from `8 * i`.
    fn stripes(self, acc: &mut Acc, data: &[[u8; STRIPE]], secret: &[u8]);
    /// Scrambles the accumulators with the last 64 bytes of the secret, after each block.
    fn scramble(self, acc: &mut Acc);
    /// Whole blocks, each accumulated and scrambled.
    fn blocks(self, acc: &mut Acc, blocks: &[[u8; BLOCK]]) {
        let s = secret();
        for b in blocks {
            self.stripes(acc, b.as_chunks().0, s);
            self.scramble(acc);
        }
    }
}

fn mix2(acc: &Acc, i: usize, secret: &[u8]) -> u64 {
    let a = acc[2 * i] ^ read64(secret, 16 * i);
    let b = acc[2 * i + 1] ^ read64(secret, 16 * i + 8);
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

fn merge(acc: &Acc, secret: &[u8], start: u64) -> u64 {
    let mut h = start;
    for i in 0..4 {
        h = h.wrapping_add(mix2(acc, i, secret));
    }
    h ^= h >> 37;
    h = h.wrapping_mul(PRIME_MX1);
    h ^ (h >> 32)
}

fn digest64(acc: &Acc, len: u64) -> u64 {
    merge(
        acc,
        &secret()[MERGE_SECRET_LOW..],
        len.wrapping_mul(PRIME64_1),
    )
}

fn digest128(acc: &Acc, len: u64) -> u128 {
    let s = secret();
    let low = merge(acc, &s[MERGE_SECRET_LOW..], len.wrapping_mul(PRIME64_1));
    let high = merge(acc, &s[MERGE_SECRET_HIGH..], !len.wrapping_mul(PRIME64_2));
    (u128::from(high) << 64) | u128::from(low)
}

fn last_stripe<K: Kernel>(k: K, acc: &mut Acc, stripe: &[u8; STRIPE]) {
    k.stripes(
        acc,
        std::slice::from_ref(stripe),
        &secret()[LAST_STRIPE_SECRET..],
    );
}

/// The accumulators after the whole of `input` (longer than [`CUTOFF`]).
fn oneshot_acc<K: Kernel>(k: K, input: &[u8]) -> Acc {
    debug_assert!(input.len() > CUTOFF);
    let mut acc = INIT_ACC;
    // Every block but one that ends the input exactly is followed by a scramble.
    let full = (input.len() - 1) / BLOCK;
    let (blocks, rest) = input.split_at(full * BLOCK);
    k.blocks(&mut acc, blocks.as_chunks().0);
    let (stripes, _) = rest[..rest.len() - 1].as_chunks::<STRIPE>();
    k.stripes(&mut acc, stripes, secret());
    let tail = input
        .last_chunk::<STRIPE>()
        .expect("longer than the cutoff");
    last_stripe(k, &mut acc, tail);
    acc
}

pub(super) fn oneshot64<K: Kernel>(k: K, input: &[u8]) -> u64 {
    digest64(&oneshot_acc(k, input), input.len() as u64)
}

pub(super) fn oneshot128<K: Kernel>(k: K, input: &[u8]) -> u128 {
    digest128(&oneshot_acc(k, input), input.len() as u64)
}

/// Streaming state: the same values as the one-shot functions over the concatenated input.
/// Totals of [`CUTOFF`] bytes or less are in `buf` whole and handed to twox-hash at digest.
#[derive(Clone)]
pub(super) struct Stream<K> {
    k: K,
    acc: Acc,
    /// Stripes accumulated since the last scramble.
    in_block: usize,
    buf: [u8; BUFFER],
    buffered: usize,
    total: u64,
}

impl<K: Kernel> Stream<K> {
    pub(super) fn new(k: K) -> Self {
        Self {
            k,
            acc: INIT_ACC,
            in_block: 0,
            buf: [0; BUFFER],
            buffered: 0,
            total: 0,
        }
    }

    /// Accumulates whole stripes, scrambling at each block border.
    fn consume(k: K, acc: &mut Acc, in_block: &mut usize, mut stripes: &[[u8; STRIPE]]) {
        let room = STRIPES_PER_BLOCK - *in_block;
        if stripes.len() < room {
            k.stripes(acc, stripes, &secret()[8 * *in_block..]);
            *in_block += stripes.len();
            return;
        }
        k.stripes(acc, &stripes[..room], &secret()[8 * *in_block..]);
        k.scramble(acc);
        stripes = &stripes[room..];
        let (blocks, rest) = stripes.as_flattened().as_chunks::<BLOCK>();
        k.blocks(acc, blocks);
        let rest = rest.as_chunks::<STRIPE>().0;
        k.stripes(acc, rest, secret());
        *in_block = rest.len();
    }

    pub(super) fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        // The buffer is consumed only when more bytes follow: the last stripe of the input
        // is always still there at digest, and a block is scrambled only if more follows.
        if data.len() <= BUFFER - self.buffered {
            self.buf[self.buffered..][..data.len()].copy_from_slice(data);
            self.buffered += data.len();
            return;
        }
        if self.buffered > 0 {
            let (head, rest) = data.split_at(BUFFER - self.buffered);
            self.buf[self.buffered..].copy_from_slice(head);
            data = rest;
            Self::consume(
                self.k,
                &mut self.acc,
                &mut self.in_block,
                self.buf.as_chunks().0,
            );
            self.buffered = 0;
        }
        if data.len() > BUFFER {
            // Straight from the input, keeping 1..=BUFFER bytes back.
            let n = (data.len() - 1) / BUFFER * BUFFER;
            let (now, rest) = data.split_at(n);
            Self::consume(self.k, &mut self.acc, &mut self.in_block, now.as_chunks().0);
            // A digest with fewer than a stripe buffered takes its last stripe partly from
            // the bytes before: keep them where they would be after a buffer-full.
            self.buf[BUFFER - STRIPE..].copy_from_slice(&now[n - STRIPE..]);
            data = rest;
        }
        self.buf[..data.len()].copy_from_slice(data);
        self.buffered = data.len();
    }

    /// The accumulators as if the input ended here, or the whole input when it is short.
    fn finish(&self) -> Result<Acc, &[u8]> {
        if self.total <= CUTOFF as u64 {
            return Err(&self.buf[..self.buffered]);
        }
        let mut acc = self.acc;
        let mut in_block = self.in_block;
        let n = self.buffered;
        let mut tail = [0; STRIPE];
        if n >= STRIPE {
            let stripes = &self.buf[..n - 1].as_chunks::<STRIPE>().0;
            Self::consume(self.k, &mut acc, &mut in_block, stripes);
            tail.copy_from_slice(&self.buf[n - STRIPE..n]);
        } else {
            tail[..STRIPE - n].copy_from_slice(&self.buf[BUFFER - (STRIPE - n)..]);
            tail[STRIPE - n..].copy_from_slice(&self.buf[..n]);
        }
        last_stripe(self.k, &mut acc, &tail);
        Ok(acc)
    }

    pub(super) fn digest64(&self) -> u64 {
        match self.finish() {
            Ok(acc) => digest64(&acc, self.total),
            Err(short) => twox_hash::XxHash3_64::oneshot(short),
        }
    }

    pub(super) fn digest128(&self) -> u128 {
        match self.finish() {
            Ok(acc) => digest128(&acc, self.total),
            Err(short) => twox_hash::XxHash3_128::oneshot(short),
        }
    }
}

/// The AVX-512F kernel. Only [`Avx512::detect`] makes one, so holding one proves the CPU
/// has the feature; that is what makes calling its `#[target_feature]` functions sound.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx512(());

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    pub(super) fn detect() -> Option<Self> {
        static HAS: OnceLock<bool> = OnceLock::new();
        HAS.get_or_init(has_avx512f).then_some(Self(()))
    }
}

/// AVX-512F usable: the CPU has it and the OS saves its registers. Asked directly rather
/// than through `is_x86_feature_detected!`, whose first call probes every CPUID leaf it
/// knows: in a virtual machine each CPUID exits to the hypervisor, and the first get of
/// every process would pay for all of them (docs/benchmarks.md, "Measurements behind the code").
/// This asks three leaves and XCR0 (leaf 7 is asked before knowing it exists: a CPU
/// answers a leaf past its maximum with harmless data, ignored then). The tests check it
/// against std's answer.
#[cfg(target_arch = "x86_64")]
fn has_avx512f() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
    // CPUID is safe to call from Rust 1.94 on, unsafe before (rust-version is older).
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 CPU.
    let (max, leaf1, leaf7) = unsafe { (__cpuid(0).eax, __cpuid(1), __cpuid_count(7, 0)) };
    // CPUID.1:ECX.OSXSAVE: the OS enabled XSAVE, so XGETBV may run.
    if max < 7 || leaf1.ecx & (1 << 27) == 0 {
        return false;
    }
    // SAFETY: XGETBV exists where OSXSAVE is set (checked just above).
    let xcr0 = unsafe { _xgetbv(0) };
    // SSE, AVX, opmask, ZMM0-15 upper halves and ZMM16-31 state all enabled by the OS.
    const ZMM_STATE: u64 = 0b1110_0110;
    xcr0 & ZMM_STATE == ZMM_STATE && leaf7.ebx & (1 << 16) != 0
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Acc, BLOCK, PRIME32_1, SECRET_LEN, STRIPE, STRIPES_PER_BLOCK};
    use std::arch::x86_64::*;

    /// One stripe, split over two sums: `prod` takes lo32(d ^ k) * hi32(d ^ k) per lane and
    /// `data` the input itself. xxh3 adds the input to the neighbouring lane (acc[i ^ 1]);
    /// summing it unswapped and swapping the sum once per run of stripes ([`combine`])
    /// gives the same accumulators with one shuffle less per stripe and two short
    /// dependency chains instead of one long one.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn stripe(sums: (__m512i, __m512i), data: &[u8; STRIPE], key: &[u8]) -> (__m512i, __m512i) {
        assert!(key.len() >= STRIPE);
        // SAFETY: both pointers have 64 readable bytes (the array type; the assert), and
        // loadu takes any alignment.
        let (d, k) = unsafe {
            (
                _mm512_loadu_si512(data.as_ptr().cast()),
                _mm512_loadu_si512(key.as_ptr().cast()),
            )
        };
        let dk = _mm512_xor_si512(d, k);
        let product = _mm512_mul_epu32(dk, _mm512_srli_epi64::<32>(dk));
        (
            _mm512_add_epi64(sums.0, product),
            _mm512_add_epi64(sums.1, d),
        )
    }

    /// The accumulators after a run of stripes: products in place, input sums swapped into
    /// the neighbouring lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn combine(acc: __m512i, sums: (__m512i, __m512i)) -> __m512i {
        let swapped = _mm512_shuffle_epi32::<0b01_00_11_10>(sums.1);
        _mm512_add_epi64(acc, _mm512_add_epi64(sums.0, swapped))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn scramble(acc: __m512i, key: &[u8; STRIPE]) -> __m512i {
        // SAFETY: 64 readable bytes (the array type), any alignment.
        let k = unsafe { _mm512_loadu_si512(key.as_ptr().cast()) };
        let a = _mm512_xor_si512(acc, _mm512_srli_epi64::<47>(acc));
        let a = _mm512_xor_si512(a, k);
        // 64-bit lanes times a 32-bit prime, from two 32x32->64 products.
        let p = _mm512_set1_epi64(PRIME32_1 as i64);
        let lo = _mm512_mul_epu32(a, p);
        let hi = _mm512_mul_epu32(_mm512_srli_epi64::<32>(a), p);
        _mm512_add_epi64(lo, _mm512_slli_epi64::<32>(hi))
    }

    #[target_feature(enable = "avx512f")]
    fn load(acc: &Acc) -> __m512i {
        // SAFETY: 8 u64 are 64 readable bytes.
        unsafe { _mm512_loadu_si512(acc.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx512f")]
    fn store(acc: &mut Acc, v: __m512i) {
        // SAFETY: 8 u64 are 64 writable bytes.
        unsafe { _mm512_storeu_si512(acc.as_mut_ptr().cast(), v) }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn stripes(acc: &mut Acc, data: &[[u8; STRIPE]], secret: &[u8]) {
        let mut sums = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for (i, d) in data.iter().enumerate() {
            sums = stripe(sums, d, &secret[8 * i..]);
        }
        store(acc, combine(load(acc), sums));
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn scramble_acc(acc: &mut Acc, secret: &[u8; SECRET_LEN]) {
        let key = secret
            .last_chunk::<STRIPE>()
            .expect("the secret is longer than a stripe");
        store(acc, scramble(load(acc), key));
    }

    /// Whole blocks with the accumulators kept in a register throughout.
    #[target_feature(enable = "avx512f")]
    pub(super) fn blocks(acc: &mut Acc, blocks: &[[u8; BLOCK]], secret: &[u8; SECRET_LEN]) {
        let key = secret
            .last_chunk::<STRIPE>()
            .expect("the secret is longer than a stripe");
        let mut a = load(acc);
        for b in blocks {
            let (stripes, _) = b.as_chunks::<STRIPE>();
            let mut sums = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for i in 0..STRIPES_PER_BLOCK {
                sums = stripe(sums, &stripes[i], &secret[8 * i..]);
            }
            a = scramble(combine(a, sums), key);
        }
        store(acc, a);
    }
}

#[cfg(target_arch = "x86_64")]
impl Kernel for Avx512 {
    #[inline]
    fn stripes(self, acc: &mut Acc, data: &[[u8; STRIPE]], secret: &[u8]) {
        // SAFETY: an Avx512 exists only where the CPU has AVX-512F (Avx512::detect).
        unsafe { avx512::stripes(acc, data, secret) }
    }

    #[inline]
    fn scramble(self, acc: &mut Acc) {
        // SAFETY: as above.
        unsafe { avx512::scramble_acc(acc, secret()) }
    }

    #[inline]
    fn blocks(self, acc: &mut Acc, blocks: &[[u8; BLOCK]]) {
        // SAFETY: as above.
        unsafe { avx512::blocks(acc, blocks, secret()) }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The specification's loop in plain integers: tests the shared code on any CPU.
    #[derive(Clone, Copy)]
    pub(crate) struct Scalar;

    impl Kernel for Scalar {
        fn stripes(self, acc: &mut Acc, data: &[[u8; STRIPE]], secret: &[u8]) {
            for (s, d) in data.iter().enumerate() {
                for i in 0..8 {
                    let v = read64(d, 8 * i);
                    let k = v ^ read64(secret, 8 * s + 8 * i);
                    acc[i ^ 1] = acc[i ^ 1].wrapping_add(v);
                    acc[i] = acc[i].wrapping_add((k & 0xFFFF_FFFF) * (k >> 32));
                }
            }
        }

        fn scramble(self, acc: &mut Acc) {
            let key = &secret()[SECRET_LEN - STRIPE..];
            for (i, a) in acc.iter_mut().enumerate() {
                *a ^= *a >> 47;
                *a ^= read64(key, 8 * i);
                *a = a.wrapping_mul(PRIME32_1);
            }
        }
    }

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        crate::hash::tests::bytes(n, seed)
    }

    /// One-shot, and streamed in chunks that land on and beside every border the streaming
    /// state has (stripe, buffer, block), against the reference.
    fn check<K: Kernel>(k: K, data: &[u8]) {
        use xxhash_rust::xxh3 as reference;
        let n = data.len();
        let (want64, want128) = (reference::xxh3_64(data), reference::xxh3_128(data));
        if n > CUTOFF {
            assert_eq!(oneshot64(k, data), want64, "one-shot 64, len {n}");
            assert_eq!(oneshot128(k, data), want128, "one-shot 128, len {n}");
        }
        let patterns: [&[usize]; 9] = [
            &[1],
            &[7, 64],
            &[63, 1, 64],
            &[256],
            &[255, 257],
            &[1024, 3],
            &[1025],
            &[4099],
            &[8, 300, 8, 5000],
        ];
        for pat in patterns {
            let mut s = Stream::new(k);
            let (mut at, mut i) = (0, 0);
            while at < n {
                let step = pat[i % pat.len()].min(n - at);
                s.update(&data[at..at + step]);
                at += step;
                i += 1;
            }
            assert_eq!(s.digest64(), want64, "stream {pat:?} 64, len {n}");
            assert_eq!(s.digest128(), want128, "stream {pat:?} 128, len {n}");
        }
    }

    fn kernels_check(data: &[u8]) {
        check(Scalar, data);
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = Avx512::detect() {
            check(k, data);
        }
    }

    #[test]
    fn every_length_to_4096_matches_the_reference() {
        for n in 0..=4096 {
            kernels_check(&bytes(n, 3));
        }
    }

    #[test]
    fn block_multiples_and_large_inputs_match_the_reference() {
        let big = bytes((8 << 20) + 77, 4);
        for blocks in [1, 2, 3, 16, 17, 255, 256, 1024] {
            for delta in [-65isize, -64, -1, 0, 1, 63, 64, 65] {
                let n = (blocks * BLOCK) as isize + delta;
                kernels_check(&big[..n as usize]);
            }
        }
        for n in [550_000, 1 << 20, (8 << 20) + 77] {
            kernels_check(&big[..n]);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_detection_agrees_with_std() {
        assert_eq!(
            has_avx512f(),
            std::arch::is_x86_feature_detected!("avx512f")
        );
    }

    /// The scripts that test each path set this where the CPU has AVX-512F, so a build that
    /// silently lost the kernel fails instead of testing twox-hash twice.
    #[test]
    fn the_avx512_kernel_is_used_where_expected() {
        if std::env::var_os("XLA_PCACHE_EXPECT_AVX512").is_some() {
            #[cfg(target_arch = "x86_64")]
            assert!(Avx512::detect().is_some(), "AVX-512F expected on this CPU");
            assert_eq!(crate::hash::HashImpl::Dispatch.path(), "avx512");
        }
    }
}
