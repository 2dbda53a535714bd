//! Unit tests of signed puts and trusting reads (`sign.rs`, "No squatting").

use super::*;
use crate::entry;
use crate::hash::{entry_name, name_hex};

fn key(s: &str) -> Key<'_> {
    Key {
        bytes: s.as_bytes(),
        is_text: true,
    }
}

fn signer(name: &str, byte: u8) -> Arc<Signer> {
    Arc::new(Signer::new(name, &[byte; 32]).unwrap())
}

fn trust(signers: &[&Signer]) -> Option<Arc<TrustSet>> {
    let keys: Vec<(String, Vec<u8>)> = signers
        .iter()
        .map(|s| (s.name().to_string(), s.public_key().to_vec()))
        .collect();
    Some(Arc::new(TrustSet::new(&keys).unwrap()))
}

fn open(dir: &Path, signer: Option<Arc<Signer>>, trust: Option<Arc<TrustSet>>) -> Store {
    open_ro(dir, signer, trust, false)
}

fn open_ro(
    dir: &Path,
    signer: Option<Arc<Signer>>,
    trust: Option<Arc<TrustSet>>,
    read_only: bool,
) -> Store {
    Store::open(
        dir,
        StoreOptions {
            signer,
            trust,
            read_only,
            ..Default::default()
        },
    )
    .unwrap()
}

fn meta() -> Vec<(String, String)> {
    vec![("framework".to_string(), "jax".to_string())]
}

fn payload(s: &Store, k: &str) -> Option<Vec<u8>> {
    s.get(key(k)).unwrap().map(|b| b.payload().to_vec())
}

#[test]
fn a_signed_put_is_served_to_trusting_and_untrusting_readers() {
    let d = tempfile::tempdir().unwrap();
    let ci = signer("ci-1", 1);
    let w = open(d.path(), Some(ci.clone()), None);
    assert!(w.put(key("k"), b"exe", &meta()).unwrap());
    let r = open(d.path(), None, trust(&[&ci]));
    let b = r.get(key("k")).unwrap().unwrap();
    assert_eq!(b.payload(), b"exe");
    assert_eq!(b.header.meta, meta(), "the signature is not producer meta");
    assert_eq!(b.header.signature.as_ref().unwrap().signer, "ci-1");
    assert_eq!(payload(&open(d.path(), None, None), "k").unwrap(), b"exe");
    let ro = open_ro(d.path(), None, trust(&[&ci]), true);
    assert_eq!(payload(&ro, "k").unwrap(), b"exe");
    assert_eq!(r.counters.get(Counter::Untrusted), 0);
    // A larger payload (mapped, hashed on every core) verifies too.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    assert!(w.put(key("big"), &big, &[]).unwrap());
    assert_eq!(payload(&r, "big").unwrap(), big);
}

#[test]
fn untrusted_and_unsigned_entries_are_counted_misses() {
    let d = tempfile::tempdir().unwrap();
    let ci = signer("ci-1", 1);
    let mallory = signer("mallory-1", 2);
    open(d.path(), Some(mallory), None)
        .put(key("m"), b"evil", &[])
        .unwrap();
    open(d.path(), None, None)
        .put(key("u"), b"evil", &[])
        .unwrap();
    let r = open(d.path(), None, trust(&[&ci]));
    // A read ahead refuses them too, and leaves the counting to the lookup it stands for.
    assert!(r.get_uncounted(key("m")).unwrap().is_none());
    assert_eq!(r.counters.get(Counter::Untrusted), 0);
    assert!(r.get(key("m")).unwrap().is_none());
    assert!(r.get(key("u")).unwrap().is_none());
    assert_eq!(r.counters.get(Counter::Untrusted), 2);
    assert_eq!(r.counters.get(Counter::Corrupt), 0);
    // Neither was removed: an untrusting reader still has them.
    assert_eq!(payload(&open(d.path(), None, None), "m").unwrap(), b"evil");
    let listed = r.untrusted_entries(false).unwrap();
    let mut why: Vec<String> = listed.iter().map(|(_, _, w)| w.clone()).collect();
    why.sort();
    assert_eq!(why, vec!["signed by mallory-1, not trusted", "unsigned"]);
    assert_eq!(r.untrusted_entries(true).unwrap().len(), 2);
    assert!(r.untrusted_entries(false).unwrap().is_empty());
    assert!(open(d.path(), None, None).get(key("m")).unwrap().is_none());
}

