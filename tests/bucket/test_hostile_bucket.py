"""What another writer of a shared bucket can plant, against a real S3 service (SeaweedFS
``weed mini``) and a real redis-server on loopback: every such object is a bounded miss or
a bounded wait, never a spin, an abort or memory in proportion to what was planted."""

from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path
from typing import Any

import obstore
import pytest
import redis
from xla_pcache import Store, entry_name, open_store
from xla_pcache._names import EntryName
from xla_pcache.bucket import upkeep
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import CLAIM_DIR, ENTRY_DIR, SPOOL_BYTES
from xla_pcache.tiers.redis import KEY_PREFIX
from xla_pcache.torch_xla import _bucket_start

from tests.helpers import cli_here, run_worker
from tests.tiers.relay import Relay
from tests.tiers.servers import (
    S3_BUCKET,
    BucketServer,
    RedisServer,
    bucket_client,
    fresh_prefix,
    put_objects,
)


# On main this test spun for ever inside claim() (HEAD of the claim 404, its conditional
# create 412, and that path skipped both the sleep and the deadline): the pytest timeout is
# its bound, not a clock read here.
@pytest.mark.timeout(120)
def test_an_object_planted_below_a_claim_name_is_a_bounded_wait(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    store = Store(tmp_path / "c", remote=server.url(prefix))
    assert store.remote is not None
    claims = store.remote.claims()
    assert claims is not None
    name = entry_name("k")
    obstore.put(bucket_client(server, prefix), f"{CLAIM_DIR}/{name}/x", b"planted", mode="create")
    got = claims.claim(name, wait=2, lease=30)
    if not server.directories:
        # GCS: the planted object is beside the claim's name, not in its way.
        assert got.state == "claimed" and got.held, got.state
        got.release()
        store.close()
        return
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


def _writer(root: Path, url: str, entries: dict[str, bytes]) -> Store:
    """A store at ``root`` over the tier at ``url`` that put ``entries`` there: each
    published, every upload done."""
    writer = Store(root, remote=url)
    for key, value in entries.items():
        assert writer.put(key, value)
    assert writer.remote is not None
    writer.remote.flush()
    return writer


def test_garbage_and_oversized_objects_are_misses_in_bounded_memory(
    tmp_path: Path, server: BucketServer
) -> None:
    """A planted object far over the reader's budget costs one ranged read, not its size
    in memory (on main: downloaded whole, then copied once more); a garbage one and a
    real entry over the budget are misses too; each kind warns once and counts."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    huge = 200 << 20
    obstore.put(client, f"{ENTRY_DIR}/{entry_name('huge')}", b"\0" * huge, mode="create")
    obstore.put(client, f"{ENTRY_DIR}/{entry_name('junk')}", os.urandom(3000), mode="create")
    _writer(tmp_path / "w", url, {"real": os.urandom(6 << 20), "small": b"fits"})
    report = _read(tmp_path / "r", url, "4M", "huge", "junk", "junk", "real", "small")
    assert report["got"] == {"huge": None, "junk": None, "real": None, "small": 4}, report
    assert report["stats"]["remote_rejected"] == 4, report["stats"]
    assert report["stats"]["remote_hits"] == 1, report["stats"]
    # One warning per kind: over the limit, and not an entry file.
    assert len(report["warnings"]) == 2, report["warnings"]
    # The 200 MiB object was never held: a ranged read of its first 8 MiB at most (on main
    # the reader grew by twice its size).
    assert report["grew_kib"] < 64 << 10, report


def test_a_large_entry_is_spooled_to_tmp_and_served(tmp_path: Path, server: BucketServer) -> None:
    """An entry over SPOOL_BYTES travels through an unnamed file under the cache's tmp/:
    served whole and verified, and nothing is left in tmp/."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    payload = os.urandom(SPOOL_BYTES + (9 << 20))
    _writer(tmp_path / "w", url, {"big": payload})
    report = _read(tmp_path / "r", url, "none", "big")
    assert report["got"] == {"big": len(payload)}, report
    assert report["stats"]["remote_hits"] == 1 and not report["warnings"], report
    reader = Store(tmp_path / "r")
    blob = reader.get("big")
    assert blob is not None and bytes(blob) == payload
    assert os.listdir(tmp_path / "r" / "tmp") == []


def test_the_spool_never_follows_a_link_planted_at_tmp(
    tmp_path: Path, server: BucketServer
) -> None:
    """tmp/ replaced by a link while a process runs: a large remote hit is still served,
    from memory, and nothing is spooled where the link points (the spool file is opened
    beneath the cache's root with no link followed, as the core opens everything)."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    payload = os.urandom(SPOOL_BYTES + (1 << 20))
    _writer(tmp_path / "w", url, {"big": payload})
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
    _writer(tmp_path / "w", redis_server.url, {"real": os.urandom(6 << 20), "small": b"fits"})
    report = _read(tmp_path / "r", redis_server.url, "4M", "huge", "junk", "real", "small")
    assert report["got"] == {"huge": None, "junk": None, "real": None, "small": 4}, report
    assert report["stats"]["remote_rejected"] == 3, report["stats"]
    assert len(report["warnings"]) == 2, report["warnings"]
    assert report["grew_kib"] < 64 << 10, report


def test_names_reach_a_tier_only_through_the_validating_type(
    tmp_path: Path, server: BucketServer
) -> None:
    """Object keys and claim names are usable only as EntryName: a name with '/', '..',
    NUL or another shape is refused before any request."""
    for bad in ("../x", "a/b", "..", "\0" * 32, "A" * 32, "0" * 31, "0" * 33, "", 7):
        with pytest.raises((ValueError, TypeError)):
            EntryName(bad)
    ok = entry_name("k")
    assert EntryName(ok) == ok
    store = Store(tmp_path / "c", remote=server.url(fresh_prefix()))
    tier = store.remote.tiers[0] if store.remote is not None else None
    assert tier is not None
    assert tier.get("../" + ok[3:], max_bytes=None, spool=None) is None
    assert tier.stats()["remote_rejected"] == 1
    claims = store.remote.claims() if store.remote is not None else None
    assert claims is not None
    with pytest.raises(ValueError, match="name"):
        claims.claim("../../x", wait=0, lease=30)
    store.close()


# ------------------------------------------------------------------------------ upkeep
# What a key-less writer can plant among the bucket's upkeep (bucket/upkeep.py), read through
# its one reader (bucket/reader.py): keys the client cannot parse, objects below our
# names, objects shaped to cost memory, numbers out of range, markers by the thousand.


def _keys(server: BucketServer, prefix: str) -> list[str]:
    return sorted(str(o["path"]) for o in obstore.list(bucket_client(server, prefix)).collect())


def _gz(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def test_keys_the_client_cannot_parse_are_skipped_counted_and_named(
    relay: Relay, server: BucketServer
) -> None:
    """S3 keeps keys with '//' or a '.'/'..' segment, which obstore refuses a listing page
    at a time (SeaweedFS collapses them, so the relay lists them as S3 would). On main a
    single one made every listing raise: stats, prune, the writers' budget check, the
    torch_xla markers and claims all failed. Now the listing goes past each (one warning,
    counted), recovers the entries that shared its page, and names it with the command
    that removes it."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    names = sorted(entry_name(f"k{i}") for i in range(1100))
    put_objects(client, {f"{ENTRY_DIR}/{n}": b"x" * 10 for n in names})
    bad = [
        f"{prefix}/{ENTRY_DIR}//first",  # before every entry
        f"{prefix}/{ENTRY_DIR}/{names[1050]}/../x",  # after a thousand: its page recovered
        f"{prefix}/{upkeep.USE_RECORD_DIR}/./r",
        f"{prefix}/{upkeep.MARKER_DIR}//m",
        f"{prefix}/{CLAIM_DIR}/..",
    ]
    for key in bad:
        relay.plant(key, 5)
    from xla_pcache.bucket.reader import HEADS_PER_REFUSED, list_requests_bound

    b = upkeep.Bucket(url)
    relay.take()
    stats = b.stats()
    assert stats["entries"] == 1100 and stats["bytes"] == 11_000, stats
    # Three listings (entries with two refused keys, records and claims with one each).
    wire = relay.take()
    bound = sum(list_requests_bound(n, r) for n, r in ((1100, 2), (0, 1), (0, 1)))
    assert wire["list"] <= bound and wire["head"] <= 4 * HEADS_PER_REFUSED, wire
    assert sorted(stats["unlistable"]) == sorted(k for k in bad if "torch_xla" not in k), stats
    assert stats["skipped_by_kind"] == {"unlistable": 4}, stats
    assert b.estimate().records == 0  # the records' listing went past its refused key
    assert b.marked() == []
    assert sorted(b.reader.unlistable) == sorted(bad)
    # Through the command: stats names each key and how to remove it; prune keeps the budget.
    out = cli_here("stats", "--path", url)
    assert out.exit_code == 0, out.output
    assert _removal_hint(server, bad[1]) in out.output
    b.write_stored_budget(upkeep.BucketStoredBudget(max_size=5000))
    out = cli_here("prune", "--path", url, "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.output[out.output.index("{") :])
    assert report["entries_before"] == 1100 and report["bytes"] <= 4500, report
    assert report["skipped"]["unlistable"] == 5 and len(report["unlistable"]) == 5, report
    # What the client cannot remove, --untrusted names (exit 1: they are still there).
    out = cli_here("prune", "--untrusted", "--path", url)
    assert out.exit_code == 1, out.output
    for key in bad:
        assert _hint_names(server, key) in out.output, out.output


def _hint_names(server: BucketServer, key: str) -> str:
    """How the command that removes ``key`` names it: ``--key '...'`` for S3's; for GCS's,
    the object's URL with every byte but letters and digits percent-encoded (one request
    for exactly that object: ``gcloud storage rm`` would expand wildcards in the name)."""
    if server.scheme == "s3":
        return f"--key '{key}'"
    exact = "".join(
        c if c.isascii() and c.isalnum() else "".join(f"%{b:02X}" for b in c.encode()) for c in key
    )
    return f"'https://storage.googleapis.com/{server.bucket}/{exact}'"


def _removal_hint(server: BucketServer, key: str) -> str:
    if server.scheme == "s3":
        return f"aws s3api delete-object --bucket {S3_BUCKET} {_hint_names(server, key)}"
    return f"curl -X DELETE {_GCS_AUTH} {_hint_names(server, key)}"


_GCS_AUTH = '-H "Authorization: Bearer $(gcloud auth print-access-token)"'


def test_objects_planted_below_our_names_stop_no_prune_and_are_removed(
    tmp_path: Path, server: BucketServer
) -> None:
    """An object below the lease's name makes SeaweedFS (and MinIO, and hierarchical
    namespaces) refuse the lease's create and answer 404 to its HEAD: on main every prune
    raised from then on. Now prune removes what is below the name and the directory it
    made, and takes the lease. The same below an entry's name kept that entry out of the
    bucket for ever (its create refused, its GET 404): `prune --untrusted` removes it."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    writer = _writer(tmp_path / "w", url, dict.fromkeys("abc", bytes(1000)))
    obstore.put(client, f"{upkeep.LEASE}/x", b"squat")
    if not server.directories:
        _objects_beside_our_names(tmp_path, server, prefix, writer)
        return
    report = upkeep.Bucket(url).prune(max_size=2500)
    assert report.removed == 1 and report.entries == 2, report
    assert report.skipped == {"squat": 1}, report.skipped
    assert not [k for k in _keys(server, prefix) if "prune.lease" in k]
    out = cli_here("prune", "--path", url, "--max-size", "1M")
    assert out.exit_code == 0, out.output  # the lease is usable again
    # An entry's name squatted: its create is refused, a reader misses.
    name = entry_name("sq")
    obstore.put(client, f"{ENTRY_DIR}/{name}/x/y", b"squat")
    assert writer.put("sq", b"v" * 100)
    writer.remote.flush()
    assert writer.stats()["remote_put_exists"] == 1
    out = cli_here("prune", "--untrusted", "--path", url)
    assert out.exit_code == 0, out.output
    assert f"removed {ENTRY_DIR}/{name}/x/y" in out.output, out.output
    assert not [k for k in _keys(server, prefix) if name in k]
    other = Store(tmp_path / "o", remote=url)
    assert other.put("sq", b"v" * 100)
    assert other.remote is not None
    other.remote.flush()
    assert other.stats()["remote_puts"] == 1
    assert Store(tmp_path / "r", remote=url).get("sq") is not None
    writer.close()
    other.close()


def _objects_beside_our_names(
    tmp_path: Path, server: BucketServer, prefix: str, writer: Store
) -> None:
    """GCS: a name is no directory, so an object below the lease's name or an entry's is
    beside it, in the way of nothing: the prune takes the lease, the entry is written and
    read, and `prune --untrusted` removes both planted objects (nothing xla_pcache
    writes)."""
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    report = upkeep.Bucket(url).prune(max_size=2500)
    assert report.removed == 1 and report.entries == 2 and not report.skipped, report
    name = entry_name("sq")
    obstore.put(client, f"{ENTRY_DIR}/{name}/x/y", b"squat")
    assert writer.put("sq", b"v" * 100)
    assert writer.remote is not None
    writer.remote.flush()
    stats = writer.stats()
    assert stats["remote_put_exists"] == 0 and stats["remote_puts"] == 4, stats
    assert Store(tmp_path / "r", remote=url).get("sq") is not None
    out = cli_here("prune", "--untrusted", "--path", url)
    assert out.exit_code == 0, out.output
    assert f"removed {ENTRY_DIR}/{name}/x/y" in out.output, out.output
    assert f"removed {upkeep.LEASE}/x" in out.output, out.output
    assert sorted(k for k in _keys(server, prefix) if "/x" in k) == [], _keys(server, prefix)
    assert f"{ENTRY_DIR}/{name}" in _keys(server, prefix)
    writer.close()


def test_directories_a_squat_leaves_below_the_lease_stop_no_prune(
    tmp_path: Path, server: BucketServer
) -> None:
    """Found by the bucket-state fuzzer. On a service with directories an object planted
    below the lease's name leaves directories behind once it is removed (by whoever
    planted it), and one deeper than the squat clean-up went (5 levels) left the deepest:
    they refuse the lease's create, its HEAD is 404 and no listing of objects shows them.
    Every prune was then refused ("can be neither created nor found") for good, and `prune
    --untrusted` did not clear them either. Now the directories below the name are walked
    (a listing with a delimiter names them) and removed children first."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    put_objects(client, {f"{ENTRY_DIR}/{entry_name(f'e{i}')}": b"x" * 1000 for i in range(3)})
    obstore.put(client, f"{upkeep.LEASE}/a/b/c/d/e", b"squat")
    obstore.delete(client, f"{upkeep.LEASE}/a/b/c/d/e")
    report = upkeep.Bucket(url).prune(max_size=2500)
    assert report.removed == 1 and report.entries == 2, report
    # An object five deep: the prune that removes it removes every directory it made (on
    # GCS it is beside the lease's name, in nobody's way, and left to `--untrusted`).
    obstore.put(client, f"{upkeep.LEASE}/p/q/r/s/t", b"squat")
    report = upkeep.Bucket(url).prune(max_size=1500)
    squats = {"squat": 1} if server.directories else {}
    assert report.removed == 1 and report.skipped == squats, report
    out = cli_here("prune", "--path", url, "--max-size", "1M")
    assert out.exit_code == 0, out.output
    # Left empty below the budget's name: `prune --untrusted` clears it, and the budget is
    # written again.
    obstore.put(client, f"{upkeep.CONFIG}/a/b/c/d/e/f", b"squat")
    obstore.delete(client, f"{upkeep.CONFIG}/a/b/c/d/e/f")
    out = cli_here("prune", "--untrusted", "--path", url)
    assert out.exit_code == 0, out.output
    assert obstore.list_with_delimiter(client, upkeep.ROOT)["common_prefixes"] == [ENTRY_DIR]
    out = cli_here("config", "--path", url, "--max-size", "5K")
    assert out.exit_code == 0, out.output
    assert upkeep.Bucket(url).read_stored_budget().max_size == 5 << 10


def test_an_empty_object_is_refused_not_a_failure(tmp_path: Path, server: BucketServer) -> None:
    """Found by the bucket-state fuzzer: a ranged GET of an object of no bytes is answered
    416 (S3, GCS and Azure alike), and every read here is ranged. An empty object planted at
    an entry's name counted as the tier failing (`remote_get_errors`, and the tier left
    alone for `retry_after`: the next get of a real entry missed); an empty record,
    `config`, `state` or `usage` made `stats`, `prune` and a writer's budget check fail
    (exit 2, "416 Range Not Satisfiable"). Now an empty object is a refused value (a miss
    counted `remote_rejected`) or an upkeep object skipped as malformed."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    writer = _writer(tmp_path / "w", url, {"real": b"x" * 100})
    obstore.put(client, f"{ENTRY_DIR}/{entry_name('empty')}", b"")
    reader = Store(tmp_path / "r", remote=url)
    assert reader.get("empty") is None
    assert reader.get("real") is not None  # the tier was not left alone
    assert reader.remote is not None
    counters = reader.remote.tiers[0].stats()
    assert counters.get("remote_rejected") == 1, counters
    assert not [k for k in counters if k.endswith("_errors")], counters
    put_objects(
        client,
        {
            upkeep.CONFIG: b"",
            upkeep.STATE: b"",
            upkeep.USAGE: b"",
            upkeep.new_use_record_name(1, 1): b"",
        },
    )
    out = cli_here("stats", "--path", url, "--json")
    assert out.exit_code == 0, out.output
    skipped = json.loads(out.output)["skipped_by_kind"]
    assert skipped == {"config-malformed": 1, "state-malformed": 1}, skipped
    out = cli_here("prune", "--path", url, "--max-size", "1M", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.output[out.output.index("{") :])
    assert report["records_folded"] == 1 and report["entries"] == 2, report
    assert upkeep.Bucket(url).estimate().records == 0  # folded, and the estimate reads
    reader.close()
    writer.close()


# A prune in its own process, on the bucket of the first argument: its report and how much
# its peak RSS grew (VmHWM, its own) while it ran.
_PRUNER = r"""
import json, sys
from xla_pcache.bucket.upkeep import Bucket

def peak_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))

