//! Operations a caller asks for explicitly: contains, delete, clear, listing, len, stats, verify.

use super::*;

impl Store {
    pub fn contains(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        Ok(self.names_of(key).any(|n| self.entry_exists(n)))
    }

    /// The files an entry of `key` may be under (`gate::candidates`): the plain name, and
    /// with trusted keys (or a signer) each trusted signer's own name.
    fn names_of<'a>(&'a self, key: Key<'a>) -> impl Iterator<Item = u128> + 'a {
        let trust = self.opts.trust.as_deref().or(self.write_trust.as_ref());
        gate::candidates(key.bytes, trust).map(|(n, _)| n)
    }

    /// Whether a file stands under `name`'s entry name (in a real shard directory).
    pub(super) fn entry_exists(&self, name: u128) -> bool {
        self.dir(&Layout::shard_rel(name))
            .and_then(|d| d.stat(&Name::entry(name)))
            .is_ok()
    }

    /// Removes the entry (moved to trash first, so readers that opened it finish). True if
    /// there was one.
    pub fn delete(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
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
                self.append(&[Record::Delete { name, t }]);
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
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
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
        self.append(&[Record::Clear { t }]);
        let mut st = self.state();
        st.view.entries.clear_up_to(t);
        Ok(n)
    }

    fn entry_display(&self, shard: Option<&Name>, file: &Name) -> String {
        self.layout
            .entries()
            .join(shard.map_or("", Name::as_str))
            .join(file.as_str())
            .display()
            .to_string()
    }

