//! Unit tests of the store.

use super::evict::EVICT_LOCK;
use super::*;
use crate::hash::entry_name;
use crate::journal;
use crate::lock::LockGuard;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};

fn key(s: &str) -> Key<'_> {
    Key {
        bytes: s.as_bytes(),
        is_text: true,
    }
}

/// Puts `value` under `n` keys: `<prefix>0`, `<prefix>1`, ...
fn put_many(s: &Store, prefix: &str, n: usize, value: &[u8]) {
    for i in 0..n {
        s.put(key(&format!("{prefix}{i}")), value, &[]).unwrap();
    }
}

fn open(dir: &Path, max: Option<u64>) -> Store {
    Store::open(
        dir,
        StoreOptions {
            max_size: max,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn round_trip_first_writer_and_delete() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    assert!(s.put(key("k"), b"one", &[]).unwrap());
    assert!(!s.put(key("k"), b"two", &[]).unwrap());
    assert_eq!(s.get(key("k")).unwrap().unwrap().payload(), b"one");
    assert!(s.delete(key("k")).unwrap());
    assert!(s.get(key("k")).unwrap().is_none());
    assert!(matches!(
        s.put(key(""), b"x", &[]),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn corrupt_file_is_a_counted_miss_and_removed() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    s.put(key("k"), &[1u8; 1000], &[]).unwrap();
    let p = s.layout.entry_path(entry_name(b"k"));
    let mut bytes = fs::read(&p).unwrap();
    bytes[500] ^= 1;
    fs::write(&p, bytes).unwrap();
    assert!(s.get(key("k")).unwrap().is_none());
    assert_eq!(s.counters.get(Counter::Corrupt), 1);
    assert!(!p.exists());
}

#[test]
fn read_only_store_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    open(d.path(), None).put(key("k"), b"v", &[]).unwrap();
    let ro = Store::open(
        d.path(),
        StoreOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let journals = journal::list(&Dir::open_path(&ro.layout.journal_dir(), true).unwrap()).unwrap();
    assert!(!ro.put(key("new"), b"v", &[]).unwrap());
    assert!(ro.get(key("k")).unwrap().is_some());
    assert!(matches!(ro.clear(false), Err(StoreError::ReadOnly(_))));
    ro.flush();
    drop(ro);
    assert_eq!(
        journal::list(&Dir::open_path(&d.path().join("journal"), true).unwrap()).unwrap(),
        journals
    );
}

#[test]
fn budget_is_kept_and_oldest_go_first() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), Some(100_000));
    for i in 0..30 {
        assert!(s.put(key(&format!("k{i}")), &[0u8; 10_000], &[]).unwrap());
    }
    let st = s.stats().unwrap();
    assert!(st.bytes <= 100_000, "{} bytes over budget", st.bytes);
    assert!(s.get(key("k29")).unwrap().is_some());
    assert!(s.get(key("k0")).unwrap().is_none());
}

#[test]
fn compaction_folds_journals_of_dead_processes() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), Some(1 << 30));
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = child.id();
    for i in 0..70u64 {
        let name = journal::file_name(crate::clock::hostname(), dead, i);
        let mut buf = Vec::new();
        JournalRecord::Touch {
            name: i as u128 + 1,
            disk_bytes: 4096,
            t: i,
            put: true,
        }
        .encode(&mut buf);
        JournalRecord::Stats {
            counters: vec![1, 0, 1],
        }
        .encode(&mut buf);
        fs::write(s.layout.journal_dir().join(name), buf).unwrap();
    }
    assert!(s.put(key("trigger"), b"v", &[]).unwrap());
    let left = journal::list(&Dir::open_path(&s.layout.journal_dir(), true).unwrap())
        .unwrap()
        .0;
    assert_eq!(
        left.len(),
        1,
        "only this process's journal remains: {left:?}"
    );
    let fresh = open(d.path(), None);
    let st = fresh.stats().unwrap();
    assert_eq!(st.entries, 71, "entries of dead processes stay indexed");
    assert_eq!(
        st.counters[Counter::Hits as usize],
        70,
        "their counters are kept"
    );
}

