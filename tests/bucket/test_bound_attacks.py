"""Attacks on the newest bounds, as a writer of the bucket without a key would make them:
a prune cut short that reaches entries by name (``bucket/prune_reach.py``) and a torch_xla
host start (``torch_xla/_bucket_start.py``), on a real S3 service (SeaweedFS on loopback)
behind the tests' relay."""

from __future__ import annotations

import random
from pathlib import Path

import obstore
import pytest
from xla_pcache import entry_name, open_store
from xla_pcache.bucket import prune_reach, upkeep
from xla_pcache.bucket.reader import MAX_USE_RECORD
from xla_pcache.config import Settings
from xla_pcache.torch_xla import _bucket_start

from tests.bucket.bucket_plants import (
    ENTRIES,
    _held,
    _hex,
    _hidden_after_the_entries,
    _prune_json,
    _written_by_a_host,
)
from tests.bucket.test_bucket_floods import GRAPHS, NEWER, _key, _markers, _torch_xla_bucket
from tests.bucket.test_start_attacks import _start
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, put_objects


def test_a_flood_of_small_records_leaves_a_real_records_names_their_turns(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """One key after every entry hides them, and 2,000 records planted after the host's,
    each naming one made-up entry: a prune cut short gave each record's first name a turn
    before any record's second, so the planted records took 1,999 of the 2,000 asks and
    the host's record reached one of its 12 entries; the bucket stayed over its budget
    (while the flood lasts: its records name nothing, so each prune deletes them, and the
    attacker plants 2,000 more before the next)."""
    prefix, url, real = _written_by_a_host(server, tmp_path)
    rng = random.Random(3)
    put_objects(
        bucket_client(server, prefix),
        {
            upkeep.new_use_record_name(0, 0): upkeep.use_record_body([_hex(rng)])
            for _ in range(upkeep.Limits().asks)
        },
    )
    size = sum(_held(server, prefix).values())
    _hidden_after_the_entries(relay, prefix, real, 1)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=size // 2))
    code, report, _ = _prune_json(url)
    assert code == 3 and report["asked"] <= upkeep.Limits().asks, report
    assert report["reached"] == ENTRIES, {k: report[k] for k in ("asked", "reached")}
    assert sum(_held(server, prefix).values()) <= size // 2, report


def test_records_take_their_first_turns_oldest_first_and_drawn_alternately() -> None:
    """The records' first turns alternate between the oldest by the service's time
    (records planted after a host's cannot go before it) and an order drawn per prune
    (records planted before it cannot know which go first): a host's record behind 200
    older planted ones of two made-up names each is not always last to be asked."""
    rng = random.Random(5)
    host = "records/r-host"
    firsts: list[int] = []
    orders = set()
    for _ in range(80):
        unseen = prune_reach.Unseen({}, 100)
        for i in range(200):
            for place in (0, 1):
                unseen.offer("records", (float(place), float(i), f"records/r-{i:04d}"), _hex(rng))
        unseen.offer("records", (0.0, 1000.0, host), _hex(rng))
        names = unseen.names()
        assert len(names) == 100 and names[0][1] == "records/r-0000", names[:2]
        # The turns alternate, the oldest and the drawn (each a first name).
        assert all(path is not None for _, path in names)
        orders.add(tuple(path for _, path in names[1::2]))
        firsts.append(next((i for i, (_, p) in enumerate(names) if p == host), -1))
    assert len(orders) == 80
    # About half the turns drawn among 201 records: 28 % of prunes reach it (measured
    # over 2,000); never once in 80 would be 0.72 ** 80 ~ 4e-12.
    assert any(i >= 0 for i in firsts), firsts


def _valid_made_up(url: str, home: Path, relay: Relay, prefix: str, n: int) -> None:
    """``n`` valid entries of made-up graphs (as xla_pcache writes them: they verify), and
    their markers, written after the real ones."""
    settings = Settings.from_env().replace(xdg_cache_home=str(home / "planter"))
    graphs = [str(10**35 + i) for i in range(n)]
    with open_store(url, settings=settings) as w:
        for g in graphs:
            assert w.put(_key(g), b"planted" * 100)
    relay.plant_many([f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in graphs], when=NEWER)


def test_valid_entries_of_made_up_graphs_newest_take_no_start_from_the_real_ones(
    relay: Relay, server: BucketServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid entries of made-up graphs (they verify: not garbage), as many as a start
    fetches (``PULL_FETCHES``, 64 here, the same code), with their markers newer than the
    real ones: newest first stopped only on misses, and these are hits, so the start fetched
    the planted ones to its cap and none of the 20 real entries. Now newest first takes half
    the fetches (32, all planted), and the other 32 are drawn from the 32 planted left and
    the 20 real: none of them real has the chance 1 / C(52, 20), about 8e-15 (about 12 are
    real, on average)."""
    monkeypatch.setattr(_bucket_start, "PULL_FETCHES", 64)
    prefix, url, _ = _torch_xla_bucket(server, tmp_path)
    _valid_made_up(url, tmp_path, relay, prefix, 64)
    fetched, wire, skipped = _start(url, tmp_path / "host", relay)
    host = Settings.from_env().replace(xdg_cache_home=str(tmp_path / "host"))
    with open_store(url, settings=host) as s:
        real = sum(_key(str(10**30 + 7919 * i)) in s for i in range(GRAPHS))
    assert real >= 1, (fetched, real, wire, skipped)
    assert fetched == 64, (fetched, wire, skipped)


@pytest.mark.parametrize("planted", ["earlier", "later"])
def test_records_planted_before_the_hosts_take_no_fold_unsaid(
    planted: str, relay: Relay, server: BucketServer
) -> None:
    """Records sorting before every host's (``r-1-...``), claiming the most a prune folds
    (32 of 8 MiB: its 256 MiB): the host's record waits for the next prune, whose records
    the attacker plants again, so the uses it holds never count: the prune removed the
    entry a host used, said ``pruned: true`` and exited 0. Records are now folded oldest
    first by the service's time: planted later, they wait behind the host's record, which
    keeps its entry; planted earlier, they take the fold, name nothing, and the prune says
    it was cut short (exit 3)."""
    from tests.bucket.bucket_plants import ENTRY_BYTES, RECORDS, _bucket

    prefix, url, names = _bucket(server, 4)
    client = bucket_client(server, prefix)
    used = names[0]
    obstore.put(client, upkeep.new_use_record_name(0, 0), upkeep.use_record_body([used]))
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=2 * ENTRY_BYTES))
    cap = upkeep.Limits().record_bytes // MAX_USE_RECORD
    relay.plant_many(
        (f"{prefix}/{RECORDS}/r-1-{i:016x}-1-1" for i in range(cap)),
        size=MAX_USE_RECORD,
        when=NEWER if planted == "later" else None,
    )
    code, report, _ = _prune_json(url)
    kept = used not in report["removed_names"]
    assert kept or (code == 3 and not report["pruned"] and report["cut_short"]), (code, report)
    assert kept or planted == "earlier", report
