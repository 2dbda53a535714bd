//! Property tests of the decoders of what other processes write into the cache (entry
//! files, journals, the index snapshot): any bytes at all give an error or a value, never a
//! panic, and what the encoders write decodes back.
//!
//! A few thousand cases per decoder run with `cargo test`; many more with, e.g.,
//! `PROPTEST_CASES=1000000 cargo test --release -p xla_pcache_core fuzz_` (proptest reads
//! the variable). Inputs are arbitrary bytes, and bytes made to pass the checksums (so the
//! parsers behind them are reached) with fields and lengths chosen at random.

use crate::entry;
use crate::hash::checksum;
use crate::journal::{self, JournalRecord};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    ProptestConfig {
        cases,
        // Nothing written into the source tree; a failure prints its input.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A header of random fields (lengths near the limits included) with a valid checksum,
/// followed by a random payload.
fn entry_with_valid_header_checksum() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 64..600),
        prop::sample::select(vec![
            0u32,
            1,
            63,
            64,
            127,
            128,
            192,
            256,
            512,
            4096,
            u32::MAX,
        ]),
        prop::sample::select(vec![0u32, 1, 2, 30, 64, 200, 1 << 20, u32::MAX]),
        prop::sample::select(vec![0u32, 1, 6, 7, 100, 65536, u32::MAX]),
        prop::sample::select(vec![0u64, 1, 100, 1 << 20, u64::MAX - 10, u64::MAX]),
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(
            |(mut h, header_len, key_len, meta_len, payload_len, payload)| {
                h[0..4].copy_from_slice(&entry::MAGIC);
                h[4..6].copy_from_slice(&entry::ENTRY_VERSION.to_le_bytes());
                h[8..12].copy_from_slice(&header_len.to_le_bytes());
                h[12..16].copy_from_slice(&key_len.to_le_bytes());
                h[16..20].copy_from_slice(&meta_len.to_le_bytes());
                h[24..32].copy_from_slice(&payload_len.to_le_bytes());
                let cut = (header_len as usize).min(h.len());
                if cut >= 64 {
                    let sum = entry::header_checksum(&h[..cut]);
                    h[56..64].copy_from_slice(&sum.to_le_bytes());
                }
                h.extend_from_slice(&payload);
                h
            },
        )
}

/// A valid entry, then damaged: bytes flipped, cut or appended.
fn damaged_entry() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 1..200),
        prop::collection::vec(("[a-z]{0,8}", "[ -~]{0,40}"), 0..4),
        prop::collection::vec(any::<u8>(), 0..2000),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        any::<Option<prop::sample::Index>>(),
    )
        .prop_map(|(key, meta, payload, flips, cut)| {
            let mut f = entry::encode_header(
                &key,
                true,
                &meta,
                payload.len() as u64,
                checksum(&payload),
                1,
            )
            .expect("valid inputs");
            f.extend_from_slice(&payload);
            for (at, x) in flips {
                let i = at.index(f.len());
                f[i] ^= x;
            }
            if let Some(c) = cut {
                let n = c.index(f.len() + 1);
                f.truncate(n);
            }
            f
        })
}

/// Journal records of random kinds and lengths, each with a valid checksum, and random
/// bytes between some of them.
fn journal_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        (
            any::<u8>(),
            prop::sample::select(vec![0usize, 7, 8, 24, 32, 40, 1016, 1024, 1025]),
            any::<u8>(),
            any::<bool>(),
        ),
        0..20,
    )
    .prop_map(|recs| {
        let mut out = Vec::new();
        for (kind, len, fill, garbage) in recs {
            let start = out.len();
            out.push(0xA5);
            out.push(kind % 8);
            out.extend_from_slice(&(len as u16).to_le_bytes());
            out.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
            let sum = checksum(&out[start..]);
            out.extend_from_slice(&sum.to_le_bytes());
            if garbage {
                out.push(fill);
            }
        }
        out
    })
}

/// A snapshot body of random counts and fields behind the right magic and version, with a
/// valid checksum.
fn snapshot_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec![0u64, 1, 2, 5, 1 << 32, u64::MAX]),
        prop::sample::select(vec![0u32, 1, 3, u32::MAX]),
        prop::sample::select(vec![0u32, 1, 18, 20, 1000, u32::MAX]),
        prop::collection::vec(any::<u8>(), 0..600),
        any::<bool>(),
    )
        .prop_map(|(n_entries, n_journals, n_counters, rest, hits)| {
            let mut b = b"XPCS".to_vec();
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&n_entries.to_le_bytes());
            b.extend_from_slice(&n_journals.to_le_bytes());
            b.extend_from_slice(&n_counters.to_le_bytes());
            b.extend_from_slice(&rest);
            if hits {
                b.extend_from_slice(b"HITS");
                b.extend_from_slice(&u64::MAX.to_le_bytes());
            }
            let sum = checksum(&b);
            b.extend_from_slice(&sum.to_le_bytes());
            b
        })
}

