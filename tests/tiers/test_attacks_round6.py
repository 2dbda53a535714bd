"""Attacks on the bucket's new bounds and fallbacks, as a writer of the bucket without a key
would make them (docs/reliability.md's threat model), on a real S3 service (SeaweedFS on
loopback) behind the tests' relay (``tests/tiers/relay.py``), which lists keys SeaweedFS
cannot hold as S3 lists them and plants thousands without a PUT each.

Each test is one attack: a flood or a crafted object against a listing, a prune (the
command's and a writer's own), a writer's budget check or a torch_xla host start. The
defence holds when the test passes."""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path
from typing import Any

import obstore
import pytest
from xla_pcache import bucket, entry_name, open_store
from xla_pcache.bucket import recorder as upkeep_recorder
from xla_pcache.bucket import upkeep
from xla_pcache.bucket.reader import list_requests_bound
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR

from tests.helpers import cli_here
from tests.tiers.relay import S3Relay
from tests.tiers.servers import S3Server, bucket_client, fresh_prefix, put_objects
from tests.tiers.test_bucket_floods import (
    GRAPHS,
    NEWER,
    OLDER,
    _key,
    _markers,
    _start,
    _torch_xla_bucket,
)

ENTRIES = 12
ENTRY_BYTES = 1000
BUDGET = ENTRIES * ENTRY_BYTES // 2
TARGET = int(BUDGET * upkeep.LOW_WATERMARK)
RECORDS = f"{upkeep.USE_RECORD_DIR}"


def _hex(rng: random.Random, below: int = 16**32) -> str:
    return f"{rng.randrange(below):032x}"


def _bucket(s3: S3Server, n: int = ENTRIES) -> tuple[str, str, list[str]]:
    """A fresh prefix holding ``n`` entry objects; (prefix, url, their names)."""
    prefix = fresh_prefix()
    client = bucket_client(s3, prefix)
    names = sorted(entry_name(f"{prefix}-{i}") for i in range(n))
    put_objects(client, {f"{ENTRY_DIR}/{x}": b"x" * ENTRY_BYTES for x in names})
    return prefix, s3.url(prefix), names


def _prune_json(url: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    out = cli_here("prune", "--path", url, "--json", *extra)
    return out.exit_code, json.loads(out.stdout), out.stderr


# ------------------------------------------------------------------- records hidden
def test_records_hidden_behind_refused_keys_make_a_prune_say_it_was_cut_short(
    relay: S3Relay, s3: S3Server
) -> None:
    """257 keys the client refuses, named to sort before every record (``records/r-0<i>``
    and a control character): the listing of ``records/`` stops at its budget before the
    hosts' records, so the prune folds none of them and orders entries as if none had
    been used: it removes the entry a host used last, and said ``pruned: true``, exit 0. It
    now says its view was cut short (exit 3), as it does for the entries' listing."""
    prefix, url, names = _bucket(s3, 4)
    client = bucket_client(s3, prefix)
    used = names[0]  # the first to go by name among equals: a record must keep it
    obstore.put(client, upkeep.new_use_record_name(0, 0), upkeep.use_record_body([used]))
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=2 * ENTRY_BYTES))
    relay.plant_many(f"{prefix}/{RECORDS}/r-0{i:04d}\x01" for i in range(257))
    code, report, _ = _prune_json(url)
    kept = used not in report["removed_names"]
    assert kept or (code == 3 and not report["pruned"] and report["cut_short"]), (code, report)


# ------------------------------------------------------------------- the gallop defeated
def test_objects_of_ours_between_refused_names_do_not_stop_the_gallop(
    relay: S3Relay, s3: S3Server
) -> None:
    """300 pairs before every real entry, each an object at an entry's name (an ordinary
    PUT, a byte) and a key the client refuses right after it (``<name>\\x01``): each
    refused page hides an object the walk finds by name, which made it count no flood, so
    it never galloped and went past one pair a page until its budget, never reaching the
    real entries: the command's prune saw none of them. Keys refused before the entries are
    one of the floods the docs say cannot hide entries from the command's prune. Only
    objects listed between refused keys now stop a gallop."""
    prefix, url, real = _bucket(s3)
    rng = random.Random(7)
    low = int(real[0], 16)
    fake = sorted({_hex(rng, low) for _ in range(300)})
    put_objects(bucket_client(s3, prefix), {f"{ENTRY_DIR}/{x}": b"f" for x in fake})
    relay.plant_many(f"{prefix}/{ENTRY_DIR}/{x}\x01" for x in fake)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    relay.take()
    code, report, _ = _prune_json(url)
    wire = relay.take()
    removed = set(report["removed_names"])
    assert len(removed & set(real)) >= ENTRIES // 2, (code, report["entries_before"], report)
    assert report["bytes"] <= TARGET, report
    bound = list_requests_bound(ENTRIES + 2 * len(fake), len(fake)) + 10
    assert wire["list"] <= bound and wire.get("head", 0) <= 2 * 257 + 10, wire