#[test]
fn eviction_cut_short_goes_on_with_the_next_puts() {
    let d = tempfile::tempdir().unwrap();
    let unbounded = open(d.path(), None);
    put_many(&unbounded, "big", 60, &[0u8; 16_000]);
    drop(unbounded);
    let max = 400_000;
    let s = Store::open(
        d.path(),
        StoreOptions {
            max_size: Some(max),
            evict_slice: Duration::ZERO,
            ..Default::default()
        },
    )
    .unwrap();
    let bytes = || s.stats().unwrap().bytes;
    assert!(bytes() > 2 * max);
    // A zero time slice evicts one entry per put: the eviction is cut short...
    s.put(key("small0"), b"x", &[]).unwrap();
    assert!(bytes() > max);
    // (The refused put's own slices aimed to leave room for it below the watermark.)
    let backlog = s.state().evict_backlog;
    assert!(
        backlog.is_some_and(|t| t <= 360_000 && t > 359_000),
        "{backlog:?}"
    );
    let mut i = 1;
    while bytes() > max {
        s.put(key(&format!("small{i}")), b"x", &[]).unwrap();
        i += 1;
        assert!(i < 1000);
    }
    // ...and goes on below the budget, down to the low watermark, with the next puts.
    let before = bytes();
    assert!(before > 360_000 && s.state().evict_backlog.is_some());
    s.put(key("one more"), b"x", &[]).unwrap();
    assert!(
        bytes() < before,
        "a put under budget did not go on with the backlog"
    );
    while s.state().evict_backlog.is_some() {
        s.put(key(&format!("small{i}")), b"x", &[]).unwrap();
        i += 1;
        assert!(i < 1000);
    }
    assert!(bytes() <= 360_000);
}

#[test]
fn puts_sweep_the_trash_at_most_every_tenth_of_its_grace_and_evict_always() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(
        d.path(),
        StoreOptions {
            max_size: Some(20 * 4096),
            trash_grace: Duration::from_secs(600),
            ..Default::default()
        },
    )
    .unwrap();
    let evictions = || s.counters.get(Counter::Evictions);
    let mut i = 0;
    let mut put_until_evicted = || {
        let before = evictions();
        while evictions() == before {
            assert!(s.put(key(&format!("k{i}")), &[7u8; 1000], &[]).unwrap());
            i += 1;
        }
    };
    let last_sweep = || s.state().last_sweep;
    put_until_evicted(); // the first eviction of the process sweeps
    let first = last_sweep();
    assert!(first.is_some());
    put_until_evicted();
    assert_eq!(
        last_sweep(),
        first,
        "a put's eviction within a minute of the last sweep skips it"
    );
    s.evict(None, None).unwrap();
    assert!(last_sweep() > first, "an explicit evict sweeps");
}

#[test]
fn read_whole_reads_to_the_end_whatever_size_fstat_gave() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("f");
    let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
    fs::write(&p, &data).unwrap();
    for local in [true, false] {
        // Exact, stale-small (the file grew, as a replaced file seen through a cached size
        // does) and stale-large sizes.
        for hint in [300_000, 10, 0, 299_999, 1_000_000] {
            let f = File::open(&p).unwrap();
            assert_eq!(
                super::read::read_whole(&f, hint, local).unwrap(),
                data,
                "{local} {hint}"
            );
        }
    }
}

