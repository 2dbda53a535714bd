"""What a later release leaves in a bucket is left alone by this one (ARCHITECTURE.md,
"Formats of other releases"), on real S3 and GCS services (SeaweedFS and the tests' GCS
server on loopback): its entries (format version one higher, every checksum valid) are
misses counted ``newer_format``, refused after their first bytes, never replaced by a put,
never removed by a torch_xla host start (no garbage: that release reads them), whose
markers a prune keeps; they are pruned by LRU like any entry; and a later layout's objects
(below ``xla_pcache-2/``) are never touched by a prune, ``prune --untrusted`` or a start.
What a writer without a key plants as "later" stops no signer, and no start removes it (as
a planted untrusted entry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import obstore
import pytest
from xla_pcache import bucket, entry_name, open_store
from xla_pcache._core import generate_signing_key, signed_entry_name, signing_public_key
from xla_pcache.bucket import upkeep
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla import _bucket_start

from tests.bucket.test_bucket_floods import _key, _torch_xla_bucket
from tests.helpers import cli_here
from tests.jax.helpers import JAX_ONLY, finish_jax, hits, results, runs, start_jax
from tests.later_format import as_version
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix, put_objects

REMOVED = "torch_xla-garbage"


def _host(url: str, home: Path, **given: Any) -> bucket.BucketStore:
    store = open_store(url, settings=Settings.from_env().replace(xdg_cache_home=str(home)), **given)
    assert isinstance(store, bucket.BucketStore)
    return store


def _objects(server: BucketServer, prefix: str) -> dict[str, bytes]:
    """Every object below ``prefix``, by path, with its bytes."""
    client = bucket_client(server, prefix)
    return {
        str(m["path"]): bytes(obstore.get(client, str(m["path"])).bytes())
        for m in obstore.list(client).collect()
    }


def _to_version(
    server: BucketServer, prefix: str, names: list[str], version: int = 2
) -> dict[str, bytes]:
    """The entries ``names`` of the bucket rewritten as format ``version`` (what a later
    release wrote at those names); their bytes now, by path."""
    client = bucket_client(server, prefix)
    later = {
        f"{ENTRY_DIR}/{n}": as_version(
            bytes(obstore.get(client, f"{ENTRY_DIR}/{n}").bytes()), version
        )
        for n in names
    }
    put_objects(client, later)
    return later


def test_a_later_entry_in_a_bucket_is_a_miss_and_no_put_replaces_it(
    server: BucketServer, tmp_path: Path
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    with _host(url, tmp_path / "writer") as w:
        assert w.put("jit_f-" + "a" * 64, b"x" * 5000)
    later = _to_version(server, prefix, [entry_name("jit_f-" + "a" * 64)])
    with _host(url, tmp_path / "old") as old:
        assert old.get("jit_f-" + "a" * 64) is None
        stats = old.stats()
        assert stats["newer_format"] == 1 and stats["corrupt"] == 0, stats
        assert old.remote is not None and old.remote.stats()["remote_newer_format"] == 1
        # Its own compile goes to its host-local store; the bucket's object is the first
        # writer's and stays.
        assert old.put("jit_f-" + "a" * 64, b"y" * 5000)
        assert old.get("jit_f-" + "a" * 64) is not None
    assert {p: b for p, b in _objects(server, prefix).items() if p in later} == later


def test_a_replace_overwrites_this_releases_object_and_leaves_a_later_one(
    server: BucketServer, tmp_path: Path
) -> None:
    """``Store.replace`` of a plain name (a plan that changes) overwrites the bucket's object
    when it is this release's, conditional on the write it read (its ETag; on GCS its
    generation, without which the service refuses the overwrite), and leaves it when a
    later release wrote it there (``remote_put_newer_format``)."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    key = "plan-x"

    def replace(home: str, value: bytes) -> dict[str, Any]:
        """A fresh host's replace of ``key``: its remote counters once the write is done."""
        with _host(url, tmp_path / home) as h:
            assert h.replace(key, value) and h.remote is not None
            h.remote.flush()
            return dict(h.remote.stats())

    with _host(url, tmp_path / "a") as a:
        assert a.put(key, b"one" * 100)
    stats = replace("b", b"two" * 100)
    assert stats.get("remote_puts") == 1 and not stats.get("remote_put_errors"), stats
    with _host(url, tmp_path / "c") as c:
        blob = c.get(key)
        assert blob is not None and bytes(blob) == b"two" * 100
    later = _to_version(server, prefix, [entry_name(key)])
    stats = replace("d", b"three" * 100)
    assert stats.get("remote_put_newer_format") == 1 and not stats.get("remote_puts"), stats
    held = _objects(server, prefix)
    assert {p: held.get(p) for p in later} == later


