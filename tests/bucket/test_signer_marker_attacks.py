"""Attacks on the markers a signing torch_xla writer puts under its signer's own entry names
(``torch_xla/<signed_entry_name>-<graph>`` beside the plain name's), as a writer of the
bucket without a key would make them, on a real S3 service (SeaweedFS on loopback) behind
the tests' relay: a matrix of the hosts that meet them (trusting ``ci-2``, trusting none,
trusting a rotated ``ci-2``; writing and read-only) against what a start fetches, what it
removes, what it costs, and what a prune keeps.

The rule under attack: a start follows a marker whose name is the plain one or a trusted
signer's own (``_bucket_start._vouches``, each key once), removes with a name it proved
garbage that name's own marker only (``_bucket_garbage``), and a prune keeps one marker a
listed entry (``prune._drop_markers``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import obstore
import pytest
from xla_pcache import entry_name
from xla_pcache._core import generate_signing_key, signed_entry_name, signing_public_key
from xla_pcache.bucket import upkeep
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla import _bucket_start
from xla_pcache.torch_xla._bucket_garbage import PULL_REMOVALS
from xla_pcache.torch_xla._bucket_start import PULL_MISSES

from tests.bucket.test_bucket_floods import NEWER, OLDER, _key, _markers
from tests.bucket.test_start_garbage import REMOVED, _bucket_holds, _graphs, _put_marked, _start
from tests.tiers.relay import Relay, answer
from tests.tiers.servers import (
    BucketServer,
    bucket_client,
    fresh_prefix,
    put_objects,
    removal_requests,
)

CI2 = generate_signing_key()
CI2_KEY = ("ci-2", signing_public_key(CI2))
# The same key name, another key: a fleet that rotated "ci-2", or another fleet's "ci-2".
OTHER_CI2_KEY = ("ci-2", signing_public_key(generate_signing_key()))
HOSTS: dict[str, dict[str, Any]] = {
    "trusts ci-2": {"trusted_keys": [CI2_KEY]},
    "trusts none": {},
    "trusts a rotated ci-2": {"trusted_keys": [OTHER_CI2_KEY]},
}
SIGNED = 20
GARBAGE = b"garbage" * 20
WRITES = {"put", "post", "delete"}


def _signed_bucket(
    server: BucketServer, tmp_path: Path, n: int = SIGNED
) -> tuple[str, str, list[str]]:
    """A fresh prefix where a writer signing with ``ci-2`` put ``n`` torch_xla entries
    (each under its plain name and ci-2's own) with the markers of both names."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    graphs = _graphs(10**30, n)
    _put_marked(url, tmp_path / "signer", graphs, signing_key=("ci-2", CI2))
    return prefix, url, graphs


def _plain(graphs: list[str]) -> set[str]:
    return {entry_name(_key(g)) for g in graphs}


def _own(graphs: list[str], signer: str = "ci-2") -> set[str]:
    return {signed_entry_name(_key(g), signer) for g in graphs}


def _own_marker(prefix: str, g: str, signer: str = "ci-2", graph: str | None = None) -> str:
    return f"{_markers(prefix)}/{signed_entry_name(_key(g), signer)}-{graph or g}"


def _plain_marker(prefix: str, g: str) -> str:
    return f"{_markers(prefix)}/{entry_name(_key(g))}-{g}"


def _own_garbage(
    server: BucketServer, relay: Relay, prefix: str, graphs: list[str], when: Any
) -> None:
    """Garbage at ci-2's own names of ``graphs`` (made up), and their own markers."""
    put_objects(
        bucket_client(server, prefix),
        {f"{ENTRY_DIR}/{signed_entry_name(_key(g), 'ci-2')}": GARBAGE for g in graphs},
    )
    relay.plant_many([_own_marker(prefix, g) for g in graphs], when=when)


def _marker_keys(server: BucketServer, prefix: str) -> set[str]:
    """The markers the server holds (not through the relay)."""
    listed = obstore.list(bucket_client(server, prefix), upkeep.MARKER_DIR).collect()
    return {str(m["path"]).rpartition("/")[2] for m in listed}


def _each_host_fetches_what_it_serves(url: str, tmp_path: Path, relay: Relay) -> None:
    """Each kind of host's start fetches the signed entries its trust lets it serve (none
    for a rotated ci-2, which GETs both names of each), deletes nothing, and GETs nothing
    else."""
    for host in sorted(HOSTS):
        fetched, wire, skipped = _start(url, tmp_path / host, relay, **HOSTS[host])
        served = 0 if host == "trusts a rotated ci-2" else SIGNED
        assert fetched == served and "delete" not in wire, (host, wire, skipped)
        assert wire["get"] == (2 * SIGNED if served == 0 else SIGNED), (host, wire)


# ------------------------------------------------------------------- trust
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_squatted_plain_name_leaves_the_signers_copy_to_each_host(
    host: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Twenty entries signed by ci-2 (both names, both markers), and one graph whose plain
    name was squatted with garbage before ci-2's writer put it (its entry under ci-2's own
    name only, with both markers). A writing host of each kind starts: whatever it trusts,
    it removes the squat (garbage for any reader) and never an object or marker of ci-2's
    own names; a ci-2 host after it fetches all 21, and a prune keeps every own marker."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    squatted = str(3 * 10**34)
    plain = entry_name(_key(squatted))
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{plain}": GARBAGE})
    _put_marked(url, tmp_path / "late-signer", [squatted], signing_key=("ci-2", CI2))
    own = _own([*graphs, squatted])
    entries, marked = _bucket_holds(url)
    assert own <= entries & marked and plain in entries & marked

    fetched, wire, skipped = _start(url, tmp_path / "host", relay, **HOSTS[host])
    expected = {"trusts ci-2": SIGNED + 1, "trusts none": SIGNED, "trusts a rotated ci-2": 0}
    assert fetched == expected[host], (wire, skipped)
    assert skipped.get(REMOVED) == 1, (wire, skipped)
    # The squat, and its marker but where the host keeps it (below): one request on S3.
    objects = 1 if host == "trusts ci-2" else 2
    assert wire["delete"] == removal_requests(server, 1, objects), (wire, skipped)
    entries, marked = _bucket_holds(url)
    assert own <= entries & marked and plain not in entries, (entries, marked)
    # A host that fetched the key from ci-2's own name keeps the plain name's marker (it
    # did not follow it to nothing); the others remove it with the squat.
    assert (plain in marked) == (host == "trusts ci-2"), marked

    fetched, wire, skipped = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == SIGNED + 1 and not WRITES & set(wire), (wire, skipped)
    report = upkeep.Bucket(url).prune(max_size=10**9, older_than=10**9)
    entries, marked = _bucket_holds(url)
    assert own <= entries & marked and report.removed == 0, report
    fetched, _, _ = _start(url, tmp_path / "ci2-next", relay, trusted_keys=[CI2_KEY])
    assert fetched == SIGNED + 1


def test_squats_at_both_names_are_replaced_where_the_signer_may_and_removed(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at both names of a graph (the plain one and ci-2's own) with both markers,
    planted before ci-2's writer compiles it: its put cannot create the plain name and
    overwrites its own. A host trusting none removes the plain squat and its marker; a host
    trusting a rotated ci-2 removes nothing more; a ci-2 host fetches the entry."""
    prefix, url, _ = _signed_bucket(server, tmp_path, 0)
    g = str(4 * 10**34)
    plain, own = entry_name(_key(g)), signed_entry_name(_key(g), "ci-2")
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{n}": GARBAGE for n in (plain, own)})
    relay.plant_many([_plain_marker(prefix, g), _own_marker(prefix, g)], when=OLDER)
    _put_marked(url, tmp_path / "signer", [g], signing_key=("ci-2", CI2))

    fetched, wire, skipped = _start(url, tmp_path / "none", relay)
    assert fetched == 0 and skipped.get(REMOVED) == 1, (wire, skipped)
    fetched, wire, skipped = _start(url, tmp_path / "rot", relay, trusted_keys=[OTHER_CI2_KEY])
    assert fetched == 0 and "delete" not in wire, (wire, skipped)
    assert _bucket_holds(url) == ({own}, {own})
    fetched, wire, _ = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == 1 and "delete" not in wire, wire


# ------------------------------------------------------------------- hostile own names
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_garbage_at_made_up_graphs_own_names_steers_no_host(
    host: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at ci-2's own names of 100 made-up graphs with their own markers, half newer
    than the real entries and half older. A host that trusts none never reads a ci-2 name:
    it GETs the real entries only and removes nothing. A host that follows ci-2's names (the
    real key's, or a rotated one under that name) removes the garbage (no reader's
    entry) with its own markers, at most PULL_REMOVALS a start, never a real object: the
    flood drains in two starts (a ci-2 host's) or a few (a rotated one misses the real
    entries too), and the next host fetches every entry it serves."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    made_up = _graphs(10**35, 100)
    _own_garbage(server, relay, prefix, made_up[:50], NEWER)
    _own_garbage(server, relay, prefix, made_up[50:], OLDER)
    real = _plain(graphs) | _own(graphs)
    served = 0 if host == "trusts a rotated ci-2" else SIGNED

    fetched, wire, skipped = _start(url, tmp_path / "one", relay, **HOSTS[host])
    if host == "trusts none":
        assert fetched == served, (wire, skipped)
        assert wire["get"] == SIGNED and "delete" not in wire, (wire, skipped)
        assert REMOVED not in skipped
        return
    removed = [skipped.get(REMOVED, 0)]
    for i in range(3):
        assert removal_requests(server, removed[-1]) == wire.get("delete", 0), (wire, skipped)
        assert removed[-1] <= PULL_REMOVALS, (wire, skipped)
        if sum(removed) == 100:
            break
        _, wire, skipped = _start(url, tmp_path / f"next{i}", relay, **HOSTS[host])
        removed.append(skipped.get(REMOVED, 0))
    # A ci-2 host's misses are the garbage only: it removes PULL_REMOVALS a start. A
    # rotated host misses the real entries too (not its key's), and removes fewer.
    if host == "trusts ci-2":
        assert removed == [PULL_REMOVALS, 100 - PULL_REMOVALS], removed
    assert sum(removed) == 100, removed
    assert _bucket_holds(url) == (real, real)
    # Drained: a new host fetches every entry it serves (with 68 planted among the 88 it
    # draws past the newest 32, the first fetched only a share, as with plain names).
    fetched, wire, skipped = _start(url, tmp_path / "after", relay, **HOSTS[host])
    assert fetched == served and REMOVED not in skipped, (wire, skipped)


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("planted", [PULL_MISSES, 1000, 10_000])
def test_own_name_markers_of_no_entry_cost_no_get(
    planted: int, host: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Markers under ci-2's own names of made-up graphs (no entry at either name), newer
    than the real ones, by the 32 up to ten thousand (past a start's listing): no host
    spends a GET on one once it found more than PULL_MISSES to fetch, and a host that
    trusts none spends nothing on them at all. Every host fetches what it serves."""
    prefix, url, _ = _signed_bucket(server, tmp_path)
    relay.plant_many([_own_marker(prefix, g) for g in _graphs(10**35, planted)], when=NEWER)
    served = 0 if host == "trusts a rotated ci-2" else SIGNED
    fetched, wire, skipped = _start(url, tmp_path / "host", relay, **HOSTS[host])
    assert fetched == served and "delete" not in wire, (wire, skipped)
    # A rotated ci-2 host asks both names of each real key: the plain one, then ci-2's.
    assert wire["get"] == (2 * SIGNED if served == 0 else SIGNED), (wire, skipped)


# ------------------------------------------------------------------- read-only
READ_ONLY = ["read-only host", "?ro=1 bucket", "XLA_PERSISTENT_CACHE_READ_ONLY"]


@pytest.mark.parametrize("how", READ_ONLY)
def test_a_read_only_host_removes_and_writes_nothing_at_own_names(
    how: str, relay: Relay, server: BucketServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Garbage at ci-2's own names of 40 made-up graphs with their own markers, and a
    squatted plain name whose graph ci-2 has under its own name only: a read-only ci-2 host
    (opened so, of a ``?ro=1`` URL, or under ``XLA_PERSISTENT_CACHE_READ_ONLY=1``) sends
    no PUT, POST or DELETE, in any number of starts."""
    prefix, url, _ = _signed_bucket(server, tmp_path)
    _own_garbage(server, relay, prefix, _graphs(10**35, 40), NEWER)
    squatted = str(3 * 10**34)
    put_objects(
        bucket_client(server, prefix), {f"{ENTRY_DIR}/{entry_name(_key(squatted))}": GARBAGE}
    )
    _put_marked(url, tmp_path / "late-signer", [squatted], signing_key=("ci-2", CI2))
    before = _bucket_holds(url)
    ro: dict[str, Any] = {"read_only": True} if how == "read-only host" else {}
    ro_url = server.url(prefix, ro="1") if how == "?ro=1 bucket" else url
    if how == "XLA_PERSISTENT_CACHE_READ_ONLY":
        monkeypatch.setenv(how, "1")
    for i in range(2):
        _, wire, skipped = _start(ro_url, tmp_path / f"ro{i}", relay, trusted_keys=[CI2_KEY], **ro)
        assert not WRITES & set(wire) and REMOVED not in skipped, (wire, skipped)
    assert _bucket_holds(url) == before


# ------------------------------------------------------------------- the blind path
@pytest.mark.parametrize("n", [PULL_MISSES, PULL_MISSES + 1])
def test_two_markers_an_entry_count_once_against_the_blind_path(
    n: int, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """``n`` entries signed by ci-2 hold ``2 n`` markers: a start follows markers blindly
    while it finds at most PULL_MISSES keys to fetch, each key once whatever names mark it,
    so a fleet of 32 signed entries is fetched from one listing (no listing of the
    entries), and one of 33 through the entries' listing; every host fetches all it
    serves, a GET an entry."""
    _, url, _ = _signed_bucket(server, tmp_path, n)
    for host in ("trusts ci-2", "trusts none"):
        fetched, wire, skipped = _start(url, tmp_path / host, relay, **HOSTS[host])
        assert fetched == n and wire["get"] == n, (host, wire, skipped)
        assert (wire["list"] == 1) == (n <= PULL_MISSES), (host, wire)


# ------------------------------------------------------------------- markers elsewhere
def test_own_markers_naming_other_graphs_cost_nothing_and_go_at_the_next_prune(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Markers under each real entry's own name (and plain name) that name another graph: a
    real one's, and made-up ones, newer and older than the entry. No host follows one (its
    name is none of that graph's), so a start's GETs are those of the real entries; the
    prune drops every one of them and keeps the two real markers of each entry."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    other = {g: graphs[(i + 1) % SIGNED] for i, g in enumerate(graphs)}
    planted = [_own_marker(prefix, g, graph=other[g]) for g in graphs]
    planted += [f"{_markers(prefix)}/{entry_name(_key(g))}-{other[g]}" for g in graphs]
    newer = [_own_marker(prefix, g, graph=str(10**35 + i)) for i, g in enumerate(graphs)]
    older = [_own_marker(prefix, g, graph=str(10**36 + i)) for i, g in enumerate(graphs)]
    relay.plant_many(planted + newer, when=NEWER)
    relay.plant_many(older, when=OLDER)
    _each_host_fetches_what_it_serves(url, tmp_path, relay)
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.pruned and report.markers_removed == len(planted) + 2 * SIGNED, report
    real = {f"{entry_name(_key(g))}-{g}" for g in graphs}
    real |= {f"{signed_entry_name(_key(g), 'ci-2')}-{g}" for g in graphs}
    assert _marker_keys(server, prefix) == real and not relay.planted


# ------------------------------------------------------------------- prune
def test_a_prune_keeps_one_marker_a_name_and_drops_every_planted_one(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Ten thousand markers of made-up graphs under the first real entry's own name (newer
    than it, sorting before its real marker), a thousand own-name markers of made-up graphs
    with no entry, and one own-name marker of each real graph dated before its entry was
    written: a start fetches every real entry within its bounds, and the prune removes
    every planted marker and keeps the two real ones of each entry (the plain name's and
    ci-2's own), whatever the host trusts; a start after it lists them in one request."""
    prefix, url, graphs = _signed_bucket(server, tmp_path)
    first = min(_own(graphs))
    flood = [f"{_markers(prefix)}/{first}-0{i:05d}" for i in range(10_000)]
    no_entry = [_own_marker(prefix, g) for g in _graphs(10**35, 1000)]
    relay.plant_many(flood + no_entry, when=NEWER)
    before = [_own_marker(prefix, g, graph=str(10**36 + i)) for i, g in enumerate(graphs)]
    relay.plant_many(before, when=OLDER)
    fetched, wire, skipped = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == SIGNED and wire["get"] == SIGNED, (wire, skipped)
    fetched, wire, skipped = _start(url, tmp_path / "none", relay)
    assert fetched == SIGNED and wire["get"] == SIGNED, (wire, skipped)

    report = upkeep.Bucket(url).prune(max_size=10**9)
    planted = len(flood) + len(no_entry) + len(before)
    assert report.pruned and report.markers_removed == planted, report
    assert not relay.planted
    entries, marked = _bucket_holds(url)
    assert entries == marked == _plain(graphs) | _own(graphs)
    assert len(_marker_keys(server, prefix)) == 2 * SIGNED
    fetched, wire, _ = _start(url, tmp_path / "after", relay, trusted_keys=[CI2_KEY])
    assert fetched == SIGNED and wire["list"] == 1, wire


def test_a_prune_drops_a_marker_with_its_own_name_only(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """An entry whose ci-2 copy is gone (removed by a prune over budget, or by hand) keeps
    its plain name's marker, and one whose plain copy is gone keeps ci-2's own: a prune
    drops the marker of the name that went, never the other's; a ci-2 host fetches both."""
    prefix, url, graphs = _signed_bucket(server, tmp_path, 2)
    own_gone, plain_gone = graphs
    client = bucket_client(server, prefix)
    obstore.delete(client, f"{ENTRY_DIR}/{signed_entry_name(_key(own_gone), 'ci-2')}")
    obstore.delete(client, f"{ENTRY_DIR}/{entry_name(_key(plain_gone))}")
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.pruned and report.markers_removed == 2, report
    left = {entry_name(_key(own_gone)), signed_entry_name(_key(plain_gone), "ci-2")}
    assert _bucket_holds(url) == (left, left)
    fetched, wire, _ = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == 2 and "delete" not in wire, wire


def test_a_prune_over_budget_takes_each_names_marker_with_it(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A prune that removes entries to keep the budget (each name is an object of its own,
    least recently used first) removes each removed name's marker, and keeps the marker
    of every name it kept."""
    _, url, _ = _signed_bucket(server, tmp_path)
    size = sum(e.size for e in upkeep.Bucket(url).entries().values())
    report = upkeep.Bucket(url).prune(max_size=size // 2)
    assert report.pruned and report.removed > 0, report
    entries, marked = _bucket_holds(url)
    assert entries == marked and not set(report.removed_names) & entries, report
    assert report.markers_removed == report.removed, report


def test_a_signers_copy_rewritten_by_its_signer_keeps_its_marker(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A signer's own name is overwritten by each put of its signer (a second ci-2 host
    compiles the graph again): its copy is then newer than the marker the first wrote,
    and a prune keeps only markers not older than their entry. Where the plain name was
    squatted (the entry under ci-2's own name only), the prune must keep that name's
    marker, the only way a ci-2 host finds the entry: the second host marks it again."""
    import time

    prefix, url, _ = _signed_bucket(server, tmp_path, 0)
    g = str(3 * 10**34)
    own = signed_entry_name(_key(g), "ci-2")
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{entry_name(_key(g))}": GARBAGE})
    _put_marked(url, tmp_path / "signer", [g], signing_key=("ci-2", CI2))
    _start(url, tmp_path / "untrusting", relay)  # removes the squat and its marker
    assert _bucket_holds(url) == ({own}, {own})
    written = upkeep.Bucket(url).entries()[own].written
    time.sleep(2.2)  # past the prune's slack: Last-Modified is whole seconds
    _put_marked(url, tmp_path / "second-signer", [g], signing_key=("ci-2", CI2))
    assert upkeep.Bucket(url).entries()[own].written > written + 1
    report = upkeep.Bucket(url).prune(max_size=10**9)
    # The plain name is free again (the squat went): the second host's put made it too.
    both = {own, entry_name(_key(g))}
    assert report.markers_removed == 0 and _bucket_holds(url) == (both, both), report
    fetched, wire, _ = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == 1, wire


# ------------------------------------------------------------------- own names by name
NOT_OURS = "torch_xla-not-ours"


def _start_holding(
    url: str, home: Path, relay: Relay, **given: Any
) -> tuple[int, int, dict[str, int], dict[str, int]]:
    """A new read-only torch_xla host's start (opened with ``given``): how many entries it
    said it fetched, how many its store holds after, its requests, and what its reads of
    the bucket counted."""
    from xla_pcache import bucket, open_store
    from xla_pcache.config import Settings

    relay.take()
    settings = Settings.from_env().replace(xdg_cache_home=str(home))
    with open_store(url, settings=settings, read_only=True, **given) as s:
        assert isinstance(s, bucket.BucketStore)
        n = _bucket_start.pull(s, _key)
        skipped = dict(s.bucket().reader.skipped)
        held = len(s)
    return n, held, relay.take(), skipped


def _cut_with_both_ends(
    server: BucketServer, relay: Relay, tmp_path: Path
) -> tuple[str, str, list[str]]:
    """Twenty ci-2 entries; garbage at 32 made-up graphs' plain names with their markers
    newer than the real ones and 32 older (a start's misses newest first, then as many
    drawn: the real entries are fetched in the drawn order); and a run of 300 keys the
    client refuses right after the first name's markers, which cuts a start's listing of
    the markers short (every name after it asked for by name, as a flood of markers
    under each name does)."""
    from tests.bucket.bucket_plants import _garbage_with_markers

    prefix, url, graphs = _signed_bucket(server, tmp_path)
    _garbage_with_markers(server, relay, prefix, _graphs(10**35, PULL_MISSES), NEWER)
    _garbage_with_markers(server, relay, prefix, _graphs(10**36, PULL_MISSES), OLDER)
    first = min(_plain(graphs) | _own(graphs))
    relay.plant_many([f"{_markers(prefix)}/{first}-9\x01{i}" for i in range(300)])
    return prefix, url, graphs


def test_a_key_fetched_under_one_name_is_not_fetched_again_under_another(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A ci-2 host whose listing of the markers was cut short asks for ci-2's own names by
    name (their markers unlisted) beside the keys of the plain markers it listed: where
    the drawn order put an own name first, it fetched the entry there, then fetched the
    same key again for its plain marker (a second GET, and the start said it fetched 21
    of 20 entries, its budget's room counted twice). A key the store holds is no fetch."""
    _, url, _ = _cut_with_both_ends(server, relay, tmp_path)
    for i in range(6):
        n, held, wire, skipped = _start_holding(
            url, tmp_path / f"ci2-{i}", relay, trusted_keys=[CI2_KEY]
        )
        assert n == held == SIGNED, (i, n, wire, skipped)
        # A GET each real entry; each garbage key, its plain name and ci-2's own (a 404).
        assert wire["get"] <= SIGNED + 2 * 2 * PULL_MISSES + 1, (i, wire)


def test_a_signed_fleets_own_names_are_no_misses_for_a_host_that_trusts_none(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """The same bucket, and a host that trusts no key: it reads the entries' plain names
    only, and ci-2's own copies are no entry for it. Planted: 32 garbage newer, 32 older,
    one run of refused keys. docs/reliability.md: with at most 32 planted among what a
    start draws, it misses a real entry with a chance of 1 / C(planted + real, real)
    (8e-15 for 32 and 20). The ci-2 copies, asked for by name, name keys of this build:
    each leads to its key's plain copy (fetched once), never a miss. When they were refused
    as not this build's and counted as misses, it stopped early in about one start of two
    (19, 20, 18, 16, 20, 9 of 20 in six starts)."""
    _, url, _ = _cut_with_both_ends(server, relay, tmp_path)
    for i in range(8):
        n, held, wire, skipped = _start_holding(url, tmp_path / f"none-{i}", relay)
        assert n == held == SIGNED, (i, n, wire, skipped)
        assert skipped.get(NOT_OURS, 0) < SIGNED, (i, wire, skipped)


def test_garbage_at_an_untrusted_signers_own_names_costs_no_host_a_get(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at the own names of 200 made-up graphs under a signer no host trusts
    (``ci-9``), with their markers, newer than the real entries: no host follows such a
    marker (its name is none it reads), so no host GETs one or removes one. They stay
    until a prune over budget takes them as it takes any object at an entry's name (a
    prune keeps one marker an entry it lists)."""
    prefix, url, _ = _signed_bucket(server, tmp_path)
    made_up = _graphs(10**35, 200)
    put_objects(
        bucket_client(server, prefix),
        {f"{ENTRY_DIR}/{signed_entry_name(_key(g), 'ci-9')}": GARBAGE for g in made_up},
    )
    relay.plant_many([_own_marker(prefix, g, "ci-9") for g in made_up], when=NEWER)
    _each_host_fetches_what_it_serves(url, tmp_path, relay)
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed == 0 and report.removed == 0, report
    entries, marked = _bucket_holds(url)
    assert entries == marked and len(entries) == 2 * SIGNED + 200


def _refuse_puts_below(relay: Relay, monkeypatch: pytest.MonkeyPatch, refused: str) -> None:
    """The relay answers a PUT of the key ``refused`` (whole, the prefix included) as a
    service with directories (GCS with a hierarchical namespace, Azure Data Lake) does when
    an object was planted below that name: 409, nothing written. SeaweedFS keeps an object
    beside a directory of its name, so it cannot show this itself."""
    forward = relay._forward

    def refusing(h: Any) -> None:
        if h.command == "PUT" and Relay._key_of(h.path) == refused:
            length = int(h.headers.get("Content-Length") or 0)
            if length:
                h.rfile.read(length)
            conflict = b"<Error><Code>PathConflict</Code><Message>a directory</Message></Error>"
            answer(h, 409, conflict)
            return
        forward(h)

    monkeypatch.setattr(relay, "_forward", refusing)


def test_a_refused_plain_marker_leaves_the_signers_own_marker(
    relay: Relay, server: BucketServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Garbage at a graph's plain name, and an object planted below the name of its plain
    marker (``torch_xla/<plain>-<graph>/x``), on a service with directories, which then
    refuses that marker: ci-2's writer puts the entry under its own name only, and its
    plain marker fails. It wrote its markers one after the other and stopped at the first
    failure, so its own marker, the only way a ci-2 host finds the entry, was never
    written: a ci-2 host fetched nothing. Each marker is now written whatever became of
    the other."""
    prefix, url, _ = _signed_bucket(server, tmp_path, 0)
    g = str(3 * 10**34)
    plain, own = entry_name(_key(g)), signed_entry_name(_key(g), "ci-2")
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{plain}": GARBAGE})
    _refuse_puts_below(relay, monkeypatch, f"{_markers(prefix)}/{plain}-{g}")
    _put_marked(url, tmp_path / "signer", [g], signing_key=("ci-2", CI2))
    assert _marker_keys(server, prefix) == {f"{own}-{g}"}
    fetched, wire, _ = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == 1, wire


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_own_names_asked_for_by_name_are_never_removed(
    host: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """The bucket above (its markers' listing cut short, so ci-2's own names are asked for
    by name), and writing hosts of each kind: whatever a start asks for by name and
    refuses, it removes only planted garbage (what it fetched, proved and followed a
    marker to; garbage asked for by name is refused and left), never a real object or a
    real marker."""
    prefix, url, graphs = _cut_with_both_ends(server, relay, tmp_path)
    real = _plain(graphs) | _own(graphs)
    removed = 0
    for i in range(4):
        _, wire, skipped = _start(url, tmp_path / f"w{i}", relay, **HOSTS[host])
        now = skipped.get(REMOVED, 0)
        assert wire.get("delete", 0) == removal_requests(server, now), (wire, skipped)
        assert now <= PULL_REMOVALS, (wire, skipped)
        removed += now
        entries, marked = _held_on_the_server(server, prefix)
        assert real <= entries and real == marked, (i, real - entries, marked ^ real)
    assert removed >= PULL_MISSES, removed  # the garbage it followed markers to


def _held_on_the_server(server: BucketServer, prefix: str) -> tuple[set[str], set[str]]:
    """The names under ``entries/`` and the markers' entry names, as the server holds them
    (the relay's refused keys cut a listing through it short)."""
    listed = obstore.list(bucket_client(server, prefix), ENTRY_DIR).collect()
    entries = {str(m["path"]).rpartition("/")[2] for m in listed}
    return entries, {m.partition("-")[0] for m in _marker_keys(server, prefix)}


def test_a_prune_cut_short_reaches_both_names_past_own_name_markers_by_the_thousand(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """One key the client refuses after every entry hides the entries from the prune's
    listing, and ten thousand own-name markers of made-up graphs, dated before any real
    one (the oldest first is the markers' order), name entries that are not there: the
    prune asks at most its bound of names (the fleet's records, ``usage`` and markers
    taking turns), reaches both names of every signed entry, removes none within the
    budget and keeps both markers of each; the planted markers it found absent go."""
    from tests.bucket.bucket_plants import _hidden_after_the_entries

    prefix, url, graphs = _signed_bucket(server, tmp_path)
    real = _plain(graphs) | _own(graphs)
    relay.plant_many([_own_marker(prefix, g) for g in _graphs(10**35, 10_000)], when=OLDER)
    _hidden_after_the_entries(relay, prefix, real, 1)
    relay.take()
    report = upkeep.Bucket(url).prune(max_size=10**9)
    wire = relay.take()
    assert report.cut_short and not report.pruned, report
    assert report.entries_before == 2 * SIGNED and report.removed == 0, report
    assert report.asked <= upkeep.Limits().asks and wire["head"] <= report.asked + 2 * 257 + 10
    entries, marked = _held_on_the_server(server, prefix)
    assert entries == marked == real
    assert report.markers_removed <= report.asked, report


def test_a_marker_planted_in_the_entrys_second_does_not_take_the_real_ones_place(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at a graph's plain name, so that ci-2's entry of it is under its own name
    only, and a marker planted under that own name for graph ``0``, dated the very time
    of the real marker (a planter that watches the bucket and writes in the same second;
    Last-Modified is whole seconds on some services, and the prune allows a second of
    slack). The prune must keep the real marker, the only way a ci-2 host finds the
    entry: it reads the entry's header, whose key names the real graph. When it kept the
    oldest not older than the entry, ties going to the name that sorts first, it kept the
    planted one."""
    prefix, url, _ = _signed_bucket(server, tmp_path, 0)
    g = str(3 * 10**34)
    plain, own = entry_name(_key(g)), signed_entry_name(_key(g), "ci-2")
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{plain}": GARBAGE})
    _put_marked(url, tmp_path / "signer", [g], signing_key=("ci-2", CI2))
    _start(url, tmp_path / "untrusting", relay)  # removes the squat and its marker
    listed = obstore.list(bucket_client(server, prefix), upkeep.MARKER_DIR).collect()
    (real,) = [m for m in listed if str(m["path"]).endswith(f"/{own}-{g}")]
    relay.plant(f"{_markers(prefix)}/{own}-0", when=real["last_modified"])
    upkeep.Bucket(url).prune(max_size=10**9)
    assert f"{own}-{g}" in _marker_keys(server, prefix)
    fetched, wire, _ = _start(url, tmp_path / "ci2", relay, trusted_keys=[CI2_KEY])
    assert fetched == 1, wire