#[test]
fn eviction_drops_records_of_vanished_files_and_goes_on_to_the_target() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    put_many(&s, "k", 10, &[7u8; 10_000]);
    let per = s.stats().unwrap().bytes / 10;
    // Another host removed the five oldest files; this view has not heard of it.
    for i in 0..5 {
        fs::remove_file(s.layout.entry_path(entry_name(format!("k{i}").as_bytes()))).unwrap();
    }
    let state = |s: &Store| {
        let mut st = s.state();
        let guard = s
            .locks
            .try_lock_for(EVICT_LOCK, Duration::ZERO)
            .unwrap()
            .unwrap();
        // The put path's eviction (a deadline, no reconciliation).
        let deadline = Some(Instant::now() + Duration::from_secs(10));
        s.evict_locked(&mut st, guard, Some(per * 3), None, deadline)
            .unwrap()
    };
    let r = state(&s);
    assert_eq!(r.dropped, 5, "the phantoms freed nothing");
    assert_eq!(r.removed, 2, "and eviction went on to the target");
    assert_eq!(r.bytes, 2 * per, "freed bytes are the files' own");
    let st = s.stats().unwrap();
    assert_eq!((st.entries, st.bytes), (3, 3 * per));
    assert_eq!(s.entry_files().unwrap().len(), 3);
}

#[test]
fn explicit_evict_reconciles_with_the_directory() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), Some(1 << 20));
    put_many(&s, "k", 6, &[7u8; 10_000]);
    // Another writer's file the view does not know (its put record unread), and a record
    // whose file is gone.
    let other = open(d.path(), None);
    fs::remove_file(s.layout.entry_path(entry_name(b"k0"))).unwrap();
    let per = s.stats().unwrap().bytes / 6;
    other.put(key("x"), &[1u8; 10_000], &[]).unwrap();
    let theirs = other.state().journal.path().unwrap().to_path_buf();
    fs::remove_file(theirs).unwrap();
    let r = s.evict(Some(per * 2), None).unwrap();
    assert_eq!((r.dropped, r.added), (1, 1), "{r:?}");
    assert_eq!(r.removed, 4, "{r:?}");
    assert_eq!(s.entry_files().unwrap().len(), 2);
    let st = s.stats().unwrap();
    assert_eq!((st.entries, st.bytes), (2, 2 * per));
    assert!(st.view_fresh && st.view_age.is_some());
}

#[test]
fn puts_are_refused_far_over_budget_while_another_evicts() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), Some(100_000));
    // Another process holds the evictor lock and the view says the cache is far over.
    let other = open(d.path(), None);
    let _held = other
        .locks
        .try_lock_for(EVICT_LOCK, Duration::ZERO)
        .unwrap()
        .unwrap();
    fill_over_budget(&other, &s);
    assert!(!s.put(key("k"), &[1u8; 10_000], &[]).unwrap());
    assert_eq!(s.counters.get(Counter::PutsRefused), 1);
    drop(_held);
    assert!(
        s.put(key("k"), &[1u8; 10_000], &[]).unwrap(),
        "evicts, then admits"
    );
}

/// `other` fills the cache to twice the 100 kB budget of `s`, whose view then knows it.
fn fill_over_budget(other: &Store, s: &Store) {
    put_many(other, "o", 20, &[1u8; 10_000]);
    other.flush();
    s.stats().unwrap();
}

/// `fill_over_budget`, then `other` takes the evictor lock (returned).
fn over_budget_and_locked(other: &Store, s: &Store) -> LockGuard {
    fill_over_budget(other, s);
    other
        .locks
        .try_lock_for(EVICT_LOCK, Duration::ZERO)
        .unwrap()
        .unwrap()
}

/// Returns once a put on `s` is waiting for the evictor lock: `s` has read its view twice
/// since `before` (a put over budget reads it once before it waits, then at each look while
/// it waits). Gives up when `done` is set (the put returned first: its assertions then
/// fail, rather than this wait hang). Orders the threads without timing them.
fn until_a_put_waits(s: &Store, before: Option<Instant>, done: &AtomicBool) {
    let mut last = before;
    let mut reads = 0;
    while reads < 2 && !done.load(Ordering::SeqCst) {
        let now = s.state().last_refresh;
        if now != last {
            reads += 1;
            last = now;
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_put_over_budget_waits_for_another_eviction_then_evicts_itself() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), Some(100_000));
    let other = open(d.path(), None);
    let held = over_budget_and_locked(&other, &s);
    let before = s.state().last_refresh;
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // The other evictor finishes while this put waits for it.
        scope.spawn(|| {
            until_a_put_waits(&s, before, &done);
            drop(held);
        });
        let put = s.put(key("k"), &[1u8; 10_000], &[]);
        done.store(true, Ordering::SeqCst);
        assert!(put.unwrap(), "waited, evicted, admitted");
    });
    assert_eq!(s.counters.get(Counter::PutsRefused), 0);
    assert!(s.counters.get(Counter::Evictions) > 0, "evicted itself");
    assert!(s.stats().unwrap().bytes <= 100_000);
}

