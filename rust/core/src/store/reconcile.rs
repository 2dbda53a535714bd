//! Reconciling the view with the entry files, for an explicit `evict()` (never on
//! the put path): the only place besides `verify` that lists every shard.
//!
//! Under stale views (another host's journal read late) the view holds records of files
//! that are gone and misses files that exist, so eviction decided from it alone can stop
//! with the directory over budget. Listing costs one read of each shard (made fresh first
//! on a network filesystem) and a stat per file: it grows with the directory's entry count.
//! Its memory does not: one batch of shards' listing at a time, walked against the view in
//! name order, and what differs.

use super::evict::{EvictReport, Heartbeat};
use super::{disk_bytes, State, Store};
use crate::dir::{self as cdir, Kind, Name};
use crate::hash::parse_name_hex;
use crate::journal::Record;
use crate::layout::{freshen_dir, ENTRIES};
use crate::lock::LockGuard;
use std::io;

/// Threads listing shards at once on a network filesystem, and shards listed between two
/// heartbeats of the evictor's lease.
const LIST_THREADS: usize = 8;
const LIST_BATCH: usize = 16;

impl Store {
    /// The entry files of one shard: (name, disk bytes, mtime). A missing shard is empty.
    fn list_shard(&self, shard: u8, out: &mut Vec<(u128, (u64, u64))>) -> io::Result<()> {
        let rel = ENTRIES.join(&Name::shard(shard));
        let dir = match self.dir(&rel) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Not a real directory (counted, warned): nothing in it belongs to the cache.
            Err(e) if cdir::is_unsafe(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        if !self.fs.local {
            freshen_dir(&dir);
        }
        // Foreign files (and freshen markers) are verify's business.
        let (files, _) = dir.list_of(Kind::Entry)?;
        for file in files {
            let Some(name) = parse_name_hex(file.as_str()) else {
                continue;
            };
            if (name >> 120) as u8 != shard {
                continue;
            }
            match dir.stat(&file) {
                Ok(m) if m.is_file() => out.push((name, (disk_bytes(&m), m.mtime_ns()))),
                _ => {}
            }
        }
        Ok(())
    }

    /// Lists every shard and brings the view in line with it: records of files that are
    /// gone are dropped (`report.dropped`), files the view does not know are indexed with
    /// their size on disk and their mtime as last use (`report.added`), and sizes are
    /// corrected. What it changes is written to the journal, so other processes learn it.
    pub(super) fn reconcile(
        &self,
        st: &mut State,
        guard: &mut LockGuard,
        beat: &mut Heartbeat,
        report: &mut EvictReport,
    ) -> io::Result<()> {
        // Stamped before the listing: a file published after it has a later put record,
        // which wins over the deletes written here.
        let t0 = crate::clock::unix_ns();
        // On a network filesystem each shard costs round trips (a fresh listing, then the
        // attributes): shards are listed by several threads at once.
        let workers = if self.fs.local { 1 } else { LIST_THREADS };
        // The view in name order (one snapshot block at a time), walked alongside the
        // listings of the shards, which come in name order too: what this holds is one
        // batch of shards' files (40 bytes each) and what differs, never every file. The
        // view is changed only once every shard was listed, so a lease lost or a stop asked
        // for on the way changes nothing.
        let mut view = st.view.entries.iter_by_name().peekable();
        let mut gone: Vec<u128> = Vec::new();
        let mut changed: Vec<(u128, u64, u64)> = Vec::new();
        let shards: Vec<u8> = (0..=255u8).collect();
        for batch in shards.chunks(LIST_BATCH) {
            let lists = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..workers)
                    .map(|w| {
                        scope.spawn(move || {
                            let mut files = Vec::new();
                            for &shard in batch.iter().skip(w).step_by(workers) {
                                self.list_shard(shard, &mut files)?;
                            }
                            Ok::<_, io::Error>(files)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(io::Error::other("shard listing panicked")))
                    })
                    .collect::<Vec<_>>()
            });
            let mut found: Vec<(u128, (u64, u64))> = Vec::new();
            for files in lists {
                found.extend(files?);
            }
            found.sort_unstable_by_key(|f| f.0);
            // Every name of this batch's shards is at most `last`.
            let last_shard = batch.last().copied().unwrap_or(u8::MAX);
            let in_batch = |n: u128| (n >> 120) as u8 <= last_shard;
            let mut files = found.into_iter().peekable();
            loop {
                let next_view = view.peek().map(|v| v.0).filter(|&n| in_batch(n));
                let next_file = files.peek().map(|f| f.0);
                match (next_view, next_file) {
                    (None, None) => break,
                    (Some(v), None) => {
                        // Indexed, and no file: gone.
                        gone.push(v);
                        view.next();
                    }
                    (Some(v), Some(f)) if v < f => {
                        gone.push(v);
                        view.next();
                    }
                    (v, Some(f)) => {
                        let Some((name, (disk, mtime))) = files.next() else {
                            break;
                        };
                        let indexed = if v == Some(f) {
                            view.next().map(|(_, info)| info)
                        } else {
                            None
                        };
                        let t = match indexed {
                            Some(info) if info.disk_bytes == disk => continue,
                            Some(info) => info.last_use,
                            None => {
                                report.added += 1;
                                mtime.min(t0)
                            }
                        };
                        changed.push((name, disk, t));
                    }
                }
            }
            if !beat.beat(guard, self) || self.interrupt_pending() {
                // The lease is someone else's now, or the caller asked to stop: change
                // nothing.
                return Ok(());
            }
        }
        drop(view);
        let mut records = Vec::new();
        for name in gone {
            st.view.forget(name, t0);
            records.push(Record::Delete { name, t: t0 });
            report.dropped += 1;
        }
        for (name, disk, t) in changed {
            st.view.found(name, disk, t);
            // A publish record: being found is not a use, so it counts no hit.
            records.push(Record::Touch {
                name,
                disk_bytes: disk,
                t,
                put: true,
            });
        }
        if !records.is_empty() {
            self.append_locked(st, &records);
        }
        Ok(())
    }
}
