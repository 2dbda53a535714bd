//! xxh3 hashing: key digests, entry file names and a streaming hasher for callers.

use xxhash_rust::xxh3::{xxh3_128, xxh3_64, Xxh3};

/// Longest key the store accepts. Keys are kept whole in the entry header, so this bounds
/// the header a reader must take in before it can verify anything.
pub const MAX_KEY_LEN: usize = 4096;

/// The 128-bit name under which an entry is filed. Every key goes through the hash, so
/// file names are uniform, safe on every filesystem and never case-folded into each other;
/// the full key is kept in the header and compared on read, so equal names cannot alias.
pub fn entry_name(key: &[u8]) -> u128 {
    xxh3_128(key)
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

/// Checksum of an entry payload.
pub fn checksum(data: &[u8]) -> u64 {
    xxh3_64(data)
}

/// Streaming xxh3-128 over parts. Each part is length-prefixed so that
/// `("ab", "c")` and `("a", "bc")` hash differently.
#[derive(Clone, Default)]
pub struct KeyHasher {
    inner: Xxh3,
}

impl KeyHasher {
    pub fn new() -> Self {
        Self { inner: Xxh3::new() }
    }

    pub fn update(&mut self, part: &[u8]) {
        self.inner.update(&(part.len() as u64).to_le_bytes());
        self.inner.update(part);
    }

    pub fn digest128(&self) -> u128 {
        self.inner.digest128()
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
mod tests {
    use super::*;

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
