//! Bringing the view up to date: the other processes' journals re-read (through a fresh
//! listing on a network filesystem, at most every `FRESHEN_EVERY` from the put path), the
//! cache's stored settings re-read when due (`budget.rs`), and what the reads could not use
//! counted.

use super::{State, Store};
use crate::dir as cdir;
use crate::layout::{freshen_dir, JOURNAL};
use crate::stats::Counter;
use std::io;
use std::time::{Duration, Instant};

/// The put path makes the journal listing fresh (network filesystems) at most this often;
/// the processes of one host share their client's cache, so each benefits from the others.
const FRESHEN_EVERY: Duration = Duration::from_millis(50);

impl Store {
    /// Brings the view up to date for an explicit call (stats, evict, len...): through a
    /// fresh listing of the journals on a network filesystem.
    pub(super) fn refresh(&self, st: &mut State) -> io::Result<()> {
        self.reload_settings(st);
        self.refresh_view(st, true)
    }

    /// `refresh` for the put path: the journal listing is made fresh at most every
    /// `FRESHEN_EVERY` (two metadata round trips on a network filesystem).
    pub(super) fn refresh_for_put(&self, st: &mut State) -> io::Result<()> {
        let due = st.last_freshen.is_none_or(|t| t.elapsed() >= FRESHEN_EVERY);
        self.refresh_view(st, due)
    }

    /// Before a put publishes into a bounded cache on a network filesystem: a view whose
    /// journal listing is older than `FRESHEN_EVERY` is read again through a fresh one.
    /// Otherwise a view is re-read only once the measured put rate says it may be full,
    /// and that rate is itself measured at refreshes: when a fleet starts putting together
    /// (an idle fleet's first compiles), nobody's view would move for up to
    /// `refresh_interval` while each admits its puts into the same free space. Rare puts
    /// (a compile cache's) pay nothing more: the refresh after the put is then not due.
    /// True if it read the view just now.
    pub(super) fn refresh_before_publish(&self, st: &mut State) -> bool {
        if self.fs.local || st.last_freshen.is_some_and(|t| t.elapsed() < FRESHEN_EVERY) {
            return false;
        }
        let res = self.refresh_for_put(st);
        self.refresh_ok(res)
    }

    /// Re-reads the journals through a fresh listing; false (logged, counted) if they
    /// cannot be read.
    pub(super) fn refresh_or_warn(&self, st: &mut State) -> bool {
        let res = self.refresh(st);
        self.refresh_ok(res)
    }

    /// Every way of re-reading the journals ends here (`refresh`, `refresh_for_put`,
    /// `refresh_before_publish`, `refresh_or_warn`): `freshen` makes the journal listing
    /// fresh first on a network filesystem.
    fn refresh_view(&self, st: &mut State, freshen: bool) -> io::Result<()> {
        // Our own buffered hits belong in the view too.
        self.append_locked(st, &[]);
        // The cache's stored settings, re-read at the refresh interval (an explicit call
        // reads them first, in `refresh`).
        self.reload_settings_if_due(st);
        // A network client serves journal lengths from its attribute cache (20 s on sshfs):
        // without a fresh listing this process would not see the other hosts' puts for that
        // long, and each host would fill the budget on its own.
        let (fresh, from_server) = if self.fs.local {
            (true, false)
        } else if freshen && !self.opts.read_only {
            st.last_freshen = Some(Instant::now());
            let fresh = self.dir(&JOURNAL).is_ok_and(|d| freshen_dir(&d));
            (fresh, true)
        } else {
            (st.view.fresh && st.last_freshen.is_some(), false)
        };
        // The put rate counts the other processes' journals only (this one's may have been
        // reopened under a new name).
        let own = st.journal.name();
        if st.view.own_journal.as_ref() != own {
            st.view.own_journal = own.cloned();
        }
        let res = st.view.refresh(&self.root, fresh, from_server);
        self.note_unreadable(st);
        if let Err(e) = res {
            if cdir::is_unsafe(&e) {
                self.unsafe_path("journal or index", &e);
            }
            return Err(e);
        }
        st.pending_bytes = 0;
        st.last_refresh = Some(Instant::now());
        st.note_put_rate();
        Ok(())
    }

    /// Whether a refresh from the put path worked; a failure is counted and logged (the
    /// put goes on with the view it has).
    pub(super) fn refresh_ok(&self, res: io::Result<()>) -> bool {
        match res {
            Ok(()) => true,
            Err(e) => {
                self.counters.inc(Counter::Errors);
                self.warn("index", || format!("cannot read the cache index: {e}"));
                false
            }
        }
    }

    /// Takes the view's count of index files newly found unreadable into the counters.
    fn note_unreadable(&self, st: &mut State) {
        let n = std::mem::take(&mut st.view.newly_unreadable);
        if n > 0 {
            self.counters.add(Counter::Unreadable, n);
        }
        // Journal names that are not a journal's (in journal/ or a snapshot's list): paths
        // the store refused to follow.
        let bad = std::mem::take(&mut st.view.newly_bad_names);
        if bad > 0 {
            self.counters.add(Counter::UnsafePaths, bad);
            self.warn("journal-names", || {
                format!(
                    "skipped {bad} journal name(s) in {} or its index snapshot that are not \
                     a journal's (never opened or removed)",
                    self.layout.journal_dir().display()
                )
            });
        }
        let sizes = std::mem::take(&mut st.view.newly_bad_sizes);
        if sizes > 0 {
            self.counters.add(Counter::UnsafePaths, sizes);
            self.warn("journal-sizes", || {
                format!(
                    "skipped {sizes} record(s) in the journals of {} claiming an entry larger \
                     than the filesystem (not counted against the budget)",
                    self.layout.journal_dir().display()
                )
            });
        }
    }

    /// The index files this view skipped because it could not read them, for reports.
    pub(super) fn unreadable_files(&self, st: &State) -> Vec<String> {
        let mut v: Vec<String> = st
            .view
            .unreadable
            .iter()
            .map(|(name, owner)| {
                let dir = if name.ends_with(".log") {
                    "journal"
                } else {
                    "index"
                };
                format!(
                    "{} (unreadable, owner {owner})",
                    self.layout.root.join(dir).join(name).display()
                )
            })
            .collect();
        v.sort();
        v
    }
}