# ------------------------------------------------------------------- writers' own prunes
def _puts_by_a_host(url: str, home: Path, keys: str, n: int, size: int) -> bucket.BucketStore:
    """A writer host's store (its cache home is ``home``) after ``n`` puts of ``size`` bytes
    at keys ``{keys}-{i}``, its uploads flushed."""
    store = open_store(url, settings=Settings.from_env().replace(xdg_cache_home=str(home)))
    assert isinstance(store, bucket.BucketStore)
    for i in range(n):
        assert store.put(f"{keys}-{i}", bytes(size))
    assert store.remote is not None
    store.remote.flush()
    return store


def _writer(url: str, home: Path, name: str, n: int = 4, size: int = 2000) -> tuple[int, int]:
    """A writer host's process: ``n`` puts of ``size`` bytes, its record and budget check at
    exit; (prunes it ran, of them cut short)."""
    store = _puts_by_a_host(url, home / name, name, n, size)
    store._recorder.flush(final=True)
    out = (int(store._recorder.prunes), int(store._recorder.prunes_cut_short))
    store.close()
    return out


def test_an_object_below_states_name_does_not_make_every_writer_prune(
    relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """One object planted below ``state``'s name (``state/x``), on a service that makes a
    directory of it: no prune can write ``state`` again, so writers never learn that a
    prune ran, take the size as unknown with no prune behind it, and every writer host
    prunes at every check (every interval, and at every exit). SeaweedFS keeps an object
    beside a directory of its name (a plain PUT of ``state`` is taken), so the prune's
    ``state`` stands and a writer right after it, within the budget, does not prune."""
    prefix, url, _ = _bucket(s3, 4)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=10 * ENTRY_BYTES))
    obstore.put(bucket_client(s3, prefix), f"{upkeep.STATE}/x", b"squat")
    assert _writer(url, tmp_path, "first")[0] == 1
    assert upkeep.Bucket(url).read_state() is not None
    assert _writer(url, tmp_path, "second", n=1, size=100)[0] == 0


