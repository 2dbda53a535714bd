//! Admission: whether a put may go on in a bounded cache, and how far ahead an eviction
//! from the put path makes room.
//!
//! Eviction runs in time slices and in one process at a time, so puts from many processes
//! can outrun it. Three things bound how far over budget the directory gets:
//! - the margin: the other processes' puts this view has not read yet count as if they
//!   were in it (`PutRate::likely_unseen`);
//! - admission: a put that does not fit with that margin evicts, or waits a little for
//!   the process that is evicting, and is refused only when neither makes room in time
//!   (`Store::admits`, `AdmitWait`);
//! - evict-ahead: an eviction from the put path goes below the low watermark by what the
//!   others likely put before the next eviction can run (`PutRate::evict_ahead`).
//!
//! The decisions live in `PutRate` and `AdmitWait`, which take the instants and values they
//! need as arguments and never read a clock, so their tests run on injected instants. The
//! `Store` methods below only gather those values and do the I/O.

use super::{State, Store};
use std::time::{Duration, Instant};

/// How long after a process checks the budget its put becomes visible to the others (the
/// link, then its journal record): the others' puts in that window are unseen by both.
pub(super) const PUBLISH_WINDOW: Duration = Duration::from_millis(10);
/// The put rate is measured over windows at least this long (about one fresh listing of the
/// journals on a network filesystem, where the others' puts arrive in such steps)...
pub(super) const RATE_WINDOW: Duration = Duration::from_millis(50);
/// ...follows a rise at once and decays over about this long.
const RATE_DECAY: Duration = Duration::from_secs(1);
/// A put-path eviction also makes room for the others' puts over about this long, at their
/// measured rate...
const EVICT_AHEAD: Duration = Duration::from_millis(100);
/// ...but for no more than this share of the budget.
const EVICT_AHEAD_MAX: f64 = 0.25;
/// A put waiting for another process's eviction looks again after 5 ms, doubling to 50 ms.
const ADMIT_POLL_MIN: Duration = Duration::from_millis(5);
const ADMIT_POLL_MAX: Duration = Duration::from_millis(50);
/// Eviction slices a put over budget may run itself before it is refused.
const ADMIT_OWN_SLICES: u32 = 3;

/// Why a put over budget was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Another process held the evictor lock until `lock_timeout`, and what the view showed
    /// of its eviction meanwhile did not make room.
    LockHeld,
    /// This process evicted, and what it could evict did not make room (entries it could
    /// not remove, or a budget smaller than what it cannot see to evict).
    NoRoom,
}

/// Whether a put of `size` bytes fits in `max` with the view's `total` and `unseen` bytes.
pub(super) fn fits(total: u64, unseen: u64, size: u64, max: u64) -> bool {
    total.saturating_add(unseen).saturating_add(size) <= max
}

/// The other processes' put rate (bytes/s) as this view saw their journals grow: the last
/// window's when that is higher, else decaying over about `RATE_DECAY`; and the sample the
/// current window started from.
#[derive(Debug, Default, Clone)]
pub(super) struct PutRate {
    rate: f64,
    sample: Option<(Instant, u64)>,
}

impl PutRate {
    /// Bytes per second.
    #[cfg(test)]
    pub(super) fn rate(&self) -> f64 {
        self.rate
    }

    /// Folds in `total`, the other processes' put bytes as read at `now` (a running sum
    /// over their journals). A rise counts at once: a fleet that starts together fills an
    /// empty budget within a few hundred milliseconds, before a smoothed rate would have
    /// caught up, and the disk would overshoot the budget by most of that; a fall decays,
    /// since puts come in bursts. A sample less than `RATE_WINDOW` after the window's start
    /// is ignored (the window stays open).
    pub(super) fn note(&mut self, now: Instant, total: u64) {
        if let Some((t, before)) = self.sample {
            let dt = now.saturating_duration_since(t);
            if dt < RATE_WINDOW {
                return;
            }
            let rate = total.saturating_sub(before) as f64 / dt.as_secs_f64();
            if rate >= self.rate {
                self.rate = rate;
            } else {
                let weight = 1.0 - (-dt.as_secs_f64() / RATE_DECAY.as_secs_f64()).exp();
                self.rate += weight * (rate - self.rate);
            }
        }
        self.sample = Some((now, total));
    }