#[test]
fn a_squatted_key_is_still_served_from_the_trusted_writer() {
    let d = tempfile::tempdir().unwrap();
    let ci = signer("ci-1", 1);
    let mallory = signer("mallory-1", 2);
    for (k, squatter) in [("unsigned", None), ("signed", Some(mallory.clone()))] {
        assert!(open(d.path(), squatter, None)
            .put(key(k), b"evil", &[])
            .unwrap());
        let w = open(d.path(), Some(ci.clone()), trust(&[&ci]));
        assert!(w.put(key(k), b"good", &meta()).unwrap(), "{k}");
        // First writer wins among trusted entries: a second trusted put is an existing key.
        assert!(!w.put(key(k), b"good again", &meta()).unwrap());
        assert_eq!(payload(&w, k).unwrap(), b"good");
        let r = open_ro(d.path(), None, trust(&[&ci]), true);
        assert_eq!(payload(&r, k).unwrap(), b"good", "{k}");
        assert_eq!(r.counters.get(Counter::Untrusted), 0, "served, not refused");
        // An untrusting reader sees the first writer's entry, as before.
        assert_eq!(payload(&open(d.path(), None, None), k).unwrap(), b"evil");
        assert_eq!(
            w.get_entry_file(key(k))
                .unwrap()
                .map(|f| f.ends_with(b"good")),
            Some(true)
        );
    }
    let report = open(d.path(), None, None)
        .verify(false, &mut |_, _| {})
        .unwrap();
    assert!(
        report.foreign.is_empty() && report.corrupt.is_empty(),
        "{report:?}"
    );
    assert_eq!(report.entries, 4);
}

#[test]
fn a_squatter_of_the_signers_own_name_is_replaced() {
    let d = tempfile::tempdir().unwrap();
    let ci = signer("ci-1", 1);
    let forger = signer("ci-1", 9);
    // The plain name, then ci-1's own name, taken first by a forger calling itself ci-1.
    open(d.path(), None, None)
        .put(key("k"), b"evil", &[])
        .unwrap();
    let f = open(d.path(), Some(forger), trust(&[]));
    assert!(f.put(key("k"), b"forged", &[]).unwrap());
    let r = open(d.path(), None, trust(&[&ci]));
    assert!(r.get(key("k")).unwrap().is_none());
    let w = open(d.path(), Some(ci.clone()), None);
    assert!(w.put(key("k"), b"good", &[]).unwrap());
    assert_eq!(payload(&r, "k").unwrap(), b"good");
}

#[test]
fn rotation_two_trusted_keys_then_one_revoked() {
    let d = tempfile::tempdir().unwrap();
    let (ci1, ci2) = (signer("ci-1", 1), signer("ci-2", 2));
    open(d.path(), Some(ci1.clone()), None)
        .put(key("old"), b"1", &[])
        .unwrap();
    open(d.path(), Some(ci2.clone()), None)
        .put(key("new"), b"2", &[])
        .unwrap();
    let both = open(d.path(), None, trust(&[&ci1, &ci2]));
    assert_eq!(payload(&both, "old").unwrap(), b"1");
    assert_eq!(payload(&both, "new").unwrap(), b"2");
    let revoked = open(d.path(), None, trust(&[&ci2]));
    assert!(revoked.get(key("old")).unwrap().is_none());
    assert_eq!(payload(&revoked, "new").unwrap(), b"2");
    // The new key publishes beside the revoked key's entry.
    let w = open(d.path(), Some(ci2.clone()), trust(&[&ci2]));
    assert!(w.put(key("old"), b"1 again", &[]).unwrap());
    assert_eq!(payload(&revoked, "old").unwrap(), b"1 again");
}