def test_a_torch_xla_start_neither_fetches_nor_removes_later_entries(
    server: BucketServer, tmp_path: Path
) -> None:
    """A writing host's start meets the later release's entries its markers name: each a
    miss (a verdict of ``newer_format``, not garbage), none fetched, none removed, every
    marker left."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    _to_version(server, prefix, [entry_name(_key(g)) for g in graphs])
    before = _objects(server, prefix)
    with _host(url, tmp_path / "host") as host:
        assert _bucket_start.pull(host, _key) == 0
        skipped = dict(host.bucket().reader.skipped)
        assert host.stats()["newer_format"] >= 1
    assert REMOVED not in skipped, skipped
    assert _objects(server, prefix) == before


def test_a_prune_keeps_a_later_entrys_markers_and_prunes_it_by_lru_only(
    server: BucketServer, tmp_path: Path
) -> None:
    """A second marker beside a later entry's: the prune reads its header, cannot tell which
    is the real one, and keeps both (as past its reads); within the budget nothing of it
    goes. Over the budget, the LRU removes it as any entry, markers and all."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    name = entry_name(_key(graphs[0]))
    _to_version(server, prefix, [name])
    planted = f"{upkeep.MARKER_DIR}/{name}-7"
    put_objects(bucket_client(server, prefix), {planted: b""})
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed == 0, report
    held = _objects(server, prefix)
    assert {f"{ENTRY_DIR}/{name}", planted, f"{upkeep.MARKER_DIR}/{name}-{graphs[0]}"} <= set(held)
    report = upkeep.Bucket(url).prune(max_size=1)
    assert report.removed == len(graphs), report
    assert not any(
        p.startswith((f"{ENTRY_DIR}/", f"{upkeep.MARKER_DIR}/")) for p in _objects(server, prefix)
    )


def test_a_later_layouts_objects_are_never_touched(server: BucketServer, tmp_path: Path) -> None:
    """Objects of a later layout below ``xla_pcache-2/`` (its budget, usage, state, records,
    markers, entries, lease): ``prune``, ``prune --untrusted``, ``stats`` and a start leave
    every one, and a later entry among this layout's entries is no junk either."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    later_layout = {
        "xla_pcache-2/config": b'{"format": 2, "max_size": 1}',
        "xla_pcache-2/usage": b"later usage",
        "xla_pcache-2/state": b'{"format": 2}',
        "xla_pcache-2/prune.lease": b'{"host": "later"}',
        "xla_pcache-2/records/r-1-later": b"later record",
        f"xla_pcache-2/markers/{entry_name(_key(graphs[0]))}-{graphs[0]}-2": b"",
        f"xla_pcache-2/entries/{'0' * 32}": b"later entry",
    }
    put_objects(bucket_client(server, prefix), later_layout)
    later_entry = _to_version(server, prefix, [entry_name(_key(graphs[1]))])
    untrusted = cli_here("prune", "--untrusted", "--path", url)
    assert untrusted.exit_code == 0, untrusted.output
    assert cli_here("stats", "--path", url).exit_code == 0
    pruned = cli_here("prune", "--path", url, "--max-size", "1G")
    assert pruned.exit_code == 0, pruned.output
    with _host(url, tmp_path / "host") as host:
        assert _bucket_start.pull(host, _key) == len(graphs) - 1
    held = _objects(server, prefix)
    assert {p: held.get(p) for p in later_layout} == later_layout
    assert {p: held.get(p) for p in later_entry} == later_entry


def test_a_planted_later_object_blocks_no_signer_and_no_start_removes_it(
    server: BucketServer, tmp_path: Path
) -> None:
    """A writer of the bucket without a key plants objects of a made-up later format at a
    key's plain name and at a signer's own name. The signer's own name belongs to this
    format: its write replaces what is there, and a fresh trusting host fetches it. A
    writing host's start leaves the planted plain object (a later release's for all it can
    tell, as an untrusted entry is another's): the prune's LRU removes it."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    seed = generate_signing_key()
    trusted = [("ci-1", signing_public_key(seed))]
    key = _key("4242")
    with _host(url, tmp_path / "scratch") as scratch:
        assert scratch.put(key, b"planted")
    client = bucket_client(server, prefix)
    plain = f"{ENTRY_DIR}/{entry_name(key)}"
    fake = as_version(bytes(obstore.get(client, plain).bytes()), 9999)
    own = f"{ENTRY_DIR}/{signed_entry_name(key, 'ci-1')}"
    put_objects(
        client, {plain: fake, own: fake, f"{upkeep.MARKER_DIR}/{entry_name(key)}-4242": b""}
    )
    with _host(url, tmp_path / "ci", signing_key=("ci-1", seed), trusted_keys=trusted) as ci:
        assert ci.put(key, b"compiled")
        ci.mark(key, "4242")
    with _host(url, tmp_path / "reader", trusted_keys=trusted) as reader:
        blob = reader.get(key)
        assert blob is not None and bytes(blob) == b"compiled"
    with _host(url, tmp_path / "start") as start:
        assert _bucket_start.pull(start, _key) == 0
        assert REMOVED not in start.bucket().reader.skipped
    assert _objects(server, prefix)[plain] == fake
    report = upkeep.Bucket(url).prune(max_size=1)
    assert report.removed >= 1 and plain not in _objects(server, prefix)