#[test]
fn a_put_over_budget_is_admitted_when_another_evictor_frees_room_while_holding_the_lock() {
    let d = tempfile::tempdir().unwrap();
    // A wait long enough for a loaded machine; the other holds the lock for longer still.
    let s = Store::open(
        d.path(),
        StoreOptions {
            max_size: Some(100_000),
            lock_timeout: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .unwrap();
    let other = open(d.path(), None);
    let held = over_budget_and_locked(&other, &s);
    let before = s.state().last_refresh;
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // The other process evicts while this put waits, and keeps the lock until it returns.
        scope.spawn(|| {
            until_a_put_waits(&s, before, &done);
            for i in 0..15 {
                other.delete(key(&format!("o{i}"))).unwrap();
            }
            other.flush();
        });
        let put = s.put(key("k"), &[1u8; 10_000], &[]);
        done.store(true, Ordering::SeqCst);
        assert!(
            put.unwrap(),
            "admitted once the other's deletes were in the view"
        );
    });
    let still_held = s.locks.try_lock_for(EVICT_LOCK, Duration::ZERO).unwrap();
    assert!(still_held.is_none(), "admitted without the evictor lock");
    drop(held);
    assert_eq!(s.counters.get(Counter::PutsRefused), 0);
    assert_eq!(s.counters.get(Counter::Evictions), 0);
}

#[test]
fn a_put_path_eviction_makes_room_for_the_others_measured_puts() {
    // What one entry of these takes on disk.
    let one = {
        let d = tempfile::tempdir().unwrap();
        let s = open(d.path(), None);
        s.put(key("one"), &[1u8; 10_000], &[]).unwrap();
        s.stats().unwrap().bytes
    };
    // The same over-budget cache, once with a quiet fleet and once with a busy one.
    let bytes_after_a_put = |rate: f64| {
        let d = tempfile::tempdir().unwrap();
        let s = open(d.path(), Some(100_000));
        fill_over_budget(&open(d.path(), None), &s);
        {
            let mut st = s.state();
            // A window just begun: the put's refresh leaves the rate as set.
            let others = st.view.others_put_bytes;
            st.put_rate.set(rate, Instant::now(), others);
        }
        assert!(s.put(key("k"), &[1u8; 10_000], &[]).unwrap());
        (s.stats().unwrap().bytes, s.low_water(100_000))
    };
    let (quiet, low) = bytes_after_a_put(0.0);
    assert!(quiet > low - 2 * one, "{quiet} vs watermark {low}");
    // 1 MB/s over the 100 ms ahead is more than the 25% of the budget it may take.
    let (busy, _) = bytes_after_a_put(1_000_000.0);
    assert!(
        busy <= low - 25_000 + one && busy < quiet,
        "{busy} vs watermark {low}, quiet {quiet}"
    );
}

/// Every file under `dir` with its content, for before/after comparisons.
fn snapshot_tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let data = fs::read(&p).unwrap_or_default();
        out.push((p, data));
    }
    out.sort();
    out
}