fn check_entry(bytes: &[u8]) {
    if let Ok(h) = entry::verify(bytes) {
        // What verifies is exactly what its header says.
        assert_eq!(h.file_len(), bytes.len() as u64);
    }
    let _ = entry::decode_header(bytes);
    if bytes.len() >= entry::FIXED_HEADER {
        let _ = entry::header_len(&bytes[..entry::FIXED_HEADER]);
        let _ = entry::expected_file_len(&bytes[..entry::FIXED_HEADER]);
    }
}

fn check_journal(bytes: &[u8]) {
    let (recs, used) = journal::decode(bytes);
    assert!(used <= bytes.len());
    // What was decoded encodes back to the bytes it came from, for the known kinds.
    let mut again = Vec::new();
    for r in &recs {
        r.encode(&mut again);
    }
    assert!(again.len() <= used);
}

fn check_snapshot(bytes: &[u8]) {
    let _ = crate::snapshot::decode_v1(bytes);
    let mut f = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
    if let Ok(crate::snapshot::Opened::V2(base, _)) =
        crate::snapshot::Base::open(f, bytes.len() as u64)
    {
        for b in 0..base.blocks() {
            let _ = base.block(b);
        }
        let _ = base.lookup(0);
        let _ = base.lookup(u128::MAX);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_entry_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        check_entry(&bytes);
    }

    #[test]
    fn fuzz_entry_valid_header_checksum(bytes in entry_with_valid_header_checksum()) {
        check_entry(&bytes);
    }

    #[test]
    fn fuzz_entry_damaged(bytes in damaged_entry()) {
        check_entry(&bytes);
    }

    #[test]
    fn fuzz_journal_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        check_journal(&bytes);
    }

    #[test]
    fn fuzz_journal_checksummed_records(bytes in journal_bytes()) {
        check_journal(&bytes);
    }

    #[test]
    fn fuzz_journal_round_trip(recs in prop::collection::vec(
        (any::<u128>(), any::<u64>(), any::<u64>(), 0u8..5, prop::collection::vec(any::<u64>(), 0..130)),
        0..30,
    )) {
        let recs: Vec<JournalRecord> = recs
            .into_iter()
            .map(|(name, a, t, kind, counters)| match kind {
                0 => JournalRecord::Touch { name, disk_bytes: a, t, put: true },
                1 => JournalRecord::Touch { name, disk_bytes: a, t, put: false },
                2 => JournalRecord::Delete { name, t },
                3 => JournalRecord::Clear { t },
                _ => JournalRecord::Stats { counters: counters.into_iter().take(128).collect() },
            })
            .collect();
        let mut buf = Vec::new();
        for r in &recs {
            r.encode(&mut buf);
        }
        let (back, used) = journal::decode(&buf);
        prop_assert_eq!(back, recs);
        prop_assert_eq!(used, buf.len());
    }

    #[test]
    fn fuzz_snapshot_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        check_snapshot(&bytes);
    }

    #[test]
    fn fuzz_snapshot_checksummed(bytes in snapshot_bytes()) {
        check_snapshot(&bytes);
    }

    /// A valid version-2 snapshot with bytes flipped anywhere (header, blocks, meta, fence,
    /// filter): opening and every lookup give a value or an error, never a panic.
    #[test]
    fn fuzz_snapshot_v2_flipped(
        n in 0u64..400,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
    ) {
        let f = tempfile::tempfile().unwrap();
        let mut w = crate::snapshot::Writer::new(f, n).unwrap();
        for i in 0..n {
            let info = crate::lru::EntryInfo { disk_bytes: i, last_use: i, hits: 0 };
            w.push(u128::from(i) * 0x1_0000_0001, info).unwrap();
        }
        let (f, len) = w.finish(&crate::snapshot::Meta::default()).unwrap();
        let mut bytes = vec![0u8; len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut bytes, 0).unwrap();
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        check_snapshot(&bytes);
    }
}
