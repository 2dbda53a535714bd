//! The view's entries: the snapshot's, read on demand, under what the journals said since.
//!
//! A process that gets and puts needs the total and whether eviction is due, not every
//! record. So the snapshot stays on disk (`snapshot::Base`: totals in its header, one
//! 4 KiB block read per lookup) and only the names the journals mention since it was
//! written are held in memory (`over`). A name the overlay holds "shadows" its snapshot
//! record: the overlay has the truth for it (present with its record, or removed). Totals
//! are the snapshot's, less what is shadowed, plus the overlay's.
//!
//! Only an evictor needs the order: it keeps a batch of the snapshot's oldest entries
//! (`EVICT_BATCH`, found by one streaming pass over the blocks with a bounded heap) and
//! merges it with the overlay's own order.

use crate::lru::{EntryInfo, Lru};
use crate::snapshot::Base;
use std::collections::{BinaryHeap, HashSet, VecDeque};

/// Snapshot entries an evictor lists per pass over the snapshot: its memory for the order
/// is this many records (40 bytes each, about 2.6 MB), whatever the cache's size.
pub const EVICT_BATCH: usize = 65536;

#[derive(Debug, Default)]
pub struct Entries {
    base: Option<Base>,
    over: Lru,
    shadowed: HashSet<u128>,
    shadowed_bytes: u128,
    shadowed_count: u64,
    /// The snapshot's oldest unshadowed entries, oldest first (see `oldest`).
    candidates: VecDeque<(u128, EntryInfo)>,
    /// The newest (last use, name) listed so far; the snapshot's entries after it are not.
    listed_to: Option<(u64, u128)>,
    /// Whether the last listing reached the snapshot's newest entry.
    listed_all: bool,
    /// A snapshot block could not be read: the view is then what it could read, and the
    /// next refresh starts again from the snapshot.
    pub damaged: bool,
}

impl Entries {
    /// Entries over a snapshot (none: an empty base).
    pub fn with_base(base: Option<Base>) -> Entries {
        Entries {
            base,
            ..Entries::default()
        }
    }

    /// Entries all in memory (a version-1 snapshot, read whole).
    pub fn from_lru(lru: Lru) -> Entries {
        Entries {
            over: lru,
            ..Entries::default()
        }
    }

    /// How many snapshot entries are held in memory besides the snapshot (for tests: a
    /// process that only puts holds what the journals said, not the snapshot).
    #[cfg(test)]
    pub fn in_memory(&self) -> usize {
        self.over.len()
    }

    /// Snapshot blocks read since the snapshot was opened.
    #[cfg(test)]
    pub fn blocks_read(&self) -> u64 {
        self.base.as_ref().map_or(0, |b| b.blocks_read.get())
    }