#[test]
fn directories_swapped_for_links_while_open_are_skipped_and_counted() {
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(7 * 86400);
    for name in ["victim", ".victim", "x.lease"] {
        let p = outside.path().join(name);
        fs::write(&p, b"not the cache's").unwrap();
        fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let s = Store::open(
        d.path(),
        StoreOptions {
            max_size: Some(64 << 10),
            tmp_grace: Duration::ZERO,
            trash_grace: Duration::ZERO,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(s.put(key("before"), &[1u8; 3000], &[]).unwrap());
    let before = snapshot_tree(outside.path());
    let shard = d.path().join(Layout::shard_rel(entry_name(b"k1")).as_str());
    for sub in [
        d.path().join("tmp"),
        d.path().join("trash"),
        d.path().join("locks/claims"),
        shard,
    ] {
        let _ = fs::create_dir_all(&sub);
        fs::rename(&sub, sub.with_extension("moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), &sub).unwrap();
    }
    for i in 0..30 {
        let k = format!("k{i}");
        let _ = s.put(key(&k), &[2u8; 3000], &[]);
        let _ = s.get(key(&k));
    }
    let _ = s.claim(key("c"), Duration::ZERO);
    let _ = s.evict(Some(1), Some(Duration::ZERO));
    let _ = s.verify(true, &mut |_, _| {});
    let _ = s.clear(false);
    assert_eq!(snapshot_tree(outside.path()), before);
    assert!(s.counters().get(Counter::UnsafePaths) > 0);
}

#[test]
fn an_unreadable_journal_is_skipped_and_reported() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), Some(1 << 20));
    assert!(s.put(key("mine"), b"v", &[]).unwrap());
    // A journal that is not a regular file stands for one this user cannot read.
    fs::create_dir(d.path().join("journal/otherhost-7-1.log")).unwrap();
    let st = s.stats().unwrap();
    assert_eq!(st.entries, 1);
    // A process whose first call is stats() sees the count at once.
    let d2 = tempfile::tempdir().unwrap();
    drop(open(d2.path(), None));
    fs::create_dir(d2.path().join("journal/otherhost-7-1.log")).unwrap();
    let unreadable = Store::counter_names()
        .iter()
        .position(|n| *n == "unreadable")
        .unwrap();
    let first = open(d2.path(), None).stats().unwrap();
    assert_eq!(first.counters[unreadable], 1);
    let r = s.evict(None, None).unwrap();
    assert!(
        r.skipped_files
            .iter()
            .any(|f| f.contains("otherhost-7-1.log")),
        "{:?}",
        r.skipped_files
    );
    assert_eq!(s.counters().get(Counter::Unreadable), 1);
    let v = s.verify(true, &mut |_, _| {}).unwrap();
    assert!(v.skipped_files.iter().any(|f| f.contains("otherhost")));
}

#[test]
fn explicit_evict_reconciles_every_shard_batch_over_a_snapshot() {
    // Entries in every batch of shards, most of them in a snapshot (read a block at a
    // time), then files gone and files unindexed across all of them: the listing is walked
    // a batch of shards at a time against the view in name order.
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    put_many(&s, "k", 400, &[7u8; 100]);
    {
        let mut st = s.state();
        s.compact_locked(&mut st);
        assert!(st.view.snapshot_bytes > 0);
    }
    for i in (0..400).step_by(10) {
        fs::remove_file(s.layout.entry_path(entry_name(format!("k{i}").as_bytes()))).unwrap();
    }
    let other = open(d.path(), None);
    put_many(&other, "x", 30, &[1u8; 100]);
    let theirs = other.state().journal.path().unwrap().to_path_buf();
    fs::remove_file(theirs).unwrap();
    let r = s.evict(None, None).unwrap();
    assert_eq!((r.dropped, r.added, r.removed), (40, 30, 0), "{r:?}");
    assert_eq!(s.stats().unwrap().entries, 390);
    assert_eq!(s.entry_files().unwrap().len(), 390);
    // Reconciled: a second pass finds nothing to change.
    let r = s.evict(None, None).unwrap();
    assert_eq!((r.dropped, r.added), (0, 0), "{r:?}");
}

fn opts_refresh(max: Option<u64>, read_only: bool) -> StoreOptions {
    StoreOptions {
        max_size: max,
        read_only,
        refresh_interval: Duration::from_millis(50),
        ..Default::default()
    }
}

#[test]
fn the_stored_budget_bounds_every_process_which_may_only_lower_it() {
    let d = tempfile::tempdir().unwrap();
    let unbounded = Store::open(d.path(), opts_refresh(None, false)).unwrap();
    let larger = Store::open(d.path(), opts_refresh(Some(10_000_000), false)).unwrap();
    let smaller = Store::open(d.path(), opts_refresh(Some(50_000), false)).unwrap();
    let ro = Store::open(d.path(), opts_refresh(None, true)).unwrap();
    assert_eq!(unbounded.max_size(), None);
    let stored = crate::stored_budget::StoredBudget {
        max_size: Some(100_000),
        max_age: None,
    };
    unbounded.write_stored_budget(&stored).unwrap();
    // Running processes take the change within the refresh interval.
    std::thread::sleep(Duration::from_millis(60));
    for s in [&unbounded, &larger, &ro] {
        s.stats().unwrap();
        assert_eq!(s.max_size(), Some(100_000));
        assert_eq!(s.stored_budget(), stored);
    }
    assert_eq!(smaller.max_size(), Some(50_000));
    // Processes with no budget of their own, or a larger one, keep the cache within the
    // stored one.
    for i in 0..60 {
        let w = if i % 2 == 0 { &unbounded } else { &larger };
        w.put(key(&format!("k{i}")), &[7u8; 8000], &[]).unwrap();
    }
    larger.evict(None, None).unwrap();
    assert!(unbounded.stats().unwrap().bytes <= 100_000);
    assert!(matches!(
        ro.write_stored_budget(&stored),
        Err(StoreError::ReadOnly(_))
    ));
    // Unset: today's behaviour again.
    unbounded
        .write_stored_budget(&crate::stored_budget::StoredBudget::default())
        .unwrap();
    assert_eq!(unbounded.max_size(), None);
    assert_eq!(larger.max_size(), Some(100_000));
    std::thread::sleep(Duration::from_millis(60));
    larger.stats().unwrap();
    assert_eq!(larger.max_size(), Some(10_000_000));
}

/// Settings the file cannot hold are refused when written, by any caller: a max age under a
/// second would be stored as none, and a file holding none is ignored by every process, its
/// budget with it.
#[test]
fn settings_out_of_bounds_are_refused_and_the_stored_ones_kept() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), opts_refresh(None, false)).unwrap();
    let stored = crate::stored_budget::StoredBudget {
        max_size: Some(100_000),
        max_age: Some(Duration::from_secs(3600)),
    };
    s.write_stored_budget(&stored).unwrap();
    for (bad, field) in [
        (
            crate::stored_budget::StoredBudget {
                max_age: Some(Duration::from_millis(500)),
                ..stored
            },
            "max_age",
        ),
        (
            crate::stored_budget::StoredBudget {
                max_age: Some(Duration::ZERO),
                ..stored
            },
            "max_age",
        ),
        (
            crate::stored_budget::StoredBudget {
                max_size: Some(0),
                ..stored
            },
            "max_size",
        ),
    ] {
        match s.write_stored_budget(&bad) {
            Err(StoreError::Invalid(msg)) => assert!(msg.starts_with(field), "{msg}"),
            other => panic!("{bad:?} not refused: {other:?}"),
        }
        let fresh = Store::open(d.path(), opts_refresh(None, false)).unwrap();
        assert_eq!(fresh.stored_budget(), stored, "{bad:?}");
        assert_eq!(fresh.counters.get(Counter::UnsafePaths), 0, "{bad:?}");
    }
}

