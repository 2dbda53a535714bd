"""What another writer of a shared bucket can plant, against a real S3 service (SeaweedFS
``weed mini``) and a real redis-server on loopback: every such object is a bounded miss or
a bounded wait, never a spin, an abort or memory in proportion to what was planted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import obstore
import pytest
import redis
from xla_pcache import Store, entry_name
from xla_pcache._names import EntryName
from xla_pcache.tiers.objstore import CLAIM_DIR, ENTRY_DIR, SPOOL_BYTES
from xla_pcache.tiers.redis import KEY_PREFIX

from tests.helpers import run_worker
from tests.tiers.servers import (
    RedisServer,
    S3Server,
    bucket_client,
    fresh_prefix,
)


# On main this test spun for ever inside claim() (HEAD of the claim 404, its conditional
# create 412, and that path skipped both the sleep and the deadline): the pytest timeout is
# its bound, not a clock read here.
@pytest.mark.timeout(120)
def test_an_object_planted_below_a_claim_name_is_a_bounded_wait(
    tmp_path: Path, s3: S3Server
) -> None:
    prefix = fresh_prefix()
    store = Store(tmp_path / "c", remote=s3.url(prefix))
    assert store.remote is not None
    claims = store.remote.claims()
    assert claims is not None
    name = entry_name("k")
    obstore.put(bucket_client(s3, prefix), f"{CLAIM_DIR}/{name}/x", b"planted", mode="create")
    got = claims.claim(name, wait=2, lease=30)
    assert got.state in ("abandoned", "timed_out"), got.state
    assert not got.held
    # The same claim taken for takeover (the overwrite path) is bounded as well.
    got = claims.claim(name, wait=1, lease=0)
    assert got.state != "claimed" and not got.held
    store.close()


# A reader in its own process, as a user's program: it opens the cache with a budget, gets
# the keys named on its command line and reports what it got, its counters, the warnings
# the package logged and how much its peak RSS grew during the gets.
_READER = r"""
import json, logging, sys
from xla_pcache import Store

def peak_kib():
    # VmHWM, this process's own: ru_maxrss keeps the high-water mark of the process it was
    # spawned from (the test's), so a growth under that would read as none.
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("xla_pcache").addHandler(Keep())
root, url, budget, *keys = sys.argv[1:]
store = Store(root, remote=url, max_size=None if budget == "none" else budget)
store.remote  # the client and its threads, before the baseline
before = peak_kib()
got = {}
for k in keys:
    blob = store.get(k)
    got[k] = None if blob is None else len(blob)
    del blob
