"""Objects planted in a bucket by a writer without a key make writers prune neither at every
check nor never: a ``state`` that cannot be written, more entries than a writer's prune may
hold, or a key that cuts every listing short each leave the writers pruning at their pace
and keeping the budget. On a real S3 service (``tests/bucket/bucket_plants.py``); the
defence holds when the test passes."""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path

import obstore
import pytest
from xla_pcache.bucket import recorder as upkeep_recorder
from xla_pcache.bucket import upkeep
from xla_pcache.tiers.objstore import ENTRY_DIR

from tests.bucket.bucket_plants import (
    BUDGET,
    ENTRIES,
    ENTRY_BYTES,
    RECORDS,
    _bucket,
    _held,
    _hex,
    _hidden_after_the_entries,
    _prune_json,
    _writer,
    _written_by_a_host,
)
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client


def test_an_object_below_states_name_does_not_make_every_writer_prune(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """One object planted below ``state``'s name (``state/x``), on a service that makes a
    directory of it: no prune can write ``state`` again, so writers never learn that a
    prune ran, take the size as unknown with no prune behind it, and every writer host
    prunes at every check (every interval, and at every exit). SeaweedFS keeps an object
    beside a directory of its name (a plain PUT of ``state`` is taken), so the prune's
    ``state`` stands and a writer right after it, within the budget, does not prune."""
    prefix, url, _ = _bucket(server, 4)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=10 * ENTRY_BYTES))
    obstore.put(bucket_client(server, prefix), f"{upkeep.STATE}/x", b"squat")
    assert _writer(url, tmp_path, "first")[0] == 1
    assert upkeep.Bucket(url).read_state() is not None
    assert _writer(url, tmp_path, "second", n=1, size=100)[0] == 0


def test_a_writers_prune_past_its_entry_cap_prunes_what_it_saw_once_an_interval(
    relay: Relay, server: BucketServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More objects at entries' names than a writer's prune may hold
    (``WRITER_LIMITS.entries``, 250,000; 2,000 here, the same code): the prune stopped
    there, removed nothing, wrote no ``state``, and so every writer host pruned again at
    every check, each listing its cap, while the bucket stayed over its budget. A bound
    limits what one host reads: the writer now prunes what it listed, says it was cut short
    and marks ``state`` so, and the next writer leaves it for an interval."""
    cap = 2000
    monkeypatch.setattr(upkeep, "WRITER_LIMITS", upkeep.Limits(entries=cap, seconds=120.0))
    prefix, url, _ = _bucket(server)
    rng = random.Random(11)
    # The planted names sort after every real one (theirs are random), so the cap falls
    # among planted ones: a real entry past the cap would be unseen, and rightly kept.
    relay.plant_many(
        (f"{prefix}/{ENTRY_DIR}/ffff{_hex(rng, 16**28)[4:]}" for _ in range(cap + 1)),
        size=1,
    )
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=BUDGET))
    relay.take()
    _writer(url, tmp_path, "first", n=1, size=100)
    first = relay.take()
    listed = obstore.list(bucket_client(server, prefix), ENTRY_DIR).collect()
    assert sum(m["size"] for m in listed) <= BUDGET, (len(listed), first)
    _writer(url, tmp_path, "second", n=1, size=100)
    second = relay.take()
    assert second.get("list", 0) <= 3, (first, second)


def test_one_refused_key_makes_writers_prune_neither_never_nor_at_every_check(
    relay: Relay, server: BucketServer, tmp_path: Path
) -> None:
    """After a prune cut short by one key after every entry, writers' estimate was unknown:
    the first writer to check an interval later pruned, whatever the size, and so on every
    interval for as long as the key stayed (each prune paying the key again). Now what that
    prune saw (listed or reached) plus the writes recorded since it is a lower bound: a
    writer within it does not prune (a record older than that prune, whose writes its
    totals hold, does not count), one past it does and keeps the budget, and once a day a
    writer looks again in case the key is gone."""
    prefix, url, real = _written_by_a_host(server, tmp_path)
    _hidden_after_the_entries(relay, prefix, real, 1)
    size = sum(_held(server, prefix).values())
    b = upkeep.Bucket(url)
    b.write_stored_budget(upkeep.BucketStoredBudget(max_size=2 * size))
    code, report, _ = _prune_json(url)
    assert code == 3 and report["bytes"] == size and report["removed"] == 0, report
    client = bucket_client(server, prefix)

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
    assert sum(_held(server, prefix).values()) <= 2 * size * upkeep.LOW_WATERMARK
    age_state(2 * upkeep_recorder.AGE_PRUNE_EVERY_S)
    assert _writer(url, tmp_path, "a-day-later", n=1, size=100) == (1, 1)