#[test]
fn a_hostile_config_is_ignored_with_one_warning_and_a_count() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), opts_refresh(Some(1000), false)).unwrap();
    fs::write(d.path().join("CONFIG"), "xla_pcache-config 1\nmax-size 1\n").unwrap();
    s.stats().unwrap();
    assert_eq!(s.max_size(), Some(1));
    fs::remove_file(d.path().join("CONFIG")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", d.path().join("CONFIG")).unwrap();
    s.stats().unwrap();
    s.stats().unwrap();
    assert_eq!(s.max_size(), Some(1000));
    assert_eq!(s.counters.get(Counter::UnsafePaths), 1);
}

#[test]
fn entries_unused_past_the_stored_max_age_are_evicted_by_puts() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), opts_refresh(None, false)).unwrap();
    s.put(key("old"), b"v", &[]).unwrap();
    s.put(key("used"), b"v", &[]).unwrap();
    s.write_stored_budget(&crate::stored_budget::StoredBudget {
        max_size: None,
        max_age: Some(Duration::from_secs(1)),
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    // A hit records a use (hit_interval is per process: a fresh process reads it).
    let reader = Store::open(d.path(), opts_refresh(None, false)).unwrap();
    assert!(reader.get(key("used")).unwrap().is_some());
    reader.flush();
    drop(reader);
    std::thread::sleep(Duration::from_millis(500));
    s.put(key("new"), b"v", &[]).unwrap();
    assert!(s.get(key("old")).unwrap().is_none(), "old entry kept");
    assert!(s.get(key("used")).unwrap().is_some());
    assert!(s.get(key("new")).unwrap().is_some());
    assert_eq!(s.counters.get(Counter::Evictions), 1);
}

#[test]
fn an_uncounted_read_counts_no_lookup_until_count_hit() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    let meta = vec![("compile_time_s".to_string(), "1.5".to_string())];
    assert!(s.put(key("k"), b"payload", &meta).unwrap());
    let c = |k: Counter| s.counters.get(k);
    let blob = s.get_uncounted(key("k")).unwrap().unwrap();
    assert!(s.get_uncounted(key("absent")).unwrap().is_none());
    assert_eq!((c(Counter::Hits), c(Counter::Misses)), (0, 0));
    assert_eq!((c(Counter::BytesRead), c(Counter::CompileSavedMs)), (0, 0));
    // Nor a use of the entry (what eviction goes by): a read ahead may never be used.
    s.flush();
    let hits = |s: &Store| s.entries().unwrap()[0].hits;
    assert_eq!(hits(&open(d.path(), None)), 0);
    // Served later: counted as the get it stands for, its use with it.
    s.count_hit(&blob);
    assert_eq!((c(Counter::Hits), c(Counter::BytesRead)), (1, 7));
    assert_eq!(c(Counter::CompileSavedMs), 1500);
    s.flush();
    assert_eq!(hits(&open(d.path(), None)), 1);
    s.get(key("k")).unwrap().unwrap();
    assert_eq!((c(Counter::Hits), c(Counter::BytesRead)), (2, 14));
    // Damage is still found and counted (and removed) by an uncounted read.
    let path = s.layout.entry_path(entry_name(b"k"));
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert!(s.get_uncounted(key("k")).unwrap().is_none());
    assert_eq!(c(Counter::Corrupt), 1);
    assert_eq!(c(Counter::Misses), 0);
    assert!(!path.exists());
}

