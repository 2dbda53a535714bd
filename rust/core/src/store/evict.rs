//! Eviction: refreshing the index view, evicting under the lock, compaction, sweeping.

use super::*;

impl Store {
    pub(super) fn refresh(&self, st: &mut State) -> io::Result<()> {
        // Our own buffered hits belong in the view too.
        self.append_locked(st, &[]);
        st.view.refresh(&self.layout)?;
        st.pending_bytes = 0;
        st.last_refresh = Some(Instant::now());
        Ok(())
    }

    /// After a put: re-read the journals when due; evict when over budget and compact when
    /// the journals grew. Skips (never waits) when another process holds the evictor lock.
    pub(super) fn maybe_evict(&self, st: &mut State) {
        let max = self.opts.max_size;
        let due = st
            .last_refresh
            .is_none_or(|t| t.elapsed() >= self.opts.refresh_interval)
            || max.is_some_and(|m| st.view.lru.total_bytes() + st.pending_bytes > m)
            || st.evict_backlog.is_some();
        if !due {
            return;
        }
        if let Err(e) = self.refresh(st) {
            self.counters.inc(Counter::Errors);
            self.warn("index", || format!("cannot read the cache index: {e}"));
            return;
        }
        let total = st.view.lru.total_bytes();
        let over = max.filter(|&m| total > m);
        // An eviction cut short by its time slice goes on with the next put.
        let backlog = st.evict_backlog.filter(|&t| total > t);
        if over.is_none() && backlog.is_none() && !st.view.wants_compaction() {
            return;
        }
        let guard = match self.locks.try_lock_for(EVICT_LOCK, Duration::ZERO) {
            Ok(Some(g)) => g,
            Ok(None) => return,
            Err(e) => {
                self.warn("lock", || format!("cannot take the evictor lock: {e}"));
                return;
            }
        };
        let target = over
            .map(|m| (m as f64 * self.opts.low_watermark) as u64)
            .or(backlog);
        let deadline = Instant::now() + self.opts.evict_slice;
        if let Err(e) = self.evict_locked(st, guard, target, None, Some(deadline)) {
            self.counters.inc(Counter::Errors);
            self.warn("evict", || format!("eviction failed: {e}"));
        }
    }

    /// Evicts with the lock held: refreshes, removes oldest entries until the total is at
    /// most `target` and every entry unused for `older_than`, then compacts and sweeps. Past
    /// `deadline` it stops and leaves the rest to the next put (`State::evict_backlog`).
    pub(super) fn evict_locked(
        &self,
        st: &mut State,
        mut guard: LockGuard,
        target: Option<u64>,
        older_than: Option<Duration>,
        deadline: Option<Instant>,
    ) -> io::Result<EvictReport> {
        let started = crate::clock::unix_ns();
        let res = self.evict_with(st, &mut guard, target, older_than, deadline);
        if let Some(trace) = &self.opts.evict_trace {
            let line = format!(
                "{} {started} {}\n",
                std::process::id(),
                crate::clock::unix_ns()
            );
            let _ = OpenOptions::new()
                .append(true)
                .create(true)
                .open(trace)
                .and_then(|mut f| f.write_all(line.as_bytes()));
        }
        drop(guard);
        res
    }

