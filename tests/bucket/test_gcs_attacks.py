"""An attacker with write access to a GCS bucket and no signing key: objects planted as
GCS keeps them (verbatim: ``//``, ``.`` and ``..`` segments, control characters, names of
1,024 bytes; a name that is no UTF-8 is refused by the service), at every place of ours
(entries, markers, use records, claims, the lease, the budget) and pointing outside the
prefix. Each case is a miss or a skip with a counter, never an exception, and nothing that
is not ours is removed: objects outside the prefix, and real entries, stay. Real objects on
the GCS server of the tests (no relay: the service itself lists them)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from xla_pcache import Store, bucket, entry_name, open_store
from xla_pcache.bucket import upkeep
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import CLAIM_DIR, ENTRY_DIR
from xla_pcache.torch_xla import _bucket_start

from tests.helpers import cli_here
from tests.tiers.servers import GCS_BUCKET, GcsServer, fresh_prefix

pytestmark = [
    pytest.mark.gcs,
    pytest.mark.parametrize("bucket_server", ["gs"], indirect=True),
]

RECORDS = upkeep.USE_RECORD_DIR
MARKERS = upkeep.MARKER_DIR


def _key(graph: str) -> str:
    return f"torch_xla/{graph}"


def _fleet(server: GcsServer, tmp_path: Path) -> tuple[str, str, set[str]]:
    """A prefix where a torch_xla writer put three entries with their markers, and the
    names of its entries."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    settings = Settings.from_env().replace(xdg_cache_home=str(tmp_path / "writer"))
    graphs = [str(10**30 + i) for i in range(3)]
    with open_store(url, settings=settings) as w:
        assert isinstance(w, bucket.BucketStore)
        for g in graphs:
            assert w.put(_key(g), b"graph" * 200)
            w.mark(_key(g), g)
    return prefix, url, {entry_name(_key(g)) for g in graphs}


def _hostile(prefix: str, real: set[str]) -> list[str]:
    """Names an attacker plants, in each directory of ours and at each fixed name: ``..``
    and ``//`` segments (some climbing out of the prefix at the victims), ``.``, control
    characters, a name of 1,024 bytes."""
    some = sorted(real)[0]
    out: list[str] = []
    for d in (ENTRY_DIR, MARKERS, RECORDS, CLAIM_DIR):
        out += [
            f"{prefix}/{d}/../../../victim",
            f"{prefix}/{d}/{some}/../../../../victim",
            f"{prefix}/{d}//{some}",
            f"{prefix}/{d}/./{some}",
            f"{prefix}/{d}/{some}\x01",
            f"{prefix}/{d}/..",
        ]
    for fixed in ("config", "usage", "state", "prune.lease"):
        out += [
            f"{prefix}/{upkeep.ROOT}/{fixed}/../../victim",
            f"{prefix}/{upkeep.ROOT}/{fixed}//x",
        ]
    long = f"{prefix}/{ENTRY_DIR}/{some}-"
    out.append(long + "z" * (1024 - len(long.encode())))
    return out


def _victims(server: GcsServer, prefix: str) -> list[str]:
    """Objects that are not ours, where the ``..`` names point: beside the prefix and in it."""
    names = [f"{prefix}/victim", f"{prefix}/{upkeep.ROOT}/victim", "victim", f"{prefix}-x/victim"]
    for n in names:
        server.plant(n, b"not ours")
    return names