@JAX_ONLY[0]
@JAX_ONLY[1]
def test_a_jax_host_compiles_what_a_later_release_keeps_and_leaves_it(
    bucket_server: BucketServer, tmp_path: Path
) -> None:
    """A JAX host fills the bucket; a later release's hosts rewrote every entry (the
    executables, their module records, the plan) in their format. A fresh host of this
    release misses, compiles the same results, and leaves every object as it was."""
    prefix = fresh_prefix()
    url = bucket_server.url(prefix)
    env = {**bucket_server.env(), "JAX_COMPILATION_CACHE_DIR": url}

    def host(name: str) -> dict[str, Any]:
        home = tmp_path / name
        (home / "work").mkdir(parents=True)
        return finish_jax(
            start_jax(runs(0, layers=1), {**env, "XDG_CACHE_HOME": str(home)}, cwd=home / "work")
        )

    first = host("a")
    names = [
        p.rpartition("/")[2]
        for p in _objects(bucket_server, prefix)
        if p.startswith(f"{ENTRY_DIR}/")
    ]
    assert len(names) >= 2, names
    _to_version(bucket_server, prefix, names)
    before = {
        p: b for p, b in _objects(bucket_server, prefix).items() if p.startswith(f"{ENTRY_DIR}/")
    }
    second = host("b")
    assert hits(second) == [0] and results(second) == results(first)
    after = {
        p: b for p, b in _objects(bucket_server, prefix).items() if p.startswith(f"{ENTRY_DIR}/")
    }
    assert after == before


@pytest.mark.torch_xla
def test_a_torch_xla_host_compiles_what_a_later_release_keeps_and_leaves_it(
    tmp_path: Path, bucket_server: BucketServer
) -> None:
    """A torch_xla host fills the bucket; a later release rewrote its entry in its format. A
    fresh writing host of this release starts (its start neither fetches nor removes the
    later entry), compiles the graph, gets the same result, and leaves the object as it was."""
    import json

    from tests.helpers import clean_env, run_worker
    from tests.torch_xla.helpers import PROGRAM, cold

    prefix = fresh_prefix()
    url = bucket_server.url(prefix)

    def run(name: str) -> dict[str, Any]:
        home = tmp_path / name
        (home / "work").mkdir(parents=True)
        report = run_worker(
            str(PROGRAM),
            json.dumps({"graphs": ["add"]}),
            cwd=home / "work",
            env=clean_env(
                ("XLA_", "PJRT_", "JAX_"),
                PJRT_DEVICE="CPU",
                TF_CPP_MIN_LOG_LEVEL="1",
                XDG_CACHE_HOME=str(home),
                XLA_PERSISTENT_CACHE_PATH=url,
                **bucket_server.env(),
            ),
        )
        assert "Traceback" not in report["stderr"], report["stderr"][-4000:]
        return report

    first = run("a")
    cold(first)
    names = [
        p.rpartition("/")[2]
        for p in _objects(bucket_server, prefix)
        if p.startswith(f"{ENTRY_DIR}/")
    ]
    assert len(names) == 1, names
    _to_version(bucket_server, prefix, names)
    before = {
        p: b
        for p, b in _objects(bucket_server, prefix).items()
        if not p.startswith("xla_pcache-1/records/")
    }
    second = run("b")
    assert second["counters"]["PersistentCacheMiss"] == 1, second["counters"]
    assert second["results"] == first["results"]
    after = {
        p: b
        for p, b in _objects(bucket_server, prefix).items()
        if not p.startswith("xla_pcache-1/records/")
    }
    assert after == before