    pub fn len(&self) -> usize {
        let base = self.base.as_ref().map_or(0, |b| b.entries);
        (base.saturating_sub(self.shadowed_count) as usize).saturating_add(self.over.len())
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn total_bytes(&self) -> u64 {
        let base = self.base.as_ref().map_or(0, |b| b.total);
        let t = base
            .saturating_sub(self.shadowed_bytes)
            .saturating_add(self.over.total_wide());
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    fn lookup(&mut self, name: u128) -> Option<EntryInfo> {
        let base = self.base.as_ref()?;
        match base.lookup(name) {
            Ok(r) => r,
            Err(e) => {
                if !self.damaged {
                    log::warn!("xla_pcache: cannot read the index snapshot: {e}");
                }
                self.damaged = true;
                None
            }
        }
    }

    fn shadow(&mut self, name: u128, info: EntryInfo) {
        if self.shadowed.insert(name) {
            self.shadowed_bytes += u128::from(info.disk_bytes);
            self.shadowed_count += 1;
        }
    }

    /// Moves `name`'s snapshot record, if any, into the overlay.
    fn materialize(&mut self, name: u128) {
        if self.base.is_none() || self.over.get(name).is_some() || self.shadowed.contains(&name) {
            return;
        }
        if let Some(info) = self.lookup(name) {
            self.shadow(name, info);
            self.over.insert(name, info);
        } else {
            // Known absent from the snapshot: the overlay has the truth from now on.
            self.shadowed.insert(name);
        }
    }

    /// `materialize` for many names, reading each snapshot block they fall in once.
    pub fn materialize_many(&mut self, names: &mut Vec<u128>) {
        let Some(base) = self.base.as_ref() else {
            return;
        };
        names.retain(|n| self.over.get(*n).is_none() && !self.shadowed.contains(n));
        names.sort_unstable();
        names.dedup();
        let mut found = Vec::new();
        let mut i = 0;
        let mut failed = None;
        while i < names.len() {
            let Some(b) = base.block_of(names[i]) else {
                i += 1;
                continue;
            };
            let mut j = i + 1;
            while j < names.len() && base.block_of(names[j]) == Some(b) {
                j += 1;
            }
            match base.block(b) {
                Ok(recs) => {
                    for &n in &names[i..j] {
                        if let Ok(at) = recs.binary_search_by_key(&n, |r| r.0) {
                            found.push(recs[at]);
                        }
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    // Left to the one-by-one path, which notes the damage.
                    names.drain(i..j);
                    continue;
                }
            }
            i = j;
        }
        if let Some(e) = failed {
            if !self.damaged {
                log::warn!("xla_pcache: cannot read the index snapshot: {e}");
            }
            self.damaged = true;
        }
        for &n in names.iter() {
            self.shadowed.insert(n);
        }
        for (n, info) in found {
            self.shadowed.remove(&n);
            self.shadow(n, info);
            self.over.insert(n, info);
        }
    }

    pub fn get(&self, name: u128) -> Option<EntryInfo> {
        if let Some(i) = self.over.get(name) {
            return Some(i);
        }
        if self.shadowed.contains(&name) {
            return None;
        }
        // A read error here reads as absent: the index is a hint.
        self.base.as_ref()?.lookup(name).ok().flatten()
    }

    /// `get` of many names in increasing order, reading each snapshot block once.
    pub fn get_sorted(&self, names: &[u128]) -> Vec<Option<EntryInfo>> {
        let mut block: Option<(usize, Vec<(u128, EntryInfo)>)> = None;
        names
            .iter()
            .map(|&n| {
                if let Some(i) = self.over.get(n) {
                    return Some(i);
                }
                if self.shadowed.contains(&n) {
                    return None;
                }
                let base = self.base.as_ref()?;
                let b = base.block_of(n)?;
                if block.as_ref().is_none_or(|(at, _)| *at != b) {
                    block = Some((b, base.block(b).unwrap_or_default()));
                }
                let recs = &block.as_ref()?.1;
                recs.binary_search_by_key(&n, |r| r.0)
                    .ok()
                    .map(|at| recs[at].1)
            })
            .collect()
    }

    pub fn touch(&mut self, name: u128, disk_bytes: u64, t: u64) {
        self.materialize(name);
        self.over.touch(name, disk_bytes, t);
    }

    pub fn hit(&mut self, name: u128, disk_bytes: u64, t: u64) {
        self.materialize(name);
        self.over.hit(name, disk_bytes, t);
    }

    pub fn remove_if_older(&mut self, name: u128, t: u64) -> Option<EntryInfo> {
        self.materialize(name);
        self.over.remove_if_older(name, t)
    }

    pub fn remove(&mut self, name: u128) -> Option<EntryInfo> {
        self.materialize(name);
        self.over.remove(name)
    }

    /// Removes every entry last used at or before `t` (a clear: rare, so it may read the
    /// whole snapshot; what it removes from the snapshot is remembered by name).
    pub fn clear_up_to(&mut self, t: u64) {
        self.over.clear_up_to(t);
        let Some(base) = self.base.as_ref() else {
            return;
        };
        let mut dead = Vec::new();
        for b in 0..base.blocks() {
            match base.block(b) {
                Ok(recs) => dead.extend(recs.into_iter().filter(|r| r.1.last_use <= t)),
                Err(_) => self.damaged = true,
            }
        }
        for (n, info) in dead {
            if !self.shadowed.contains(&n) {
                self.shadow(n, info);
            }
        }
    }

    /// Least recently used entries, oldest first. The snapshot's part comes from a batch of
    /// its oldest entries, listed again (one pass over it) when the batch is used up.
    pub fn oldest(&mut self) -> impl Iterator<Item = (u128, EntryInfo)> + '_ {
        while self
            .candidates
            .front()
            .is_some_and(|(n, _)| self.shadowed.contains(n))
        {
            self.candidates.pop_front();
        }
        if self.candidates.is_empty() && !self.listed_all && self.base.is_some() {
            self.list_oldest();
        }
        let limit = if self.listed_all {
            None
        } else {
            self.listed_to
        };
        let shadowed = &self.shadowed;
        let cands = self
            .candidates
            .iter()
            .copied()
            .filter(move |(n, _)| !shadowed.contains(n));
        Merge {
            a: cands.peekable(),
            b: self.over.oldest().peekable(),
        }
        .take_while(move |(n, i)| limit.is_none_or(|l| (i.last_use, *n) <= l))
    }

    fn list_oldest(&mut self) {
        let Some(base) = self.base.as_ref() else {
            return;
        };
        let after = self.listed_to;
        let mut heap: BinaryHeap<(u64, u128, u64, u32)> = BinaryHeap::new();
        let mut eligible = 0usize;
        for b in 0..base.blocks() {
            let recs = match base.block(b) {
                Ok(r) => r,
                Err(_) => {
                    self.damaged = true;
                    continue;
                }
            };
            for (n, i) in recs {
                if self.shadowed.contains(&n) || after.is_some_and(|a| (i.last_use, n) <= a) {
                    continue;
                }
                eligible += 1;
                heap.push((i.last_use, n, i.disk_bytes, i.hits));
                if heap.len() > EVICT_BATCH {
                    heap.pop();
                }
            }
        }
        self.listed_all = eligible <= EVICT_BATCH;
        let sorted = heap.into_sorted_vec();
        if let Some(&(t, n, _, _)) = sorted.last() {
            self.listed_to = Some((t, n));
        }
        self.candidates = sorted
            .into_iter()
            .map(|(t, n, b, h)| {
                (
                    n,
                    EntryInfo {
                        disk_bytes: b,
                        last_use: t,
                        hits: h,
                    },
                )
            })
            .collect();
    }

    /// Every entry, in no particular order: the overlay's, then the snapshot's read a block
    /// at a time (a block that cannot be read is left out).
    pub fn iter(&self) -> impl Iterator<Item = (u128, EntryInfo)> + '_ {
        let blocks = self.base.as_ref().map_or(0, |b| b.blocks());
        self.over.iter().chain(
            (0..blocks)
                .flat_map(move |b| {
                    self.base
                        .as_ref()
                        .and_then(|base| base.block(b).ok())
                        .unwrap_or_default()
                })
                .filter(move |(n, _)| !self.shadowed.contains(n)),
        )
    }

    /// Every entry in name order, holding one snapshot block and the overlay's names sorted.
    /// A snapshot block that cannot be read is left out (its entries are then unindexed
    /// until `verify --repair` or an explicit evict finds their files).
    pub fn iter_by_name(&self) -> impl Iterator<Item = (u128, EntryInfo)> + '_ {
        let mut over: Vec<(u128, EntryInfo)> = self.over.iter().collect();
        over.sort_unstable_by_key(|r| r.0);
        let base = self.base.as_ref();
        let blocks = base.map_or(0, |b| b.blocks());
        let base_iter = (0..blocks)
            .flat_map(move |b| match base.map(|x| x.block(b)) {
                Some(Ok(recs)) => recs,
                Some(Err(e)) => {
                    log::warn!(
                        "xla_pcache: leaving out a damaged block of the index snapshot ({e}); \
                         run `xla-pcache verify --repair` to reindex its entries"
                    );
                    Vec::new()
                }
                None => Vec::new(),
            })
            .filter(move |(n, _)| !self.shadowed.contains(n));
        Merge {
            a: base_iter.peekable(),
            b: over.into_iter().peekable(),
        }
        .by_name()
    }
}

