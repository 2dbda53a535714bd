"""A torch_xla host start removes what it proved to be garbage (``torch_xla/_bucket_garbage.py``)
on a real S3 service (SeaweedFS on loopback) behind the tests' relay: a planted flood
drains across writing hosts' starts; a read-only host removes nothing; nor does any host
remove an entry that is whole but unsigned or untrusted, or over its budget, or valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import obstore
import pytest
from xla_pcache import bucket, entry_name, open_store
from xla_pcache._core import generate_signing_key, signed_entry_name, signing_public_key
from xla_pcache.bucket import upkeep
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla import _bucket_start
from xla_pcache.torch_xla._bucket_garbage import PULL_REMOVALS
from xla_pcache.torch_xla._bucket_start import PULL_MISSES

from tests.bucket.bucket_plants import _garbage_with_markers
from tests.bucket.test_bucket_floods import GRAPHS, NEWER, OLDER, _key, _torch_xla_bucket
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, removal_requests

CI = generate_signing_key()
CI_KEY = ("ci-1", signing_public_key(CI))
# What a start's reads count for what it removed, and for a removal that failed.
REMOVED = "torch_xla-garbage"
FAILED = "torch_xla-garbage-failed"


def _start(
    url: str, home: Path, relay: Relay, **given: Any
) -> tuple[int, dict[str, int], dict[str, int]]:
    """A new torch_xla host's start (opened with ``given``): how many entries it fetched,
    its requests, and what its reads of the bucket counted, by kind."""
    relay.take()
    settings = Settings.from_env().replace(xdg_cache_home=str(home))
    with open_store(url, settings=settings, **given) as s:
        assert isinstance(s, bucket.BucketStore)
        n = _bucket_start.pull(s, _key)
        skipped = dict(s.bucket().reader.skipped)
    return n, relay.take(), skipped


def _bucket_holds(url: str) -> tuple[set[str], set[str]]:
    """The names under ``entries/`` and the markers' entry names (as the relay lists them)."""
    b = upkeep.Bucket(url)
    marked, listing = b.markers()
    assert listing.complete
    return set(b.entries()), {name for name, _, _ in marked}


def _graphs(first: int, n: int) -> list[str]:
    """``n`` made-up graphs' names, none of them a real one's."""
    return [str(first + i) for i in range(n)]


def _put_marked(url: str, home: Path, graphs: list[str], **given: Any) -> None:
    """Valid entries of ``graphs``, with their markers, put by a writer opened with
    ``given``."""
    settings = Settings.from_env().replace(xdg_cache_home=str(home))
    with open_store(url, settings=settings, **given) as w:
        assert isinstance(w, bucket.BucketStore)
        for g in graphs:
            assert w.put(_key(g), b"made-up graph " * 100)
            w.mark(_key(g), g)


def _flip_last_byte(server: BucketServer, prefix: str, name: str) -> None:
    """The object ``name`` under ``entries/`` with its last byte changed: its header and
    length whole, its payload no longer the one its checksum (or signed digest) names."""
    client = bucket_client(server, prefix)
    data = bytes(obstore.get(client, f"{ENTRY_DIR}/{name}").bytes())
    obstore.put(client, f"{ENTRY_DIR}/{name}", data[:-1] + bytes([data[-1] ^ 0xFF]))