#[test]
fn entry_files_carry_their_signature_and_trusting_stores_refuse_others() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let ci = signer("ci-1", 1);
    let src = open(a.path(), Some(ci.clone()), None);
    src.put(key("k"), &[7u8; 5000], &meta()).unwrap();
    let file = src.get_entry_file(key("k")).unwrap().unwrap();
    let dst = open(b.path(), None, trust(&[&ci]));
    let blob = dst
        .take_entry_file(key("k"), file.clone(), true)
        .unwrap()
        .unwrap();
    assert_eq!(blob.header.meta, meta());
    // Backfilled with its signature: a trusting reader of the copy hits.
    assert_eq!(payload(&dst, "k").unwrap(), vec![7u8; 5000]);
    let copied = dst.get_entry_file(key("k")).unwrap().unwrap();
    let sig = |f: &[u8]| entry::decode_header(f).unwrap().signature;
    assert!(sig(&copied).is_some() && sig(&copied) == sig(&file));

    let unsigned = open(c.path(), None, None);
    unsigned.put(key("u"), b"x", &[]).unwrap();
    let ufile = unsigned.get_entry_file(key("u")).unwrap().unwrap();
    assert!(dst
        .take_entry_file(key("u"), ufile.clone(), true)
        .unwrap()
        .is_err());
    assert!(dst.put_entry_file(key("u"), &ufile).unwrap().is_err());
    assert!(dst.verify_entry_file(key("u"), ufile).unwrap().is_err());
    assert_eq!(dst.counters.get(Counter::Untrusted), 3);
    assert!(!dst.contains(key("u")).unwrap());
}

