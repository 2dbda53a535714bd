"""What the attacks on a bucket by a writer without a key share (docs/reliability.md's threat
model): a bucket of entry objects, a writer host's puts and exit, a prune's report, garbage
planted with its markers, and keys the client refuses planted after every entry; on a real
S3 service (SeaweedFS on loopback) behind the tests' relay (``tests/tiers/relay.py``), which
lists keys SeaweedFS cannot hold as S3 lists them and plants thousands without a PUT each."""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path
from typing import Any

import obstore
from xla_pcache import bucket, entry_name, open_store
from xla_pcache.bucket import upkeep
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR

from tests.bucket.test_bucket_floods import _key, _markers
from tests.helpers import cli_here
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix, put_objects

ENTRIES = 12
ENTRY_BYTES = 1000
BUDGET = ENTRIES * ENTRY_BYTES // 2
TARGET = int(BUDGET * upkeep.LOW_WATERMARK)
RECORDS = f"{upkeep.USE_RECORD_DIR}"


def _hex(rng: random.Random, below: int = 16**32) -> str:
    return f"{rng.randrange(below):032x}"


def _bucket(server: BucketServer, n: int = ENTRIES) -> tuple[str, str, list[str]]:
    """A fresh prefix holding ``n`` entry objects; (prefix, url, their names)."""
    prefix = fresh_prefix()
    client = bucket_client(server, prefix)
    names = sorted(entry_name(f"{prefix}-{i}") for i in range(n))
    put_objects(client, {f"{ENTRY_DIR}/{x}": b"x" * ENTRY_BYTES for x in names})
    return prefix, server.url(prefix), names


def _prune_json(url: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    out = cli_here("prune", "--path", url, "--json", *extra)
    return out.exit_code, json.loads(out.stdout), out.stderr


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


def _garbage_with_markers(
    server: BucketServer, relay: Relay, prefix: str, graphs: list[str], when: datetime.datetime
) -> None:
    """Garbage at the entries of ``graphs`` (made up), and their markers dated ``when``."""
    put_objects(
        bucket_client(server, prefix),
        {f"{ENTRY_DIR}/{entry_name(_key(g))}": b"garbage" * 20 for g in graphs},
    )
    relay.plant_many([f"{_markers(prefix)}/{entry_name(_key(g))}-{g}" for g in graphs], when=when)


# Keys that quote what the client's error says of a refused key: its message shows the raw
# key first and its escaped form after, each after ``path: "``.
LYING_KEYS = {
    "below a name": 'x path: "zz"//y',
    "a control character": 'x path: "zz\\"\x01',
    "a dot segment": '../y path: "',
}


# One key the client refuses as a name of its own, sorting right after every entry: the
# service lists it in the first page, the client refuses that page as a whole, and no
# listing through it sees the entries before it (no page was listed before it to recover
# from). A prune then saw nothing, removed nothing and exited 3 for any bucket under 1,000
# entries. The fleet names its entries in its records (a put included), ``usage`` and
# markers: a prune cut short asks for those it did not list by name, within
# ``Limits.asks`` HEADs.
AFTER_EVERY_ENTRY = "f" * 32 + "\x01"


def _written_by_a_host(
    server: BucketServer, home: Path, n: int = ENTRIES
) -> tuple[str, str, set[str]]:
    """A fresh prefix where a writer host put ``n`` entries (no budget yet, so it does not
    prune), its record uploaded; (prefix, url, the entries' names)."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    _puts_by_a_host(url, home / "first-writer", prefix, n, ENTRY_BYTES).close()
    listed = obstore.list(bucket_client(server, prefix), ENTRY_DIR).collect()
    assert len(listed) == n
    return prefix, url, {str(m["path"]).rpartition("/")[2] for m in listed}


def _held(server: BucketServer, prefix: str) -> dict[str, int]:
    """The entries the server holds (not through the relay): name -> size."""
    listed = obstore.list(bucket_client(server, prefix), ENTRY_DIR).collect()
    return {str(m["path"]).rpartition("/")[2]: int(m["size"]) for m in listed}


def _hidden_after_the_entries(relay: Relay, prefix: str, real: set[str], n: int) -> None:
    """``n`` keys the client refuses as names of their own, after every entry."""
    if n == 1:
        relay.plant(f"{prefix}/{ENTRY_DIR}/{AFTER_EVERY_ENTRY}")
        return
    rng = random.Random(n)
    low = int(max(real), 16) + 1
    relay.plant_many(
        f"{prefix}/{ENTRY_DIR}/{low + rng.randrange(16**32 - low):032x}\x01" for _ in range(n)
    )