/// Merges two ordered streams, by (last use, name) or by name.
struct Merge<A: Iterator, B: Iterator> {
    a: std::iter::Peekable<A>,
    b: std::iter::Peekable<B>,
}

impl<A, B> Iterator for Merge<A, B>
where
    A: Iterator<Item = (u128, EntryInfo)>,
    B: Iterator<Item = (u128, EntryInfo)>,
{
    type Item = (u128, EntryInfo);
    fn next(&mut self) -> Option<Self::Item> {
        let key = |r: &(u128, EntryInfo)| (r.1.last_use, r.0);
        match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if key(x) <= key(y) => self.a.next(),
            (Some(_), Some(_)) => self.b.next(),
            (Some(_), None) => self.a.next(),
            _ => self.b.next(),
        }
    }
}

impl<A, B> Merge<A, B>
where
    A: Iterator<Item = (u128, EntryInfo)>,
    B: Iterator<Item = (u128, EntryInfo)>,
{
    fn by_name(mut self) -> impl Iterator<Item = (u128, EntryInfo)> {
        std::iter::from_fn(move || match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if x.0 <= y.0 => self.a.next(),
            (Some(_), Some(_)) => self.b.next(),
            (Some(_), None) => self.a.next(),
            _ => self.b.next(),
        })
    }
}