def test_a_writers_prune_past_its_entry_cap_prunes_what_it_saw_once_an_interval(
    relay: S3Relay, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More objects at entries' names than a writer's prune may hold
    (``WRITER_LIMITS.entries``, 250,000; 2,000 here, the same code): the prune stopped
    there, removed nothing, wrote no ``state``, and so every writer host pruned again at
    every check, each listing its cap, while the bucket stayed over its budget. A bound
    limits what one host reads: the writer now prunes what it listed, says it was cut short
    and marks ``state`` so, and the next writer leaves it for an interval."""
    cap = 2000
    monkeypatch.setattr(upkeep, "WRITER_LIMITS", upkeep.Limits(entries=cap, seconds=120.0))
    prefix, url, _ = _bucket(s3)
    rng = random.Random(11)
    relay.plant_many(
        (f"{prefix}/{ENTRY_DIR}/{_hex(rng)}" for _ in range(cap + 1)),
        size=1,
    )
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    relay.take()
    _writer(url, tmp_path, "first", n=1, size=100)
    first = relay.take()
    listed = obstore.list(bucket_client(s3, prefix), ENTRY_DIR).collect()
    assert sum(m["size"] for m in listed) <= BUDGET, (len(listed), first)
    _writer(url, tmp_path, "second", n=1, size=100)
    second = relay.take()
    assert second.get("list", 0) <= 3, (first, second)


# ------------------------------------------------------------------- torch_xla host starts


def _garbage_with_markers(
    s3: S3Server, relay: S3Relay, prefix: str, graphs: list[str], when: datetime.datetime
) -> None:
    """Garbage at the entries of ``graphs`` (made up), and their markers dated ``when``."""
    put_objects(
        bucket_client(s3, prefix),
        {f"{ENTRY_DIR}/{entry_name(_key(g))}": b"garbage" * 20 for g in graphs},
    )
    relay.plant_many([f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in graphs], when=when)


@pytest.mark.parametrize("shape", ["garbage entries", "markers of no entry, a listing cut short"])
def test_objects_planted_at_both_ends_in_time_stop_no_start(
    shape: str, relay: S3Relay, s3: S3Server, tmp_path: Path
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
    prefix, url, _ = _torch_xla_bucket(s3, tmp_path)
    n = bucket.PULL_MISSES
    newer, older = [str(10**35 + i) for i in range(n)], [str(10**36 + i) for i in range(n)]
    if shape == "garbage entries":
        _garbage_with_markers(s3, relay, prefix, newer, NEWER)
        _garbage_with_markers(s3, relay, prefix, older, OLDER)
    else:
        relay.plant(f"{prefix}/{ENTRY_DIR}/{'f' * 32}\x01")
        for graphs, when in ((newer, NEWER), (older, OLDER)):
            relay.plant_many(
                [f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in graphs], when=when
            )
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire


def test_markers_of_no_entry_behind_a_cut_short_listing_go_at_the_next_prune(
    relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """The second shape above (64 markers of no entry, at both ends in time, and one key
    that cuts the entries' listing short) still stops a start before any prune. The next
    prune, cut short by the same key, asks for the markers' entries by name, finds them
    absent and removes their markers: the start after it fetches every real entry. On main
    a prune cut short removed no marker of an entry it did not list."""
    prefix, url, _ = _torch_xla_bucket(s3, tmp_path)
    n = bucket.PULL_MISSES
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
    relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """Markers of made-up graphs under every real entry's name, sorting before its real
    marker, 6,000 an entry (120,000): a start lists the markers of the entries a page at a
    time, two pages an entry before the next, and at most 100 pages in all; every page
    went to the planted markers and no real marker was reached. The entries whose markers
    the pages could not finish are now asked for by name: the first bytes of each file name
    its key, a torch_xla key of this build is fetched (and verified whole)."""
    prefix, url, graphs = _torch_xla_bucket(s3, tmp_path)
    names = sorted(entry_name(_key(g)) for g in graphs)
    relay.plant_many(
        (f"{_markers(prefix)}/{n}-0{j:05d}" for n in names for j in range(6000)), when=NEWER
    )
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire


# ------------------------------------------------------------------- crafted keys
# Keys that quote what the client's error says of a refused key: its message shows the raw
# key first and its escaped form after, each after ``path: "``.
LYING_KEYS = {
    "below a name": 'x path: "zz"//y',
    "a control character": 'x path: "zz\\"\x01',
    "a dot segment": '../y path: "',
}


@pytest.mark.parametrize("shape", sorted(LYING_KEYS))
def test_a_refused_key_quoting_the_clients_error_stops_no_listing(
    shape: str, relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """One key the client refuses whose text holds ``path: "`` (what the client's error
    says before the key): the key was read back from the first such text in the error, so
    the listing took a made-up key for the refused one, found it outside the prefix and
    raised: ``stats``, every prune, every writer's check and every torch_xla start of the
    bucket failed on one planted object."""
    prefix, url, real = _bucket(s3)
    relay.plant(f"{prefix}/{ENTRY_DIR}/{real[3]}/{LYING_KEYS[shape]}")
    stats = cli_here("stats", "--path", url, "--json")
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["entries"] == ENTRIES
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    code, report, err = _prune_json(url)
    assert code in (0, 3) and report["entries_before"] == ENTRIES, (code, report, err)
    assert report["bytes"] <= TARGET
    assert any(LYING_KEYS[shape] in k for k in report["unlistable"]), report["unlistable"]


def test_a_refused_key_quoting_the_clients_error_stops_no_host_start(
    relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """The same key under ``torch_xla/``: a start's listing raised, and the host started
    with nothing from the bucket."""
    prefix, url, _ = _torch_xla_bucket(s3, tmp_path)
    relay.plant(f"{_markers(prefix)}/{'0' * 32}-1/{LYING_KEYS['below a name']}")
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire


# ------------------------------------------------------------------- flood shapes
def _shape(kind: str, n: int, prefix: str, real: list[str]) -> list[str]:
    """The keys of a flood of ``kind``, ``n`` of them, planted on the relay."""
    e = f"{prefix}/{ENTRY_DIR}"
    rng = random.Random(f"{kind}-{n}")
    low = int(real[0], 16)
    long_tail = "a" * 900
    if kind == "refused names before":
        return [f"{e}/{_hex(rng, low)}\x01" for _ in range(n)]
    if kind == "refused below names before":
        return [f"{e}/{_hex(rng, low)}//x" for _ in range(n)]
    if kind == "alternating refused names and listed names":
        hexes = sorted(_hex(rng, low) for _ in range(n))
        return [f"{e}/{h}\x01" for h in hexes] + [f"{e}/{h}" for h in hexes]
    if kind == "1,000-byte refused names before":
        return [f"{e}/{_hex(rng, low)}\x01{long_tail}" for _ in range(n)]
    if kind == "1,000-byte refused below names":
        return [f"{e}/{_hex(rng)}/{long_tail}//x" for _ in range(n)]
    if kind == "refused before, at shard-like lengths":
        return [f"{e}/{'0' * (1 + k % 33)}\x01{k}" for k in range(n)]
    if kind == "refused empty names":
        return [f"{e}//{i}" for i in range(n)]
    raise AssertionError(kind)


SHAPES = [
    ("refused names before", 4),
    ("refused names before", 5),
    ("refused names before", 1001),
    ("refused below names before", 8),
    ("refused below names before", 1001),
    ("alternating refused names and listed names", 300),
    ("1,000-byte refused names before", 100),
    ("1,000-byte refused below names", 100),
    ("refused before, at shard-like lengths", 300),
    ("refused empty names", 300),
]


@pytest.mark.parametrize(("kind", "n"), SHAPES)
def test_a_flood_of_any_shape_leaves_the_commands_prune_honest(
    kind: str, n: int, relay: S3Relay, s3: S3Server
) -> None:
    """Floods of each shape, at the counts where the walk changes what it does (4 and 5
    around the gallop, 8 for the listing with a delimiter, 1,001 past a page): the
    command's prune sees every real entry and keeps the budget, or says it was cut short
    (exit 3, not ``pruned``); it removes only what it listed; its requests stay within
    ``list_requests_bound``."""
    prefix, url, real = _bucket(s3)
    keys = _shape(kind, n, prefix, real)
    relay.plant_many(keys)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    relay.take()
    code, report, err = _prune_json(url)
    wire = relay.take()
    assert code in (0, 3), (code, err)
    if code == 0:
        assert report["pruned"] and report["cut_short"] is None, report
        assert report["entries_before"] >= ENTRIES and report["bytes"] <= TARGET, report
    else:
        assert not report["pruned"] and report["cut_short"], report
    assert set(report["removed_names"]) <= set(real) | {k.rpartition("/")[2] for k in keys}
    assert report["entries_before"] == ENTRIES, report  # the real ones, every time
    bound = list_requests_bound(ENTRIES + len(keys), len(keys)) + 10
    assert wire["list"] <= bound and wire.get("head", 0) <= 2 * 257 + 10, wire


def test_the_three_plants_at_once_and_markers_far_in_the_future_steer_no_start(
    relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """Cases (a), (b) and (c) together, dated far ahead: 1,000 empty markers of made-up
    graphs, 10,000 objects sorting before every marker and 10,000 markers under the first
    real entry's name, all dated ten years ahead, and garbage at 32 made-up entries with
    their markers: a new host still fetches every real entry, within its bounds."""
    prefix, url, graphs = _torch_xla_bucket(s3, tmp_path)
    d = _markers(prefix)
    far = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3650)
    first = min(entry_name(_key(g)) for g in graphs)
    relay.plant_many(
        [f"{d}/{entry_name(_key(g))}-{g}" for g in (str(10**37 + i) for i in range(1000))]
        + [f"{d}/0000{i:028x}-{i}" for i in range(10_000)]
        + [f"{d}/{first}-0{i}" for i in range(10_000)],
        when=far,
    )
    _garbage_with_markers(s3, relay, prefix, [str(10**35 + i) for i in range(32)], far)
    fetched, wire = _start(url, tmp_path / "host", relay)
    assert fetched == GRAPHS, wire
    assert wire["get"] <= GRAPHS + 2 * bucket.PULL_MISSES, wire


# ------------------------------------------------------------------- entries reached by name
# One key the client refuses as a name of its own, sorting right after every entry: the
# service lists it in the first page, the client refuses that page as a whole, and no
# listing through it sees the entries before it (no page was listed before it to recover
# from). A prune then saw nothing, removed nothing and exited 3 for any bucket under 1,000
# entries. The fleet names its entries in its records (a put included), ``usage`` and
# markers: a prune cut short asks for those it did not list by name, within
# ``Limits.asks`` HEADs.
AFTER_EVERY_ENTRY = "f" * 32 + "\x01"


def _written_by_a_host(s3: S3Server, home: Path, n: int = ENTRIES) -> tuple[str, str, set[str]]:
    """A fresh prefix where a writer host put ``n`` entries (no budget yet, so it does not
    prune), its record uploaded; (prefix, url, the entries' names)."""
    prefix = fresh_prefix()
    url = s3.url(prefix)
    _puts_by_a_host(url, home / "first-writer", prefix, n, ENTRY_BYTES).close()
    listed = obstore.list(bucket_client(s3, prefix), ENTRY_DIR).collect()
    assert len(listed) == n
    return prefix, url, {str(m["path"]).rpartition("/")[2] for m in listed}


def _held(s3: S3Server, prefix: str) -> dict[str, int]:
    """The entries the server holds (not through the relay): name -> size."""
    listed = obstore.list(bucket_client(s3, prefix), ENTRY_DIR).collect()
    return {str(m["path"]).rpartition("/")[2]: int(m["size"]) for m in listed}


def _hidden_after_the_entries(relay: S3Relay, prefix: str, real: set[str], n: int) -> None:
    """``n`` keys the client refuses as names of their own, after every entry."""
    if n == 1:
        relay.plant(f"{prefix}/{ENTRY_DIR}/{AFTER_EVERY_ENTRY}")
        return
    rng = random.Random(n)
    low = int(max(real), 16) + 1
    relay.plant_many(
        f"{prefix}/{ENTRY_DIR}/{low + rng.randrange(16**32 - low):032x}\x01" for _ in range(n)
    )


@pytest.mark.parametrize("refused", [1, 10_000])
def test_keys_refused_after_every_entry_hide_no_entry_from_the_commands_prune(
    refused: int, relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """One key (or ten thousand) the client refuses, after the last entry of a bucket of 12
    over its budget: on main the command's prune listed none of them, removed none, exit 3,
    and the bucket stayed over its budget for good. The writer named its puts in its
    record: the prune asks for them by name and brings the bucket within its budget, and
    still says it was cut short."""
    prefix, url, real = _written_by_a_host(s3, tmp_path)
    size = sum(_held(s3, prefix).values())
    budget = size // 2
    _hidden_after_the_entries(relay, prefix, real, refused)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=budget))
    relay.take()
    code, report, err = _prune_json(url)
    wire = relay.take()
    assert code == 3 and not report["pruned"] and report["cut_short"], (code, report, err)
    assert report["entries_before"] == ENTRIES and report["reached"] == ENTRIES, report
    held = _held(s3, prefix)
    assert sum(held.values()) <= budget * upkeep.LOW_WATERMARK, (held, report)
    assert set(report["removed_names"]) <= real and set(held) <= real, report
    assert report["asked"] <= upkeep.Limits().asks and wire.get("head", 0) <= (
        report["asked"] + 2 * 257 + 10
    ), wire
    if refused > 1:
        return  # what follows walks the flood again: once is enough
    # The next prune finds the same within budget, and removes nothing more.
    code, again, _ = _prune_json(url)
    assert code == 3 and again["removed"] == 0 and again["entries_before"] == len(held), again
    # `stats` cannot list them either; it shows what the last prune saw.
    stats = json.loads(cli_here("stats", "--path", url, "--json").stdout)
    assert not stats["listing_complete"] and stats["last_prune_complete"] is False, stats
    assert stats["last_prune_entries"] == len(held), stats
    assert f"{len(held):,} entries" in cli_here("stats", "--path", url).stdout


def test_a_writers_own_prune_reaches_the_entries_a_refused_key_hides(
    relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """The same key, and a writer whose puts take the bucket past its budget: on main its
    prune (inside the program, without a delimiter) saw no entry and removed none; every
    writer after it did the same. It now reaches them by name and keeps the budget. A
    read-only host of the bucket meanwhile writes nothing to it."""
    prefix, url, real = _written_by_a_host(s3, tmp_path)
    _hidden_after_the_entries(relay, prefix, real, 1)
    budget = sum(_held(s3, prefix).values())  # full: the next puts go past it
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=budget))
    relay.take()
    ro = Settings.from_env().replace(xdg_cache_home=str(tmp_path / "reader"), read_only=True)
    with open_store(url, settings=ro) as reader:
        assert reader.get(f"{prefix}-0") is not None
    wire = relay.take()
    assert not {"put", "post", "delete"} & set(wire), wire
    prunes, cut_short = _writer(url, tmp_path, "second-writer", n=4, size=ENTRY_BYTES)
    assert (prunes, cut_short) == (1, 1)
    held = _held(s3, prefix)
    assert sum(held.values()) <= budget * upkeep.LOW_WATERMARK, held
    # Least recently used first: of the first writer's entries, not the ones just written.
    assert len(real - set(held)) >= 4, held