#[test]
fn a_touch_records_a_use_and_counts_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    assert!(s.put(key("record"), b"module", &[]).unwrap());
    assert!(s.touch(key("record")).unwrap());
    assert!(!s.touch(key("absent")).unwrap());
    let c = |k: Counter| s.counters.get(k);
    assert_eq!(
        (c(Counter::Hits), c(Counter::Misses), c(Counter::BytesRead)),
        (0, 0, 0)
    );
    s.flush();
    // A use, as a hit records one: what eviction goes by.
    assert_eq!(open(d.path(), None).entries().unwrap()[0].hits, 1);
    // A read-only store records no use.
    let ro = Store::open(d.path(), opts_refresh(None, true)).unwrap();
    assert!(!ro.touch(key("record")).unwrap());
    // A directory where the entry would be is not an entry.
    let squat = s.layout.entry_path(entry_name(b"squat"));
    std::fs::create_dir_all(&squat).unwrap();
    assert!(!s.touch(key("squat")).unwrap());
}

#[test]
fn prefetch_counters_by_name_reach_the_journal() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    assert!(s.add_prefetch("used", 3));
    assert!(s.add_prefetch("saved_ms", 1200));
    assert!(!s.add_prefetch("hits", 1), "not a prefetch counter");
    assert!(
        !s.add_prefetch("prefetch_used", 1),
        "named without the prefix"
    );
    assert_eq!(s.counters.get(Counter::Hits), 0);
    s.flush();
    let st = open(d.path(), None).stats().unwrap();
    assert_eq!(st.counters[Counter::PrefetchUsed as usize], 3);
    assert_eq!(st.counters[Counter::PrefetchSavedMs as usize], 1200);
}