    /// What the other writers likely published that a view has not read: about this
    /// process's own puts since it was read (`pending_bytes`) each of the view's `writers`,
    /// or the measured rate over the time since the view was current (`current_at`; none:
    /// never read) plus `PUBLISH_WINDOW`, whichever is more. Near zero in a quiet fleet; in
    /// a busy one it is what keeps a view that is even 50 ms old from admitting puts into
    /// space that is already taken.
    pub(super) fn likely_unseen(
        &self,
        pending_bytes: u64,
        writers: usize,
        current_at: Option<Instant>,
        now: Instant,
    ) -> u64 {
        let by_own = pending_bytes.saturating_mul(writers.max(1) as u64);
        let since = current_at.map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
            + PUBLISH_WINDOW;
        let by_rate = (self.rate * since.as_secs_f64()) as u64;
        by_own.max(by_rate)
    }

    /// How far below the low watermark an eviction from the put path of a `max`-byte budget
    /// goes: what the others likely put over `EVICT_AHEAD`, at most `EVICT_AHEAD_MAX` of the
    /// budget. When a busy fleet refills the margin below the watermark within
    /// milliseconds, an eviction down to the watermark alone leaves room for a put or two,
    /// and every other put waits for the evictor lock. Near zero in a quiet fleet.
    pub(super) fn evict_ahead(&self, max: u64) -> u64 {
        (self.rate * EVICT_AHEAD.as_secs_f64()).min(max as f64 * EVICT_AHEAD_MAX) as u64
    }

    /// A rate as if measured, with a window just begun at `now` from `total`.
    #[cfg(test)]
    pub(super) fn set(&mut self, rate: f64, now: Instant, total: u64) {
        self.rate = rate;
        self.sample = Some((now, total));
    }
}

/// The wait of a put that does not fit after its own first eviction attempt: up to a
/// deadline, polling with a growing pause while another process evicts, and running at
/// most `ADMIT_OWN_SLICES` slices of eviction itself.
#[derive(Debug)]
pub(super) struct AdmitWait {
    deadline: Instant,
    pause: Duration,
    own_slices: u32,
}

impl AdmitWait {
    /// A wait starting at `now` for at most `timeout`.
    pub(super) fn new(now: Instant, timeout: Duration) -> Self {
        Self {
            deadline: now + timeout,
            pause: ADMIT_POLL_MIN,
            own_slices: 0,
        }
    }

    /// After a slice of eviction by this process that left no room: Ok to go on (a slice
    /// cut short continues at once, a few times), the refusal once it ran
    /// `ADMIT_OWN_SLICES`. A backlog larger than that (a budget just lowered) is the next
    /// puts' to work off: no put stalls for a whole eviction batch.
    pub(super) fn evicted_without_room(&mut self) -> Result<(), Refusal> {
        self.own_slices += 1;
        if self.own_slices >= ADMIT_OWN_SLICES {
            return Err(Refusal::NoRoom);
        }
        Ok(())
    }

    /// With the evictor lock held by another process at `now`: how long to sleep before
    /// looking again, or the refusal once the deadline has passed.
    pub(super) fn pause(&mut self, now: Instant) -> Result<Duration, Refusal> {
        if now >= self.deadline {
            return Err(if self.own_slices > 0 {
                Refusal::NoRoom
            } else {
                Refusal::LockHeld
            });
        }
        let pause = self.pause.min(self.deadline - now);
        self.pause = (self.pause * 2).min(ADMIT_POLL_MAX);
        Ok(pause)
    }
}

impl State {
    /// `PutRate::likely_unseen` for this view now. The view is current as of its last
    /// refresh on a local filesystem (no `last_freshen` there), of its last fresh listing
    /// on a network one.
    pub(super) fn likely_unseen(&self) -> u64 {
        self.put_rate.likely_unseen(
            self.pending_bytes,
            self.view.writers,
            self.last_freshen.or(self.last_refresh),
            Instant::now(),
        )
    }

    /// Folds the other processes' puts read by the last refresh into `put_rate`.
    pub(super) fn note_put_rate(&mut self) {
        self.put_rate
            .note(Instant::now(), self.view.others_put_bytes);
    }
}

