//! Single flight: a per-key "compiling" claim, so that a fleet that misses the same key
//! compiles it once while the others wait for the entry to be published.
//!
//! A claim is a lease of `crate::lock` (the evictor's lease rules) named after the entry,
//! in `<root>/locks/claims/<32 hex>.lease`, taken with `link()` so that exactly one
//! process wins it. While it is held, a thread of the holder's store heartbeats it (every
//! quarter of `claim_lease`). A waiter judges it stale when it has seen its content
//! unchanged for longer than `claim_lease` on its own monotonic clock (no clock of another
//! host is ever compared), and then takes it over. The holder's `put` of the key releases
//! it (the file is removed once the entry is published); a holder that gives up without
//! publishing (the compile failed, or the framework chose not to cache the program)
//! *retires* it: the file stays for a few seconds with a last content saying so, which
//! tells the waiters to compile themselves at once instead of waiting or claiming one
//! after another. A retired claim is taken over by the next claimer without waiting.
//!
//! Waiting polls, with backoff, one file per poll: the claim (one open + read + close
//! while it is held); the entry is looked at (one `stat`) only once the claim is gone,
//! stale or retired. Polls start 25 ms apart and double up to half a second, so a waiter
//! makes about 6 polls in its first second and 2 per second after that: 4 filesystem
//! calls a second (6 on a network filesystem that counts the close). Half a second, not
//! more: a waiter notices a publish a quarter of a second late on average, small against
//! the hit it then loads, while a fleet of 500 waiters costs an NFS server ~2,000 calls/s. inotify would not see other hosts'
//! changes on NFS or sshfs, the case this exists for, so there is no watch.
//!
//! A claim is a hint, like the evictor lease: correctness never depends on it (first
//! writer wins on publish). Any filesystem failure while claiming or waiting is logged
//! once, counted, and answered with [`ClaimState::Unclaimed`]: compile as if there were
//! no single flight.

use super::{check_key, Key, Store};
use crate::dir::{Rel, Root};
use crate::error::StoreError;
use crate::forksafe::ForkMutex;
use crate::hash::{entry_name, name_hex};
use crate::layout::Layout;
use crate::lock::{LeaseView, LockDir, LockError, LockGuard, LockMode, LockOptions};
use crate::stats::Counter;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// First pause between two polls of a waiter.
const POLL_FIRST: Duration = Duration::from_millis(25);
/// Longest pause between two polls (the backoff doubles up to it).
pub const POLL_MAX: Duration = Duration::from_millis(500);
/// How long a retired claim stays before its holder removes it: a few of a waiter's
/// longest pauses, so that every waiter sees it and knows that nobody will publish.
const RETIRED_LINGER: Duration = Duration::from_secs(3);
/// Cap on a wait, so that a huge timeout cannot overflow an `Instant`.
const MAX_WAIT: Duration = Duration::from_secs(86_400);
/// The claims' directory under `<root>/locks`.
#[cfg(test)]
pub const CLAIM_DIR: &str = "claims";
/// The claims' directory beneath the root.
pub const CLAIMS: Rel = Rel::fixed("locks/claims");

/// How a [`Store::claim`] or [`Store::wait_for`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    /// This process holds the claim: compile, then `put` (which releases it) or release it.
    Claimed,
    /// The entry is in the store (it was there already, or a holder published it).
    Published,
    /// The holder gave up without publishing (its compile failed or was not cached):
    /// compile without waiting any longer.
    Abandoned,
    /// The wait ran out while another process held the claim: compile.
    TimedOut,
    /// Nobody holds a claim (or its holder stopped heartbeating) and this call does not
    /// claim (read-only store, `wait_for`), or claiming failed: compile.
    Unclaimed,
}

impl ClaimState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Claimed => "claimed",
            ClaimState::Published => "published",
            ClaimState::Abandoned => "abandoned",
            ClaimState::TimedOut => "timed_out",
            ClaimState::Unclaimed => "unclaimed",
        }
    }
}

/// What [`Store::claim`] returns: the outcome, the claim when it is ours, and how long it
/// waited for another holder.
#[derive(Debug)]
pub struct ClaimOutcome {
    pub state: ClaimState,
    pub claim: Option<Claim>,
    pub waited: Duration,
    /// The claim was taken over from a holder that stopped heartbeating.
    pub took_over: bool,
}

/// A claim this process holds. Released by the store's `put` of its key, by
/// [`release`](Claim::release), or when dropped; heartbeated until then.
#[derive(Debug)]
pub struct Claim {
    keeper: Arc<Keeper>,
    name: String,
    entry: u128,
    released: bool,
}

