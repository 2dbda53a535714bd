//! Unit tests of what a later release left in the directory (ARCHITECTURE.md, "Formats of
//! other releases"): an entry of a newer format is a miss counted `newer_format`, never
//! removed nor replaced as damage (get, put, delete, verify --repair, clear); it is budgeted
//! and evicted by LRU as any entry; a newer snapshot, journal records and CONFIG are not
//! destroyed by this release's compaction or `config`; and what a key-less writer plants as
//! "newer" cannot block a signer's key.

use super::*;
use crate::entry;
use crate::hash::{entry_name, name_hex};
use crate::journal::JournalRecord;
use crate::sign;
use crate::stored_budget::StoredBudget;

fn key(s: &str) -> Key<'_> {
    Key {
        bytes: s.as_bytes(),
        is_text: true,
    }
}

fn open_with(dir: &Path, opts: StoreOptions) -> Store {
    Store::open(dir, opts).unwrap()
}

fn open(dir: &Path) -> Store {
    open_with(dir, StoreOptions::default())
}

fn signer(name: &str, byte: u8) -> Arc<Signer> {
    Arc::new(Signer::new(name, &[byte; 32]).unwrap())
}

fn trust(s: &Signer) -> Option<Arc<TrustSet>> {
    let keys = vec![(s.name().to_string(), s.public_key().to_vec())];
    Some(Arc::new(TrustSet::new(&keys).unwrap()))
}

/// `file` (a whole entry file) as a later release would write it: format version `v`, its
/// header checksum recomputed, so that only the version is unknown.
fn as_version(file: &[u8], v: u16) -> Vec<u8> {
    let mut f = file.to_vec();
    let h = entry::decode_header(&f).unwrap();
    f[4..6].copy_from_slice(&v.to_le_bytes());
    let sum = entry::header_checksum(&f[..h.header_len]);
    f[56..64].copy_from_slice(&sum.to_le_bytes());
    f
}

/// An entry file of `k` with `payload`, written by a scratch store (never a later one).
fn entry_file(k: &str, payload: &[u8]) -> Vec<u8> {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path());
    s.put(key(k), payload, &[]).unwrap();
    s.get_entry_file(key(k)).unwrap().unwrap()
}

/// Writes `bytes` at the entry name `name` of the cache at `root`, as a later release (or a
/// writer of the directory) would.
fn plant(root: &Path, name: u128, bytes: &[u8]) -> std::path::PathBuf {
    let hex = name_hex(name);
    let path = root.join("entries").join(&hex[..2]).join(&hex);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn newer_count(s: &Store) -> u64 {
    s.counters.get(Counter::NewerFormat)
}

#[test]
fn a_newer_entry_is_a_miss_counted_apart_and_left_in_place() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path());
    let newer = as_version(&entry_file("k", &[5u8; 300_000]), 2);
    let path = plant(d.path(), entry_name(b"k"), &newer);
    for _ in 0..2 {
        assert!(s.get(key("k")).unwrap().is_none());
    }
    assert_eq!(newer_count(&s), 2);
    assert_eq!(s.counters.get(Counter::Corrupt), 0);
    assert_eq!(s.counters.get(Counter::Misses), 2);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        newer,
        "never removed by a get"
    );
    // Not an entry this release can hand out, but one that is there.
    assert!(s.get_entry_file(key("k")).unwrap().is_none());
    assert!(s.contains(key("k")).unwrap());
    // A small one (read, not mapped) and a large one (mapped) alike.
    let small = as_version(&entry_file("s", b"tiny"), 9);
    let small_path = plant(d.path(), entry_name(b"s"), &small);
    assert!(s.get(key("s")).unwrap().is_none());
    assert_eq!(std::fs::read(&small_path).unwrap(), small);
    assert_eq!(newer_count(&s), 3);
}