b = Bucket(sys.argv[1])
b.read_stored_budget()  # the client and its runtime, before the baseline
before = peak_kib()
report = b.prune(max_size=int(sys.argv[2]))
print(json.dumps({"grew_kib": peak_kib() - before, "report": report.as_dict()}))
"""


def test_a_prune_takes_bounded_memory_whatever_usage_and_records_hold(
    tmp_path: Path, server: BucketServer
) -> None:
    """A 65 KB `usage` object of 64 MiB of short lines took a prune on main from 45 MiB to
    1.3 GiB (a bytes object per line), and every name of every record was folded into one
    dict (200,000 names of no entry: some 100 MiB more). Now both are streamed and only the
    listed entries are looked up: the prune grows by a few MiB."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    names = [entry_name(f"e{i}") for i in range(20)]
    put_objects(client, {f"{ENTRY_DIR}/{n}": b"x" * 100 for n in names})
    planted = "".join(os.urandom(16).hex() + "\n" for _ in range(200_000))
    usage = _gz(b"ab\n" * ((64 << 20) // 3))
    put_objects(
        client,
        {
            upkeep.USAGE: usage,
            upkeep.new_use_record_name(0, 0): _gz((planted + names[3] + "\n").encode()),
        },
    )
    out = run_worker("-c", _PRUNER, url, "1900", timeout=300)
    assert "Traceback" not in out.pop("stderr")
    report = out["report"]
    assert out["grew_kib"] < 32 << 10, out
    assert report["records_folded"] == 1 and report["removed"] == 1, report
    assert names[3] not in report["removed_names"]  # the one the record named is kept
    # Read no further than MAX_INFLATE times its size (not the 64 MiB it inflates to).
    lines = report["skipped"]["usage-lines"]
    assert 0 < lines <= upkeep.MAX_INFLATE * len(usage) // 3, report["skipped"]
    assert report["skipped"]["usage-malformed"] == 1, report["skipped"]


def test_a_record_or_usage_inflates_at_most_a_few_times_its_size(server: BucketServer) -> None:
    """Found by the bucket-state fuzzer: a thousand planted records, each some 33 KB of gzip
    that inflates to 32 MiB of lines of a record's shape, held `xla-pcache prune` past its
    two-minute deadline: each was read up to the cap of its kind (MAX_USE_RECORD *
    MAX_INFLATE), a million lines each matched as entry names. What xla_pcache writes
    inflates to about twice its size: a record or `usage` is now read no further than
    MAX_INFLATE times its own size, so what one costs is in proportion to the bytes read
    (which a prune bounds: Limits.record_bytes), not to what they inflate to."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    name = entry_name("e")
    bomb = _gz((name + "\n").encode() * (1 << 20))
    path = upkeep.new_use_record_name(0, 0)
    usage = _gz(f"{name} 1 1\n".encode() * (1 << 20))
    put_objects(client, {path: bomb, upkeep.USAGE: usage, f"{ENTRY_DIR}/{name}": b"x"})
    assert len(bomb) < 256 << 10 and len(usage) < 256 << 10
    b = upkeep.Bucket(url)
    got = sum(1 for _ in b.use_record_names(path))
    assert 0 < got <= upkeep.MAX_INFLATE * len(bomb) // (len(name) + 1), (got, len(bomb))
    assert b.reader.skipped == {"record-malformed": 1}, b.reader.skipped
    # usage the same way: the prune folds a few thousand of its lines, not a million.
    report = b.prune(max_size=10**6)
    assert report.skipped == {"usage-malformed": 1, "record-malformed": 1}, report.skipped


def test_a_prune_reads_within_its_limits(tmp_path: Path, server: BucketServer) -> None:
    """At most `Limits.records` records are folded a prune (the rest wait for the next);
    past `Limits.entries` (a writer's prune inside a program) it prunes among the entries
    it listed and those the records name that it reached by name (at most `Limits.asks`),
    and says it was cut short; past `Limits.seconds` nothing more is removed; the lease is
    given back."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    names = [entry_name(f"e{i}") for i in range(3)]
    put_objects(client, {f"{ENTRY_DIR}/{n}": b"x" * 100 for n in names})
    put_objects(
        client, {upkeep.new_use_record_name(0, 0): upkeep.use_record_body(names) for _ in range(3)}
    )
    b = upkeep.Bucket(url)
    report = b.prune(max_size=10**6, limits=upkeep.Limits(records=2))
    assert (report.records_folded, report.records_left) == (2, 1), report
    # Past its deadline (none left here) a prune stops before removing anything.
    report = b.prune(max_size=100, limits=upkeep.Limits(seconds=0))
    assert not report.pruned and report.removed == 0 and "stopped" in (report.busy or ""), report
    report = b.prune(max_size=100, limits=upkeep.Limits(entries=2, asks=0))
    assert not report.pruned and report.busy is None, report
    assert report.entries_before == 2 and report.removed == 1, report
    assert "stopped after 2 objects" in (report.cut_short or ""), report
    keys = _keys(server, prefix)
    assert len([k for k in keys if k.startswith(ENTRY_DIR)]) == 2 and upkeep.LEASE not in keys
    put_objects(client, {f"{ENTRY_DIR}/{n}": b"x" * 100 for n in names})
    report = b.prune(max_size=100, limits=upkeep.Limits(entries=2))
    assert (report.entries_before, report.reached, report.removed) == (3, 1, 2), report
    assert len([k for k in _keys(server, prefix) if k.startswith(ENTRY_DIR)]) == 1


def test_planted_markers_cost_a_torch_xla_start_bounded_requests(
    tmp_path: Path, relay: Relay, server: BucketServer
) -> None:
    """2,000 empty markers, each named for its graph's entry, cost every torch_xla host
    start 2,000 GETs on main. Now a start lists them (two pages) and, finding more than
    PULL_MISSES entries to fetch, lists the entries and then the markers of those only: no
    GET for a marker of no entry."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    graphs = [str(10**20 + i) for i in range(2000)]
    put_objects(
        client,
        {f"{upkeep.MARKER_DIR}/{entry_name(f'torch_xla/{g}')}-{g}": b"" for g in graphs},
    )
    time.sleep(1.1)  # the real marker newer (whole seconds), so it comes first
    home = tmp_path / "h"
    settings = Settings.from_env().replace(xdg_cache_home=str(home))
    writer = open_store(url, settings=settings)
    assert writer.put("torch_xla/7", b"graph" * 100)
    writer.mark("torch_xla/7", "7")
    writer.close()
    host = open_store(url, settings=settings.replace(xdg_cache_home=str(tmp_path / "n")))
    relay.take()
    assert _bucket_start.pull(host, lambda g: f"torch_xla/{g}") == 1
    wire = relay.take()
    # Two pages of markers, one of entries, one of the markers of those entries.
    assert wire.get("list", 0) <= 4 + 1 and wire.get("get", 0) == 1, wire  # main: 2,000 GETs
    host.close()


def test_numbers_out_of_range_in_the_bucket_are_ignored_not_raised(
    tmp_path: Path, server: BucketServer
) -> None:
    """A 400-digit max_size passed main's check, then `stats` and `config` crashed with a
    traceback and `prune` raised OverflowError; a budget nested 2,000 deep raised
    RecursionError. Every number read from the bucket is now held to the directory's own
    bounds: what is out of range is ignored with one warning and counted."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    put_objects(client, {f"{ENTRY_DIR}/{entry_name('e')}": b"x" * 100})
    huge = "9" * 400
    obstore.put(client, upkeep.CONFIG, f'{{"max_size": {huge}, "max_age_s": 1e400}}'.encode())
    obstore.put(client, upkeep.STATE, f'{{"time": 1, "entries": 1, "bytes": {huge}}}'.encode())
    obstore.put(client, upkeep.USAGE, _gz(f"{entry_name('e')} {huge} {huge}\n".encode()))
    stats = json.loads(cli_here("stats", "--path", url, "--json").output)
    assert stats["max_size"] is None and stats["last_prune"] is None, stats
    assert stats["skipped_by_kind"] == {"config-malformed": 1, "state-malformed": 1}, stats
    for args in (("stats",), ("config", "--show"), ("prune", "--max-size", "1M")):
        out = cli_here(*args, "--path", url)
        assert out.exit_code == 0, (args, out.output)
    report = upkeep.Bucket(url).prune(max_size=10**6)
    assert report.entries == 1 and report.skipped["usage-lines"] == 1, report
    obstore.put(client, upkeep.CONFIG, b'{"max_size": ' + b"[" * 2000 + b"]" * 2000 + b"}")
    out = cli_here("stats", "--path", url, "--json")
    assert out.exit_code == 0 and json.loads(out.output)["max_size"] is None, out.output
