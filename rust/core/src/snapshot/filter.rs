//! The snapshot's name filter: a Bloom filter, so that a lookup of a name the snapshot does
//! not hold (most puts) reads no block.

use super::MAX_FENCE_LEN;

/// Bits of the name filter per expected entry, and probes per name: about 1% false
/// positives.
const FILTER_BITS_PER_ENTRY: u64 = 10;
const FILTER_PROBES: u64 = 7;

/// A Bloom filter of names (double hashing over the name's two halves, each mixed: names
/// are hashes, but what a snapshot holds is whatever its writer put there).
#[derive(Debug, Clone)]
pub(super) struct Filter {
    /// A power of two of words.
    pub(super) words: Vec<u64>,
}

impl Filter {
    /// The filter's size in bits for `expected` entries.
    pub(super) fn bits_for(expected: u64) -> u64 {
        expected
            .saturating_mul(FILTER_BITS_PER_ENTRY)
            .clamp(64, MAX_FENCE_LEN * 8)
            .next_power_of_two()
    }

    pub(super) fn sized(expected: u64) -> Filter {
        Filter {
            words: vec![0; (Filter::bits_for(expected) / 64) as usize],
        }
    }

    fn probes(&self, name: u128) -> impl Iterator<Item = (usize, u64)> {
        let mask = (self.words.len() as u64 * 64).wrapping_sub(1);
        let (lo, hi) = (name as u64, (name >> 64) as u64);
        let h1 = mix(lo ^ mix(hi));
        let h2 = mix(h1 ^ hi ^ 0x9e37_79b9_7f4a_7c15) | 1;
        (0..FILTER_PROBES).map(move |i| {
            let bit = h1.wrapping_add(i.wrapping_mul(h2)) & mask;
            ((bit / 64) as usize, 1u64 << (bit % 64))
        })
    }

    pub(super) fn add(&mut self, name: u128) {
        for (w, b) in self.probes(name) {
            self.words[w] |= b;
        }
    }

    pub(super) fn may_hold(&self, name: u128) -> bool {
        self.words.is_empty() || self.probes(name).all(|(w, b)| self.words[w] & b != 0)
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