    /// Every name under entries/ (walks the directory): (Some(shard), file) for the names
    /// in real shard directories, (None, name) for anything else directly under entries/
    /// (a stray file, or a shard that is not a real directory).
    pub(super) fn entry_files(&self) -> Result<Vec<(Option<Name>, Name)>, StoreError> {
        let mut out = Vec::new();
        let Some((entries, shards)) = self.list_entries_dir()? else {
            return Ok(out);
        };
        for shard in shards {
            if !entries.stat(&shard).is_ok_and(|m| m.is_dir()) {
                out.push((None, shard));
                continue;
            }
            let Ok(d) = entries.sub(&shard) else {
                out.push((None, shard));
                continue;
            };
            let names = match d.list() {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(io_err(
                        "list",
                        &self.layout.entries().join(shard.as_str()),
                        e,
                    ))
                }
            };
            out.extend(names.into_iter().map(|n| (Some(shard.clone()), n)));
        }
        Ok(out)
    }

    pub(super) fn read_header(&self, rel: &Rel) -> Result<(entry::Header, Stat), ReadError> {
        let mut f = match self.root.open_file(rel, libc::O_RDONLY, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) if cdir::is_unsafe(&e) => return Err(ReadError::Unsafe(e.to_string())),
            Err(e) => return Err(ReadError::Io(e)),
        };
        let m = cdir::fstat(&f).map_err(ReadError::Io)?;
        if !m.is_file() {
            return Err(ReadError::Corrupt(EntryError::BadMagic, m.ino()));
        }
        let mut fixed = [0u8; entry::FIXED_HEADER];
        f.read_exact(&mut fixed)
            .map_err(|_| ReadError::Corrupt(EntryError::TooShort(m.len()), m.ino()))?;
        let hl = entry::header_len(&fixed).map_err(|e| ReadError::Corrupt(e, m.ino()))?;
        let mut h = fixed.to_vec();
        h.resize(hl, 0);
        f.read_exact(&mut h[entry::FIXED_HEADER..])
            .map_err(|_| ReadError::Corrupt(EntryError::TooShort(m.len()), m.ino()))?;
        let header = entry::decode_header(&h).map_err(|e| ReadError::Corrupt(e, m.ino()))?;
        if header.file_len() != m.len() {
            return Err(ReadError::Corrupt(
                EntryError::BadLength {
                    expected: header.file_len(),
                    actual: m.len(),
                },
                m.ino(),
            ));
        }
        Ok((header, m))
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
        if remove && self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
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

    /// Every entry with its header (walks the directory; headers only, payloads unread).
    pub fn entries(&self) -> Result<Vec<EntrySummary>, StoreError> {
        let mut out = Vec::new();
        for shard in self.entry_shards()? {
            out.extend(self.shard_entries(&shard)?);
        }
        Ok(out)
    }

    /// The names under entries/, sorted: `shard_entries` of each, in turn, lists every
    /// entry, a shard at a time (so a caller can show the first ones at once, at any size).
    pub fn entry_shards(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .list_entries_dir()?
            .map(|(_, names)| names.into_iter().map(|n| n.to_string()).collect())
            .unwrap_or_default())
    }

    /// entries/ and the names in it, sorted; None when there is no entries/ yet.
    fn list_entries_dir(&self) -> Result<Option<(Dir, Vec<Name>)>, StoreError> {
        let entries = match self.dir(&ENTRIES) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("list", &self.layout.entries(), e)),
        };
        let mut names = entries
            .list()
            .map_err(|e| io_err("list", &self.layout.entries(), e))?;
        names.sort();
        Ok(Some((entries, names)))
    }

    /// The entries of one shard with their headers, last use and hits from the index
    /// (looked up together: the snapshot blocks of one shard's names, each read once).
    /// Nothing for a name that is no shard directory.
    pub fn shard_entries(&self, shard: &str) -> Result<Vec<EntrySummary>, StoreError> {
        let Some(shard_name) = Name::new(Kind::Shard, shard) else {
            return Ok(Vec::new());
        };
        let rel = ENTRIES.join(&shard_name);
        let d = match self.dir(&rel) {
            Ok(d) => d,
            Err(_) => return Ok(Vec::new()),
        };
        let names = match d.list() {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list", &self.layout.entries().join(shard), e)),
        };
        let mut files: Vec<(u128, Name)> = names
            .into_iter()
            .filter_map(|f| parse_name_hex(f.as_str()).map(|n| (n, f)))
            .collect();
        files.sort_unstable();
        let uses = {
            let mut st = self.state();
            let _ = self.refresh(&mut st);
            let names: Vec<u128> = files.iter().map(|f| f.0).collect();
            st.view.entries.get_sorted(&names)
        };
        let mut out = Vec::with_capacity(files.len());
        for ((name, file), info) in files.into_iter().zip(uses) {
            let Ok((h, m)) = self.read_header(&rel.join(&file)) else {
                continue;
            };
            out.push(EntrySummary {
                name: name_hex(name),
                key: h.key.clone(),
                key_is_text: h.key_is_text,
                size: h.payload_len,
                disk_bytes: disk_bytes(&m),
                created_ns: h.created_ns,
                last_use_ns: info.map(|i| i.last_use),
                hits: info.map_or(0, |i| i.hits),
                signer: h.signature.map(|f| f.signer),
                meta: h.meta,
            });
        }
        Ok(out)
    }

    /// The keys of entries just evicted or deleted (file names as `EvictReport::names`
    /// gives them), read from their headers in trash/ while they are there (a few minutes):
    /// a report can name what it removed without listing the cache first.
    pub fn trashed_keys(&self, names: &[String]) -> Vec<(String, Vec<u8>, bool)> {
        let wanted: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        let Ok(trash) = self.dir(&TRASH) else {
            return Vec::new();
        };
        let Ok(files) = trash.list() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for f in files {
            let Some((name, _)) = f.as_str().split_once('.') else {
                continue;
            };
            if !wanted.contains(name) {
                continue;
            }
            if let Ok((h, _)) = self.read_header(&TRASH.join(&f)) {
                out.push((name.to_string(), h.key, h.key_is_text));
            }
        }
        out
    }

    /// Number of entries, from the index. A cache whose directory vanished has none; an index
    /// that cannot be read now gives the last count seen (with a warning).
    pub fn len(&self) -> Result<u64, StoreError> {
        let mut st = self.state();
        if let Err(e) = self.refresh(&mut st) {
            if !fs::symlink_metadata(&self.layout.root).is_ok_and(|m| m.is_dir()) {
                self.warn("vanished", || {
                    format!("cache directory {} is gone", self.layout.root.display())
                });
                return Ok(0);
            }
            self.warn("index", || format!("cannot read the cache index: {e}"));
        }
        Ok(st.view.entries.len() as u64)
    }

    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }

    /// Counters of every process that used the cache, plus entries and bytes from the index.
    pub fn stats(&self) -> Result<Stats, StoreError> {
        self.maybe_flush_stats(true);
        let mut st = self.state();
        if let Err(e) = self.refresh(&mut st) {
            // Stats of a vanished cache are this process's own counters.
            self.warn("index", || format!("cannot read the cache index: {e}"));
        } else if !self.opts.read_only && self.counters.is_dirty() {
            // The refresh itself counted something (an unreadable journal, a path that is
            // not a real directory): in the figures now, not at the next call.
            self.flush_stats_locked(&mut st, true);
            let _ = self.refresh(&mut st);
        }
        let mut counters = st.view.counters();
        let mut tiers = st.view.tier_counters();
        if self.opts.read_only || !st.view.is_loaded() {
            add_into(&mut counters, &self.counters.snapshot());
            crate::stats::add_tiers_into(&mut tiers, &self.counters.tiers());
        }
        Ok(Stats {
            counters,
            tiers,
            entries: st.view.entries.len() as u64,
            bytes: st.view.entries.total_bytes(),
            journals: st.view.journals.len() as u64,
            view_age: st.view.age(),
            view_fresh: st.view.fresh,
        })
    }

    /// Walks every file: verifies entries, reconciles the index, reports leftovers. With
    /// `repair`, removes corrupt and foreign files and fixes the index.
    pub fn verify(
        &self,
        repair: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport, StoreError> {
        if repair && self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
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
            match self.read_entry(&rel, None) {
                Ok(blob) if gate::filed_under(&blob.header, name) => {
                    let disk = self
                        .dir(&dir_rel)
                        .and_then(|d| d.stat(file))
                        .map(|m| disk_bytes(&m))
                        .unwrap_or(0);
                    report.entries += 1;
                    report.bytes += disk;
                    seen.insert(name, disk);
                    let _ = blob;
                }
                Ok(_) | Err(ReadError::Corrupt(..)) => {
                    report.corrupt.push(display);
                    if repair {
                        let _ = self.dir(&dir_rel).and_then(|d| d.unlink(file));
                        fix.push(Record::Delete {
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
                    fix.push(Record::Touch {
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
                fix.push(Record::Delete { name, t: now });
            }
            for r in &fix {
                if let Record::Touch {
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
}

/// What stands at an entry's name when it is no regular file.
pub(super) fn squatter_kind(m: &Stat) -> &'static str {
    match m.file_type() {
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFSOCK => "a socket",
        _ => "a device",
    }
}

/// `entries/<shard>`, or `entries` itself for a name directly under it.
fn entries_rel(shard: Option<&Name>) -> Rel {
    match shard {
        Some(s) => ENTRIES.join(s),
        None => ENTRIES,
    }
}
