//! A pure in-memory LRU of entry names weighted by bytes on disk (no I/O).

use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryInfo {
    pub disk_bytes: u64,
    pub last_use: u64,
    /// Hit records folded in since the entry was published: at most one per process per
    /// hit interval (hits are rate-limited before they reach the journal), so a lower bound.
    pub hits: u32,
}

#[derive(Debug, Default, Clone)]
pub struct Lru {
    map: HashMap<u128, EntryInfo>,
    order: BTreeSet<(u64, u128)>,
    /// Wide enough that no set of entries can overflow it, whatever sizes a journal or
    /// snapshot written by someone else claims.
    total: u128,
}

impl Lru {
    /// An empty LRU with room for `n` entries' records.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            map: HashMap::with_capacity(n),
            ..Self::default()
        }
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    #[cfg(test)]
    pub fn total_bytes(&self) -> u64 {
        u64::try_from(self.total).unwrap_or(u64::MAX)
    }
    pub fn get(&self, name: u128) -> Option<EntryInfo> {
        self.map.get(&name).copied()
    }
    /// The total, unclamped.
    pub fn total_wide(&self) -> u128 {
        self.total
    }

    /// Adds `name` as `info` says (a record read from a snapshot), replacing any record.
    pub fn insert(&mut self, name: u128, info: EntryInfo) {
        self.remove(name);
        self.map.insert(name, info);
        self.order.insert((info.last_use, name));
        self.total += u128::from(info.disk_bytes);
    }

    /// Records that `name` exists with `disk_bytes` and was used at `t` (keeps the latest use).
    pub fn touch(&mut self, name: u128, disk_bytes: u64, t: u64) {
        match self.map.get_mut(&name) {
            Some(info) => {
                // An older record (read late from another journal) may be of an earlier
                // file of this name: only a record as new as the view's says the size.
                if t < info.last_use {
                    return;
                }
                if t > info.last_use {
                    self.order.remove(&(info.last_use, name));
                    info.last_use = t;
                    self.order.insert((t, name));
                }
                self.total = self.total - u128::from(info.disk_bytes) + u128::from(disk_bytes);
                info.disk_bytes = disk_bytes;
            }
            None => {
                self.map.insert(
                    name,
                    EntryInfo {
                        disk_bytes,
                        last_use: t,
                        hits: 0,
                    },
                );
                self.order.insert((t, name));
                self.total += u128::from(disk_bytes);
            }
        }
    }

    /// A `touch` for a hit record: also counts it. The size of an indexed entry is left as
    /// its put said: a hit may have read an earlier file of the same name (replaced since,
    /// the hit record folded after the new put's).
    pub fn hit(&mut self, name: u128, disk_bytes: u64, t: u64) {
        let size = self.map.get(&name).map_or(disk_bytes, |i| i.disk_bytes);
        self.touch(name, size, t);
        self.add_hits(name, 1);
    }

    /// Adds `n` hits to `name` if it is indexed (saturating: a count, not a wrapping id).
    pub fn add_hits(&mut self, name: u128, n: u32) {
        if let Some(info) = self.map.get_mut(&name) {
            info.hits = info.hits.saturating_add(n);
        }
    }

    /// Removes `name` if it was not used after `t` (a later use means it was published again).
    pub fn remove_if_older(&mut self, name: u128, t: u64) -> Option<EntryInfo> {
        match self.map.get(&name) {
            Some(info) if info.last_use <= t => self.remove(name),
            _ => None,
        }
    }

    pub fn remove(&mut self, name: u128) -> Option<EntryInfo> {
        let info = self.map.remove(&name)?;
        self.order.remove(&(info.last_use, name));
        self.total -= u128::from(info.disk_bytes);
        Some(info)
    }

    /// Removes every entry last used at or before `t`.
    pub fn clear_up_to(&mut self, t: u64) {
        while let Some(&(lu, name)) = self.order.first() {
            if lu > t {
                break;
            }
            self.remove(name);
        }
    }

    /// Least recently used entries, oldest first.
    pub fn oldest(&self) -> impl Iterator<Item = (u128, EntryInfo)> + '_ {
        self.order.iter().map(move |&(_, n)| (n, self.map[&n]))
    }

    pub fn iter(&self) -> impl Iterator<Item = (u128, EntryInfo)> + '_ {
        self.map.iter().map(|(&n, &i)| (n, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_follows_last_use() {
        let mut l = Lru::default();
        l.touch(1, 10, 100);
        l.touch(2, 20, 200);
        l.touch(3, 30, 300);
        l.touch(1, 10, 400);
        let order: Vec<u128> = l.oldest().map(|(n, _)| n).collect();
        assert_eq!(order, vec![2, 3, 1]);
        assert_eq!(l.total_bytes(), 60);
        l.touch(1, 10, 50); // an older use does not make it older
        assert_eq!(l.oldest().last().unwrap().0, 1);
    }

    #[test]
    fn remove_respects_later_use() {
        let mut l = Lru::default();
        l.touch(1, 10, 100);
        assert!(l.remove_if_older(1, 50).is_none());
        assert!(l.remove_if_older(1, 100).is_some());
        assert_eq!(l.total_bytes(), 0);
        assert!(l.is_empty());
    }

    #[test]
    fn size_update_keeps_total() {
        let mut l = Lru::default();
        l.touch(1, 10, 1);
        l.touch(1, 25, 2);
        assert_eq!(l.total_bytes(), 25);
        l.touch(1, 99, 1); // an older record, maybe of an earlier file of this name
        assert_eq!(l.total_bytes(), 25);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn hits_are_counted_until_removed() {
        let mut l = Lru::default();
        l.touch(1, 10, 1);
        l.hit(1, 10, 2);
        l.hit(1, 10, 3);
        l.touch(1, 10, 4); // a put of a present entry is not a hit
        assert_eq!(l.get(1).unwrap().hits, 2);
        l.hit(1, 99, 5); // a hit of an earlier file of that name: the put's size stays
        assert_eq!(l.get(1).unwrap().disk_bytes, 10);
        assert_eq!(l.total_bytes(), 10);
        l.add_hits(1, 0);
        l.add_hits(2, 5); // not indexed: ignored
        assert!(l.get(2).is_none());
        l.add_hits(1, u32::MAX);
        assert_eq!(l.get(1).unwrap().hits, u32::MAX);
        l.remove(1);
        l.touch(1, 10, 5); // published again: counting starts over
        assert_eq!(l.get(1).unwrap().hits, 0);
    }

    #[test]
    fn clear_up_to_time() {
        let mut l = Lru::default();
        for i in 0..10u64 {
            l.touch(i as u128, 1, i);
        }
        l.clear_up_to(4);
        assert_eq!(l.len(), 5);
        assert_eq!(l.oldest().next().unwrap().0, 5);
    }
}
