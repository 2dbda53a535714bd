"""Floods of planted objects against a bucket's bounds, on a real S3 service (SeaweedFS on
loopback) behind the tests' relay, which lists keys SeaweedFS cannot hold (``//``, ``.``
and ``..`` segments, control characters) as S3 lists them, a page of 1,000 at a time, and
plants ten thousand of them without a PUT each.

A bound limits what one host reads; it never switches off what the fleet relies on. On the
commit these tests start from, 257 keys the client refuses stopped every listing: ``prune``
saw no entry, removed none and said ``pruned: true``; and a torch_xla host start followed
markers planted first and fetched none of the real entries. Each test here failed there."""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path
from typing import Any

import obstore
import pytest
from xla_pcache import bucket, entry_name, open_store
from xla_pcache.bucket import objects as bucket_objects
from xla_pcache.bucket import upkeep
from xla_pcache.bucket.reader import LIST_PAGE, list_requests_bound
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla import _bucket_start

from tests.helpers import cli_here
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix, put_objects

FLOOD = 10_000
ENTRIES = 12
ENTRY_BYTES = 1000


def _hex(rng: random.Random, below: int = 16**32) -> str:
    return f"{rng.randrange(below):032x}"


def _flood(kind: str, prefix: str, real: list[str]) -> list[str]:
    """``FLOOD`` keys of ``kind`` below ``entries/`` (whole keys, the prefix included)."""
    rng = random.Random(kind)
    e = f"{prefix}/{ENTRY_DIR}"
    low = int(min(real), 16)  # keys of these sort before every real entry
    half = FLOOD // 2
    keys = {
        "before": lambda: [f"{e}/{_hex(rng, low)}//x" for _ in range(FLOOD)],
        "between": lambda: [f"{e}/{_hex(rng)}//x" for _ in range(FLOOD)],
        "dots": lambda: (
            [f"{e}/{_hex(rng)}/./x" for _ in range(half)]
            + [f"{e}/{_hex(rng)}/../x" for _ in range(half)]
        ),
        "dot-names": lambda: (
            [f"{e}/./{_hex(rng)}" for _ in range(half)]
            + [f"{e}/../{_hex(rng)}" for _ in range(half)]
        ),
        "controls": lambda: [f"{e}/{_hex(rng)}/\x01{i}" for i in range(FLOOD)],
        "in-shard": lambda: [f"{e}/ab/{_hex(rng)}//x" for _ in range(FLOOD)],
        "control-names-before": lambda: [f"{e}/{_hex(rng, low)}\x01" for _ in range(FLOOD)],
        "control-after-each": lambda: [
            f"{e}/{r}\x01{i}" for r in real for i in range(FLOOD // len(real))
        ],
    }[kind]()
    return keys


def _bucket(server: BucketServer) -> tuple[str, str, list[str]]:
    """A fresh prefix holding ``ENTRIES`` entry objects; (prefix, url, their names)."""
    prefix = fresh_prefix()
    client = bucket_client(server, prefix)
    names = sorted(entry_name(f"{prefix}-{i}") for i in range(ENTRIES))
    for n in names:
        obstore.put(client, f"{ENTRY_DIR}/{n}", b"x" * ENTRY_BYTES)
    return prefix, server.url(prefix), names


BUDGET = ENTRIES * ENTRY_BYTES // 2
TARGET = int(BUDGET * upkeep.LOW_WATERMARK)
# Kinds whose keys the command's prune lists past completely (a listing with a delimiter,
# or one skip past each run); the others are refused names of their own, which no listing
# can see past as a whole: the prune says it was cut short (exit 3), and still sees and
# prunes every real entry.
COMPLETE = ["before", "between", "dots", "dot-names", "controls", "in-shard"]
CUT_SHORT = ["control-names-before", "control-after-each"]


@pytest.mark.parametrize("kind", COMPLETE + CUT_SHORT)
def test_the_commands_prune_keeps_the_budget_past_a_flood(
    kind: str, relay: Relay, server: BucketServer
) -> None:
    """Ten thousand planted keys of each kind: the prune lists every real entry and brings
    them within the budget. On main it listed none (stopped after 256), removed none and
    said pruned: true."""
    prefix, url, real = _bucket(server)
    relay.plant_many(_flood(kind, prefix, real))
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    relay.take()
    out = cli_here("prune", "--path", url, "--json")
    report = json.loads(out.stdout)
    wire = relay.take()
    assert report["entries_before"] == ENTRIES, (kind, report)
    assert report["bytes"] <= TARGET, report
    assert set(report["removed_names"]) <= set(real), report
    if kind in COMPLETE:
        assert out.exit_code == 0 and report["pruned"] and report["cut_short"] is None, report
        assert report["listing_complete"], report
    else:
        # Cut short: said so (exit 3, "cut short", pruned false), what it saw pruned.
        assert out.exit_code == 3, out.output
        assert not report["pruned"] and report["cut_short"], report
        assert "prune cut short" in out.stderr and report["skipped"]["cut-short"] == 1, out.stderr
    # The listing of entries/ within its bound (ten listings besides it at most: records,
    # claims, markers, the lease's directory).
    bound = list_requests_bound(ENTRIES + FLOOD, FLOOD) + 10
    assert wire["list"] <= bound and wire.get("head", 0) <= 2 * 257 + 10, wire


@pytest.mark.parametrize("kind", ["before", "in-shard", "between"])
def test_a_writers_prune_past_a_flood_prunes_what_it_sees_and_says_so(
    kind: str, relay: Relay, server: BucketServer
) -> None:
    """A writer's prune runs inside the program and never holds more than its limits, so it
    lists without a delimiter: past a flood it cannot see through it prunes what it listed,
    says it was cut short, and leaves the bucket's state saying so (so the next writer's
    check prunes again, and `stats` shows it). On main it saw none, removed none and said
    pruned: true."""
    prefix, url, real = _bucket(server)
    relay.plant_many(_flood(kind, prefix, real))
    b = upkeep.Bucket(url)
    b.write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    report = b.prune(limits=upkeep.WRITER_LIMITS)
    assert not report.pruned and report.cut_short and report.busy is None, report
    seen_after = report.entries_before - report.removed
    assert report.bytes == seen_after * ENTRY_BYTES <= TARGET, report
    if kind == "before":
        # Galloping past the flood planted before them: every real entry seen.
        assert report.entries_before == ENTRIES, report
    assert not upkeep.Bucket(url).estimate().known
    stats = json.loads(cli_here("stats", "--path", url, "--json").stdout)
    assert stats["last_prune_complete"] is False, stats
    # The command lists with a delimiter: it sees them all and prunes within the budget.
    out = cli_here("prune", "--path", url, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["bytes"] <= TARGET


def test_stats_counts_every_entry_past_a_flood(relay: Relay, server: BucketServer) -> None:
    prefix, url, real = _bucket(server)
    relay.plant_many(_flood("between", prefix, real))
    stats = json.loads(cli_here("stats", "--path", url, "--json").stdout)
    assert stats["entries"] == ENTRIES and stats["listing_complete"], stats
    assert stats["directories"] == FLOOD and stats["skipped_by_kind"]["unlistable"] >= 1, stats
    text = cli_here("stats", "--path", url).stdout
    assert "names under entries/" in text and "10,000" in text, text


# ------------------------------------------------------------------- torch_xla markers
GRAPHS = 20


def _key(graph: str) -> str:
    return f"torch_xla/{graph}"


def _torch_xla_bucket(server: BucketServer, tmp_path: Path) -> tuple[str, str, list[str]]:
    """A fresh prefix where a writer put ``GRAPHS`` torch_xla entries with their markers."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    settings = Settings.from_env().replace(xdg_cache_home=str(tmp_path / "writer"))
    graphs = [str(10**30 + 7919 * i) for i in range(GRAPHS)]
    with open_store(url, settings=settings) as w:
        assert isinstance(w, bucket.BucketStore)
        for g in graphs:
            assert w.put(_key(g), b"graph" * 100)
            w.mark(_key(g), g)
    return prefix, url, graphs


def _start(url: str, home: Path, relay: Relay) -> tuple[int, dict[str, int]]:
    """A new torch_xla host's start: how many entries it fetched, and its requests."""
    relay.take()
    with open_store(url, settings=Settings.from_env().replace(xdg_cache_home=str(home))) as s:
        assert isinstance(s, bucket.BucketStore)
        n = _bucket_start.pull(s, _key)
    return n, relay.take()


def _markers(prefix: str) -> str:
    return f"{prefix}/{upkeep.MARKER_DIR}"


# Newer than anything a test writes in this session, however long it runs (a date a few
# minutes ahead was older than the entries of tests run later in a long session).
NEWER = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
OLDER = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)


@pytest.mark.parametrize("planted", [32, 1000])
def test_empty_markers_of_made_up_graphs_steer_no_host_start(
    planted: int, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Markers planted for made-up graphs, named right for this build, newer than the real
    ones and with no entry: on main a start fetched them first and stopped after 32
    useless GETs, fetching no real entry. A marker vouches for nothing: finding more to
    fetch than it may miss, a start lists the entries and follows only markers of those,
    so such a marker costs no GET at all."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    fakes = [str(10**35 + i) for i in range(planted)]
    relay.plant_many([f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in fakes], when=NEWER)
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire
    assert wire["get"] == GRAPHS, wire


@pytest.mark.parametrize("shape", ["markers", "junk"])
def test_objects_planted_first_crowd_out_no_real_marker(
    shape: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Ten thousand objects sorting before every real marker (marker-shaped, of made-up
    entries; or of any name): on main a start's listing stopped at 10,000 objects in key
    order, before the newest-first sort, and never listed a real marker. Now a start whose
    listing was crowded lists the entries and then only their markers, jumping over what
    lies between them."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    d = _markers(prefix)
    if shape == "markers":
        keys = [f"{d}/0000{i:028x}-{i}" for i in range(FLOOD)]
    else:
        keys = [f"{d}/!{i:08d}" for i in range(FLOOD)]
    relay.plant_many(keys)
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS and wire["get"] == GRAPHS, wire
    # One listing of the markers (cut at PULL_MARKERS), one of the entries, and a few
    # pages of the markers of those entries.
    assert wire["list"] <= 10 + 1 + 4, wire


def test_markers_planted_under_a_real_entrys_name_are_pruned_and_crowd_out_nothing(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Ten thousand markers named after one real entry (made-up graphs), sorting before
    its real marker and every other: on main a start listed only those (1 entry fetched)
    and prune kept them all, because that entry exists. Now a start lists past them to
    every real marker (that entry's own included), and prune keeps one marker an entry:
    the oldest not older than the entry, which its writer wrote right after it."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    first = min(entry_name(_key(g)) for g in graphs)
    relay.plant_many([f"{_markers(prefix)}/{first}-{i}" for i in range(1, FLOOD + 1)], when=NEWER)
    fetched, wire = _start(url, tmp_path / "one", relay)
    assert fetched == GRAPHS and wire["get"] == GRAPHS, wire
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.pruned and report.markers_removed == FLOOD, report
    assert not relay.planted
    markers = obstore.list(bucket_client(server, prefix), upkeep.MARKER_DIR).collect()
    assert len(markers) == GRAPHS
    fetched, wire = _start(url, tmp_path / "two", relay)
    assert fetched == GRAPHS and wire["list"] == 1, wire


def test_a_marker_planted_before_its_entry_is_pruned(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A marker older than its entry was not written by the entry's writer (it writes the
    marker after): prune removes it, and keeps the writer's."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    name = entry_name(_key(graphs[0]))
    early = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    relay.plant(f"{_markers(prefix)}/{name}-1", when=early)
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed == 1 and not relay.planted, report
    assert len(obstore.list(bucket_client(server, prefix), upkeep.MARKER_DIR).collect()) == GRAPHS


def test_a_flood_under_entries_still_leaves_a_host_its_entries(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A start that cannot follow its markers blindly lists the entries: a flood of keys
    the client refuses there, planted after every entry, costs it a page and a HEAD an
    entry and hides none of them. That listing cannot tell whether the refused pages held
    other entries, so the markers of entries it did not see are followed after the others,
    within PULL_MISSES fetches of no entry from each end."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    real = sorted(entry_name(_key(g)) for g in graphs)
    relay.plant_many(_flood("control-after-each", prefix, real))
    relay.plant_many(
        [f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in map(str, range(100))],
        when=NEWER,
    )
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS and wire["get"] <= GRAPHS + 2 * _bucket_start.PULL_MISSES, wire
    assert wire["list"] <= list_requests_bound(GRAPHS + FLOOD, GRAPHS) + 2 * (
        1 + 100 // LIST_PAGE
    ), wire


def _put_all(client: Any, keys: list[str]) -> None:
    """Empty objects at ``keys``, 64 at a time."""
    put_objects(client, dict.fromkeys(keys, b""))


def test_objects_planted_below_our_names_by_the_thousand_stop_no_prune(
    relay: Relay, server: BucketServer
) -> None:
    """Ten thousand objects below the lease's name, on a service that makes a directory of
    it (which then refuses the lease's create): on main a prune removed a hundred of them
    and gave up, exit 1, so a hundred prunes in a row did nothing. Now it removes them
    all (a request per thousand) and takes the lease. Ten thousand objects below entries'
    names cost a prune a HEAD and a DELETE per directory they made (four each at most) on
    main: now at most SQUAT_REMOVALS a prune, the rest the next."""
    prefix, url, _ = _bucket(server)
    _put_all(bucket_client(server, prefix), [f"{upkeep.LEASE}/x{i}" for i in range(FLOOD)])
    below = [f"{prefix}/{ENTRY_DIR}/{_hex(random.Random(i))}/x" for i in range(FLOOD)]
    relay.plant_many(below)
    relay.take()
    out = cli_here("prune", "--path", url, "--max-size", "1M", "--json")
    wire = relay.take()
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    if not server.directories:
        # GCS: beside our names, in nobody's way: the prune takes the lease and leaves
        # those below it (`prune --untrusted`'s); those below entries' names are junk in
        # entries/, removed as any other (one DELETE each on GCS), with no directory to
        # look for.
        assert "squat" not in report["skipped"], report
        assert wire.get("head", 0) <= 10 and wire["delete"] <= FLOOD + 30, wire
        assert len(obstore.list(bucket_client(server, prefix), upkeep.LEASE).collect()) == FLOOD
        assert not any(k in relay.planted for k in below)
        return
    assert report["skipped"]["squat"] == FLOOD, report
    removals = bucket_objects.SQUAT_REMOVALS
    assert wire["head"] <= removals + 10 and wire["delete"] <= removals + 30, wire
    assert not obstore.list(bucket_client(server, prefix), upkeep.LEASE).collect()
    # The objects below entries' names past the first prune's share wait for the next.
    left = sum(k in relay.planted for k in below)
    assert FLOOD - removals <= left < FLOOD, left
    assert cli_here("prune", "--path", url, "--max-size", "1M").exit_code == 0
    assert sum(k in relay.planted for k in below) <= left - removals // 2


def test_garbage_planted_with_markers_newer_than_the_real_ones_stops_no_start(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Found attacking the start's bounds: garbage planted at the entries of 40 made-up
    graphs, with their markers, newer than the real ones. Each is an entry that exists, so
    a start fetches it, and refuses it; on main the 32nd such refusal stopped the start
    before any real entry. Now, after PULL_MISSES refusals newest first, it goes on oldest
    first: a flood planted at one time does not stop it before the real entries."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    fakes = [str(10**35 + i) for i in range(40)]
    client = bucket_client(server, prefix)
    put_objects(client, {f"{ENTRY_DIR}/{entry_name(_key(g))}": b"garbage" * 20 for g in fakes})
    relay.plant_many([f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in fakes], when=NEWER)
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire
    assert wire["get"] <= GRAPHS + 2 * _bucket_start.PULL_MISSES, wire


def test_writers_do_not_all_prune_again_when_the_size_cannot_be_told(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """A prune cut short marks the bucket's state so, and writers take the size as unknown;
    so do they when keys the client refuses cut their listing of records short: each would
    prune at its next check, every writer host of a fleet one after another, each paying
    the flood. One an interval is enough: a writer leaves it when a prune ran less than an
    interval ago, and prunes once the last one is older. On main the state's mark was not
    read (the writer pruned on its stale totals) and a records' flood made every writer
    prune."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=1000))
    client = bucket_client(server, prefix)

    def state(age: float, complete: bool) -> None:
        t = datetime.datetime.now(datetime.UTC).timestamp() - age
        body = {"time": t, "entries": 0, "bytes": 0, "complete": complete}
        obstore.put(client, upkeep.STATE, json.dumps(body).encode())

    def writer(name: str) -> int:
        settings = Settings.from_env().replace(xdg_cache_home=str(tmp_path / name))
        store = open_store(url, settings=settings)
        assert isinstance(store, bucket.BucketStore)
        for i in range(4):
            assert store.put(f"{name}-{i}", bytes(2000))
        assert store.remote is not None
        store.remote.flush()
        store._recorder.flush(final=True)
        prunes = int(store._recorder.prunes)
        store.close()
        return prunes

    state(0.0, False)
    assert writer("after-a-cut-short-prune") == 0
    state(3600.0, False)
    assert writer("an-hour-later") == 1
    # Records the client cannot list, each its own refused page: their listing is cut short.
    records = f"{prefix}/{upkeep.USE_RECORD_DIR}"
    relay.plant_many(f"{records}/r-{i:04d}\x01" for i in range(FLOOD))
    state(0.0, True)
    assert writer("records-flooded") == 0


def test_objects_planted_before_every_entry_and_marker_crowd_out_no_start(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Found attacking the start's bounds: past a crowded listing of markers a start lists
    the entries, at most PULL_ENTRIES objects; a hundred thousand objects planted before
    every entry used all of it, and the start then knew no entry and fetched none. Runs of
    objects that are no name of ours are now jumped over (a page a run), in both
    listings."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    entries = 100_001  # past _bucket_start.PULL_ENTRIES
    relay.plant_many(f"{prefix}/{ENTRY_DIR}/!{i:08d}" for i in range(entries))
    relay.plant_many(f"{_markers(prefix)}/!{i:08d}" for i in range(FLOOD))
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS and wire["get"] == GRAPHS, wire
    assert wire["list"] <= 8, wire
