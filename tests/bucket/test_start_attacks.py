"""Attacks on how a torch_xla host start chooses what it fetches
(``torch_xla/_bucket_start.py``), as a writer of the bucket without a key would make them, on
a real S3 service (SeaweedFS on loopback) behind the tests' relay: the entries it asks for
by name when their markers are crowded out, and the order drawn past the newest ones."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from xla_pcache import bucket, entry_name, open_store
from xla_pcache.bucket import upkeep
from xla_pcache.bucket.marker_listing import MARKER_PAGES
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla import _bucket_garbage, _bucket_start

from tests.bucket.test_bucket_floods import GRAPHS, NEWER, _key, _markers, _torch_xla_bucket
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, put_objects, removal_requests


def _start(url: str, home: Path, relay: Relay) -> tuple[int, dict[str, int], dict[str, int]]:
    """A new torch_xla host's start: how many entries it fetched, its requests, and what
    its reads of the bucket skipped, by kind."""
    relay.take()
    with open_store(url, settings=Settings.from_env().replace(xdg_cache_home=str(home))) as s:
        assert isinstance(s, bucket.BucketStore)
        n = _bucket_start.pull(s, _key)
        skipped = dict(s.bucket().reader.skipped)
        held = len(s)
    wire = relay.take()
    wire["held"] = held
    return n, wire, skipped


def _crowd(relay: Relay, prefix: str, names: list[str], each: int) -> None:
    """``each`` markers of made-up graphs under each of ``names``, sorting before any real
    marker there (a real graph's name does not start with 0)."""
    relay.plant_many(
        (f"{_markers(prefix)}/{n}-0{j:05d}" for n in names for j in range(each)), when=NEWER
    )


def _forged_header(key: str) -> bytes:
    """An object whose first bytes claim to hold an entry of ``key`` (the entry format's
    magic, a text key's flag, its length, the key), and then nothing that verifies."""
    k = key.encode()
    head = bytearray(64)
    head[0:4] = b"XPCE"
    head[4:6] = (1).to_bytes(2, "little")
    head[6:8] = (1).to_bytes(2, "little")
    head[12:16] = len(k).to_bytes(4, "little")
    return bytes(head) + k + b"garbage" * 20


def test_entries_of_another_kind_asked_for_by_name_are_refused_and_counted(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Markers crowded out under the real entries' names and under entries that are not
    this build's torch_xla ones: a JAX-like key, a torch_xla key of another build, a header
    that names a key of this build filed under another entry's name, and one filed under
    its own name that does not verify. The start asks for each by name: it fetches the 20
    real ones, refuses the two whose header names no torch_xla key of this build (counted,
    ``torch_xla-not-ours``), fetches the key the third names under that key's own name
    (nothing there: a miss, as a marker of it would cost), and the fourth fails the core's
    checks: none of the others reaches the host's store."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    settings = Settings.from_env().replace(xdg_cache_home=str(tmp_path / "other"))
    others = ["jax/abc", f"{_key(graphs[0])}-another-build"]
    with open_store(url, settings=settings) as w:
        for key in others:
            assert w.put(key, b"x" * 300)
    forged_elsewhere = f"{'0' * 31}1"
    forged_own = _key("77777")
    put_objects(
        bucket_client(server, prefix),
        {
            f"{ENTRY_DIR}/{forged_elsewhere}": _forged_header(_key("55555")),
            f"{ENTRY_DIR}/{entry_name(forged_own)}": _forged_header(forged_own),
        },
    )
    names = sorted(
        [entry_name(_key(g)) for g in graphs]
        + [entry_name(k) for k in others]
        + [forged_elsewhere, entry_name(forged_own)]
    )
    # More pages than a start lists: every entry's markers are left unfinished.
    each = 1000 * (MARKER_PAGES // len(names) + 2)
    _crowd(relay, prefix, names, each)
    fetched, wire, skipped = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS and wire["held"] == GRAPHS, (wire, skipped)
    assert skipped.get("torch_xla-not-ours") == 2, skipped
    assert skipped.get("torch_xla-cut-short") == 1, skipped
    # A ranged read of each one's first bytes, then the fetch of the real ones, of the one
    # filed under its own name, and of the key the one filed elsewhere names.
    assert wire["get"] == len(names) + GRAPHS + 2, wire


def test_entries_outside_the_crowd_are_not_asked_for_by_name(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """The real entries' markers crowded out as in round 6, and ten thousand entry names of
    no entry spread among them (listed, nothing there): the start asks by name only for
    the entries whose markers it could not finish, not for every entry it passed, so it
    fetches every real entry with a ranged read and a fetch each and never reads one of
    the ten thousand."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    real = sorted(entry_name(_key(g)) for g in graphs)
    rng = random.Random(7)
    relay.plant_many(f"{prefix}/{ENTRY_DIR}/{rng.randrange(16**32):032x}" for _ in range(10_000))
    _crowd(relay, prefix, real, 6000)
    fetched, wire, skipped = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, (wire, skipped)
    # The first entry's real marker is among the first 10,000 keys of ``torch_xla/`` (its
    # 6,000 planted ones and the next entry's), which the start lists first: fetched by key.
    assert wire["get"] == 2 * GRAPHS - 1, (wire, skipped)
    assert "torch_xla-not-ours" not in skipped, skipped


# On S3 alone: 130,000 names served by the relay exercise the start's bound, not the
# protocol (tests/bucket/test_bucket_floods.py floods both), and on gs it was CI's slowest.
@pytest.mark.parametrize("bucket_server", ["s3"], indirect=True)
def test_a_flood_of_names_past_exhausted_pages_costs_a_bounded_share_until_a_prune(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """The pages spent before the real entries are reached: 2,001 markers under each of 60
    entry names that sort first, and ten thousand entry names of no entry. Every entry not
    reached is asked for by name in a drawn order, and the start stops once the reads that
    found nothing there reach PULL_MISSES plus the entries fetched: what it costs stays
    bounded (it cannot tell ten thousand made-up names from the real ones, so it fetches a
    share in proportion), it says it was cut short, and the next prune removes the
    markers planted under those names: the start after it fetches every real entry."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    first = [f"{i:032x}" for i in range(60)]
    rng = random.Random(11)
    relay.plant_many(
        [f"{prefix}/{ENTRY_DIR}/{n}" for n in first]
        + [f"{prefix}/{ENTRY_DIR}/{rng.randrange(16**32):032x}" for _ in range(10_000)]
    )
    _crowd(relay, prefix, first, 2001)
    fetched, wire, skipped = _start(url, tmp_path / "host", relay)
    m = _bucket_start.PULL_MISSES
    # Newest first: nothing (no marker reached); drawn: at most 2 * PULL_MISSES + fetched
    # reads of names, two requests for each entry fetched.
    assert wire.get("get", 0) <= m + 3 * fetched, (fetched, wire)
    assert skipped.get("torch_xla-cut-short") == 1 and skipped.get("torch_xla-markers") == 1
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed >= 60 * 2000, report
    fetched, wire, _ = _start(url, tmp_path / "after", relay)
    assert fetched == GRAPHS, wire


def test_ten_thousand_garbage_entries_among_the_drawn_cost_the_misses_cap(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at 10,000 made-up graphs' entries with their markers, half newer than the
    real entries and half older: past the newest 32 (all garbage), 9,968 planted and 20
    real entries are drawn, and the start stops once the misses there reach PULL_MISSES
    plus the entries fetched there. It fetches a real entry unless its first 32 draws are
    all planted (a chance of about (9,968 / 9,988) ** 32, 94 %: the share in proportion
    that a bound on requests leaves against that many plants, so the test asserts the
    cost), its GETs stay within 2 * PULL_MISSES plus two per entry fetched, and it says it
    was cut short. It removes the first PULL_REMOVALS garbage entries it refused, with
    their markers (a request each): the flood drains across the fleet's starts
    (``test_start_garbage.py``)."""
    from tests.bucket.bucket_plants import _garbage_with_markers
    from tests.bucket.test_bucket_floods import OLDER

    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    newer = [str(10**35 + i) for i in range(5000)]
    older = [str(10**36 + i) for i in range(5000)]
    _garbage_with_markers(server, relay, prefix, newer, NEWER)
    _garbage_with_markers(server, relay, prefix, older, OLDER)
    fetched, wire, skipped = _start(url, tmp_path / "host", relay)
    m = _bucket_start.PULL_MISSES
    assert wire["get"] <= 2 * m + 2 * fetched, (fetched, wire)
    assert fetched == wire["held"] and skipped.get("torch_xla-markers") == 1, skipped
    removed = _bucket_garbage.PULL_REMOVALS
    assert skipped.get("torch_xla-garbage") == removed, skipped
    assert wire["delete"] == removal_requests(server, removed), (wire, skipped)
