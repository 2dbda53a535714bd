//! The one gate for what a process may load: where an entry of a key may be (the candidate
//! names, in the order they are tried) and the verdict on a whole entry file found there or
//! received (a tier, a bundle).
//!
//! Every path that hands executable bytes to a caller, or decides what stands for an entry,
//! goes through here: the store's get and `contains` (`read.rs`), `delete` (`delete.rs`),
//! `get_entry_file` and the received files (`entry_file.rs`: tiers, backfill, bundles, and
//! whether a received signature is kept), a signed put's look at what its names hold
//! (`write.rs`), `verify` and `untrusted_entries` (`verify.rs`), and, through the binding,
//! the tiers' names (`Store::entry_names`, `tier_names`) and the torch_xla host pool. Nothing
//! else writes the order of the names a reader tries or decides on a signature: `sign.rs`
//! verifies one when `judge` asks it to.

use super::{check_key, Key, Store};
use crate::entry::{self, EntryError};
use crate::error::StoreError;
use crate::hash::entry_name;
use crate::sign::{self, TrustSet, Untrusted, Verdict};

/// The names an entry of `key` may be under, in the order a reader tries them, each with the
/// signer whose own name it is: the plain name (None), then, with a trusted set, each trusted
/// signer's own name for the key (`sign::signed_name`), in the set's order. Without a set,
/// the plain name only. First-writer-wins holds among the entries a reader trusts because
/// every reader tries them in this one order.
pub(crate) fn candidates<'a>(
    key: &'a [u8],
    trust: Option<&'a TrustSet>,
) -> impl Iterator<Item = (u128, Option<&'a str>)> + 'a {
    std::iter::once((entry_name(key), None)).chain(
        trust
            .into_iter()
            .flat_map(TrustSet::names)
            .map(move |s| (sign::signed_name(key, s), Some(s))),
    )
}

/// Why a whole entry file is not served: the core's verdict, handed to whoever fetched or
/// received the file (a tier's fetch through `Accept`, a bundle's import, a head a tier
/// read), so that nothing checks the same bytes twice to learn it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a whole entry: a checksum, the length or the header does not check out (for a
    /// trusting reader, a payload that does not hash to its signed digest).
    Corrupt(EntryError),
    /// Whole, but a trusting reader does not serve it (its payload was not read).
    Untrusted(Untrusted),
    /// Whole, and filed under a name that is not its key's.
    OtherKey,
    /// A later release's entry (its format version is above this release's): a miss, never
    /// removed nor replaced as damage (ARCHITECTURE.md, "Formats of other releases").
    NewerFormat(u16),
}

impl Refusal {
    /// The refusal of a file whose check failed with `e`: a later format is no damage.
    pub(crate) fn of(e: EntryError) -> Refusal {
        match e {
            EntryError::NewerFormat(v) => Refusal::NewerFormat(v),
            e => Refusal::Corrupt(e),
        }
    }

    /// Its kind, as callers name it: `corrupt`, `untrusted`, `other_key`, `newer_format`.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Corrupt(_) => "corrupt",
            Refusal::Untrusted(_) => "untrusted",
            Refusal::OtherKey => "other_key",
            Refusal::NewerFormat(_) => "newer_format",
        }
    }

    /// Whether it proves the file no entry of its name for any reader of any release:
    /// damage, or another key's entry (what a writer may remove).
    pub fn proves_garbage(&self) -> bool {
        matches!(self, Refusal::Corrupt(_) | Refusal::OtherKey)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Corrupt(e) => write!(f, "corrupt ({e})"),
            Refusal::Untrusted(why) => write!(f, "untrusted ({why})"),
            Refusal::OtherKey => f.write_str("an entry of another key"),
            Refusal::NewerFormat(v) => write!(
                f,
                "an entry of format version {v}, a later release's (this one reads version {})",
                entry::ENTRY_VERSION
            ),
        }
    }
}

