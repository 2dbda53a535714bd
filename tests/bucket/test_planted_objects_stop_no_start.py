"""Objects planted in a bucket by a writer without a key stop no torch_xla host start: garbage
with markers at both ends in time, markers of no entry behind a listing cut short, markers
crowding out the real ones, a key quoting the client's error, all at once and dated far
ahead: a new host still fetches every real entry, within its bounds. On a real S3 service
(``tests/bucket/bucket_plants.py``); the defence holds when the test passes."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from xla_pcache import entry_name
from xla_pcache.bucket import upkeep
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla import _bucket_start

from tests.bucket.bucket_plants import LYING_KEYS, _garbage_with_markers
from tests.bucket.test_bucket_floods import (
    GRAPHS,
    NEWER,
    OLDER,
    _key,
    _markers,
    _start,
    _torch_xla_bucket,
)
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer


@pytest.mark.parametrize("shape", ["garbage entries", "markers of no entry, a listing cut short"])
def test_objects_planted_at_both_ends_in_time_stop_no_start(
    shape: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Garbage at the entries of made-up graphs with their markers, 32 planted before the
    fleet wrote its entries and 32 after: a start fetches newest first, and after 32
    refusals oldest first, and stops after 32 more: it fetched none of the real entries.
    Planting at both ends costs the writer 64 objects and their markers. Or no garbage at
    all: one key the client refuses after every entry cuts the start's listing of the
    entries short, and markers of entries that listing did not see are followed (a GET
    each), so 64 markers of no entry did the same (until the next prune removes them: the
    test below).

    Past the newest 32, a start now fetches in an order drawn for it, until the misses
    there reach 32 plus the entries fetched: with 32 planted objects among those 52, it
    stops before a real entry only if its first 32 draws are the 32 planted ones, a chance
    of 1 / C(52, 20) (8e-15), and otherwise fetches every real entry."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    n = _bucket_start.PULL_MISSES
    newer, older = [str(10**35 + i) for i in range(n)], [str(10**36 + i) for i in range(n)]
    if shape == "garbage entries":
        _garbage_with_markers(server, relay, prefix, newer, NEWER)
        _garbage_with_markers(server, relay, prefix, older, OLDER)
    else:
        relay.plant(f"{prefix}/{ENTRY_DIR}/{'f' * 32}\x01")
        for graphs, when in ((newer, NEWER), (older, OLDER)):
            relay.plant_many(
                [f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in graphs], when=when
            )
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire


def test_markers_of_no_entry_behind_a_cut_short_listing_go_at_the_next_prune(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """The second shape above (64 markers of no entry, at both ends in time, and one key
    that cuts the entries' listing short) still stops a start before any prune. The next
    prune, cut short by the same key, asks for the markers' entries by name, finds them
    absent and removes their markers: the start after it fetches every real entry. On main
    a prune cut short removed no marker of an entry it did not list."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    n = _bucket_start.PULL_MISSES
    newer, older = [str(10**35 + i) for i in range(n)], [str(10**36 + i) for i in range(n)]
    relay.plant(f"{prefix}/{ENTRY_DIR}/{'f' * 32}\x01")
    for graphs, when in ((newer, NEWER), (older, OLDER)):
        relay.plant_many(
            [f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in graphs], when=when
        )
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.cut_short and report.markers_removed == 2 * n, report
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire


def test_markers_planted_under_every_real_entrys_name_crowd_out_no_start(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Markers of made-up graphs under every real entry's name, sorting before its real
    marker, 6,000 an entry (120,000): a start lists the markers of the entries a page at a
    time, two pages an entry before the next, and at most 100 pages in all; every page
    went to the planted markers and no real marker was reached. The entries whose markers
    the pages could not finish are now asked for by name: the first bytes of each file name
    its key, a torch_xla key of this build is fetched (and verified whole)."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    names = sorted(entry_name(_key(g)) for g in graphs)
    relay.plant_many(
        (f"{_markers(prefix)}/{n}-0{j:05d}" for n in names for j in range(6000)), when=NEWER
    )
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire


def test_a_refused_key_quoting_the_clients_error_stops_no_host_start(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """The same key under ``torch_xla/``: a start's listing raised, and the host started
    with nothing from the bucket."""
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    relay.plant(f"{_markers(prefix)}/{'0' * 32}-1/{LYING_KEYS['below a name']}")
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire


def test_the_three_plants_at_once_and_markers_far_in_the_future_steer_no_start(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Cases (a), (b) and (c) together, dated far ahead: 1,000 empty markers of made-up
    graphs, 10,000 objects sorting before every marker and 10,000 markers under the first
    real entry's name, all dated ten years ahead, and garbage at 32 made-up entries with
    their markers: a new host still fetches every real entry, within its bounds."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    d = _markers(prefix)
    far = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3650)
    first = min(entry_name(_key(g)) for g in graphs)
    relay.plant_many(
        [f"{d}/{entry_name(_key(g))}-{g}" for g in (str(10**37 + i) for i in range(1000))]
        + [f"{d}/0000{i:028x}-{i}" for i in range(10_000)]
        + [f"{d}/{first}-0{i}" for i in range(10_000)],
        when=far,
    )
    _garbage_with_markers(server, relay, prefix, [str(10**35 + i) for i in range(32)], far)
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire
    assert wire["get"] <= GRAPHS + 2 * _bucket_start.PULL_MISSES, wire