impl Claim {
    /// The entry name (32 hex digits) the claim is for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Gives the claim up now: removed if the entry has been published, retired otherwise
    /// (waiters then compile at once). Idempotent; a no-op after the `put` released it.
    pub fn release(&mut self) {
        if !self.released {
            self.released = true;
            let published = self.keeper.entry_exists(self.entry);
            self.keeper.finish(&self.name, published);
        }
    }

    /// Whether the claim is still held by this process (not released, not lost to a
    /// takeover noticed by a heartbeat).
    pub fn held(&self) -> bool {
        !self.released && self.keeper.holds(&self.name)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.release();
    }
}

/// The claims of one store: the lease directory, and the heartbeat thread's shared state.
#[derive(Debug)]
pub(super) struct Keeper {
    pub(super) dir: LockDir,
    root: Arc<Root>,
    lease: Duration,
    state: ForkMutex<KeeperState>,
    wake: Condvar,
    counters_abandoned: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct KeeperState {
    held: HashMap<String, LockGuard>,
    /// Retired claims and when to remove them.
    retiring: Vec<(Instant, LockGuard)>,
    thread_running: bool,
    closed: bool,
}

impl Keeper {
    pub(super) fn new(root: Arc<Root>, lease: Duration, host: String) -> Arc<Keeper> {
        Arc::new(Keeper {
            dir: LockDir::beneath(
                Arc::clone(&root),
                CLAIMS,
                LockOptions {
                    mode: LockMode::Lease,
                    timeout: Duration::ZERO,
                    lease_time: lease,
                    host,
                },
            ),
            root,
            lease,
            state: ForkMutex::new(KeeperState::default()),
            wake: Condvar::new(),
            counters_abandoned: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn state(&self) -> MutexGuard<'_, KeeperState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the entry `name` has a file (in a real shard directory).
    fn entry_exists(&self, name: u128) -> bool {
        self.root
            .sub(&Layout::shard_rel(name))
            .and_then(|d| d.stat(&crate::dir::Name::entry(name)))
            .is_ok()
    }

    /// In a forked child: the parent's claims and their heartbeat thread are the parent's.
    /// The inherited guards are forgotten (dropping them would remove the parent's lease
    /// files), the heartbeat thread is known not to run here, and the state's mutex, which
    /// that thread may have held at the fork, is replaced.
    ///
    /// # Safety
    /// As `forksafe::reset_mutex`: only in a forked child that is still single-threaded.
    pub(super) unsafe fn reset_after_fork(&self) {
        // SAFETY: per the contract; the old state (and the guards in it) is leaked.
        unsafe {
            self.state.reset(KeeperState::default());
            self.dir.reset_after_fork();
        }
        self.counters_abandoned
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }

    fn holds(&self, name: &str) -> bool {
        self.state().held.contains_key(name)
    }

    /// Whether this process holds any claim (no I/O): lets `put` skip the claim path.
    pub(super) fn holds_any(&self) -> bool {
        !self.state().held.is_empty()
    }

    /// Keeps `guard` heartbeated until `finish`. Returns false (and drops the guard, which
    /// removes the lease) once the store is closed.
    fn hold(self: &Arc<Self>, name: &str, guard: LockGuard) -> bool {
        let mut st = self.state();
        if st.closed {
            return false;
        }
        st.held.insert(name.to_string(), guard);
        self.ensure_thread(&mut st);
        self.wake.notify_all();
        true
    }

    /// Releases the claim `name` if this process holds it: removes it when `published`,
    /// else retires it and removes it after [`RETIRED_LINGER`].
    pub(super) fn finish(self: &Arc<Self>, name: &str, published: bool) {
        let mut st = self.state();
        let Some(mut guard) = st.held.remove(name) else {
            return;
        };
        if published {
            drop(st);
            if let Err(e) = guard.release() {
                log::debug!("xla_pcache: releasing the claim {name}: {e}");
            }
            return;
        }
        self.counters_abandoned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match guard.retire() {
            Ok(()) => {
                st.retiring.push((Instant::now() + RETIRED_LINGER, guard));
                self.ensure_thread(&mut st);
                self.wake.notify_all();
            }
            Err(e) => {
                // Lost to a takeover, or the filesystem failed: nothing left to tell.
                log::debug!("xla_pcache: retiring the claim {name}: {e}");
                guard.leave();
            }
        }
    }

    /// Claims given up without a publish since the last call.
    pub(super) fn take_abandoned(&self) -> u64 {
        self.counters_abandoned
            .swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// Closing the store: every held claim is retired and left in place (waiters compile
    /// at once; the next claimer takes it over), retiring ones are removed now.
    pub(super) fn close(&self) {
        let mut st = self.state();
        st.closed = true;
        let held: Vec<LockGuard> = st.held.drain().map(|(_, g)| g).collect();
        let retiring: Vec<LockGuard> = st.retiring.drain(..).map(|(_, g)| g).collect();
        self.wake.notify_all();
        drop(st);
        for mut g in held {
            self.counters_abandoned
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Err(e) = g.retire() {
                log::debug!("xla_pcache: retiring a claim at close: {e}");
            }
            g.leave();
        }
        drop(retiring);
    }

    fn ensure_thread(self: &Arc<Self>, st: &mut KeeperState) {
        if st.thread_running {
            return;
        }
        let keeper = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("xla-pcache-claims".into())
            .spawn(move || keeper.run());
        match spawned {
            Ok(_) => st.thread_running = true,
            // Without heartbeats the claims go stale and are taken over: slower, not wrong.
            Err(e) => log::warn!("xla_pcache: cannot start the claim heartbeat thread: {e}"),
        }
    }

    /// The heartbeat thread: beats every held claim each quarter lease, removes retired
    /// claims when their time is up, and exits when there is nothing left to keep.
    fn run(&self) {
        let interval = (self.lease / 4).max(Duration::from_millis(10));
        let mut last_beat = Instant::now();
        let mut st = self.state();
        loop {
            if st.closed || (st.held.is_empty() && st.retiring.is_empty()) {
                st.thread_running = false;
                return;
            }
            let now = Instant::now();
            let mut until = last_beat + interval;
            if let Some(first) = st.retiring.iter().map(|(t, _)| *t).min() {
                until = until.min(first);
            }
            if until > now {
                st = self
                    .wake
                    .wait_timeout(st, until - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            let now = Instant::now();
            if now >= last_beat + interval {
                last_beat = now;
                // Heartbeats are small writes; holding the state through them only delays a
                // concurrent claim or release by as much.
                st.held.retain(|name, guard| match guard.heartbeat() {
                    Ok(()) => true,
                    Err(LockError::LeaseLost { .. }) => {
                        log::info!(
                            "xla_pcache: the compile claim {name} was taken over by another \
                             process (no heartbeat seen for {:.0?}); both may compile it",
                            self.lease
                        );
                        false
                    }
                    Err(e) => {
                        log::debug!("xla_pcache: heartbeat of the claim {name}: {e}");
                        true
                    }
                });
            }
            let (due, keep): (Vec<_>, Vec<_>) = st.retiring.drain(..).partition(|(t, _)| *t <= now);
            st.retiring = keep;
            if !due.is_empty() {
                drop(st);
                drop(due); // each guard removes its lease if it is still ours
                st = self.state();
            }
        }
    }
}

impl Store {
    /// Claims `key` for compiling, or waits up to `wait` for another process's claim on it
    /// to end. A read-only store never claims: it only waits (as [`Store::wait_for`]).
    ///
    /// Returns `Claimed` with the claim (compile, then `put`, which releases it),
    /// `Published` when the entry is there, `Abandoned` when the holder gave up without
    /// publishing, `TimedOut` when the wait ran out, `Unclaimed` when nothing was claimed
    /// (read-only, a holder gone stale, or a filesystem failure, logged). `wait` zero: one
    /// look, no waiting. Errors only for an invalid key.
    pub fn claim(&self, key: Key<'_>, wait: Duration) -> Result<ClaimOutcome, StoreError> {
        self.single_flight(key, wait, !self.opts.read_only)
    }

    /// Waits up to `timeout` for a claim another process holds on `key` to end, without
    /// ever claiming: `Published`, `Abandoned`, `TimedOut` or `Unclaimed` (no claim, or its
    /// holder stopped heartbeating).
    pub fn wait_for(&self, key: Key<'_>, timeout: Duration) -> Result<ClaimOutcome, StoreError> {
        self.single_flight(key, timeout, false)
    }

    fn single_flight(
        &self,
        key: Key<'_>,
        wait: Duration,
        may_claim: bool,
    ) -> Result<ClaimOutcome, StoreError> {
        check_key(&key)?;
        let name = entry_name(key.bytes);
        let hex = name_hex(name);
        let start = Instant::now();
        let deadline = start + wait.min(MAX_WAIT);
        let mut pause = POLL_FIRST;
        let mut waiting = false;
        let outcome = |state, claim, took_over, waited: bool| ClaimOutcome {
            state,
            claim,
            waited: if waited {
                start.elapsed()
            } else {
                Duration::ZERO
            },
            took_over,
        };
        let state = loop {
            let view = match self.claims.dir.peek(&hex) {
                Ok(v) => v,
                Err(e) => break self.claim_failed(&e),
            };
            let (stale, retired) = match &view {
                LeaseView::Free => (false, false),
                LeaseView::Held { stale, retired, .. } => (*stale, *retired),
            };
            if retired && waiting {
                // The holder we waited for gave up: nobody is going to publish.
                break ClaimState::Abandoned;
            }
            if view == LeaseView::Free || stale {
                if self.entry_exists(name) {
                    break ClaimState::Published;
                }
                if !may_claim {
                    break ClaimState::Unclaimed;
                }
                match self.claims.dir.try_lock_for(&hex, Duration::ZERO) {
                    Ok(Some(guard)) => {
                        // A holder may have published and released between the look at the
                        // entry and our claim: then there is nothing to compile.
                        if self.entry_exists(name) {
                            drop(guard);
                            break ClaimState::Published;
                        }
                        // We waited on a holder that neither published nor retired: it
                        // went stale. Not judged by how the lock went: the holder may have
                        // gone (its file removed) between our look and our link.
                        let took_over = waiting && !retired;
                        if !self.claims.hold(&hex, guard) {
                            break ClaimState::Unclaimed; // the store is closing
                        }
                        self.counters.inc(Counter::ClaimsTaken);
                        if took_over {
                            self.counters.inc(Counter::ClaimTakeovers);
                            log::info!(
                                "xla_pcache: took over the compile claim on {hex} (its holder \
                                 showed no heartbeat for {:.0?})",
                                self.opts.claim_lease
                            );
                        }
                        self.finish_wait(waiting, start, false);
                        // A test holds the claimant here while others come to wait on it.
                        crate::testhook::hold("claimed");
                        return Ok(outcome(
                            ClaimState::Claimed,
                            Some(Claim {
                                keeper: Arc::clone(&self.claims),
                                name: hex,
                                entry: name,
                                released: false,
                            }),
                            took_over,
                            waiting,
                        ));
                    }
                    // Another process won it between our look and our link: wait for it.
                    Ok(None) => {}
                    Err(e) => break self.claim_failed(&e),
                }
            }
            if !waiting {
                waiting = true;
                self.counters.inc(Counter::ClaimWaits);
                crate::testhook::reached("claim-wait");
            }
            let now = Instant::now();
            if now >= deadline {
                break ClaimState::TimedOut;
            }
            thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(POLL_MAX);
        };
        self.claims.dir.forget_lease(&hex);
        self.finish_wait(waiting, start, state == ClaimState::TimedOut);
        Ok(outcome(state, None, false, waiting))
    }

    fn finish_wait(&self, waited: bool, start: Instant, timed_out: bool) {
        if waited {
            self.counters
                .add(Counter::ClaimWaitMs, start.elapsed().as_millis() as u64);
        }
        if timed_out {
            self.counters.inc(Counter::ClaimWaitTimeouts);
        }
        self.maybe_flush_stats(false);
    }

    fn claim_failed(&self, e: &LockError) -> ClaimState {
        self.counters.inc(Counter::Errors);
        self.warn("claim", || {
            format!("compile claim failed ({e}); compiling without waiting for other processes")
        });
        ClaimState::Unclaimed
    }

    /// Moves the keeper's count of abandoned claims into the store's counters.
    pub(super) fn note_abandoned(&self) {
        let n = self.claims.take_abandoned();
        if n > 0 {
            self.counters.add(Counter::ClaimsAbandoned, n);
        }
    }

    /// After a `put` of `key`: releases this process's claim on it, if any (removed when
    /// the entry is there, retired otherwise). No I/O unless a claim is held.
    pub(super) fn release_claim_after_put(&self, key: &Key<'_>) {
        if key.bytes.is_empty() || !self.claims.holds_any() {
            return;
        }
        let name = entry_name(key.bytes);
        let hex = name_hex(name);
        if self.claims.holds(&hex) {
            let published = self.entry_exists(name);
            self.claims.finish(&hex, published);
        }
    }

    /// Releases every claim this process holds (retired: waiters compile at once).
    pub fn close_claims(&self) {
        self.claims.close();
        self.note_abandoned();
    }
}
