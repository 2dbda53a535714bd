//! The meta section: each journal's name, folded offset and counters, the counters of the
//! journals folded and removed, then the counters per tier; encoded, and read back as
//! untrusted bytes (names checked, counts bounded).

use super::read::Reader;
use super::{JournalMark, Meta, MAX_COUNTERS, MAX_JOURNALS};
use crate::dir::{Kind, Name};
use crate::hash::checksum;
use crate::stats::{
    add_tiers_into, tier_values, valid_tier_name, TierCounters, N_COUNTERS, N_TIER_COUNTERS,
};

fn fixed(v: &[u64]) -> impl Iterator<Item = u64> + '_ {
    (0..N_COUNTERS).map(|i| v.get(i).copied().unwrap_or(0))
}

/// Each journal's name, folded offset and counters, then the counters of the journals folded
/// and removed: the same in both versions of the snapshot.
pub(super) fn encode_journals(b: &mut Vec<u8>, meta: &Meta) {
    for j in &meta.journals {
        b.extend_from_slice(&(j.name.as_str().len() as u16).to_le_bytes());
        b.extend_from_slice(j.name.as_str().as_bytes());
        b.extend_from_slice(&j.offset.to_le_bytes());
        for c in fixed(&j.counters) {
            b.extend_from_slice(&c.to_le_bytes());
        }
    }
    for c in fixed(&meta.base_counters) {
        b.extend_from_slice(&c.to_le_bytes());
    }
}

pub(super) fn encode_meta(meta: &Meta) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(meta.journals.len() as u32).to_le_bytes());
    b.extend_from_slice(&(N_COUNTERS as u32).to_le_bytes());
    encode_journals(&mut b, meta);
    // The counters per tier name, after what readers of versions before them read (they
    // stop at the base counters): each journal's, in the order above, then the base's.
    b.extend_from_slice(TIERS_TAG);
    b.extend_from_slice(&(N_TIER_COUNTERS as u32).to_le_bytes());
    for tiers in meta
        .journals
        .iter()
        .map(|j| &j.tiers)
        .chain([&meta.base_tiers])
    {
        b.extend_from_slice(&(tiers.len() as u32).to_le_bytes());
        for (name, values) in tiers {
            b.push(name.len() as u8);
            b.extend_from_slice(name.as_bytes());
            for c in values {
                b.extend_from_slice(&c.to_le_bytes());
            }
        }
    }
    let sum = checksum(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

const TIERS_TAG: &[u8; 4] = b"TIER";

/// The counters per tier a snapshot's meta holds after its base counters (none in one
/// written before them). Untrusted like the rest: names are checked, counts bounded.
fn read_tiers(r: &mut Reader<'_>, meta: &mut Meta) -> Result<(), &'static str> {
    if r.at == r.b.len() {
        return Ok(());
    }
    if r.take(4)? != TIERS_TAG {
        return Err("bad tier counters");
    }
    let n_counters = r.u32()? as usize;
    let n_lists = meta.journals.len() + 1;
    for i in 0..n_lists {
        let n_tiers = r.u32()? as usize;
        let mut tiers = TierCounters::new();
        for _ in 0..n_tiers {
            let len = r.take(1)?[0] as usize;
            let name = std::str::from_utf8(r.take(len)?)
                .map_err(|_| "bad tier name")?
                .to_string();
            if !valid_tier_name(&name) {
                return Err("bad tier name");
            }
            let values = read_counters(r, n_counters)?;
            // add_tiers_into leaves out tiers past MAX_TIERS.
            add_tiers_into(
                &mut tiers,
                &TierCounters::from([(name, tier_values(&values))]),
            );
        }
        match meta.journals.get_mut(i) {
            Some(j) => j.tiers = tiers,
            None => meta.base_tiers = tiers,
        }
    }
    Ok(())
}

pub(super) fn decode_meta(b: &[u8]) -> Result<Meta, String> {
    if b.len() < 16 {
        return Err("truncated meta".into());
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if checksum(body) != u64::from_le_bytes(sum.try_into().map_err(|_| "short")?) {
        return Err("meta checksum mismatch".into());
    }
    let mut r = Reader { b: body, at: 0 };
    let n_journals = r.u32()?;
    let n_counters = r.u32()? as usize;
    check_counts(n_journals, n_counters)?;
    let mut meta = Meta::default();
    read_journals(&mut r, n_journals, n_counters, &mut meta)?;
    meta.base_counters = read_counters(&mut r, n_counters)?;
    read_tiers(&mut r, &mut meta)?;
    Ok(meta)
}

/// Refuses a journal list longer than any writer makes, or more counters than any has.
pub(super) fn check_counts(n_journals: u32, n_counters: usize) -> Result<(), &'static str> {
    if n_journals as usize > MAX_JOURNALS {
        return Err("too many journals");
    }
    if n_counters > MAX_COUNTERS {
        return Err("too many counters");
    }
    Ok(())
}

/// Reads `n` journal marks into `meta`, keeping those whose name is a journal's.
pub(super) fn read_journals(
    r: &mut Reader<'_>,
    n: u32,
    n_counters: usize,
    meta: &mut Meta,
) -> Result<(), &'static str> {
    for _ in 0..n {
        match read_journal(r, n_counters)? {
            Some(j) => meta.journals.push(j),
            None => meta.bad_names += 1,
        }
    }
    Ok(())
}

/// One journal mark; `None` when its name is not a journal's (read past all the same).
fn read_journal(
    r: &mut Reader<'_>,
    n_counters: usize,
) -> Result<Option<JournalMark>, &'static str> {
    let len = r.u16()? as usize;
    let name = std::str::from_utf8(r.take(len)?)
        .ok()
        .and_then(|s| Name::new(Kind::Journal, s));
    let offset = r.u64()?;
    let counters = read_counters(r, n_counters)?;
    Ok(name.map(|name| JournalMark {
        name,
        offset,
        counters,
        tiers: TierCounters::new(),
    }))
}

pub(super) fn read_counters(r: &mut Reader<'_>, n: usize) -> Result<Vec<u64>, &'static str> {
    // Checked against what is left before allocating: a count is whatever the file says.
    if n.checked_mul(8).is_none_or(|b| b > r.b.len() - r.at) {
        return Err("truncated");
    }
    (0..n).map(|_| r.u64()).collect()
}
