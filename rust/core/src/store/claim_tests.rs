//! Unit tests of compile claims (single flight): claim, wait, publish, abandon, takeover.

use super::claim::CLAIM_DIR;
use super::*;
use crate::hash::{entry_name, name_hex};
use std::sync::Arc;
use std::thread;

fn key(s: &str) -> Key<'_> {
    Key {
        bytes: s.as_bytes(),
        is_text: true,
    }
}

fn open_with(dir: &Path, lease_ms: u64, read_only: bool) -> Store {
    Store::open(
        dir,
        StoreOptions {
            read_only,
            claim_lease: Duration::from_millis(lease_ms),
            ..Default::default()
        },
    )
    .unwrap()
}

fn lease_file(dir: &Path, k: &str) -> PathBuf {
    dir.join("locks")
        .join(CLAIM_DIR)
        .join(format!("{}.lease", name_hex(entry_name(k.as_bytes()))))
}

fn counter(s: &Store, c: Counter) -> u64 {
    s.counters().get(c)
}

#[test]
fn one_claims_the_other_waits_for_the_put() {
    let d = tempfile::tempdir().unwrap();
    let a = open_with(d.path(), 30_000, false);
    let b = Arc::new(open_with(d.path(), 30_000, false));
    let got = a.claim(key("k"), Duration::from_secs(5)).unwrap();
    assert_eq!(got.state, ClaimState::Claimed);
    assert_eq!(got.waited, Duration::ZERO);
    assert!(got.claim.as_ref().unwrap().held());
    assert!(lease_file(d.path(), "k").exists());
    assert_eq!(counter(&a, Counter::ClaimsTaken), 1);

    let waiter = {
        let b = Arc::clone(&b);
        thread::spawn(move || b.claim(key("k"), Duration::from_secs(10)).unwrap())
    };
    thread::sleep(Duration::from_millis(300));
    assert!(a.put(key("k"), b"value", &[]).unwrap());
    // The put released the claim: its file is gone.
    assert!(!lease_file(d.path(), "k").exists());
    assert!(!got.claim.as_ref().unwrap().held());
    let seen = waiter.join().unwrap();
    assert_eq!(seen.state, ClaimState::Published);
    assert!(seen.claim.is_none());
    assert!(
        seen.waited >= Duration::from_millis(250),
        "{:?}",
        seen.waited
    );
    assert!(seen.waited < Duration::from_secs(3), "{:?}", seen.waited);
    assert_eq!(b.get(key("k")).unwrap().unwrap().payload(), b"value");
    assert_eq!(counter(&b, Counter::ClaimWaits), 1);
    assert!(counter(&b, Counter::ClaimWaitMs) >= 250);
    assert_eq!(counter(&b, Counter::ClaimsTaken), 0);
    assert_eq!(counter(&a, Counter::ClaimsAbandoned), 0);
    // Once published, a claim is never taken and nothing is waited for.
    let again = b.claim(key("k"), Duration::from_secs(5)).unwrap();
    assert_eq!(again.state, ClaimState::Published);
    assert_eq!(again.waited, Duration::ZERO);
    assert!(!lease_file(d.path(), "k").exists());
}

#[test]
fn a_release_without_put_tells_waiters_at_once_and_the_next_claimer_goes_ahead() {
    let d = tempfile::tempdir().unwrap();
    let a = open_with(d.path(), 30_000, false);
    let b = Arc::new(open_with(d.path(), 30_000, false));
    let mut got = a.claim(key("k"), Duration::from_secs(5)).unwrap();
    let waiter = {
        let b = Arc::clone(&b);
        thread::spawn(move || b.claim(key("k"), Duration::from_secs(20)).unwrap())
    };
    thread::sleep(Duration::from_millis(200));
    got.claim.as_mut().unwrap().release();
    let seen = waiter.join().unwrap();
    assert_eq!(seen.state, ClaimState::Abandoned, "the holder gave up");
    a.flush();
    assert_eq!(counter(&a, Counter::ClaimsAbandoned), 1);
    // The retired claim stays for a while so that every waiter sees it...
    let content = fs::read_to_string(lease_file(d.path(), "k")).unwrap();
    assert!(content.trim_end().ends_with("retired"), "{content:?}");
    // ...and a new claimer takes it without waiting (it is not a takeover).
    let c = open_with(d.path(), 30_000, false);
    let next = c.claim(key("k"), Duration::from_secs(5)).unwrap();
    assert_eq!(next.state, ClaimState::Claimed);
    assert!(!next.took_over);
    assert_eq!(
        counter(&c, Counter::ClaimWaits),
        0,
        "taken at the first look"
    );
    assert_eq!(counter(&c, Counter::ClaimTakeovers), 0);
}