def test_a_flood_of_garbage_drains_across_writing_hosts_starts(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at 300 made-up graphs' entries with their markers, half newer than the 20
    real entries and half older. Each writing host's start refuses at least 2 *
    PULL_MISSES of them before it stops and removes PULL_REMOVALS (the entry and the marker
    it followed, one request), counted; five starts remove all 300, the bucket keeps the
    real entries and their markers, and the next start fetches every real entry and
    removes nothing."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    newer, older = _graphs(10**35, 150), _graphs(10**36, 150)
    _garbage_with_markers(server, relay, prefix, newer, NEWER)
    _garbage_with_markers(server, relay, prefix, older, OLDER)
    real = {entry_name(_key(g)) for g in graphs}
    removed = []
    for i in range(5):
        _, wire, skipped = _start(url, tmp_path / f"host{i}", relay)
        removed.append(skipped.get(REMOVED, 0))
        assert wire.get("delete", 0) == removal_requests(server, removed[-1]), (i, wire)
        assert FAILED not in skipped, skipped
    assert removed == [PULL_REMOVALS] * 4 + [300 - 4 * PULL_REMOVALS], removed
    assert _bucket_holds(url) == (real, real)
    fetched, wire, skipped = _start(url, tmp_path / "after", relay)
    assert fetched == GRAPHS and REMOVED not in skipped, (wire, skipped)
    assert "delete" not in wire, wire


@pytest.mark.parametrize("how", ["read-only host", "?ro=1 bucket"])
def test_a_read_only_host_removes_nothing(
    how: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at 40 made-up graphs' entries with their markers: a read-only host (or any
    host of a bucket URL with ``?ro=1``) refuses them and removes none, in any number of
    starts; the first writing host's start removes all 40."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    _garbage_with_markers(server, relay, prefix, _graphs(10**35, 40), NEWER)
    before = _bucket_holds(url)
    assert len(before[0]) == len(before[1]) == GRAPHS + 40
    ro: dict[str, Any] = {"read_only": True} if how == "read-only host" else {}
    ro_url = url if ro else server.url(prefix, ro="1")
    for i in range(2):
        _, wire, skipped = _start(ro_url, tmp_path / f"ro{i}", relay, **ro)
        assert REMOVED not in skipped and "delete" not in wire, (wire, skipped)
    assert _bucket_holds(url) == before
    _, _, skipped = _start(url, tmp_path / "writer", relay)
    assert skipped.get(REMOVED) == 40, skipped
    real = {entry_name(_key(g)) for g in graphs}
    assert _bucket_holds(url) == (real, real)


def test_an_entry_a_trusting_host_does_not_trust_is_not_removed(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A host that trusts one key, and the bucket's torch_xla entries, with their markers:
    the 20 real ones and 10 more, whole but unsigned; 10 unsigned ones whose payload no
    longer matches their checksum; one signed by the trusted key whose payload no longer
    matches its signed digest (both its objects: the plain one and the signer's own); and
    garbage at 10 more. The trusting host fetches nothing, leaves every unsigned entry (an
    untrusted entry is another host's to serve, whatever its payload: it reads none of it)
    and removes the garbage and both objects of the damaged signed one, with their markers.
    A host that trusts no key then fetches the 30 whole ones and removes the 10 unsigned
    damaged ones (their checksum fails for it)."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    whole, damaged, signed = _graphs(10**33, 10), _graphs(10**34, 10), str(2 * 10**34)
    _put_marked(url, tmp_path / "w1", whole + damaged)
    for g in damaged:
        _flip_last_byte(server, prefix, entry_name(_key(g)))
    _put_marked(url, tmp_path / "w2", [signed], signing_key=("ci-1", CI))
    for name in (entry_name(_key(signed)), signed_entry_name(_key(signed), "ci-1")):
        _flip_last_byte(server, prefix, name)
    _garbage_with_markers(server, relay, prefix, _graphs(10**35, 10), NEWER)
    unsigned = {entry_name(_key(g)) for g in graphs + whole + damaged}

    fetched, wire, skipped = _start(url, tmp_path / "trusting", relay, trusted_keys=[CI_KEY])
    assert fetched == 0, (wire, skipped)
    assert skipped.get(REMOVED) == 12, (wire, skipped)
    assert wire["delete"] == removal_requests(server, 12), (wire, skipped)
    assert _bucket_holds(url) == (unsigned, unsigned)

    fetched, wire, skipped = _start(url, tmp_path / "untrusting", relay)
    assert fetched == GRAPHS + 10 and skipped.get(REMOVED) == 10, (wire, skipped)
    kept = {entry_name(_key(g)) for g in graphs + whole}
    assert _bucket_holds(url) == (kept, kept)


def test_valid_entries_are_never_removed(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A flood of 100 valid entries of made-up graphs with their markers, beside the 20
    real ones and garbage at PULL_MISSES more, newer than all of them. A host whose budget
    is below every entry's size refuses every valid one (too large for it: no proof of
    anything) and removes the garbage only (newest first); a host with room fetches all
    120 and removes nothing. Every valid entry and its marker stays in the bucket."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    flood = _graphs(10**33, 100)
    _put_marked(url, tmp_path / "w", flood)
    _garbage_with_markers(server, relay, prefix, _graphs(10**35, PULL_MISSES), NEWER)
    valid = {entry_name(_key(g)) for g in graphs + flood}

    fetched, wire, skipped = _start(url, tmp_path / "small", relay, max_size=256)
    assert fetched == 0 and skipped.get(REMOVED) == PULL_MISSES, (wire, skipped)
    assert _bucket_holds(url) == (valid, valid)

    fetched, wire, skipped = _start(url, tmp_path / "roomy", relay)
    assert fetched == GRAPHS + 100 and REMOVED not in skipped, (wire, skipped)
    assert "delete" not in wire, wire
    assert _bucket_holds(url) == (valid, valid)