grew = peak_kib() - before
store.remote.flush()
stats = {k: v for k, v in store.stats().items() if isinstance(v, int)}
warnings = [m for m in records if "remote cache" in m]
print(json.dumps({"got": got, "grew_kib": grew, "stats": stats, "warnings": warnings}))
"""


def _read(root: Path, url: str, budget: str, *keys: str) -> dict[str, Any]:
    out = run_worker("-c", _READER, str(root), url, budget, *keys, timeout=300)
    assert "Traceback" not in out.pop("stderr")
    return out


def test_garbage_and_oversized_objects_are_misses_in_bounded_memory(
    tmp_path: Path, s3: S3Server
) -> None:
    """A planted object far over the reader's budget costs one ranged read, not its size
    in memory (on main: downloaded whole, then copied once more); a garbage one and a
    real entry over the budget are misses too; each kind warns once and counts."""
    prefix = fresh_prefix()
    url = s3.url(prefix)
    client = bucket_client(s3, prefix)
    huge = 200 << 20
    obstore.put(client, f"{ENTRY_DIR}/{entry_name('huge')}", b"\0" * huge, mode="create")
    obstore.put(client, f"{ENTRY_DIR}/{entry_name('junk')}", os.urandom(3000), mode="create")
    writer = Store(tmp_path / "w", remote=url)
    assert writer.put("real", os.urandom(6 << 20))
    assert writer.put("small", b"fits")
    assert writer.remote is not None
    writer.remote.flush()
    report = _read(tmp_path / "r", url, "4M", "huge", "junk", "junk", "real", "small")
    assert report["got"] == {"huge": None, "junk": None, "real": None, "small": 4}, report
    assert report["stats"]["remote_rejected"] == 4, report["stats"]
    assert report["stats"]["remote_hits"] == 1, report["stats"]
    # One warning per kind: over the limit, and not an entry file.
    assert len(report["warnings"]) == 2, report["warnings"]
    # The 200 MiB object was never held: a ranged read of its first 8 MiB at most (on main
    # the reader grew by twice its size).
    assert report["grew_kib"] < 64 << 10, report


def test_a_large_entry_is_spooled_to_tmp_and_served(tmp_path: Path, s3: S3Server) -> None:
    """An entry over SPOOL_BYTES travels through an unnamed file under the cache's tmp/:
    served whole and verified, and nothing is left in tmp/."""
    prefix = fresh_prefix()
    url = s3.url(prefix)
    payload = os.urandom(SPOOL_BYTES + (9 << 20))
    writer = Store(tmp_path / "w", remote=url)
    assert writer.put("big", payload)
    assert writer.remote is not None
    writer.remote.flush()
    report = _read(tmp_path / "r", url, "none", "big")
    assert report["got"] == {"big": len(payload)}, report
    assert report["stats"]["remote_hits"] == 1 and not report["warnings"], report
    reader = Store(tmp_path / "r")
    blob = reader.get("big")
    assert blob is not None and bytes(blob) == payload
    assert os.listdir(tmp_path / "r" / "tmp") == []


def test_the_spool_never_follows_a_link_planted_at_tmp(tmp_path: Path, s3: S3Server) -> None:
    """tmp/ replaced by a link while a process runs: a large remote hit is still served,
    from memory, and nothing is spooled where the link points (the spool file is opened
    beneath the cache's root with no link followed, as the core opens everything)."""
    prefix = fresh_prefix()
    url = s3.url(prefix)
    payload = os.urandom(SPOOL_BYTES + (1 << 20))
    writer = Store(tmp_path / "w", remote=url)
    assert writer.put("big", payload)
    assert writer.remote is not None
    writer.remote.flush()
    spooled_at: list[str] = []

    class Watched(Store):
        # Where each spool file the store makes lies (/proc names its directory).
        def _spool(self) -> Any:
            spooled = super()._spool()
            spooled_at.append(os.readlink(f"/proc/self/fd/{spooled.fd}"))
            return spooled

    reader = Watched(tmp_path / "r", remote=url)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rmdir(tmp_path / "r" / "tmp")
    os.symlink(outside, tmp_path / "r" / "tmp")
    blob = reader.get("big")
    assert blob is not None and bytes(blob) == payload
    assert not any(p.startswith(str(outside)) for p in spooled_at), spooled_at
    assert reader.process_stats()["unsafe_paths"] >= 1
    assert os.listdir(outside) == []
    reader.close()


def test_redis_values_are_bounded_the_same_way(tmp_path: Path, redis_server: RedisServer) -> None:
    """Redis: the length and the header come first (STRLEN, GETRANGE); a value over the
    budget or not an entry file is a miss with one warning per kind, never read whole."""
    client = redis.Redis.from_url(redis_server.url)
    client.set(KEY_PREFIX + entry_name("huge"), b"\0" * (100 << 20))
    client.set(KEY_PREFIX + entry_name("junk"), os.urandom(3000))
    writer = Store(tmp_path / "w", remote=redis_server.url)
    assert writer.put("real", os.urandom(6 << 20))
    assert writer.put("small", b"fits")
    assert writer.remote is not None
    writer.remote.flush()
    report = _read(tmp_path / "r", redis_server.url, "4M", "huge", "junk", "real", "small")
    assert report["got"] == {"huge": None, "junk": None, "real": None, "small": 4}, report
    assert report["stats"]["remote_rejected"] == 3, report["stats"]
    assert len(report["warnings"]) == 2, report["warnings"]
    assert report["grew_kib"] < 64 << 10, report


def test_names_reach_a_tier_only_through_the_validating_type(tmp_path: Path, s3: S3Server) -> None:
    """Object keys and claim names are usable only as EntryName: a name with '/', '..',
    NUL or another shape is refused before any request."""
    for bad in ("../x", "a/b", "..", "\0" * 32, "A" * 32, "0" * 31, "0" * 33, "", 7):
        with pytest.raises((ValueError, TypeError)):
            EntryName(bad)
    ok = entry_name("k")
    assert EntryName(ok) == ok
    store = Store(tmp_path / "c", remote=s3.url(fresh_prefix()))
    tier = store.remote.tiers[0] if store.remote is not None else None
    assert tier is not None
    assert tier.get("../" + ok[3:]) is None
    assert tier.stats()["remote_rejected"] == 1
    claims = store.remote.claims() if store.remote is not None else None
    assert claims is not None
    with pytest.raises(ValueError, match="name"):
        claims.claim("../../x", wait=0, lease=30)
    store.close()
