"""Attacks on what an entry file's first bytes now decide, as a writer of the bucket without
a key would make them, on a real S3 service (SeaweedFS on loopback) behind the tests'
relay: a torch_xla host start led by a header to the key it names (``torch_xla._bucket_start``:
``_Fetches._key_named``, each key fetched once a start), and a prune that keeps, of an
entry's markers, the one of the graph its header names (``prune_markers.Judge``).

A matrix of the hosts that meet them (trusting ``ci-2``, trusting none, trusting a rotated
``ci-2``; writing and read-only) against what a start fetches, what it costs, what it
removes, and what a prune keeps and reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import obstore
import pytest
from xla_pcache import entry_name
from xla_pcache._core import signed_entry_name
from xla_pcache.bucket import prune_markers, upkeep
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla._bucket_start import PULL_MISSES

from tests.bucket.test_bucket_floods import NEWER, _key, _markers
from tests.bucket.test_signer_marker_attacks import (
    CI2,
    CI2_KEY,
    GARBAGE,
    HOSTS,
    SIGNED,
    _marker_keys,
    _own,
    _plain,
    _signed_bucket,
)
from tests.bucket.test_start_attacks import _forged_header
from tests.bucket.test_start_garbage import REMOVED, _graphs, _put_marked, _start
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, put_objects, removal_requests

NOT_OURS = "torch_xla-not-ours"
# Newer than every entry a test writes (markers dated so are not older than their entry).
NEWER_THAN_ALL = NEWER
WRITES = {"put", "post", "delete"}


def _cut(relay: Relay, prefix: str, names: set[str]) -> None:
    """A run of 300 keys the client refuses right after the first of ``names``' markers:
    a start's listing of the markers is cut short there, and every entry name after it is
    asked for by name (as markers planted by the thousand under each name would)."""
    first = min(names)
    relay.plant_many([f"{_markers(prefix)}/{first}-9\x01{i}" for i in range(300)])


def _forge(server: BucketServer, prefix: str, keys: list[str], first: int = 1) -> list[str]:
    """An object at a made-up entry name for each of ``keys`` (no marker), whose header
    names that key and then holds nothing that verifies; their names."""
    names = [f"{first + i:032x}" for i in range(len(keys))]
    put_objects(
        bucket_client(server, prefix),
        {f"{ENTRY_DIR}/{n}": _forged_header(k) for n, k in zip(names, keys, strict=True)},
    )
    return names


def _gets_by_name(relay: Relay, prefix: str) -> Counter[str]:
    """The GETs of each entry name in the relay's trace (ranged or whole)."""
    out: Counter[str] = Counter()
    for method, target, _ in relay.trace:
        key = Relay._key_of(target)
        if method == "GET" and key.startswith(f"{prefix}/{ENTRY_DIR}/"):
            out[key.rpartition("/")[2]] += 1
    return out


def _real_markers(graphs: list[str]) -> set[str]:
    """The markers ci-2's writer wrote of ``graphs``: each graph's under both its names."""
    return {f"{n}-{g}" for g in graphs for n in (*_plain([g]), *_own([g]))}


def _on_server(server: BucketServer, prefix: str) -> set[str]:
    listed = obstore.list(bucket_client(server, prefix), ENTRY_DIR).collect()
    return {str(m["path"]).rpartition("/")[2] for m in listed}


