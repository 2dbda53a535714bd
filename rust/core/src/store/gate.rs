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

/// Why a whole entry file is not served.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Not a whole entry: a checksum, the length or the header does not check out (for a
    /// trusting reader, a payload that does not hash to its signed digest).
    Corrupt(EntryError),
    /// Whole, but a trusting reader does not serve it (its payload was not read).
    Untrusted(Untrusted),
    /// Whole, and filed under a name that is not its key's.
    OtherKey,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Corrupt(e) => write!(f, "corrupt ({e})"),
            Refusal::Untrusted(why) => write!(f, "untrusted ({why})"),
            Refusal::OtherKey => f.write_str("an entry of another key"),
        }
    }
}

/// The verdict on a whole entry file, before a byte of its payload is handed out. Without a
/// trusted set: the header, the exact length and the xxh3 checksum. With one: the header
/// and its signature first (an entry that is unsigned or signed by a key outside the set is
/// `Untrusted`, its payload never read), then the payload's BLAKE3 against the signed digest.
pub(crate) fn judge(file: &[u8], trust: Option<&TrustSet>) -> Result<entry::Header, Refusal> {
    match trust {
        None => entry::verify(file).map_err(Refusal::Corrupt),
        Some(t) => match sign::verify_entry(file, t) {
            Ok(Verdict::Trusted(h)) => Ok(h),
            Ok(Verdict::Untrusted(why)) => Err(Refusal::Untrusted(why)),
            Err(e) => Err(Refusal::Corrupt(e)),
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

    /// Why this store would not take the whole entry file `file` for `key`, as (kind, why):
    /// kind `corrupt`, `untrusted` or `other_key`; None when it would. What an importer
    /// reports of a file `put_entry_file` refused. Writes and counts nothing.
    pub fn refusal(
        &self,
        key: Key<'_>,
        file: &[u8],
    ) -> Result<Option<(&'static str, String)>, StoreError> {
        check_key(&key)?;
        Ok(admit(file, self.opts.trust.as_deref(), key.bytes, None)
            .err()
            .map(|r| match r {
                Refusal::Corrupt(e) => ("corrupt", e.to_string()),
                Refusal::Untrusted(why) => ("untrusted", why.to_string()),
                Refusal::OtherKey => ("other_key", r.to_string()),
            }))
    }
}
