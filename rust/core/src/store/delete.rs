//! Removing entries on request: `delete` (a key's entries, moved to trash/ first so that
//! readers that opened them finish) and `clear` (every entry).

use super::listing::entries_rel;
use super::{check_key, Key, Store};
use crate::clock::unique_suffix;
use crate::dir::{self as cdir, Kind, Name};
use crate::error::{io_err, StoreError};
use crate::journal::JournalRecord;
use crate::layout::{Layout, ENTRIES, TRASH};
use crate::stats::Counter;
use std::io;

impl Store {
    /// Removes the entry (moved to trash first, so readers that opened it finish). True if
    /// there was one.
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

    /// Removes every entry. Returns how many. What cannot be removed (another user's file
    /// in a directory it owns) is skipped with a warning; a stray directory among the
    /// entries is removed through directory handles, never following a link.
    pub fn clear(&self) -> Result<u64, StoreError> {
        self.writable()?;
        let t = crate::clock::unix_ns();
        let mut n = 0;
        let mut failed = 0u64;
        let mut last_err = None;
        for (shard, file) in self.entry_files()? {
            let dir = self.dir(&entries_rel(shard.as_ref()));
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
        // Shards removed with stray directories are laid out again.
        if let Ok(entries) = self.dir(&ENTRIES) {
            for shard in 0..=255u8 {
                let _ = entries.mkdir(&Name::shard(shard), 0o777);
            }
        }
        self.append(&[JournalRecord::Clear { t }]);
        let mut st = self.state();
        st.view.entries.clear_up_to(t);
        Ok(n)
    }
}