#[test]
fn a_put_never_replaces_a_newer_entry_and_a_delete_leaves_it() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path());
    let newer = as_version(&entry_file("k", b"later"), 2);
    let path = plant(d.path(), entry_name(b"k"), &newer);
    // First writer wins: the name is taken.
    assert!(!s.put(key("k"), b"this release's", &[]).unwrap());
    assert_eq!(s.counters.get(Counter::PutExists), 1);
    assert!(!s.delete(key("k")).unwrap());
    // `Store.replace` is a delete, then a put: neither touches it.
    assert!(!s.put(key("k"), b"again", &[]).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), newer);
    // A received copy of it (a tier's value, a bundle member) is refused as newer, not
    // corrupt, and nothing is written.
    let other = tempfile::tempdir().unwrap();
    let o = open(other.path());
    let verdict = o.take_entry_file(key("k"), newer.clone(), true).unwrap();
    assert_eq!(verdict.err(), Some(gate::Refusal::NewerFormat(2)));
    assert_eq!(
        o.put_entry_file(key("k"), &newer).unwrap().err(),
        Some(gate::Refusal::NewerFormat(2))
    );
    assert_eq!(newer_count(&o), 2);
    assert!(!o.contains(key("k")).unwrap());
    // A tier's first bytes tell it too.
    let name = name_hex(entry_name(b"k"));
    assert_eq!(
        gate::judge_head(&newer[..64], &name, newer.len() as u64),
        Err(gate::Refusal::NewerFormat(2))
    );
    assert_eq!(gate::head_key(&newer), Err(gate::Refusal::NewerFormat(2)));
}

#[test]
fn repair_keeps_and_indexes_a_newer_entry_clear_leaves_it_and_clear_all_removes_it() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path());
    s.put(key("mine"), &[1u8; 10_000], &[]).unwrap();
    let newer = as_version(&entry_file("k", &[2u8; 10_000]), 3);
    let path = plant(d.path(), entry_name(b"k"), &newer);
    let mut corrupt = entry_file("c", &[3u8; 100]);
    *corrupt.last_mut().unwrap() ^= 1;
    let corrupt_path = plant(d.path(), entry_name(b"c"), &corrupt);

    let report = s.verify(true, &mut |_, _| {}).unwrap();
    assert_eq!(report.corrupt.len(), 1);
    assert_eq!(report.newer_format.len(), 1);
    assert_eq!(report.entries, 1);
    assert!(path.exists() && !corrupt_path.exists());
    // Indexed: the budget holds it.
    let fresh = open(d.path());
    assert_eq!(fresh.len().unwrap(), 2);

    assert_eq!(fresh.clear(false).unwrap(), 1);
    assert_eq!(std::fs::read(&path).unwrap(), newer);
    assert!(fresh.get(key("mine")).unwrap().is_none());
    let after = open(d.path());
    assert_eq!(after.len().unwrap(), 1, "still indexed after the clear");
    assert_eq!(after.clear(true).unwrap(), 1);
    assert!(!path.exists());
    assert_eq!(open(d.path()).len().unwrap(), 0);
}

#[test]
fn eviction_removes_a_newer_entry_by_lru_as_any_other() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path());
    let newer = as_version(&entry_file("old", &[9u8; 20_000]), 2);
    let path = plant(d.path(), entry_name(b"old"), &newer);
    // Indexed by the explicit evict's reconciliation, then the oldest goes first.
    std::thread::sleep(Duration::from_millis(20));
    s.put(key("young"), &[1u8; 20_000], &[]).unwrap();
    let report = s.evict(Some(30_000), None).unwrap();
    assert_eq!(report.removed, 1);
    assert!(!path.exists(), "evicted by LRU like any entry");
    assert!(s.get(key("young")).unwrap().is_some());
}

#[test]
fn a_newer_file_planted_at_a_signers_names_never_blocks_the_signer() {
    let d = tempfile::tempdir().unwrap();
    let ci = signer("ci-1", 1);
    let w = open_with(
        d.path(),
        StoreOptions {
            signer: Some(ci.clone()),
            trust: trust(&ci),
            ..Default::default()
        },
    );
    // A key-less writer plants "newer" files at the plain name and at the signer's own.
    let fake = as_version(&entry_file("k", b"planted"), 60_000);
    let plain = plant(d.path(), entry_name(b"k"), &fake);
    let own = plant(d.path(), sign::signed_name(b"k", "ci-1"), &fake);
    assert!(w.get(key("k")).unwrap().is_none());
    // The signer's put goes to its own name, which belongs to this format: what is there
    // that is no trusted entry of this signer (a forger's, "newer" or not) is replaced.
    assert!(w.put(key("k"), b"compiled", &[]).unwrap());
    assert_eq!(w.get(key("k")).unwrap().unwrap().payload(), b"compiled");
    assert_eq!(
        std::fs::read(&plain).unwrap(),
        fake,
        "the plain name is left"
    );
    assert_ne!(std::fs::read(&own).unwrap(), fake);
    // A trusting reader that never wrote: plain newer, then the signer's own.
    let r = open_with(
        d.path(),
        StoreOptions {
            trust: trust(&ci),
            read_only: true,
            ..Default::default()
        },
    );
    assert_eq!(r.get(key("k")).unwrap().unwrap().payload(), b"compiled");
}