#[test]
fn a_retired_claim_is_removed_after_its_linger() {
    let d = tempfile::tempdir().unwrap();
    let a = open_with(d.path(), 30_000, false);
    let mut got = a.claim(key("k"), Duration::ZERO).unwrap();
    got.claim.as_mut().unwrap().release();
    assert!(lease_file(d.path(), "k").exists());
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease_file(d.path(), "k").exists() {
        assert!(
            Instant::now() < deadline,
            "the retired claim was never removed"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_dead_holder_is_taken_over_after_the_lease_time() {
    let d = tempfile::tempdir().unwrap();
    let b = open_with(d.path(), 300, false);
    // A holder that died: a lease nobody heartbeats.
    let lease = lease_file(d.path(), "k");
    fs::create_dir_all(lease.parent().unwrap()).unwrap();
    fs::write(&lease, "otherhost 4242 00000000deadbeef 7\n").unwrap();
    let t = Instant::now();
    let got = b.claim(key("k"), Duration::from_secs(10)).unwrap();
    let took = t.elapsed();
    assert_eq!(got.state, ClaimState::Claimed);
    assert!(got.took_over);
    // Never before the lease time: a lower bound, which a slow machine only makes larger.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert_eq!(counter(&b, Counter::ClaimTakeovers), 1);
    assert_eq!(counter(&b, Counter::ClaimWaits), 1);
    let content = fs::read_to_string(&lease).unwrap();
    assert!(!content.starts_with("otherhost"), "{content:?}");
}

#[test]
fn a_live_holder_is_heartbeated_and_never_taken_over() {
    let d = tempfile::tempdir().unwrap();
    let a = open_with(d.path(), 200, false);
    let b = open_with(d.path(), 200, false);
    let _held = a.claim(key("k"), Duration::ZERO).unwrap();
    // Five lease times: only heartbeats keep the claim from going stale.
    let got = b.claim(key("k"), Duration::from_millis(1000)).unwrap();
    assert_eq!(got.state, ClaimState::TimedOut);
    assert!(got.claim.is_none());
    assert!(got.waited >= Duration::from_millis(1000));
    assert_eq!(counter(&b, Counter::ClaimWaitTimeouts), 1);
    assert_eq!(counter(&b, Counter::ClaimTakeovers), 0);
    // Zero wait: one look, answered while the claim is still held.
    let got = b.claim(key("k"), Duration::ZERO).unwrap();
    assert_eq!(got.state, ClaimState::TimedOut);
    assert!(got.claim.is_none());
}

#[test]
fn read_only_waits_but_never_claims() {
    let d = tempfile::tempdir().unwrap();
    let a = open_with(d.path(), 30_000, false);
    let ro = Arc::new(open_with(d.path(), 30_000, true));
    let got = ro.claim(key("free"), Duration::from_secs(5)).unwrap();
    assert_eq!(got.state, ClaimState::Unclaimed);
    assert_eq!(got.waited, Duration::ZERO);
    assert!(!lease_file(d.path(), "free").exists());
    assert!(
        !d.path().join("locks").join(CLAIM_DIR).exists(),
        "a read-only store creates nothing"
    );

    let _held = a.claim(key("k"), Duration::ZERO).unwrap();
    let waiter = {
        let ro = Arc::clone(&ro);
        thread::spawn(move || ro.claim(key("k"), Duration::from_secs(10)).unwrap())
    };
    thread::sleep(Duration::from_millis(200));
    assert!(a.put(key("k"), b"v", &[]).unwrap());
    assert_eq!(waiter.join().unwrap().state, ClaimState::Published);

    // wait_for never claims, even on a writable store.
    let got = a.wait_for(key("other"), Duration::from_secs(5)).unwrap();
    assert_eq!(got.state, ClaimState::Unclaimed);
    assert!(!lease_file(d.path(), "other").exists());
}

#[test]
fn a_read_only_waiter_stops_at_a_stale_claim() {
    let d = tempfile::tempdir().unwrap();
    open_with(d.path(), 300, false);
    let ro = open_with(d.path(), 300, true);
    let lease = lease_file(d.path(), "k");
    fs::create_dir_all(lease.parent().unwrap()).unwrap();
    fs::write(&lease, "otherhost 4242 00000000deadbeef 7\n").unwrap();
    let got = ro.claim(key("k"), Duration::from_secs(10)).unwrap();
    assert_eq!(got.state, ClaimState::Unclaimed);
    assert!(got.waited >= Duration::from_millis(300));
    assert!(got.waited < Duration::from_secs(3));
    assert!(
        lease.exists(),
        "a read-only store leaves the stale claim alone"
    );
}

#[test]
fn closing_the_store_retires_its_claims() {
    let d = tempfile::tempdir().unwrap();
    let a = open_with(d.path(), 30_000, false);
    let got = a.claim(key("k"), Duration::ZERO).unwrap();
    assert_eq!(got.state, ClaimState::Claimed);
    a.close_claims();
    assert!(!got.claim.as_ref().unwrap().held());
    let content = fs::read_to_string(lease_file(d.path(), "k")).unwrap();
    assert!(content.trim_end().ends_with("retired"), "{content:?}");
    // A closed store claims nothing (and says so instead of pretending).
    assert_eq!(
        a.claim(key("j"), Duration::ZERO).unwrap().state,
        ClaimState::Unclaimed
    );
    let b = open_with(d.path(), 30_000, false);
    let next = b.claim(key("k"), Duration::ZERO).unwrap();
    assert_eq!(next.state, ClaimState::Claimed);
    drop(got);
    drop(next);
    drop(b);
}

#[test]
fn one_claim_per_key_among_threads_of_one_process() {
    let d = tempfile::tempdir().unwrap();
    let s = Arc::new(open_with(d.path(), 30_000, false));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                let got = s.claim(key("k"), Duration::from_secs(10)).unwrap();
                if got.state == ClaimState::Claimed {
                    thread::sleep(Duration::from_millis(200));
                    assert!(s.put(key("k"), b"v", &[]).unwrap());
                }
                got.state
            })
        })
        .collect();
    let states: Vec<ClaimState> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let claimed = states.iter().filter(|s| **s == ClaimState::Claimed).count();
    assert_eq!(claimed, 1, "{states:?}");
    assert!(
        states
            .iter()
            .all(|s| matches!(s, ClaimState::Claimed | ClaimState::Published)),
        "{states:?}"
    );
}

