//! Checking every file: `verify` (each entry verified, the index reconciled with the files,
//! leftovers reported; with repair, what is wrong removed and the index rewritten) and
//! `untrusted_entries` (what a trusting reader would not serve).

use super::listing::entries_rel;
use super::read::ReadError;
use super::write::squatter_kind;
use super::{disk_bytes, gate, Store};
use crate::error::StoreError;
use crate::hash::parse_name_hex;
use crate::journal::JournalRecord;
use crate::layout::Layout;
use std::collections::HashMap;

/// What `verify` found (and repaired when asked).
#[derive(Debug, Default, Clone)]
pub struct VerifyReport {
    pub entries: u64,
    pub bytes: u64,
    pub corrupt: Vec<String>,
    pub foreign: Vec<String>,
    /// Entries of a later release's format: counted and indexed (budgeted, evicted by LRU
    /// like any entry), never removed by a repair.
    pub newer_format: Vec<String>,
    pub unindexed: u64,
    pub dangling: u64,
    pub stale_tmp: u64,
    pub stale_trash: u64,
    pub repaired: bool,
    /// Stopped early by `interrupt`: the counts cover the files checked until then, and
    /// the index was neither reconciled nor repaired.
    pub interrupted: bool,
    /// What it could not look at and went on without (unreadable entries or index files,
    /// directories that are not real directories inside the cache), with why.
    pub skipped_files: Vec<String>,
}

impl VerifyReport {
    /// Problems: corrupt or foreign files, and entries the index does not know (they would
    /// escape the budget). Index records of files that are gone ("dangling") are not counted:
    /// races between a delete and a hit can leave them by design, they only make eviction
    /// err toward removing more, and eviction drops them when it meets them. Stale temp and
    /// trash files are housekeeping, not faults.
    pub fn problems(&self) -> u64 {
        (self.corrupt.len() + self.foreign.len()) as u64 + self.unindexed
    }
}