# ------------------------------------------------------------------- the start
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_forged_headers_naming_real_keys_fetch_each_key_once_and_remove_nothing(
    host: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Twenty ci-2 entries (both names, both markers), their markers' listing cut short,
    and 100 objects at made-up names whose headers name the real keys (five each): every
    entry not reached is asked for by name. Each host fetches what it serves, each key
    once (a GET of an entry name: a ranged read when asked for by name, and one fetch),
    whatever the headers repeat; no forged header is a miss that stops it; a writing host
    removes nothing (nothing it fetched is garbage), and the forged objects stay."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    real = _plain(graphs) | _own(graphs)
    forged = _forge(server, prefix, [_key(g) for g in graphs] * 5)
    _cut(relay, prefix, real)
    served = 0 if host == "trusts a rotated ci-2" else SIGNED
    for i in range(3):
        relay.trace.clear()
        fetched, wire, skipped = _start(url, tmp_path / f"{host}-{i}", relay, **HOSTS[host])
        assert fetched == served, (i, wire, skipped)
        assert not WRITES & set(wire) and REMOVED not in skipped, (wire, skipped)
        assert NOT_OURS not in skipped, skipped
        gets = _gets_by_name(relay, prefix)
        assert all(gets[n] <= 1 for n in forged), gets
        assert all(gets[n] <= 2 for n in real), gets
        assert wire["get"] <= len(forged) + 2 * len(real), wire
    assert _on_server(server, prefix) == real | set(forged)


def test_a_thousand_forged_headers_naming_one_key_cost_a_start_its_misses_only(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """1,100 objects at made-up names whose headers all name one real key, beside twenty
    ci-2 entries whose markers' listing was cut short, and a host that trusts none: past
    the names an entry may have (``NAMES_A_KEY``), a name that leads to a key the start
    already holds or tried is a miss, so the start stops at its misses' cap and says it
    was cut short, after a few dozen ranged reads. When they were no misses it ran to its
    cap of PULL_FETCHES tries: 1,000 GETs every start, as the objects are never removed
    (nothing read of them is garbage). It fetched the key they name once, nothing twice."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    real = _plain(graphs) | _own(graphs)
    forged = _forge(server, prefix, [_key(graphs[0])] * 1100)
    _cut(relay, prefix, real)
    relay.trace.clear()
    fetched, wire, skipped = _start(url, tmp_path / "none", relay, read_only=True)
    assert 0 < fetched <= SIGNED, (wire, skipped)
    assert skipped.get("torch_xla-markers") == 1, skipped
    # The misses' caps (newest first, then drawn, one more a fetch there), the names an
    # entry may have, and a ranged read and a fetch of each entry fetched.
    bound = 2 * PULL_MISSES + fetched + 2 * SIGNED + 2 * fetched
    assert wire["get"] <= bound, (fetched, wire)
    gets = _gets_by_name(relay, prefix)
    assert max(gets[n] for n in forged) == 1 and max(gets[n] for n in real) <= 2, gets


@pytest.mark.parametrize("host", ["trusts none", "trusts ci-2"])
def test_forged_headers_of_made_up_keys_are_misses_of_the_drawn_order(
    host: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """PULL_MISSES objects at made-up names whose headers name made-up graphs' keys of
    this build (nothing at those keys' names), among the real names asked for by name:
    each leads the start to its key's names (a miss there, as a marker of it would cost),
    and with at most PULL_MISSES planted among the drawn a start fetches every real entry
    (but with a chance of 1 / C(52, 20)), in each of four starts; nothing is removed."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    real = _plain(graphs) | _own(graphs)
    forged = _forge(server, prefix, [_key(g) for g in _graphs(10**35, PULL_MISSES)])
    _cut(relay, prefix, real)
    signers = len(HOSTS[host].get("trusted_keys", []))
    for i in range(4):
        fetched, wire, skipped = _start(url, tmp_path / f"h{i}", relay, **HOSTS[host])
        assert fetched == SIGNED, (i, wire, skipped)
        assert not WRITES & set(wire) and NOT_OURS not in skipped, (wire, skipped)
        # A ranged read of each name, a GET of each name of each made-up key, a fetch of
        # each real key.
        bound = len(forged) + len(real) + (1 + signers) * len(forged) + SIGNED
        assert wire["get"] <= bound, wire


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_forged_headers_naming_a_squatted_key_cost_the_signers_copy_nothing(
    host: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A graph whose plain name was squatted with garbage before ci-2's writer put it (its
    entry under ci-2's own name only), its markers' listing cut short, and 40 objects at
    made-up names whose headers name its key, drawn before and after its own name: the
    first try of the key (by a forged name or its own) meets the squat, and every later
    one is skipped as tried. A ci-2 host fetches it in every start all the same (the
    fetch goes on to ci-2's own name); a writing host removes the squat at most, never
    ci-2's copy or its marker."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    g = str(3 * 10**34)
    plain, own = entry_name(_key(g)), signed_entry_name(_key(g), "ci-2")
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{plain}": GARBAGE})
    _put_marked(url, tmp_path / "late-signer", [g], signing_key=("ci-2", CI2))
    real = _plain(graphs) | _own(graphs) | {own}
    _forge(server, prefix, [_key(g)] * 40)
    _cut(relay, prefix, real)
    expected = {"trusts ci-2": SIGNED + 1, "trusts none": SIGNED, "trusts a rotated ci-2": 0}
    for i in range(3):
        fetched, wire, skipped = _start(url, tmp_path / f"{host}-{i}", relay, **HOSTS[host])
        assert fetched == expected[host], (i, wire, skipped)
        assert wire.get("delete", 0) <= removal_requests(server, 1), wire
        held = _on_server(server, prefix)
        assert real <= held, real - held
        assert f"{own}-{g}" in _marker_keys(server, prefix)
    fetched, wire, _ = _start(url, tmp_path / "ci2-after", relay, trusted_keys=[CI2_KEY])
    assert fetched == SIGNED + 1, wire


HOSTILE_KEYS = [
    "torch_xla/../../outside",
    "torch_xla/1/../2",
    "torch_xla/12\x00",
    "torch_xla/" + "9" * 41,
    "torch_xla/12@build-" + "a" * 32,
    "torch_xla/",
    "../entries/" + "0" * 32,
]


@pytest.mark.parametrize("ro", [False, True])
def test_hostile_keys_in_forged_headers_are_refused_and_lead_nowhere(
    ro: bool, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Objects at made-up names whose headers name keys no key maker of this build makes
    (paths that climb, a NUL, a graph name too long, another build's key, no graph): each
    is refused and counted, costs its ranged read only (no GET of any other object, none
    outside the prefix), and nothing is written or removed."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    real = _plain(graphs) | _own(graphs)
    forged = _forge(server, prefix, HOSTILE_KEYS)
    _cut(relay, prefix, real)
    relay.trace.clear()
    fetched, wire, skipped = _start(url, tmp_path / "h", relay, read_only=ro)
    assert fetched == SIGNED, (wire, skipped)
    assert skipped.get(NOT_OURS) == len(HOSTILE_KEYS), skipped
    assert not WRITES & set(wire), wire
    outside = [t for _, t, _ in relay.trace if not Relay._key_of(t).startswith(prefix)]
    assert not [t for t in outside if "list-type" not in t], outside
    gets = _gets_by_name(relay, prefix)
    assert all(gets[n] == 1 for n in forged), gets
    assert sum(gets.values()) == wire["get"], (gets, wire)


# ------------------------------------------------------------------- the prune
def _plant(server: BucketServer, prefix: str, markers: list[str]) -> None:
    """Markers written now on the server (none older than its entry)."""
    put_objects(bucket_client(server, prefix), {f"{upkeep.MARKER_DIR}/{m}": b"" for m in markers})


@pytest.mark.parametrize("decoy", [GARBAGE, b""], ids=["garbage", "empty"])
def test_objects_that_hold_no_entry_cannot_take_every_prunes_header_reads(
    decoy: bytes, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """MARKER_READS objects at made-up entry names sorting first, none an entry file
    (garbage, or empty), two markers under each; and a marker planted under each real
    entry's names. A prune reads the garbage's first bytes (an empty object's listed size
    tells without a read): they name no key, so none of its markers is any entry's real
    one, and they go; the same prune or the next reads the real entries' headers and
    removes the planted markers there. When first bytes that name no key kept them all
    (and an empty object's read, None, too), every prune spent its reads on the same
    decoys, and the markers planted under the real entries stayed for good."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    real = _real_markers(graphs)
    n = prune_markers.MARKER_READS
    decoys = [f"{i:032x}" for i in range(1, n + 1)]
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{d}": decoy for d in decoys})
    _plant(server, prefix, [f"{d}-{j}" for d in decoys for j in (1, 2)])
    planted = [f"{m.partition('-')[0]}-0" for m in real]
    _plant(server, prefix, planted)
    for _ in range(2):
        relay.take()
        report = upkeep.Bucket(url).prune(max_size=10**9)
        wire = relay.take()
        # Its own GETs (the state, the usage, ...), and MARKER_READS headers at most.
        assert wire["get"] <= 8 + n, wire
    assert _marker_keys(server, prefix) == real, report
    fetched, wire, _ = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == SIGNED and wire["list"] == 1, wire


@pytest.mark.parametrize("squat", ["forged header", "garbage"])
def test_a_squat_at_the_plain_name_cannot_cost_the_signers_own_marker(
    squat: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A graph's plain name squatted before ci-2's writer put it (a header naming made-up
    graph 5, or garbage naming no key), so its entry is under ci-2's own name only, with
    both markers; planted beside them, markers of graphs 0 and 5 under both names. The
    prune judges each name by its own object: at ci-2's own name the real marker stays
    and the planted ones go; at the squatted plain name no marker is the entry's (the
    squat's header decides: the planter chose it). A ci-2 host fetches the entry after."""
    prefix, url, _ = _signed_bucket(server, tmp_path, 0)
    g = str(3 * 10**34)
    plain, own = entry_name(_key(g)), signed_entry_name(_key(g), "ci-2")
    body = _forged_header(_key("5")) if squat == "forged header" else GARBAGE
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{plain}": body})
    _put_marked(url, tmp_path / "signer", [g], signing_key=("ci-2", CI2))
    _plant(server, prefix, [f"{n}-{p}" for n in (plain, own) for p in ("0", "5")])
    report = upkeep.Bucket(url).prune(max_size=10**9)
    held = _marker_keys(server, prefix)
    assert {m for m in held if m.startswith(own)} == {f"{own}-{g}"}, (held, report)
    for host in sorted(HOSTS):
        fetched, wire, _ = _start(url, tmp_path / host, relay, read_only=True, **HOSTS[host])
        assert fetched == (1 if host == "trusts ci-2" else 0), (host, wire)
        assert not WRITES & set(wire), wire


def test_refused_keys_among_an_entrys_markers_never_cost_its_real_one(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Under each of twenty ci-2 entries' names, planted markers of graphs sorting before
    and after the real one, and keys the client refuses among them (a control character,
    a ``//`` below a marker's name), 300 under the first name (past a listing's refused
    budget): the listing of the markers skips and resumes past them, and however it cuts
    an entry's markers into runs, the prune removes a marker only against that entry's
    own header. Every real marker stays, at most MARKER_READS headers are read, and a ci-2
    host fetches every entry."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    names = sorted(_plain(graphs) | _own(graphs))
    real = _real_markers(graphs)
    _plant(server, prefix, [f"{n}-{p}" for n in names for p in ("0", "9" * 39)])
    refused = [f"{_markers(prefix)}/{n}-5\x01" for n in names]
    refused += [f"{_markers(prefix)}/{n}-7//x" for n in names]
    refused += [f"{_markers(prefix)}/{names[0]}-0\x01{i}" for i in range(300)]
    relay.plant_many(refused)
    for _ in range(2):
        relay.take()
        report = upkeep.Bucket(url).prune(max_size=10**9)
        wire = relay.take()
        assert wire["get"] <= 8 + prune_markers.MARKER_READS, wire
        assert real <= _marker_keys(server, prefix), (real - _marker_keys(server, prefix), report)
    fetched, wire, skipped = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == SIGNED, (wire, skipped)


def test_ten_thousand_markers_under_one_entry_cost_one_read(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Ten thousand markers planted under one real entry's own name, sorting before and
    after its real one: the prune holds one marker at a time and reads that entry's header
    once, removes every planted one and keeps the real."""
    prefix, url, graphs = _signed_bucket(server, tmp_path, 2)
    own = signed_entry_name(_key(graphs[0]), "ci-2")
    relay.plant_many(
        [f"{_markers(prefix)}/{own}-{p}{i:05d}" for p in ("0", "9") for i in range(5000)],
        when=NEWER_THAN_ALL,
    )
    relay.take()
    report = upkeep.Bucket(url).prune(max_size=10**9)
    wire = relay.take()
    assert report.markers_removed == 10_000 and not relay.planted, report
    assert wire["get"] <= 8 + 1, wire
    assert f"{own}-{graphs[0]}" in _marker_keys(server, prefix)


def test_header_reads_starved_by_a_replanted_flood_cost_a_start_only_its_listing(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A planter who plants, before every prune, two markers under each of MARKER_READS
    forged entries sorting first (their headers name a graph neither marker is of) takes
    every read of every prune: the markers planted once under the real entries' names (500
    under each of the twenty plain names) stay through both prunes. They vouch for no
    graph (their names are not their graphs' entry names): a host start still fetches
    every real entry, within its bounds."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    n = prune_markers.MARKER_READS
    decoys = _forge(server, prefix, [_key(str(10**35 + i)) for i in range(n)])
    under_real = [
        f"{_markers(prefix)}/{entry_name(_key(g))}-0{i:04d}" for g in graphs for i in range(500)
    ]
    relay.plant_many(under_real, when=NEWER_THAN_ALL)
    for _ in range(2):
        _plant(server, prefix, [f"{d}-{j}" for d in decoys for j in (1, 2)])
        report = upkeep.Bucket(url).prune(max_size=10**9)
        assert report.markers_removed == 2 * n, report
    assert len(relay.planted) == len(under_real)
    for host in ("trusts ci-2", "trusts none"):
        fetched, wire, skipped = _start(url, tmp_path / host, relay, **HOSTS[host])
        assert fetched == SIGNED and not WRITES & set(wire), (host, wire, skipped)
        assert wire["get"] <= 2 * SIGNED + 2 * PULL_MISSES, (host, wire)