fn write_snapshot_version(root: &Path, v: u32) {
    let path = root.join("index").join("snapshot");
    let mut b = std::fs::read(&path).unwrap();
    b[4..8].copy_from_slice(&v.to_le_bytes());
    std::fs::write(&path, b).unwrap();
}

#[test]
fn compaction_never_replaces_a_later_snapshot_nor_drops_later_journal_records() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path());
    s.put(key("a"), b"1", &[]).unwrap();
    s.verify(true, &mut |_, _| {}).unwrap(); // compacts: a snapshot of this version
    write_snapshot_version(d.path(), crate::snapshot::SNAP_VERSION + 1);
    let later = std::fs::read(d.path().join("index/snapshot")).unwrap();
    // A later release's journal, of a process gone: a record of a kind this one does not
    // know among known ones.
    // (Pids above the kernel's largest: their processes are gone.)
    let journal = |pid: u32| {
        d.path()
            .join("journal")
            .join(format!("{}-{pid}-1.log", s.host))
    };
    let mut known = Vec::new();
    JournalRecord::Clear { t: 1 }.encode(&mut known);
    let mut rec = known.clone();
    rec[1] = 200;
    let sum = crate::hash::checksum(&rec[..rec.len() - 8]);
    let n = rec.len();
    rec[n - 8..].copy_from_slice(&sum.to_le_bytes());
    let jpath = journal(4_194_400);
    std::fs::write(&jpath, [known.clone(), rec].concat()).unwrap();
    let plain_journal = journal(4_194_401);
    std::fs::write(&plain_journal, &known).unwrap();

    let other = open(d.path());
    other.put(key("b"), b"2", &[]).unwrap();
    other.verify(true, &mut |_, _| {}).unwrap();
    assert_eq!(
        std::fs::read(d.path().join("index/snapshot")).unwrap(),
        later
    );
    assert!(jpath.exists());
    // Once this release may compact (the later snapshot gone), it folds the rest but keeps
    // the journal holding later records.
    std::fs::remove_file(d.path().join("index/snapshot")).unwrap();
    other.verify(true, &mut |_, _| {}).unwrap();
    assert!(d.path().join("index/snapshot").exists());
    assert!(
        jpath.exists(),
        "a later release's records are that release's to fold"
    );
    assert!(
        !plain_journal.exists(),
        "a journal of this release's records is folded"
    );
}

#[test]
fn config_never_replaces_a_later_config() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path());
    let later = "xla_pcache-config 2\nmax-size 100\nsomething-new 1\n";
    std::fs::write(d.path().join("CONFIG"), later).unwrap();
    let budget = StoredBudget {
        max_size: Some(1 << 20),
        max_age: None,
    };
    assert!(matches!(
        s.write_stored_budget(&budget),
        Err(StoreError::Format(_))
    ));
    assert!(matches!(
        s.write_stored_budget(&StoredBudget::default()),
        Err(StoreError::Format(_))
    ));
    assert_eq!(
        std::fs::read_to_string(d.path().join("CONFIG")).unwrap(),
        later
    );
    // One of this version is replaced as before.
    std::fs::write(
        d.path().join("CONFIG"),
        "xla_pcache-config 1\nmax-size 100\n",
    )
    .unwrap();
    s.write_stored_budget(&budget).unwrap();
    assert_eq!(s.stored_budget(), budget);
}

#[test]
fn a_later_snapshot_stops_compaction_for_a_day_at_most() {
    // A later release rewrites its snapshot whenever it compacts; one no release rewrote for
    // a day (or one planted to stop compaction) is replaced.
    let day = 24 * 3600 * 1_000_000_000u64;
    let now = 10 * day;
    assert!(super::evict::kept_for_its_release(
        now - 60_000_000_000,
        now
    ));
    assert!(super::evict::kept_for_its_release(now - day, now));
    assert!(!super::evict::kept_for_its_release(now - day - 1, now));
    // A change time ahead of this host's clock (another host's) keeps it, as a fresh one.
    assert!(super::evict::kept_for_its_release(now + day, now));
}