@pytest.mark.parametrize("where", ["a record", "usage, dated 1970"])
def test_made_up_names_cost_a_bounded_number_of_heads_and_remove_nothing_real(
    where: str, relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """Ten thousand made-up entry names planted in a record (or in ``usage``, dated long
    before any real use, so the oldest use first would ask them all first), with one key
    that hides the entries: the prune asks at most its bound of names, finds every real
    entry among them (each source takes its turns, each record its own), and removes
    none within the budget. On main it saw no entry at all."""
    prefix, url, real = _written_by_a_host(s3, tmp_path)
    client = bucket_client(s3, prefix)
    rng = random.Random(where)
    fake = [_hex(rng) for _ in range(10_000)]
    if where == "a record":
        obstore.put(client, upkeep.new_use_record_name(0, 0), upkeep.use_record_body(fake))
    else:
        import gzip

        lines = "".join(f"{n} 1.000 9\n" for n in sorted(fake))
        obstore.put(client, upkeep.USAGE, gzip.compress(lines.encode()))
    _hidden_after_the_entries(relay, prefix, real, 1)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=10**9))
    relay.take()
    code, report, _ = _prune_json(url)
    wire = relay.take()
    assert report["entries_before"] == ENTRIES and report["removed"] == 0, report
    bound = upkeep.Limits().asks
    assert report["asked"] == bound and wire["head"] <= bound + 2 + 10, (report["asked"], wire)
    assert code == 3 and set(_held(s3, prefix)) == real


