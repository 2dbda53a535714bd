"""Attacks on what a writing torch_xla host start removes of what it proved to be garbage
(``torch_xla/_bucket_garbage.py``), as a writer of the bucket without a key would make them,
on a real S3 service (SeaweedFS on loopback) behind the tests' relay: a start must remove
only objects no reader would serve, never a real entry or a real entry's marker, never an
object outside the bucket's prefix."""

from __future__ import annotations

from pathlib import Path

import obstore
from xla_pcache import entry_name
from xla_pcache._core import generate_signing_key, signed_entry_name, signing_public_key
from xla_pcache.bucket import upkeep
from xla_pcache.tiers.objstore import ENTRY_DIR

from tests.bucket.test_bucket_floods import GRAPHS, NEWER, _key, _markers, _torch_xla_bucket
from tests.bucket.test_start_garbage import (
    REMOVED,
    _bucket_holds,
    _graphs,
    _put_marked,
    _start,
)
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, put_objects, removal_requests

CI2 = generate_signing_key()
CI2_KEY = ("ci-2", signing_public_key(CI2))
# The same key name, another key: a fleet that rotated "ci-2", or another fleet's "ci-2".
OTHER_CI2_KEY = ("ci-2", signing_public_key(generate_signing_key()))


def test_the_marker_of_an_entry_signed_by_a_signer_the_host_does_not_trust_stays(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage planted at a graph's plain entry name before the fleet that signs with
    ``ci-2`` compiles it: that fleet's put cannot create the plain name, so its entry is
    under ci-2's own name only, with the markers of both names. A ci-2 host's start fetches
    it. A writing host that trusts no key (or other keys) proves the plain name garbage and
    removes it with the plain name's marker: ci-2's own marker must stay, as it is the only
    way a ci-2 host's start finds a real entry it serves (and a prune keeps it while that
    entry is there)."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    g = str(3 * 10**34)
    plain, own = entry_name(_key(g)), signed_entry_name(_key(g), "ci-2")
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{plain}": b"garbage" * 20})
    _put_marked(url, tmp_path / "signer", [g], signing_key=("ci-2", CI2))
    entries, marked = _bucket_holds(url)
    assert own in entries and {plain, own} <= marked
    fetched, _, _ = _start(url, tmp_path / "ci2-ro", relay, trusted_keys=[CI2_KEY], read_only=True)
    assert fetched == 1  # the fleet's unsigned entries are not ci-2's

    _, wire, skipped = _start(url, tmp_path / "untrusting", relay)
    assert skipped.get(REMOVED) == 1, (wire, skipped)
    assert wire["delete"] == removal_requests(server, 1), (wire, skipped)
    entries, marked = _bucket_holds(url)
    assert plain not in entries | marked and own in entries & marked
    fetched, wire, skipped = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == 1 and "delete" not in wire, (wire, skipped)
    report = upkeep.Bucket(url).prune(max_size=10**9, older_than=10**9)
    entries, marked = _bucket_holds(url)
    assert report.markers_removed == 0 and own in entries & marked, report
    fetched, _, _ = _start(url, tmp_path / "ci2-next", relay, trusted_keys=[CI2_KEY])
    assert fetched == 1


def test_entries_signed_by_keys_the_host_does_not_trust_are_not_removed(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Ten entries signed by ``ci-2`` (both their objects: the plain name and ci-2's own)
    with their markers, beside the 20 real unsigned ones and garbage at PULL_MISSES more. A
    writing host that trusts another key under the name ``ci-2`` (a rotated key: the
    signatures do not verify for it) fetches none of them and removes the garbage only; a
    host that trusts the real ``ci-2`` then fetches all ten and removes nothing."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    signed = _graphs(10**33, 10)
    _put_marked(url, tmp_path / "signer", signed, signing_key=("ci-2", CI2))
    from tests.bucket.bucket_plants import _garbage_with_markers

    _garbage_with_markers(server, relay, prefix, _graphs(10**35, 8), NEWER)
    kept = {entry_name(_key(g)) for g in graphs + signed}
    own = {signed_entry_name(_key(g), "ci-2") for g in signed}

    fetched, wire, skipped = _start(url, tmp_path / "rotated", relay, trusted_keys=[OTHER_CI2_KEY])
    assert fetched == 0 and skipped.get(REMOVED) == 8, (wire, skipped)
    assert _bucket_holds(url) == (kept | own, kept | own)

    fetched, wire, skipped = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == 10 and REMOVED not in skipped and "delete" not in wire, (wire, skipped)
    assert _bucket_holds(url) == (kept | own, kept | own)


def test_nothing_outside_the_prefix_is_removed(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at ten made-up graphs' entries with their markers, and the very same objects
    (garbage at those names and at the real entries', and the markers) under a sibling
    prefix, beside markers whose names lead out of ``torch_xla/`` (``..`` segments naming
    the sibling's objects). A writing host's start fetches the real entries and removes not
    one object of the sibling."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    sibling = f"{prefix}-next"
    garbage = _graphs(10**35, 10)
    from tests.bucket.bucket_plants import _garbage_with_markers

    _garbage_with_markers(server, relay, prefix, garbage, NEWER)
    names = [entry_name(_key(g)) for g in garbage + graphs]
    outside = {f"{ENTRY_DIR}/{n}": b"garbage" * 20 for n in names}
    outside.update({f"torch_xla/{entry_name(_key(g))}-{g}": b"" for g in garbage})
    put_objects(bucket_client(server, sibling), outside)
    leaf = sibling.rpartition("/")[2]
    relay.plant_many(
        [f"{_markers(prefix)}/../../{leaf}/{ENTRY_DIR}/{n}" for n in names]
        + [
            f"{_markers(prefix)}/{n}-{g}/../../../{leaf}/{ENTRY_DIR}/{n}"
            for n, g in zip(names, garbage, strict=False)
        ]
        + [f"{_markers(prefix)}/..", f"{_markers(prefix)}/../{ENTRY_DIR}/{names[0]}"],
        when=NEWER,
    )
    fetched, wire, skipped = _start(url, tmp_path / "host", relay)
    # The keys with ``..`` cut the listing of markers short: the garbage is asked for by
    # name, refused as no entry of this build's, and left (no proof it is any reader's).
    assert fetched == GRAPHS and skipped.get("unlistable"), (wire, skipped)
    assert wire.get("delete", 0) == removal_requests(server, skipped.get(REMOVED, 0)), (
        wire,
        skipped,
    )
    client = bucket_client(server, sibling)
    left = {str(o["path"]) for page in obstore.list(client) for o in page}
    assert left == set(outside), sorted(set(outside) - left)