#[test]
fn producers_cannot_write_signature_fields() {
    let d = tempfile::tempdir().unwrap();
    let s = open(d.path(), None, None);
    let m = vec![(crate::sign::META_SIGNER.to_string(), "ci-1".to_string())];
    assert!(matches!(
        s.put(key("k"), b"x", &m),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn delete_removes_the_signers_own_file_too() {
    let d = tempfile::tempdir().unwrap();
    let ci = signer("ci-1", 1);
    open(d.path(), None, None)
        .put(key("k"), b"evil", &[])
        .unwrap();
    let w = open(d.path(), Some(ci.clone()), trust(&[&ci]));
    assert!(w.put(key("k"), b"good", &[]).unwrap());
    assert!(w.contains(key("k")).unwrap());
    assert!(w.delete(key("k")).unwrap());
    assert!(!w.contains(key("k")).unwrap());
    assert!(w.entries().unwrap().is_empty());
}

#[test]
fn no_key_is_blocked_by_what_stands_at_its_names() {
    use std::os::unix::fs::symlink;
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"x").unwrap();
    let ci = signer("ci-1", 1);
    let at = |name: u128| d.path().join(Layout::entry_rel(name).as_str());
    // A directory (with a file and a link to outside inside), a FIFO and a link at both
    // names of three keys: the plain one and the trusted signer's own.
    let plant = |name: u128, how: usize| {
        let p = at(name);
        match how {
            0 => {
                std::fs::create_dir_all(p.join("sub")).unwrap();
                std::fs::write(p.join("sub/f"), b"x").unwrap();
                symlink(outside.path(), p.join("out")).unwrap();
            }
            1 => {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
            _ => symlink(outside.path().join("keep"), &p).unwrap(),
        }
    };
    let w = open(d.path(), Some(ci.clone()), trust(&[&ci]));
    for (i, k) in ["dir", "fifo", "link"].into_iter().enumerate() {
        plant(entry_name(k.as_bytes()), i);
        plant(crate::sign::signed_name(k.as_bytes(), "ci-1"), i);
        assert!(w.put(key(k), b"good", &meta()).unwrap(), "{k}");
        let r = open_ro(d.path(), None, trust(&[&ci]), true);
        assert_eq!(payload(&r, k).unwrap(), b"good", "{k}");
    }
    // An unsigned put clears its name the same way.
    plant(entry_name(b"plain"), 0);
    assert!(open(d.path(), None, None)
        .put(key("plain"), b"p", &[])
        .unwrap());
    assert!(w.counters.get(Counter::UnsafePaths) >= 3);
    assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"x");
    // prune --untrusted removes such names, whatever stands there, and nothing outside.
    for (i, k) in ["d2", "f2", "l2"].into_iter().enumerate() {
        plant(crate::sign::signed_name(k.as_bytes(), "ci-1"), i);
    }
    let listed = w.untrusted_entries(false).unwrap();
    let whys: Vec<&str> = listed.iter().map(|(_, _, w)| w.as_str()).collect();
    for what in ["a directory", "a FIFO", "a symbolic link"] {
        assert!(
            whys.contains(&format!("{what} at an entry's name").as_str()),
            "{whys:?}"
        );
    }
    w.untrusted_entries(true).unwrap();
    let left = w.untrusted_entries(false).unwrap();
    assert!(
        left.iter()
            .all(|(_, _, why)| !why.contains("at an entry's name")),
        "{left:?}"
    );
    assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"x");
}

#[test]
fn every_path_tries_the_same_names_in_the_same_order() {
    let ci = signer("ci-1", 1);
    let ci2 = signer("ci-2", 3);
    let t = trust(&[&ci2, &ci]).unwrap();
    let names: Vec<(u128, Option<&str>)> = gate::candidates(b"k", Some(&t)).collect();
    assert_eq!(
        names,
        vec![
            (entry_name(b"k"), None),
            (crate::sign::signed_name(b"k", "ci-2"), Some("ci-2")),
            (crate::sign::signed_name(b"k", "ci-1"), Some("ci-1")),
        ]
    );
    let d = tempfile::tempdir().unwrap();
    let r = open(d.path(), None, Some(t.clone()));
    let plain: Vec<u128> = names.iter().map(|(n, _)| *n).collect();
    assert_eq!(r.entry_names(key("k")).unwrap(), plain);
    assert_eq!(
        open(d.path(), None, None).entry_names(key("k")).unwrap(),
        vec![entry_name(b"k")]
    );
}

#[test]
fn each_file_of_a_squatted_key_is_handed_out_under_its_own_name() {
    let d = tempfile::tempdir().unwrap();
    let ci = signer("ci-1", 1);
    open(d.path(), None, None)
        .put(key("k"), b"evil", &[])
        .unwrap();
    open(d.path(), Some(ci.clone()), trust(&[&ci]))
        .put(key("k"), b"good", &[])
        .unwrap();
    let plain = name_hex(entry_name(b"k"));
    let own = name_hex(crate::sign::signed_name(b"k", "ci-1"));
    let untrusting = open(d.path(), None, None);
    let trusting = open(d.path(), None, trust(&[&ci]));
    let got = |s: &Store, n: &str| s.entry_file_named(key("k"), n).unwrap().is_some();
    assert!(got(&untrusting, &plain) && got(&untrusting, &own));
    assert!(!got(&trusting, &plain) && got(&trusting, &own));
    // Not under another key's name, nor a name that is none.
    assert!(!got(&untrusting, &name_hex(entry_name(b"j"))));
    assert!(untrusting.entry_file_named(key("k"), "../x").is_err());
    // Why each file is taken or not, for an importer: the verdict of the check itself.
    let refusal = |k: &str, file: &[u8]| {
        trusting
            .verify_entry_file(key(k), file.to_vec())
            .unwrap()
            .err()
            .map(|r| r.kind())
    };
    let evil = untrusting
        .entry_file_named(key("k"), &plain)
        .unwrap()
        .unwrap();
    let good = untrusting
        .entry_file_named(key("k"), &own)
        .unwrap()
        .unwrap();
    assert_eq!(refusal("k", &evil), Some("untrusted"));
    assert_eq!(refusal("k", &good), None);
    assert_eq!(refusal("j", &good), Some("other_key"));
    assert_eq!(refusal("k", &good[1..]), Some("corrupt"));
}

/// The signature fields of the entry file for `k` in `s`, as written.
fn signer_of(s: &Store, k: &str) -> Option<String> {
    let file = s.get_entry_file(key(k)).unwrap()?;
    entry::decode_header(&file)
        .unwrap()
        .signature
        .map(|f| f.signer)
}

#[test]
fn a_signer_never_signs_what_it_received() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ci = signer("ci-1", 1);
    let mallory = signer("mallory-1", 2);
    let forger = signer("ci-1", 9); // calls itself ci-1, with another key
    let src_plain = open(a.path(), None, None);
    src_plain.put(key("u"), b"unsigned bytes", &meta()).unwrap();
    let unsigned = src_plain.get_entry_file(key("u")).unwrap().unwrap();
    // An entry file of `k` signed by `s`, as another cache (a tier, a bundle) holds it.
    let file_of = |s: &Arc<Signer>, k: &str| {
        let d = tempfile::tempdir().unwrap();
        let w = open(d.path(), Some(s.clone()), None);
        w.put(key(k), b"signed bytes", &meta()).unwrap();
        w.get_entry_file(key(k)).unwrap().unwrap()
    };
    let by_mallory = file_of(&mallory, "m");
    let by_forger = file_of(&forger, "f");
    let by_ci = file_of(&ci, "c");

    // A signer without trusted keys: the CI process set up with only its key.
    let w = open(b.path(), Some(ci.clone()), None);
    // Received unsigned (a tier's value, a bundle member): published unsigned.
    assert!(w
        .take_entry_file(key("u"), unsigned.clone(), true)
        .unwrap()
        .is_ok());
    assert_eq!(signer_of(&w, "u"), None);
    // Signed by a key it does not hold, or by a forger of its name: written unsigned.
    assert_eq!(w.put_entry_file(key("m"), &by_mallory).unwrap(), Ok(true));
    assert_eq!(signer_of(&w, "m"), None);
    assert_eq!(w.put_entry_file(key("f"), &by_forger).unwrap(), Ok(true));
    assert_eq!(signer_of(&w, "f"), None);
    // Its own key's signature verifies: kept.
    assert_eq!(w.put_entry_file(key("c"), &by_ci).unwrap(), Ok(true));
    assert_eq!(signer_of(&w, "c").as_deref(), Some("ci-1"));
    // Bytes it did not compile, put directly (an adopted file): unsigned.
    assert!(w.put_unsigned(key("a"), b"adopted", &meta()).unwrap());
    assert_eq!(signer_of(&w, "a"), None);
    // What it compiled: signed.
    assert!(w.put(key("own"), b"compiled", &meta()).unwrap());
    assert_eq!(signer_of(&w, "own").as_deref(), Some("ci-1"));
    // A trusting reader serves only that last one and the one ci-1 signed.
    let r = open_ro(b.path(), None, trust(&[&ci]), true);
    for k in ["u", "m", "f", "a"] {
        assert!(payload(&r, k).is_none(), "{k} served");
    }
    assert!(payload(&r, "c").is_some() && payload(&r, "own").is_some());

    // With trusted keys, an unsigned put of bytes it did not compile is unsigned too, and
    // goes to the plain name only: it takes no signer's name.
    let c = tempfile::tempdir().unwrap();
    let t = open(c.path(), Some(ci.clone()), trust(&[&ci]));
    assert!(t.put_unsigned(key("a"), b"adopted", &meta()).unwrap());
    assert_eq!(signer_of(&open(c.path(), None, None), "a"), None);
    assert!(payload(&t, "a").is_none());

    // A store with no key keeps what an entry carries: it vouches for nothing, and a
    // trusting reader checks the signature itself.
    let d = tempfile::tempdir().unwrap();
    let relay = open(d.path(), None, None);
    assert_eq!(relay.put_entry_file(key("c"), &by_ci).unwrap(), Ok(true));
    assert_eq!(
        relay.put_entry_file(key("f"), &by_forger).unwrap(),
        Ok(true)
    );
    let r = open_ro(d.path(), None, trust(&[&ci]), true);
    assert!(payload(&r, "c").is_some());
    assert!(payload(&r, "f").is_none());
}