impl Store {
    /// Walks every file: verifies entries, reconciles the index, reports leftovers. With
    /// `repair`, removes corrupt and foreign files and fixes the index. An entry of a later
    /// release's format is reported and indexed, never removed.
    pub fn verify(
        &self,
        repair: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport, StoreError> {
        if repair {
            self.writable()?;
        }
        let _walk = self.walk();
        let files = self.entry_files()?;
        let total = files.len() as u64;
        let mut report = VerifyReport {
            repaired: repair,
            ..Default::default()
        };
        let mut seen: HashMap<u128, u64> = HashMap::new();
        let mut fix = Vec::new();
        for (i, (shard, file)) in files.iter().enumerate() {
            progress(i as u64, total);
            if i == 1 {
                // A test interrupts the walk here, once it has checked an entry.
                crate::testhook::pause("walk", || self.interrupt_pending());
            }
            if self.interrupted() {
                report.interrupted = true;
                let mut st = self.state();
                report.skipped_files.extend(self.unreadable_files(&st));
                // The corrupt files removed so far: their deletes are recorded.
                if !fix.is_empty() {
                    self.append_locked(&mut st, &fix);
                }
                return Ok(report);
            }
            let display = self.entry_display(shard.as_ref(), file);
            let dir_rel = entries_rel(shard.as_ref());
            let rel = dir_rel.join(file);
            let name = parse_name_hex(file.as_str())
                .filter(|n| shard.is_some() && Layout::shard_rel(*n) == dir_rel);
            let is_dir = || {
                self.dir(&dir_rel)
                    .and_then(|d| d.stat(file))
                    .is_ok_and(|m| m.is_dir())
            };
            let Some(name) = name.filter(|_| !is_dir()) else {
                report.foreign.push(display);
                if repair {
                    // Removed through directory handles: a link is unlinked, never followed.
                    let _ = self.dir(&dir_rel).and_then(|d| d.remove_any(file));
                }
                continue;
            };
            let disk = || {
                self.dir(&dir_rel)
                    .and_then(|d| d.stat(file))
                    .map(|m| disk_bytes(&m))
                    .unwrap_or(0)
            };
            match self.read_entry(&rel, None) {
                Ok(blob) if gate::filed_under(&blob.header, name) => {
                    let disk = disk();
                    report.entries += 1;
                    report.bytes += disk;
                    seen.insert(name, disk);
                    let _ = blob;
                }
                Err(ReadError::Newer(_)) => {
                    // Its release reads it: kept, and in the index, so that the budget
                    // holds it and the LRU evicts it as any other entry.
                    report.newer_format.push(display);
                    seen.insert(name, disk());
                }
                Ok(_) | Err(ReadError::Corrupt(..)) => {
                    report.corrupt.push(display);
                    if repair {
                        let _ = self.dir(&dir_rel).and_then(|d| d.unlink(file));
                        fix.push(JournalRecord::Delete {
                            name,
                            t: crate::clock::unix_ns(),
                        });
                    }
                }
                Err(ReadError::Missing) | Err(ReadError::Untrusted(_)) => {}
                // Not readable by this user (another's mode 0600 file): reported, left alone.
                Err(ReadError::Io(e)) => report.skipped_files.push(format!("{display} ({e})")),
                Err(ReadError::Unsafe(why)) => {
                    report.skipped_files.push(format!("{display} ({why})"))
                }
            }
        }
        progress(total, total);
        let mut st = self.state();
        if let Err(e) = self.refresh(&mut st) {
            // Reported, and the check goes on with the view as it is.
            report
                .skipped_files
                .push(format!("the index of {} ({e})", self.layout.root.display()));
        }
        report.skipped_files.extend(self.unreadable_files(&st));
        let now = crate::clock::unix_ns();
        // Sorted: the index's records of one snapshot block are read together.
        let mut files: Vec<(u128, u64)> = seen.iter().map(|(&n, &d)| (n, d)).collect();
        files.sort_unstable();
        let names: Vec<u128> = files.iter().map(|f| f.0).collect();
        let indexed = st.view.entries.get_sorted(&names);
        for ((name, disk), indexed) in files.into_iter().zip(indexed) {
            match indexed {
                Some(info) if info.disk_bytes == disk => {}
                _ => {
                    report.unindexed += u64::from(indexed.is_none());
                    // Recorded as a publish: reindexing is not a use, so it counts no hit.
                    fix.push(JournalRecord::Touch {
                        name,
                        disk_bytes: disk,
                        t: now,
                        put: true,
                    });
                }
            }
        }
        let dangling: Vec<u128> = st
            .view
            .entries
            .iter()
            .map(|(n, _)| n)
            .filter(|n| !seen.contains_key(n))
            .collect();
        report.dangling = dangling.len() as u64;
        let (tmp, trash) = self.sweep(true);
        report.stale_tmp = tmp;
        report.stale_trash = trash;
        if repair {
            for name in dangling {
                st.view.entries.remove(name);
                fix.push(JournalRecord::Delete { name, t: now });
            }
            for r in &fix {
                if let JournalRecord::Touch {
                    name,
                    disk_bytes,
                    t,
                    ..
                } = r
                {
                    st.view.entries.touch(*name, *disk_bytes, *t);
                }
            }
            self.append_locked(&mut st, &fix);
            self.sweep(false);
            drop(st);
            // The snapshot is written again from the repaired view: one that was damaged or
            // claimed what its files do not hold (a total, a journal list) is replaced now,
            // not at some later compaction. Skipped if another process holds the evictor
            // lock (it compacts when it needs to).
            if let Some(guard) = self.take_evict_lock(self.opts.lock_timeout) {
                let mut st = self.state();
                self.compact_locked(&mut st);
                drop(guard);
            }
        }
        Ok(report)
    }

    /// The entries a reader with this store's trusted keys would not serve, each as (file,
    /// key, why); with `remove`, they are moved out (two-phase, through trash/) as they are
    /// found. Corrupt files are `verify`'s, not counted here.
    pub fn untrusted_entries(
        &self,
        remove: bool,
    ) -> Result<Vec<(String, Vec<u8>, String)>, StoreError> {
        let Some(trust) = self.opts.trust.as_deref() else {
            return Err(StoreError::Invalid(
                "no trusted keys: every entry is served (set trusted keys to check)".into(),
            ));
        };
        if remove {
            self.writable()?;
        }
        let mut out = Vec::new();
        for (shard, file) in self.entry_files()? {
            if self.interrupted() {
                break;
            }
            let dir_rel = entries_rel(shard.as_ref());
            let Some(name) = parse_name_hex(file.as_str())
                .filter(|n| shard.is_some() && Layout::shard_rel(*n) == dir_rel)
            else {
                continue;
            };
            let rel = dir_rel.join(&file);
            // Something that is no file at an entry's name (a directory, a FIFO, a link)
            // serves nobody and blocks every put of its key: listed, and removed as a put
            // that meets it would.
            if let Ok((shard_dir, m)) = self
                .dir(&dir_rel)
                .and_then(|d| d.stat(&file).map(|m| (d, m)))
            {
                if !m.is_file() {
                    if remove && self.clear_squatter(&shard_dir, name, &m).is_none() {
                        continue;
                    }
                    out.push((
                        self.entry_display(shard.as_ref(), &file),
                        Vec::new(),
                        format!("{} at an entry's name", squatter_kind(&m)),
                    ));
                    continue;
                }
            }
            let (key, why) = match self.read_entry(&rel, Some(trust)) {
                Ok(b) if gate::filed_under(&b.header, name) => continue,
                Ok(b) => {
                    let by = b.header.signature.map(|f| f.signer).unwrap_or_default();
                    (
                        b.header.key,
                        format!("filed under another signer's name (signed by {by})"),
                    )
                }
                Err(ReadError::Untrusted(why)) => {
                    let key = self
                        .read_header(&rel)
                        .map(|(h, _)| h.key)
                        .unwrap_or_default();
                    (key, why.to_string())
                }
                Err(_) => continue,
            };
            if remove {
                let ino = self
                    .dir(&dir_rel)
                    .and_then(|d| d.stat(&file))
                    .map_or(0, |m| m.ino());
                self.remove_corrupt(ino, name);
            }
            out.push((self.entry_display(shard.as_ref(), &file), key, why));
        }
        Ok(out)
    }
}