def test_one_refused_key_makes_writers_prune_neither_never_nor_at_every_check(
    relay: S3Relay, s3: S3Server, tmp_path: Path
) -> None:
    """After a prune cut short by one key after every entry, writers' estimate was unknown:
    the first writer to check an interval later pruned, whatever the size, and so on every
    interval for as long as the key stayed (each prune paying the key again). Now what that
    prune saw (listed or reached) plus the writes recorded since it is a lower bound: a
    writer within it does not prune (a record older than that prune, whose writes its
    totals hold, does not count), one past it does and keeps the budget, and once a day a
    writer looks again in case the key is gone."""
    prefix, url, real = _written_by_a_host(s3, tmp_path)
    _hidden_after_the_entries(relay, prefix, real, 1)
    size = sum(_held(s3, prefix).values())
    b = upkeep.Bucket(url)
    b.write_stored_budget(upkeep.BucketStoredBudget(max_size=2 * size))
    code, report, _ = _prune_json(url)
    assert code == 3 and report["bytes"] == size and report["removed"] == 0, report
    client = bucket_client(s3, prefix)

    def age_state(seconds: float) -> None:
        state = json.loads(bytes(obstore.get(client, upkeep.STATE).bytes()))
        state["time"] -= seconds
        obstore.put(client, upkeep.STATE, json.dumps(state).encode())

    age_state(3600)
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=2)
    ms = int(old.timestamp() * 1000)
    relay.plant(f"{prefix}/{RECORDS}/r-{ms}-{'0' * 16}-1000-{10**9}", size=20, when=old)
    estimate = b.estimate()
    assert estimate.lower and estimate.bytes == size, estimate
    assert _writer(url, tmp_path, "within", n=1, size=100) == (0, 0)
    assert _writer(url, tmp_path, "past", n=ENTRIES, size=2 * ENTRY_BYTES) == (1, 1)
    assert sum(_held(s3, prefix).values()) <= 2 * size * upkeep.LOW_WATERMARK
    age_state(2 * upkeep_recorder.AGE_PRUNE_EVERY_S)
    assert _writer(url, tmp_path, "a-day-later", n=1, size=100) == (1, 1)