impl Store {
    /// Whether a put of `size` bytes may go on (`publishing`: its file is written and about
    /// to be linked into place): not while this process's view of the cache, with it, is
    /// over the budget.
    ///
    /// The other processes' puts this view has not read count as `State::likely_unseen`.
    /// On a network filesystem, when that margin does not fit, the check before
    /// publishing re-reads the journals through a fresh listing (a few metadata round
    /// trips) and looks again: a view even 50 ms old misses what a busy fleet published
    /// meanwhile, and each process would admit its own put into the same free space.
    /// While well under budget it costs a comparison.
    ///
    /// Over budget, the put evicts (never waiting for the lock); if another process holds
    /// the evictor lock, it waits up to `lock_timeout`, watching the view for that
    /// eviction's deletes and taking the lock when it is free. A put follows a compile that
    /// took seconds, and a refused one costs that compile again on the next run, so a short
    /// wait is the cheaper side. Refused only when neither happens in time.
    pub(super) fn admits(&self, max: u64, size: u64, publishing: bool) -> Result<(), Refusal> {
        let fits = |st: &State, unseen: u64| fits(st.view.entries.total_bytes(), unseen, size, max);
        {
            let mut st = self.state();
            let just_read = publishing && self.refresh_before_publish(&mut st);
            // The other writers' likely puts since this view was read count too.
            if fits(&st, st.likely_unseen()) {
                return Ok(());
            }
            if publishing && !self.fs.local && !just_read {
                if !self.refresh_or_warn(&mut st) {
                    return Ok(());
                }
                if fits(&st, st.likely_unseen()) {
                    return Ok(());
                }
            }
            self.maybe_evict(&mut st);
            if fits(&st, st.pending_bytes) {
                return Ok(());
            }
        }
        // Waited for without holding the state lock, so this process's gets go on.
        let mut wait = AdmitWait::new(Instant::now(), self.opts.lock_timeout);
        loop {
            if let Some(guard) = self.take_evict_lock(Duration::ZERO) {
                let mut st = self.state();
                // Down to where this put leaves the cache at the low watermark, as an
                // eviction after it would: stopping at the watermark itself would bring the
                // next eviction one put sooner.
                let target = self.put_low_water(&st, max).saturating_sub(size);
                self.evict_slice_locked(&mut st, guard, Some(target), None);
                if fits(&st, st.pending_bytes) {
                    return Ok(());
                }
                wait.evicted_without_room()?;
                continue;
            }
            std::thread::sleep(wait.pause(Instant::now())?);
            let mut st = self.state();
            if self.refresh_or_warn(&mut st) && fits(&st, st.likely_unseen()) {
                return Ok(());
            }
        }
    }