#[test]
fn an_adopted_lookup_is_a_hit_that_saved_only_what_is_known() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None);
    s.count_adopted(1000, Some(2500));
    s.count_adopted(500, None);
    let c = |k: Counter| s.counters.get(k);
    assert_eq!((c(Counter::Hits), c(Counter::Adopted)), (2, 2));
    assert_eq!(c(Counter::Misses), 0);
    assert_eq!(c(Counter::BytesRead), 1500);
    // Unknown adds nothing: never counted as 0 s, nor as a guess.
    assert_eq!(c(Counter::CompileSavedMs), 2500);
    s.flush();
    let st = open(d.path(), None).stats().unwrap();
    assert_eq!(st.counters[Counter::Adopted as usize], 2);
    assert_eq!(st.counters[Counter::Hits as usize], 2);
}

#[test]
fn a_store_on_its_own_handle_never_follows_a_swap() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("local");
    std::fs::create_dir(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
    let fd: std::os::fd::OwnedFd = std::fs::File::open(&path).unwrap().into();
    let opts = || StoreOptions {
        own_root: Some(Arc::new(fd.try_clone().unwrap())),
        ..Default::default()
    };
    let s = Store::open(&path, opts()).unwrap();
    assert!(s.put(key("k"), b"ours", &[]).unwrap());
    // Someone who can write the parent renames it away and puts a store of theirs in place.
    std::fs::rename(&path, d.path().join("moved")).unwrap();
    let theirs = open(&path, None);
    assert!(theirs.put(key("planted"), b"theirs", &[]).unwrap());
    assert!(theirs.put(key("k"), b"theirs", &[]).unwrap());
    assert_eq!(s.get(key("k")).unwrap().unwrap().payload(), b"ours");
    assert!(s.get(key("planted")).unwrap().is_none());
    assert!(s.put(key("new"), b"ours too", &[]).unwrap());
    assert!(theirs.get(key("new")).unwrap().is_none());
    let moved = open(&d.path().join("moved"), None);
    assert_eq!(
        moved.get(key("new")).unwrap().unwrap().payload(),
        b"ours too"
    );
    // A handle on a directory others can write is refused when the store opens.
    std::fs::set_permissions(
        d.path().join("moved"),
        std::fs::Permissions::from_mode(0o770),
    )
    .unwrap();
    assert!(matches!(
        Store::open(&path, opts()),
        Err(StoreError::Invalid(m)) if m.contains("writable by others")
    ));
}

#[test]
fn a_planted_takeover_ticket_never_makes_an_explicit_evict_fail() {
    // A keyless writer leaves a dead holder's evictor lease and a directory where its
    // takeover ticket goes: the eviction is skipped (warned, counted), never an error.
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(
        tmp.path(),
        StoreOptions {
            lock_mode: crate::lock::LockMode::Lease,
            lease_time: Duration::from_millis(30),
            lock_timeout: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .unwrap();
    let locks = tmp.path().join("locks");
    std::fs::create_dir_all(&locks).unwrap();
    let dead = "gone 1 0000000000000001 0\n";
    std::fs::write(locks.join(format!("{EVICT_LOCK}.lease")), dead).unwrap();
    std::fs::create_dir(locks.join(crate::lock::ticket_name(EVICT_LOCK, dead, 0))).unwrap();
    let errors = s.counters.get(Counter::Errors);
    let r = s.evict(None, None);
    assert!(r.is_ok(), "{r:?}");
    assert!(r.unwrap().skipped.is_some());
    assert_eq!(s.counters.get(Counter::Errors), errors + 1);
}
