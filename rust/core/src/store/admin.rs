//! Operations a caller asks for explicitly: contains, delete, clear, listing, len, stats, verify.

use super::*;

impl Store {
    pub fn contains(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        Ok(fs::symlink_metadata(self.layout.entry_path(entry_name(key.bytes))).is_ok())
    }

    /// Removes the entry (moved to trash first, so readers that opened it finish). True if
    /// there was one.
    pub fn delete(&self, key: Key<'_>) -> Result<bool, StoreError> {
        check_key(&key)?;
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        let name = entry_name(key.bytes);
        let path = self.layout.entry_path(name);
        let aside = self
            .layout
            .trash()
            .join(format!("{}.{}", name_hex(name), unique_suffix()));
        let t = crate::clock::unix_ns();
        match fs::rename(&path, &aside) {
            Ok(()) => {
                self.append(&[Record::Delete { name, t }]);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("delete", &path, e)),
        }
    }

    /// Removes every entry. Returns how many.
    pub fn clear(&self) -> Result<u64, StoreError> {
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        let t = crate::clock::unix_ns();
        let mut n = 0;
        for path in self.entry_files()? {
            match fs::remove_file(&path) {
                Ok(()) => n += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path, e)),
            }
        }
        self.append(&[Record::Clear { t }]);
        let mut st = self.state();
        st.view.lru.clear_up_to(t);
        Ok(n)
    }

    /// Every file under entries/ (walks the directory).
    pub(super) fn entry_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        let mut out = Vec::new();
        let entries = self.layout.entries();
        let rd = match fs::read_dir(&entries) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err("list", &entries, e)),
        };
        let mut shards: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        shards.sort();
        for shard in shards {
            if !is_real_dir(&shard) {
                out.push(shard);
                continue;
            }
            let rd = match fs::read_dir(&shard) {
                Ok(rd) => rd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("list", &shard, e)),
            };
            out.extend(rd.flatten().map(|e| e.path()));
        }
        Ok(out)
    }

    pub(super) fn read_header(path: &Path) -> Result<(entry::Header, fs::Metadata), ReadError> {
        let mut f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) => return Err(ReadError::Io(e)),
        };
        let m = f.metadata().map_err(ReadError::Io)?;
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

    /// Every entry with its header (walks the directory; headers only, payloads unread).
    pub fn entries(&self) -> Result<Vec<EntrySummary>, StoreError> {
        let files = self.entry_files()?;
        let view_uses: HashMap<u128, (u64, u32)> = {
            let mut st = self.state();
            let _ = self.refresh(&mut st);
            st.view
                .lru
                .iter()
                .map(|(n, i)| (n, (i.last_use, i.hits)))
                .collect()
        };
        let mut out = Vec::with_capacity(files.len());
        for path in files {
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(parse_name_hex)
            else {
                continue;
            };
            let Ok((h, m)) = Self::read_header(&path) else {
                continue;
            };
            out.push(EntrySummary {
                name: name_hex(name),
                key: h.key.clone(),
                key_is_text: h.key_is_text,
                size: h.payload_len,
                disk_bytes: disk_bytes(&m),
                created_ns: h.created_ns,
                last_use_ns: view_uses.get(&name).map(|u| u.0),
                hits: view_uses.get(&name).map_or(0, |u| u.1),
                meta: h.meta,
            });
        }
        Ok(out)
    }

    /// Number of entries, from the index. A cache whose directory vanished has none; an index
    /// that cannot be read now gives the last count seen (with a warning).
    pub fn len(&self) -> Result<u64, StoreError> {
        let mut st = self.state();
        if let Err(e) = self.refresh(&mut st) {
            if !is_real_dir(&self.layout.root) {
                self.warn("vanished", || {
                    format!("cache directory {} is gone", self.layout.root.display())
                });
                return Ok(0);
            }
            self.warn("index", || format!("cannot read the cache index: {e}"));
        }
        Ok(st.view.lru.len() as u64)
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
        }
        let mut counters = st.view.counters();
        if self.opts.read_only || !st.view.is_loaded() {
            add_into(&mut counters, &self.counters.snapshot());
        }
        Ok(Stats {
            counters,
            entries: st.view.lru.len() as u64,
            bytes: st.view.lru.total_bytes(),
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
        let files = self.entry_files()?;
        let total = files.len() as u64;
        let mut report = VerifyReport {
            repaired: repair,
            ..Default::default()
        };
        let mut seen: HashMap<u128, u64> = HashMap::new();
        let mut fix = Vec::new();
        for (i, path) in files.iter().enumerate() {
            progress(i as u64, total);
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(parse_name_hex)
                .filter(|n| path.parent() == Some(self.layout.shard_dir(*n).as_path()));
            let Some(name) = name else {
                report.foreign.push(path.display().to_string());
                if repair {
                    let _ = if is_real_dir(path) {
                        fs::remove_dir_all(path)
                    } else {
                        fs::remove_file(path)
                    };
                }
                continue;
            };
            match self.read_entry(path) {
                Ok(blob) if entry_name(&blob.header.key) == name => {
                    let disk = fs::symlink_metadata(path)
                        .map(|m| disk_bytes(&m))
                        .unwrap_or(0);
                    report.entries += 1;
                    report.bytes += disk;
                    seen.insert(name, disk);
                    let _ = blob;
                }
                Ok(_) | Err(ReadError::Corrupt(..)) => {
                    report.corrupt.push(path.display().to_string());
                    if repair {
                        let _ = fs::remove_file(path);
                        fix.push(Record::Delete {
                            name,
                            t: crate::clock::unix_ns(),
                        });
                    }
                }
                Err(ReadError::Missing) => {}
                Err(ReadError::Io(e)) => return Err(io_err("read", path, e)),
            }
        }
        progress(total, total);
        let mut st = self.state();
        self.refresh(&mut st)
            .map_err(|e| io_err("read index of", &self.layout.root, e))?;
        let now = crate::clock::unix_ns();
        for (&name, &disk) in &seen {
            match st.view.lru.get(name) {
                Some(info) if info.disk_bytes == disk => {}
                _ => {
                    report.unindexed += u64::from(st.view.lru.get(name).is_none());
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
            .lru
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
                st.view.lru.remove(name);
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
                    st.view.lru.touch(*name, *disk_bytes, *t);
                }
            }
            self.append_locked(&mut st, &fix);
            self.sweep(false);
        }
        Ok(report)
    }
}
