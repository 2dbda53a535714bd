//! The budget a process obeys: the cache's stored budget (CONFIG, `stored_budget.rs`) with
//! this process's own options, the stricter of the two, re-read at the refresh interval so
//! a change made by `xla-pcache config` reaches running processes.

use super::{State, Store};
use crate::error::StoreError;
use crate::stats::Counter;
use crate::stored_budget::{self, StoredBudget};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The stored budget as last read; 0 is "not set". Atomics, so the put path reads the
/// budget without the state lock.
#[derive(Debug, Default)]
pub(super) struct LastReadBudget {
    max_size: AtomicU64,
    max_age_s: AtomicU64,
}

impl LastReadBudget {
    fn set(&self, s: &StoredBudget) {
        self.max_size
            .store(s.max_size.unwrap_or(0), Ordering::Relaxed);
        self.max_age_s
            .store(s.max_age.map_or(0, |a| a.as_secs()), Ordering::Relaxed);
    }
    fn get(&self) -> StoredBudget {
        let size = self.max_size.load(Ordering::Relaxed);
        let age = self.max_age_s.load(Ordering::Relaxed);
        StoredBudget {
            max_size: (size > 0).then_some(size),
            max_age: (age > 0).then(|| Duration::from_secs(age)),
        }
    }
}

/// The stricter of two optional bounds (None is no bound).
fn stricter<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Store {
    /// The byte budget this process keeps: the cache's stored one, lowered by this process's
    /// `max_size` if that is smaller (a process can lower it, never raise it).
    pub fn max_size(&self) -> Option<u64> {
        stricter(self.opts.max_size, self.stored.get().max_size)
    }

    /// Entries unused for longer than this are evicted by the puts' evictor (stored only).
    pub fn max_age(&self) -> Option<Duration> {
        self.stored.get().max_age
    }

    /// The cache's stored budget as this process last read it (read again at the
    /// refresh interval, and by every explicit call that reads the index).
    pub fn stored_budget(&self) -> StoredBudget {
        self.stored.get()
    }

    /// Replaces the cache's stored budget (all of it: a field left None is unset).
    /// `Invalid` for a budget out of its bounds (`StoredBudget::check`: a budget of no
    /// bytes, a max age under a second), which would be stored as a file nobody uses.
    pub fn write_stored_budget(&self, s: &StoredBudget) -> Result<(), StoreError> {
        self.writable()?;
        // Held to the bounds CONFIG is read under (`StoredBudget::check`), in `write`.
        stored_budget::write(&self.root, s, self.opts.durable)?;
        self.reload_stored_budget(&mut self.state());
        Ok(())
    }

    /// Reads CONFIG if the refresh interval has passed since it was last read.
    pub(super) fn reload_stored_budget_if_due(&self, st: &mut State) {
        if st
            .stored_budget_read
            .is_none_or(|t| t.elapsed() >= self.opts.refresh_interval)
        {
            self.reload_stored_budget(st);
        }
    }

    /// Reads CONFIG now. A file that cannot be used is as none: counted and warned about
    /// once per reason, and today's behaviour (the process's own options) goes on.
    pub(super) fn reload_stored_budget(&self, st: &mut State) {
        st.stored_budget_read = Some(Instant::now());
        match stored_budget::read(&self.root) {
            Ok(s) => {
                self.stored.set(&s.unwrap_or_default());
                st.stored_budget_problem = None;
            }
            Err(why) => {
                self.stored.set(&StoredBudget::default());
                if st.stored_budget_problem.as_deref() != Some(why.as_str()) {
                    self.counters.inc(Counter::UnsafePaths);
                    log::warn!(
                        "xla_pcache: ignoring {}: {why} (the cache's stored settings are not \
                         used; rewrite them with `xla-pcache config`)",
                        self.layout.root.join(stored_budget::CONFIG_FILE).display()
                    );
                    st.stored_budget_problem = Some(why);
                }
            }
        }
    }
}