def test_hostile_names_are_skipped_counted_and_remove_nothing_of_anyone(
    tmp_path: Path, server: GcsServer
) -> None:
    prefix, url, real = _fleet(server, tmp_path)
    victims = _victims(server, prefix)
    hostile = _hostile(prefix, real)
    for key in hostile:
        server.plant(key, b"planted")
    assert set(hostile) <= set(server.names(prefix)), "GCS keeps each name verbatim"
    # A start, stats, the program's prune, the command's prune and --untrusted: no raise.
    with open_store(
        url, settings=Settings.from_env().replace(xdg_cache_home=str(tmp_path / "h"))
    ) as s:
        assert isinstance(s, bucket.BucketStore)
        fetched = _bucket_start.pull(s, _key)
        skipped = dict(s.bucket().reader.skipped)
    assert fetched == 3 and skipped.get("unlistable", 0) >= 1, skipped
    b = upkeep.Bucket(url)
    stats = b.stats()
    assert stats["entries"] == 3 and stats["skipped_by_kind"].get("unlistable"), stats
    report = b.prune(max_size=10**9)
    assert report.removed == 0 and report.skipped.get("unlistable"), report
    out = cli_here("prune", "--path", url, "--max-size", "1G", "--json")
    assert out.exit_code in (0, 3), out.output  # 3: a listing cut short, said so
    assert set(victims) <= set(server.names()), "a prune removed what is not ours"
    # --untrusted removes what is below xla_pcache-1/ and not ours (by name, what the
    # client can name): the victim planted there goes, those outside it stay.
    victims.remove(f"{prefix}/{upkeep.ROOT}/victim")
    out = cli_here("prune", "--untrusted", "--path", url)
    # Exit 1: what the client cannot name is still there, each named with the request that
    # removes exactly it (the name percent-encoded whole, no ``..`` collapsed).
    assert out.exit_code == 1, out.output
    dots = next(k for k in hostile if k.endswith("/../../../victim"))
    exact = urllib.parse.quote(dots, safe="").replace(".", "%2E").replace("-", "%2D")
    assert f"https://storage.googleapis.com/{GCS_BUCKET}/{exact.replace('_', '%5F')}" in (
        out.output.replace("\n", "")
    ), out.output
    held = set(server.names())
    assert set(victims) <= held, set(victims) - held
    assert {f"{prefix}/{ENTRY_DIR}/{n}" for n in real} <= held
    # What the client refuses is left for the cloud's own tool, never guessed at.
    refused = [k for k in hostile if not bucket_parseable(k)]
    assert set(refused) <= held, set(refused) - held


def bucket_parseable(key: str) -> bool:
    from xla_pcache.bucket.listing import parseable

    return parseable(key)


def test_garbage_at_our_exact_names_is_a_counted_miss(tmp_path: Path, server: GcsServer) -> None:
    """Garbage at an entry's name, a record's, the lease, the budget and ``usage``: a get
    misses (counted), a prune skips what it cannot read (counted) and keeps the entries,
    a stale lease of garbage is taken over."""
    prefix, url, real = _fleet(server, tmp_path)
    root = f"{prefix}/{upkeep.ROOT}"
    name = entry_name("k")
    server.plant(f"{prefix}/{ENTRY_DIR}/{name}", b"\x00garbage" * 50)
    server.plant(f"{root}/records/r-1-{'0' * 16}-1-1", b"\x1f\x8b" + b"\xff" * 100)
    server.plant(f"{root}/config", b"[" * 5000)
    server.plant(f"{root}/usage", b"\x1f\x8b" * 300)
    server.plant(f"{root}/state", json.dumps({"bytes": -1}).encode())
    with Store(tmp_path / "r", remote=url) as r:
        assert r.get("k") is None
        st = r.stats()
        assert st["remote_rejected"] >= 1 or st["remote_misses"] >= 1, st
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.entries == 3 + 1 or report.entries == 3, report
    held = set(server.names(prefix))
    assert {f"{prefix}/{ENTRY_DIR}/{n}" for n in real} <= held
    # A lease of garbage, written just now: it looks held, and the prune says so and
    # skips (exit 1), as for any busy lease; it raises nothing.
    server.plant(f"{root}/prune.lease", b"\x00" * 5000)
    out = cli_here("prune", "--path", url, "--max-size", "1G", "--json")
    assert out.exit_code == 1 and "prune skipped: another prune holds" in out.output, out.output
    assert "Traceback" not in out.output


def test_a_name_that_is_no_utf8_or_too_long_is_refused_by_the_service(
    server: GcsServer,
) -> None:
    """What GCS refuses never reaches a listing: a name whose percent-encoding is no UTF-8
    (400), and one over 1,024 bytes (400)."""
    prefix = fresh_prefix()
    status, _ = server.raw("PUT", f"/{GCS_BUCKET}/{prefix}%2F%FF%FE", b"x")
    assert status == 400
    status, _ = server.raw("PUT", f"/{GCS_BUCKET}/{prefix}%2F{'y' * 1100}", b"x")
    assert status == 400
    assert server.names(prefix) == []