/// The verdict on a whole entry file, before a byte of its payload is handed out. Without a
/// trusted set: the header, the exact length and the xxh3 checksum. With one: the header
/// and its signature first (an entry that is unsigned or signed by a key outside the set is
/// `Untrusted`, its payload never read), then the payload's BLAKE3 against the signed digest.
pub(crate) fn judge(file: &[u8], trust: Option<&TrustSet>) -> Result<entry::Header, Refusal> {
    match trust {
        None => entry::verify(file).map_err(Refusal::of),
        Some(t) => match sign::verify_entry(file, t) {
            Ok(Verdict::Trusted(h)) => Ok(h),
            Ok(Verdict::Untrusted(why)) => Err(Refusal::Untrusted(why)),
            Err(e) => Err(Refusal::of(e)),
        },
    }
}

/// Whether an entry judged whole belongs where it was found for `key`: its key is `key` and,
/// under a signer's own name (`signer`, from `candidates`), that signer signed it (anything
/// else there is `Misfiled`: a forger cannot file an entry under a trusted signer's name).
pub(crate) fn belongs(h: &entry::Header, key: &[u8], signer: Option<&str>) -> Result<(), Refusal> {
    if h.key != key {
        return Err(Refusal::OtherKey);
    }
    if let Some(s) = signer {
        if h.signature.as_ref().map(|f| f.signer.as_str()) != Some(s) {
            return Err(Refusal::Untrusted(Untrusted::Misfiled(s.to_string())));
        }
    }
    Ok(())
}

/// `judge`, then `belongs`: the whole decision on an entry file of `key` found under the
/// candidate name of `signer` (None: the plain name, or a file received without a name).
pub(crate) fn admit(
    file: &[u8],
    trust: Option<&TrustSet>,
    key: &[u8],
    signer: Option<&str>,
) -> Result<entry::Header, Refusal> {
    let h = judge(file, trust)?;
    belongs(&h, key, signer)?;
    Ok(h)
}

/// Whether an entry with this header belongs under the file name `name` whatever key was
/// asked for: the plain name of its key, or its signer's own name for it (how `verify` and
/// bundle export tell an entry filed correctly).
pub(crate) fn filed_under(h: &entry::Header, name: u128) -> bool {
    entry_name(&h.key) == name
        || h.signature
            .as_ref()
            .is_some_and(|f| sign::signed_name(&h.key, &f.signer) == name)
}

/// The names a remote tier keeps a whole entry of `key` under, in the order they are
/// written: the key's plain name (created: the first writer wins) and, for an entry `signer`
/// signed, that signer's own name for the key (replaced: only that signer writes there, so
/// what squats the plain name hides nothing from a trusting reader).
pub fn tier_names(key: &[u8], signer: Option<&str>) -> Vec<u128> {
    std::iter::once(entry_name(key))
        .chain(signer.map(|s| sign::signed_name(key, s)))
        .collect()
}

impl Store {
    /// The names (xxh3-128) an entry of `key` may be under for this store's reads, in the
    /// order they are tried (`candidates` under its trusted keys): what a tier is asked for.
    pub fn entry_names(&self, key: Key<'_>) -> Result<Vec<u128>, StoreError> {
        check_key(&key)?;
        Ok(candidates(key.bytes, self.opts.trust.as_deref())
            .map(|(n, _)| n)
            .collect())
    }
}

/// The verdict on the first bytes `head` of an object of `size` bytes stored under the
/// entry name `name` (32 hex digits), before the rest is read: whether they hold the whole
/// header of an entry filed under that name (`filed_under`) whose file is `size` bytes long.
/// What lets a tier refuse a foreign, damaged, misfiled or later release's object after
/// one ranged read. The header's checksum is checked; the payload is judged when the whole
/// file is received (`judge`).
pub fn judge_head(head: &[u8], name: &str, size: u64) -> Result<(), Refusal> {
    let h = entry::decode_header(head).map_err(Refusal::of)?;
    let filed = crate::hash::parse_name_hex(name).is_some_and(|at| filed_under(&h, at));
    if !filed {
        return Err(Refusal::OtherKey);
    }
    if h.file_len() != size {
        return Err(Refusal::Corrupt(EntryError::BadLength {
            expected: h.file_len(),
            actual: size,
        }));
    }
    Ok(())
}

/// The key an entry file's first bytes `head` name, and whether it is text (`entry::head_key`:
/// untrusted, for a caller to fetch and verify whole under it), or why there is none.
pub fn head_key(head: &[u8]) -> Result<(Vec<u8>, bool), Refusal> {
    entry::head_key(head).map_err(Refusal::of)
}