#[test]
fn invalid_keys_are_errors() {
    let d = tempfile::tempdir().unwrap();
    let s = open_with(d.path(), 30_000, false);
    assert!(matches!(
        s.claim(key(""), Duration::ZERO),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn sweeping_removes_claims_left_by_dead_holders_only() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(
        d.path(),
        StoreOptions {
            tmp_grace: Duration::from_secs(1),
            claim_lease: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .unwrap();
    let dead = lease_file(d.path(), "dead");
    fs::create_dir_all(dead.parent().unwrap()).unwrap();
    fs::write(&dead, "otherhost 4242 00000000deadbeef 7\n").unwrap();
    let live = s.claim(key("live"), Duration::ZERO).unwrap();
    assert_eq!(live.state, ClaimState::Claimed);
    // Twice the grace: the dead file is older than it by then, at the least. (A file's age
    // counts from its ctime, which cannot be set back.) The live claim is rewritten every
    // 25 ms, forty times within the grace.
    thread::sleep(Duration::from_secs(2));
    s.evict(None, None).unwrap();
    assert!(
        !dead.exists(),
        "an abandoned claim file older than tmp_grace is swept"
    );
    assert!(
        lease_file(d.path(), "live").exists(),
        "a heartbeated claim is never that old"
    );
    drop(live);
}