    /// Where an eviction from the put path stops: the low watermark, less what the other
    /// processes likely put before the next eviction can run (`PutRate::evict_ahead`).
    pub(super) fn put_low_water(&self, st: &State, max: u64) -> u64 {
        self.low_water(max)
            .saturating_sub(st.put_rate.evict_ahead(max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fits_counts_the_view_the_unseen_and_the_put() {
        assert!(fits(60, 20, 20, 100));
        assert!(!fits(60, 20, 21, 100));
        assert!(
            !fits(u64::MAX, 1, 1, u64::MAX - 1),
            "saturates, never wraps"
        );
    }

    #[test]
    fn the_first_sample_only_opens_a_window() {
        let t0 = Instant::now();
        let mut r = PutRate::default();
        r.note(t0, 1_000_000);
        assert_eq!(r.rate(), 0.0, "bytes put before the first read are no rate");
        r.note(t0 + 100 * MS, 1_000_000);
        assert_eq!(r.rate(), 0.0);
    }

    #[test]
    fn the_others_puts_over_a_window_are_their_rate() {
        let t0 = Instant::now();
        let mut r = PutRate::default();
        r.note(t0, 0);
        // 400 kB over 400 ms, read in steps of 100 ms.
        for i in 1..=4u32 {
            r.note(t0 + 100 * MS * i, 100_000 * u64::from(i));
        }
        assert!((r.rate() - 1_000_000.0).abs() < 1e-6, "{}", r.rate());
    }

    #[test]
    fn samples_closer_than_the_window_wait_for_it_to_close() {
        let t0 = Instant::now();
        let mut r = PutRate::default();
        r.note(t0, 0);
        r.note(t0 + 10 * MS, 10_000);
        assert_eq!(r.rate(), 0.0, "a 10 ms window is too short to measure");
        // The window still runs from t0: 60 kB over 60 ms.
        r.note(t0 + RATE_WINDOW + 10 * MS, 60_000);
        assert!((r.rate() - 1_000_000.0).abs() < 1e-6, "{}", r.rate());
    }

    #[test]
    fn a_rise_counts_at_once_and_a_fall_decays() {
        let t0 = Instant::now();
        let mut r = PutRate::default();
        r.note(t0, 0);
        r.note(t0 + 100 * MS, 0);
        assert_eq!(r.rate(), 0.0);
        // A burst of 200 kB within one 100 ms window: the window's rate at once, not a step
        // toward it.
        r.note(t0 + 200 * MS, 200_000);
        assert!((r.rate() - 2_000_000.0).abs() < 1e-6, "{}", r.rate());
        // Nothing over the next 100 ms: down by 1 - e^-0.1 of the way to zero.
        r.note(t0 + 300 * MS, 200_000);
        let expected = 2_000_000.0 * (-0.1f64).exp();
        assert!(
            (r.rate() - expected).abs() < 1e-3,
            "{} vs {expected}",
            r.rate()
        );
        // A lower rate than the current one decays toward it, never below it.
        let before = r.rate();
        r.note(t0 + 400 * MS, 300_000);
        assert!(r.rate() < before && r.rate() > 1_000_000.0, "{}", r.rate());
        // After long quiet it is about gone.
        r.note(t0 + 20_400 * MS, 300_000);
        assert!(r.rate() < 1.0, "{}", r.rate());
    }

    #[test]
    fn likely_unseen_is_the_larger_of_own_puts_times_writers_and_rate_times_age() {
        let t0 = Instant::now();
        let quiet = PutRate::default();
        // A quiet fleet: this process's own puts since the view was read, for each writer.
        assert_eq!(
            quiet.likely_unseen(10_000, 3, Some(t0), t0 + 500 * MS),
            30_000
        );
        assert_eq!(quiet.likely_unseen(10_000, 0, None, t0), 10_000);
        assert_eq!(quiet.likely_unseen(0, 4, Some(t0), t0 + 500 * MS), 0);
        // A busy one: 1 MB/s over the view's age plus the publish window.
        let mut busy = PutRate::default();
        busy.set(1_000_000.0, t0, 0);
        assert_eq!(busy.likely_unseen(0, 1, Some(t0), t0), 10_000);
        assert_eq!(busy.likely_unseen(0, 1, Some(t0), t0 + 90 * MS), 100_000);
        assert_eq!(
            busy.likely_unseen(500_000, 1, Some(t0), t0 + 90 * MS),
            500_000
        );
        // A view never read counts the publish window only.
        assert_eq!(busy.likely_unseen(0, 1, None, t0 + 90 * MS), 10_000);
        // And grows as the view ages.
        let now = busy.likely_unseen(0, 1, Some(t0), t0 + 40 * MS);
        let later = busy.likely_unseen(0, 1, Some(t0), t0 + 140 * MS);
        assert!(now > 0 && later > now, "{now} then {later}");
    }

    #[test]
    fn evict_ahead_is_the_rate_over_its_horizon_capped_at_a_quarter_of_the_budget() {
        let t0 = Instant::now();
        let mut r = PutRate::default();
        assert_eq!(
            r.evict_ahead(1_000_000),
            0,
            "nothing ahead in a quiet fleet"
        );
        r.set(100_000.0, t0, 0);
        assert_eq!(r.evict_ahead(1_000_000), 10_000);
        r.set(10_000_000.0, t0, 0);
        assert_eq!(r.evict_ahead(1_000_000), 250_000);
    }

    #[test]
    fn a_wait_polls_from_5_ms_doubling_to_50_ms_until_its_deadline() {
        let t0 = Instant::now();
        let mut w = AdmitWait::new(t0, 200 * MS);
        let mut now = t0;
        let mut pauses = Vec::new();
        loop {
            match w.pause(now) {
                Ok(p) => {
                    pauses.push(p.as_millis());
                    now += p;
                }
                Err(why) => {
                    assert_eq!(why, Refusal::LockHeld, "it never evicted itself");
                    break;
                }
            }
        }
        assert_eq!(pauses, [5, 10, 20, 40, 50, 50, 25]);
        assert_eq!(now, t0 + 200 * MS, "the last pause ends at the deadline");
    }

    #[test]
    fn a_wait_that_evicted_is_refused_for_no_room() {
        let t0 = Instant::now();
        let mut w = AdmitWait::new(t0, 100 * MS);
        assert!(w.evicted_without_room().is_ok());
        assert_eq!(w.pause(t0 + 100 * MS), Err(Refusal::NoRoom));
    }

    #[test]
    fn a_put_runs_at_most_three_slices_of_eviction_itself() {
        let t0 = Instant::now();
        let mut w = AdmitWait::new(t0, Duration::from_secs(10));
        assert!(w.evicted_without_room().is_ok());
        assert!(w.evicted_without_room().is_ok());
        assert_eq!(w.evicted_without_room(), Err(Refusal::NoRoom));
    }

    #[test]
    fn a_zero_timeout_refuses_at_once() {
        let t0 = Instant::now();
        let mut w = AdmitWait::new(t0, Duration::ZERO);
        assert_eq!(w.pause(t0), Err(Refusal::LockHeld));
    }
}
