"""Keys planted in a bucket by a writer without a key leave every prune honest: a prune
sees every real entry, or reaches by name the entries a refused key hides, within its bounds
on requests, or says its view was cut short (exit 3, not ``pruned``); it removes only what
it listed or reached. A flood or a crafted key against a listing, on a real S3 service
(``tests/bucket/bucket_plants.py``); the defence holds when the test passes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import obstore
import pytest
from xla_pcache import open_store
from xla_pcache.bucket import upkeep
from xla_pcache.bucket.reader import list_requests_bound
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR

from tests.bucket.bucket_plants import (
    BUDGET,
    ENTRIES,
    ENTRY_BYTES,
    LYING_KEYS,
    RECORDS,
    TARGET,
    _bucket,
    _held,
    _hex,
    _hidden_after_the_entries,
    _prune_json,
    _writer,
    _written_by_a_host,
)
from tests.helpers import cli_here
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, put_objects


def test_records_hidden_behind_refused_keys_make_a_prune_say_it_was_cut_short(
    relay: Relay, server: BucketServer
) -> None:
    """257 keys the client refuses, named to sort before every record (``records/r-0<i>``
    and a control character): the listing of ``records/`` stops at its budget before the
    hosts' records, so the prune folds none of them and orders entries as if none had
    been used: it removes the entry a host used last, and said ``pruned: true``, exit 0. It
    now says its view was cut short (exit 3), as it does for the entries' listing."""
    prefix, url, names = _bucket(server, 4)
    client = bucket_client(server, prefix)
    used = names[0]  # the first to go by name among equals: a record must keep it
    obstore.put(client, upkeep.new_use_record_name(0, 0), upkeep.use_record_body([used]))
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=2 * ENTRY_BYTES))
    relay.plant_many(f"{prefix}/{RECORDS}/r-0{i:04d}\x01" for i in range(257))
    code, report, _ = _prune_json(url)
    kept = used not in report["removed_names"]
    assert kept or (code == 3 and not report["pruned"] and report["cut_short"]), (code, report)


def test_objects_of_ours_between_refused_names_do_not_stop_the_gallop(
    relay: Relay, server: BucketServer
) -> None:
    """300 pairs before every real entry, each an object at an entry's name (an ordinary
    PUT, a byte) and a key the client refuses right after it (``<name>\\x01``): each
    refused page hides an object the walk finds by name, which made it count no flood, so
    it never galloped and went past one pair a page until its budget, never reaching the
    real entries: the command's prune saw none of them. Keys refused before the entries are
    one of the floods the docs say cannot hide entries from the command's prune. Only
    objects listed between refused keys now stop a gallop."""
    prefix, url, real = _bucket(server)
    rng = random.Random(7)
    low = int(real[0], 16)
    fake = sorted({_hex(rng, low) for _ in range(300)})
    put_objects(bucket_client(server, prefix), {f"{ENTRY_DIR}/{x}": b"f" for x in fake})
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


@pytest.mark.parametrize("shape", sorted(LYING_KEYS))
def test_a_refused_key_quoting_the_clients_error_stops_no_listing(
    shape: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """One key the client refuses whose text holds ``path: "`` (what the client's error
    says before the key): the key was read back from the first such text in the error, so
    the listing took a made-up key for the refused one, found it outside the prefix and
    raised: ``stats``, every prune, every writer's check and every torch_xla start of the
    bucket failed on one planted object."""
    prefix, url, real = _bucket(server)
    relay.plant(f"{prefix}/{ENTRY_DIR}/{real[3]}/{LYING_KEYS[shape]}")
    stats = cli_here("stats", "--path", url, "--json")
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["entries"] == ENTRIES
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    code, report, err = _prune_json(url)
    assert code in (0, 3) and report["entries_before"] == ENTRIES, (code, report, err)
    assert report["bytes"] <= TARGET
    assert any(LYING_KEYS[shape] in k for k in report["unlistable"]), report["unlistable"]


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
    kind: str, n: int, relay: Relay, server: BucketServer
) -> None:
    """Floods of each shape, at the counts where the walk changes what it does (4 and 5
    around the gallop, 8 for the listing with a delimiter, 1,001 past a page): the
    command's prune sees every real entry and keeps the budget, or says it was cut short
    (exit 3, not ``pruned``); it removes only what it listed; its requests stay within
    ``list_requests_bound``."""
    prefix, url, real = _bucket(server)
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


@pytest.mark.parametrize("refused", [1, 10_000])
def test_keys_refused_after_every_entry_hide_no_entry_from_the_commands_prune(
    refused: int, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """One key (or ten thousand) the client refuses, after the last entry of a bucket of 12
    over its budget: on main the command's prune listed none of them, removed none, exit 3,
    and the bucket stayed over its budget for good. The writer named its puts in its
    record: the prune asks for them by name and brings the bucket within its budget, and
    still says it was cut short."""
    prefix, url, real = _written_by_a_host(server, tmp_path)
    size = sum(_held(server, prefix).values())
    budget = size // 2
    _hidden_after_the_entries(relay, prefix, real, refused)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=budget))
    relay.take()
    code, report, err = _prune_json(url)
    wire = relay.take()
    assert code == 3 and not report["pruned"] and report["cut_short"], (code, report, err)
    assert report["entries_before"] == ENTRIES and report["reached"] == ENTRIES, report
    held = _held(server, prefix)
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
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """The same key, and a writer whose puts take the bucket past its budget: on main its
    prune (inside the program, without a delimiter) saw no entry and removed none; every
    writer after it did the same. It now reaches them by name and keeps the budget. A
    read-only host of the bucket meanwhile writes nothing to it."""
    prefix, url, real = _written_by_a_host(server, tmp_path)
    _hidden_after_the_entries(relay, prefix, real, 1)
    budget = sum(_held(server, prefix).values())  # full: the next puts go past it
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=budget))
    relay.take()
    ro = Settings.from_env().replace(xdg_cache_home=str(tmp_path / "reader"), read_only=True)
    with open_store(url, settings=ro) as reader:
        assert reader.get(f"{prefix}-0") is not None
    wire = relay.take()
    assert not {"put", "post", "delete"} & set(wire), wire
    prunes, cut_short = _writer(url, tmp_path, "second-writer", n=4, size=ENTRY_BYTES)
    assert (prunes, cut_short) == (1, 1)
    held = _held(server, prefix)
    assert sum(held.values()) <= budget * upkeep.LOW_WATERMARK, held
    # Least recently used first: of the first writer's entries, not the ones just written.
    assert len(real - set(held)) >= 4, held


@pytest.mark.parametrize("where", ["a record", "usage, dated 1970"])
def test_made_up_names_cost_a_bounded_number_of_heads_and_remove_nothing_real(
    where: str, relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """Ten thousand made-up entry names planted in a record (or in ``usage``, dated long
    before any real use, so the oldest use first would ask them all first), with one key
    that hides the entries: the prune asks at most its bound of names, finds every real
    entry among them (each source takes its turns, each record its own), and removes
    none within the budget. On main it saw no entry at all."""
    prefix, url, real = _written_by_a_host(server, tmp_path)
    client = bucket_client(server, prefix)
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
    assert code == 3 and set(_held(server, prefix)) == real
