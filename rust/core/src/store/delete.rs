//! Removing entries on request: `delete` (a key's entries, moved to trash/ first so that
//! readers that opened them finish) and `clear` (every entry). Neither removes an entry of
//! a later release's format (`clear(true)` does): its release reads it.

use super::listing::entries_rel;
use super::{check_key, disk_bytes, Key, Store};
use crate::clock::unique_suffix;
use crate::dir::{self as cdir, Kind, Name};
use crate::error::{io_err, StoreError};
use crate::hash::parse_name_hex;
use crate::journal::JournalRecord;
use crate::layout::{Layout, ENTRIES, TRASH};
use crate::stats::Counter;
use std::io;

impl Store {
    /// Removes the entry (moved to trash first, so readers that opened it finish). True if
    /// there was one. A file of a later release's format under one of its names is left.
    pub fn delete(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        self.writable()?;
        let mut any = false;
        for name in self.names_of(key).collect::<Vec<_>>() {
            any |= self.delete_name(name)?;
        }
        Ok(any)
    }

    fn delete_name(&self, name: u128) -> Result<bool, StoreError> {
        let path = self.layout.entry_path(name);
        let file = Name::entry(name);
        let aside = Name::checked(Kind::Made, &format!("{file}.{}", unique_suffix()))
            .map_err(|e| io_err("delete", &path, e))?;
        let t = crate::clock::unix_ns();
        let shard = match self.dir(&Layout::shard_rel(name)) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound || cdir::is_unsafe(&e) => {
                return Ok(false)
            }
            Err(e) => return Err(io_err("delete", &path, e)),
        };
        if shard.stat(&file).is_ok_and(|m| m.is_dir()) {
            self.unsafe_path(Layout::entry_rel(name).as_str(), &"a directory");
            return Ok(false);
        }
        if let Some(v) = self.newer_at(&Layout::entry_rel(name)) {
            log::debug!(
                "xla_pcache: {} is of entry format {v}, a later release's: not deleted",
                path.display()
            );
            return Ok(false);
        }
        let trash = self
            .dir(&TRASH)
            .map_err(|e| io_err("delete", &self.layout.trash(), e))?;
        match shard.rename(&file, &trash, &aside) {
            Ok(()) => {
                self.append(&[JournalRecord::Delete { name, t }]);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("delete", &path, e)),
        }
    }

    /// Removes every entry but those of a later release's format (`all`: those too).
    /// Returns how many it removed; the later release's it left stay indexed (budgeted,
    /// evicted by LRU) and are named in one warning. What cannot be removed (another user's
    /// file in a directory it owns) is skipped with a warning; a stray directory among the
    /// entries is removed through directory handles, never following a link.
    pub fn clear(&self, all: bool) -> Result<u64, StoreError> {
        self.writable()?;
        let t = crate::clock::unix_ns();
        let mut n = 0;
        let mut failed = 0u64;
        let mut last_err = None;
        let mut kept = Vec::new();
        for (shard, file) in self.entry_files()? {
            let rel = entries_rel(shard.as_ref());
            let named = parse_name_hex(file.as_str()).filter(|_| shard.is_some());
            if let (false, Some(name)) = (all, named) {
                if self.newer_at(&rel.join(&file)).is_some() {
                    let disk = self
                        .dir(&rel)
                        .and_then(|d| d.stat(&file))
                        .map_or(0, |m| disk_bytes(&m));
                    kept.push((name, disk));
                    continue;
                }
            }
            let dir = self.dir(&rel);
            let res = dir.and_then(|d| d.remove_any(&file));
            match res {
                Ok(_) => n += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    failed += 1;
                    last_err = Some(format!(
                        "{}: {e}",
                        self.entry_display(shard.as_ref(), &file)
                    ));
                }
            }
        }
        if let Some(e) = last_err {
            self.counters.inc(Counter::Errors);
            log::warn!(
                "xla_pcache: clear could not remove {failed} file(s) of the cache (last: {e})"
            );
        }
        if !kept.is_empty() {
            log::warn!(
                "xla_pcache: clear left {} entries of a later release's format under {} (that \
                 release reads them; clear --all removes them too)",
                kept.len(),
                self.layout.root.display()
            );
        }
        // Shards removed with stray directories are laid out again.
        if let Ok(entries) = self.dir(&ENTRIES) {
            for shard in 0..=255u8 {
                let _ = entries.mkdir(&Name::shard(shard), 0o777);
            }
        }
        // What it left is recorded after the clear, as a publish (no use): still indexed.
        let after = crate::clock::unix_ns().max(t + 1);
        let mut records = vec![JournalRecord::Clear { t }];
        records.extend(kept.iter().map(|&(name, disk_bytes)| JournalRecord::Touch {
            name,
            disk_bytes,
            t: after,
            put: true,
        }));
        let mut st = self.state();
        self.append_locked(&mut st, &records);
        st.view.entries.clear_up_to(t);
        for &(name, disk) in &kept {
            st.view.entries.touch(name, disk, after);
        }
        Ok(n)
    }
}