    pub(super) fn evict_with(
        &self,
        st: &mut State,
        guard: &mut LockGuard,
        target: Option<u64>,
        older_than: Option<Duration>,
        deadline: Option<Instant>,
    ) -> io::Result<EvictReport> {
        self.refresh(st)?;
        st.evict_backlog = None;
        let mut report = EvictReport::default();
        let now = crate::clock::unix_ns();
        let cutoff = older_than.map(|d| now.saturating_sub(d.as_nanos() as u64));
        let total = st.view.lru.total_bytes();
        let mut victims = Vec::new();
        let mut remaining = total;
        for (name, info) in st.view.lru.oldest() {
            let over = target.is_some_and(|t| remaining > t);
            let old = cutoff.is_some_and(|c| info.last_use < c);
            if !over && !old {
                break;
            }
            remaining = remaining.saturating_sub(info.disk_bytes);
            victims.push((name, info));
        }
        let mut records = Vec::with_capacity(victims.len());
        let mut last_beat = Instant::now();
        for (i, (name, info)) in victims.into_iter().enumerate() {
            // At least one entry per slice, so a backlog always shrinks.
            if i > 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                st.evict_backlog = target;
                break;
            }
            let path = self.layout.entry_path(name);
            let aside = self
                .layout
                .trash()
                .join(format!("{}.{}", name_hex(name), unique_suffix()));
            match fs::rename(&path, &aside) {
                Ok(()) => {
                    report.removed += 1;
                    report.bytes += info.disk_bytes;
                    report.names.push(name_hex(name));
                }
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound || errno(&e) == Some(libc::ESTALE) => {}
                Err(e) => {
                    self.counters.inc(Counter::Errors);
                    self.warn("evict", || format!("cannot evict {}: {e}", path.display()));
                    continue;
                }
            }
            st.view.lru.remove(name);
            records.push(Record::Delete { name, t: now });
            if last_beat.elapsed() > self.opts.lease_time / 4 {
                if let Err(e) = guard.heartbeat() {
                    // Someone took the lease over: stop and leave the rest to them.
                    self.warn("lease", || format!("eviction stopped early: {e}"));
                    break;
                }
                last_beat = Instant::now();
            }
        }
        self.counters.add(Counter::Evictions, report.removed);
        self.counters.add(Counter::EvictedBytes, report.bytes);
        if !records.is_empty() {
            self.append_locked(st, &records);
        }
        self.flush_stats_locked(st, true);
        // Sweeping lists tmp/ and trash/ and stats every file there: once per eviction, not
        // once per time slice, and from puts at most every tenth of the shortest grace (the
        // trash holds every entry evicted within its grace, so a small cache that evicts every
        // few puts would otherwise stat thousands of files per eviction). `evict()` always
        // sweeps.
        if st.evict_backlog.is_none() && (deadline.is_none() || self.sweep_due(st)) {
            self.sweep(false);
            st.last_sweep = Some(Instant::now());
        }
        if st.view.wants_compaction() {
            self.compact_locked(st);
        }
        Ok(report)
    }

    fn sweep_due(&self, st: &State) -> bool {
        let every = self.opts.trash_grace.min(self.opts.tmp_grace) / 10;
        st.last_sweep.is_none_or(|t| t.elapsed() >= every)
    }

    pub(super) fn compact_locked(&self, st: &mut State) {
        // Read our own latest records too, so the snapshot is as fresh as it can be.
        if self.refresh(st).is_err() {
            return;
        }
        let now = crate::clock::unix_ns();
        let own = st
            .journal
            .path()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .map(str::to_string);
        let mut remove = Vec::new();
        for (name, js) in &st.view.journals {
            if Some(name) == own.as_ref() {
                continue;
            }
            let Ok(m) = fs::metadata(self.layout.journal_dir().join(name)) else {
                continue;
            };
            if m.len() != js.offset {
                continue;
            }
            let gone = match journal::owner_gone(name, &self.host) {
                Some(g) => g,
                None => age(&m, now) > REMOTE_JOURNAL_AGE,
            };
            if gone {
                remove.push(name.clone());
            }
        }
        if let Err(e) = st.view.compact(&self.layout, &remove) {
            self.warn("compact", || {
                format!("cannot write the cache index snapshot: {e}")
            });
        }
    }

    /// Removes temp files, trash and lease leftovers older than their grace periods; returns
    /// how many (temp + lease leftovers, trash). With `dry_run` it only counts (for verify).
    pub(super) fn sweep(&self, dry_run: bool) -> (u64, u64) {
        let now = crate::clock::unix_ns();
        let mut counts = (0, 0);
        // (directory, grace, counted as trash, dot files only: in locks/ only the leftovers
        // of killed lease writers are swept)
        for (dir, grace, trash, dot_only) in [
            (self.layout.tmp(), self.opts.tmp_grace, false, false),
            (self.layout.trash(), self.opts.trash_grace, true, false),
            (self.layout.locks(), self.opts.tmp_grace, false, true),
            // Compile claims of holders that died, retired ones nobody took, and their temp
            // files (a live claim is rewritten every quarter lease, so it is never this old).
            (
                self.layout.locks().join(CLAIM_DIR),
                self.opts.tmp_grace,
                false,
                false,
            ),
        ] {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                if dot_only && !e.file_name().to_string_lossy().starts_with('.') {
                    continue;
                }
                let Ok(m) = e.metadata() else { continue };
                if age(&m, now) <= grace {
                    continue;
                }
                if trash {
                    counts.1 += 1;
                } else {
                    counts.0 += 1;
                }
                if !dry_run {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        counts
    }

    /// Evicts now: down to `max_size` bytes (default: the budget's low watermark, or nothing
    /// if unbounded) and every entry unused for `older_than`.
    pub fn evict(
        &self,
        max_size: Option<u64>,
        older_than: Option<Duration>,
    ) -> Result<EvictReport, StoreError> {
        if self.opts.read_only {
            return Err(StoreError::ReadOnly(self.layout.root.clone()));
        }
        let target = max_size.or(self
            .opts
            .max_size
            .map(|m| (m as f64 * self.opts.low_watermark) as u64));
        let guard = self
            .locks
            .try_lock_for(EVICT_LOCK, self.opts.lock_timeout)?;
        let Some(guard) = guard else {
            return Ok(EvictReport {
                skipped: Some("another process holds the evictor lock".into()),
                ..Default::default()
            });
        };
        let mut st = self.state();
        self.evict_locked(&mut st, guard, target, older_than, None)
            .map_err(|e| io_err("evict in", &self.layout.root, e))
    }
}
