"""xla_pcache.torch_xla against real torch + torch_xla (2.9 and 2.7 in CI) with PJRT_DEVICE=CPU.

Modelled on torch_xla's test/test_persistent_cache.py: every torch_xla run is a fresh
subprocess (``torch_xla_worker.py``) whose counters are checked. Importing torch_xla costs
seconds, so each subprocess checks several things, and runs are shared through
module-scoped fixtures. The host-local mirror is also tested in-process, without torch.

torch_xla is required here: when it is missing these tests fail rather than skip.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store, build_key
from xla_pcache.torch_xla import _build as torch_xla_build
from xla_pcache.torch_xla._host_mirror import HostMirror, is_torch_xla_name, store_key

from tests.helpers import finish_worker
from tests.torch_xla.helpers import loads, run_torch_xla, start_torch_xla, worker_env

VERSION = importlib.metadata.version("torch_xla")
# Each outcome below is the one this version must give.
LOADS = loads()


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its size and mtime: equal trees were not written."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def assert_no_torch_xla_files(store_dir: Path) -> None:
    """torch_xla names its files by a decimal hash; none may sit anywhere in the store."""
    direct = [p for p in store_dir.rglob("*") if p.is_file() and is_torch_xla_name(p.name)]
    assert direct == [], f"torch_xla wrote into the shared directory: {direct}"


def torch_xla_entries(store: Store) -> dict[str, dict[str, Any]]:
    out = {}
    for e in store.entries():
        key = e["key"]
        if isinstance(key, str) and key.startswith("torch_xla/"):
            out[build_key.split(key)[0].removeprefix("torch_xla/")] = e
    return out


def test_torch_xla_is_installed() -> None:
    # CI runs these tests for real: a missing torch_xla must show as a failure.
    assert importlib.util.find_spec("torch_xla") is not None, "torch_xla is not installed"


def test_import_does_not_import_torch() -> None:
    code = "import sys, xla_pcache, xla_pcache.torch_xla; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=worker_env())


# -- real torch_xla ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run 1 on host A, run 2 on a cold host B (its own local dir), same small graph."""
    tmp = tmp_path_factory.mktemp("runs")
    store = tmp / "store"
    first = run_torch_xla(
        {"install": {"path": str(store), "local_dir": str(tmp / "hostA")}, "graphs": ["add"]}
    )
    # Through the variables, as a user who already sets torch_xla's would.
    env = {
        "XLA_PERSISTENT_CACHE_PATH": str(store),
        "XLA_PCACHE_TORCH_XLA_LOCAL_DIR": str(tmp / "hostB"),
    }
    second = run_torch_xla({"install": {}, "graphs": ["add"]}, env)
    return {"tmp": tmp, "store": store, "first": first, "second": second}


@pytest.mark.torch_xla
def test_run1_misses_and_publishes_with_metadata(two_runs: dict[str, Any]) -> None:
    first = two_runs["first"]
    assert first["counters"]["PersistentCacheMiss"] == 1
    assert first["results"]["add"] == [0.0, 2.0, 4.0, 6.0]
    assert first["view_before"] == {}
    # torch_xla wrote its file in the private view, then it was published.
    (name, digest), *rest = first["view_after"].items()
    assert rest == []
    assert first["sync"]["published"] == 1 and first["sync"]["errors"] == 0
    store = Store(two_runs["store"], read_only=True)
    entries = torch_xla_entries(store)
    assert set(entries) == {name}
    meta = entries[name]["meta"]
    assert meta["framework"] == "torch_xla"
    assert meta["framework_version"] == importlib.metadata.version("torch_xla").split("+")[0]
    assert meta["torch_version"].split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    assert meta["device"] == "CPU"
    assert float(meta["time"]) > 0
    blob = store.get(store_key(name, torch_xla_build.build()))
    assert blob is not None
    import hashlib

    assert hashlib.sha256(bytes(blob)).hexdigest() == digest
    assert store.verify()["problems"] == 0
    # The view goes away at exit; the child environment no longer points at the store.
    assert first["view_exists_after_close"] is False
    assert first["env_path"] is None


@pytest.mark.torch_xla
def test_run2_finds_the_bytes_and_reports_the_capability(two_runs: dict[str, Any]) -> None:
    first, second = two_runs["first"], two_runs["second"]
    # Before its first execution, torch_xla's directory on the cold host already holds
    # the entry under its own name, with exactly the bytes run 1's torch_xla wrote.
    assert second["view_before"] == first["view_after"]
    counters = second["counters"]
    assert counters["PersistentCacheMiss"] == 0
    if LOADS:
        assert counters["PersistentCacheHit"] >= 1, counters
        assert counters["PersistentCacheDeserializeFailure"] == 0, counters
        assert second["capability"] == "loads"
    else:
        # torch_xla 2.9.0 on CPU cannot deserialize: counted, told once, plainly.
        assert counters["PersistentCacheHit"] == 0, counters
        assert counters["PersistentCacheDeserializeFailure"] == 1
        assert second["capability"] == "cannot-load"
        assert second["stderr"].count("cannot load them back") == 1
        assert "recompiles every graph" in second["stderr"]
    # torch_xla rewrote the file after failing to load it; first writer wins.
    assert second["sync"]["published"] == 0
    assert second["sync"]["materialized"] == 1
    store = Store(two_runs["store"], read_only=True)
    assert len(torch_xla_entries(store)) == 1


@pytest.mark.torch_xla
def test_shared_directory_never_holds_torch_xla_files(two_runs: dict[str, Any]) -> None:
    assert_no_torch_xla_files(two_runs["store"])
    for report in (two_runs["first"], two_runs["second"]):
        assert not report["view"].startswith(str(two_runs["store"]))


@pytest.mark.torch_xla
def test_read_only_serves_hits_and_publishes_nothing(two_runs: dict[str, Any]) -> None:
    store = two_runs["store"]
    before = tree(store)
    env = {"XLA_PERSISTENT_CACHE_PATH": str(store), "XLA_PERSISTENT_CACHE_READ_ONLY": "1"}
    # Host A again (warm): its pool got run 1's file when it was published. The MLP's
    # graphs are new and must not be published.
    report = run_torch_xla(
        {"install": {"local_dir": str(two_runs["tmp"] / "hostA")}, "graphs": ["add", "mlp"]}, env
    )
    assert report["view_before"] == two_runs["first"]["view_after"]
    counters = report["counters"]
    if LOADS:
        assert counters["PersistentCacheHit"] >= 1, counters
    else:
        assert counters["PersistentCacheDeserializeFailure"] >= 1, counters
    assert report["sync"]["read_only"] is True
    assert report["sync"]["published"] == 0
    assert report["sync"]["materialized"] == 0
    assert tree(store) == before
    assert_no_torch_xla_files(store)


@pytest.mark.torch_xla
def test_late_install_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    report = run_torch_xla({"before": ["add"], "install": {"path": str(store)}, "graphs": ["add"]})
    assert "too late" in report["install_error"]
    assert not store.exists() or torch_xla_entries(Store(store, read_only=True)) == {}


@pytest.mark.torch_xla
def test_a_host_local_dir_someone_else_made_is_refused(tmp_path: Path) -> None:
    """torch_xla's host-local directory on a scratch disk, made first by another user (as
    root: handed to uid 4242; otherwise a link in its place) with a pool of its own in
    it: install() refuses it with one warning naming it, and the program runs, uncached,
    with nothing read from or written to that directory."""
    store = tmp_path / "store"
    scratch = tmp_path / "scratch"
    (scratch / "planted" / "pool").mkdir(parents=True)
    (scratch / "planted" / "pool" / "123").write_bytes(b"their executable")
    if os.geteuid() == 0:
        for p in (scratch, scratch / "planted", scratch / "planted" / "pool"):
            os.chown(p, 4242, 4242)
        why = "belongs to"
    else:
        # Not root: a link in its place, refused the same way.
        scratch.rename(tmp_path / "elsewhere")
        scratch.symlink_to(tmp_path / "elsewhere")
        why = "is not a directory that can be opened without following a link"
    before = tree(scratch)
    report = run_torch_xla(
        {"install": {"path": str(store), "local_dir": str(scratch)}, "graphs": ["add"]}
    )
    assert report["view"] is None and "install_error" not in report
    assert report["results"]["add"] == [0.0, 2.0, 4.0, 6.0]
    refused = [line for line in report["stderr"].splitlines() if "is refused" in line]
    assert len(refused) == 1 and f"{scratch} {why}" in refused[0], report["stderr"]
    assert "XLA_PCACHE_TORCH_XLA_LOCAL_DIR" in refused[0]
    assert report["counters"].get("PersistentCacheHit", 0) == 0
    assert tree(scratch) == before
    assert not store.exists() or torch_xla_entries(Store(store, read_only=True)) == {}


@pytest.mark.torch_xla
def test_an_earlier_releases_host_dir_is_repaired_and_serves_at_once(
    two_runs: dict[str, Any], tmp_path: Path
) -> None:
    """The default host-local directory as an earlier release left it under ``umask 002``
    (every directory 0775), with a group member's file in the pool under the graph's name.
    main refused it, and torch_xla ran uncached at every start until someone ran chmod. Now
    it is made 0700 and emptied with one warning naming it, and torch_xla, given its view
    as ``/proc/self/fd/<n>``, loads the graph from the store in the same process."""
    store = two_runs["store"]
    ((name, digest),) = two_runs["first"]["view_after"].items()
    home = tmp_path / "home"
    local = home / "xla_pcache" / "torch_xla"
    from xla_pcache.torch_xla import _build

    # The process's host directory is its store's and its runtime build's.
    with Store(store, read_only=True) as s:
        host = HostMirror(s, str(local), build=_build.build())
    dirs = [local, Path(host.root), Path(host.pool), Path(host.views)]
    for d in dirs:
        d.mkdir(parents=True)
        os.chmod(d, 0o775)
    (Path(host.pool) / name).write_bytes(b"the group member's executable")
    report = run_torch_xla(
        {"install": {"path": str(store), "read_only": True}, "graphs": ["add"]},
        {"XDG_CACHE_HOME": str(home)},
    )
    assert report["results"]["add"] == [0.0, 2.0, 4.0, 6.0]
    counters = report["counters"]
    assert counters["PersistentCacheHit"] >= 1, counters
    assert counters["PersistentCacheMiss"] == 0, counters
    assert counters["PersistentCacheDeserializeFailure"] == 0, counters
    repaired = [line for line in report["stderr"].splitlines() if "was this user's" in line]
    assert len(repaired) == 1 and f"{local} was this user's" in repaired[0], report["stderr"]
    assert report["sync"]["repaired"] == 1
    assert {stat.S_IMODE(d.stat().st_mode) for d in dirs} == {0o700}
    import hashlib

    copy = (Path(host.pool) / name).read_bytes()
    assert hashlib.sha256(copy).hexdigest() == digest


@pytest.mark.torch_xla
def test_two_processes_at_once_store_one_intact_entry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    spec = {
        "install": {"path": str(store), "local_dir": str(tmp_path / "host")},
        "graphs": ["add"],
        "barrier": [str(tmp_path / "barrier"), 2],
    }
    reports = [
        finish_worker(p, timeout=300) for p in [start_torch_xla(spec), start_torch_xla(spec)]
    ]
    published = sum(r["sync"]["published"] for r in reports)
    assert published == 1
    assert sum(r["sync"]["already_stored"] for r in reports) == 1
    s = Store(store, read_only=True)
    (name,) = torch_xla_entries(s)
    blob = s.get(store_key(name, torch_xla_build.build()))
    assert blob is not None
    assert s.verify()["problems"] == 0
    # The stored bytes are one whole file one of the two torch_xla processes wrote.
    import hashlib

    digests = {r["view_after"][name] for r in reports}
    assert hashlib.sha256(bytes(blob)).hexdigest() in digests
    assert_no_torch_xla_files(store)


@pytest.mark.torch_xla
def test_mlp_publishes_every_graph_and_the_budget_holds(tmp_path: Path) -> None:
    full = run_torch_xla(
        {
            "install": {"path": str(tmp_path / "full"), "local_dir": str(tmp_path / "h1")},
            "graphs": ["mlp"],
        }
    )
    written = set(full["view_after"])
    assert len(written) >= 3, "an MLP step should compile several graphs"
    entries = torch_xla_entries(Store(tmp_path / "full", read_only=True))
    assert set(entries) == written
    sizes = sorted(e["disk_bytes"] for e in entries.values())
    total = sum(sizes)
    # Room for about half of them: every graph still goes in, the oldest get evicted.
    budget = max(total // 2, sizes[-1] * 2)
    assert budget < total
    small = run_torch_xla(
        {
            "install": {
                "path": str(tmp_path / "small"),
                "local_dir": str(tmp_path / "h2"),
                "max_size": budget,
            },
            "graphs": ["mlp"],
        }
    )
    assert small["results"]["mlp"] == full["results"]["mlp"]
    assert small["sync"]["published"] == len(written)
    s = Store(tmp_path / "small", read_only=True)
    stats = s.stats()
    assert isinstance(stats["bytes"], int) and stats["bytes"] <= budget
    assert stats["evictions"]
    assert s.verify()["problems"] == 0


# -- the host-local mirror, in this process -------------------------------------------------


def _mirror(store: Store, local: Path) -> HostMirror:
    return HostMirror(store, str(local), meta=lambda: {"framework": "torch_xla"})


def test_warm_host_does_no_work_and_evictions_reach_the_pool(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    for i in range(5):
        store.put(store_key(str(1000 + i)), bytes([i]) * 100, meta={"framework": "torch_xla"})
    store.put("jax/other", b"x" * 10, meta={"framework": "jax"})
    cold = _mirror(store, tmp_path / "local")
    cold.refresh_pool()
    assert cold.counters.materialized == 5 and cold.counters.header_scans == 1
    view = Path(cold.open_view())
    assert sorted(p.name for p in view.iterdir()) == [str(1000 + i) for i in range(5)]
    assert (view / "1003").read_bytes() == bytes([3]) * 100
    cold.close_view()

    warm = _mirror(store, tmp_path / "local")
    warm.refresh_pool()
    assert warm.counters.as_dict()["materialized"] == 0
    assert warm.counters.header_scans == 0  # the manifest knew every entry file

    store.delete(store_key("1001"))
    warm.refresh_pool()
    assert warm.counters.removed_from_pool == 1
    assert "1001" not in os.listdir(warm.pool)


def test_a_file_still_open_is_not_published(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    mirror = _mirror(store, tmp_path / "local")
    view = Path(mirror.open_view())
    with open(view / "42", "wb") as f:
        f.write(b"half")
        f.flush()
        mirror.publish()
        assert mirror.counters.pending == 1 and len(store) == 0
        f.write(b" and the rest")
    mirror.publish()
    blob = store.get(store_key("42"))
    assert blob is not None and bytes(blob) == b"half and the rest"
    assert blob.meta["torch_xla_name"] == "42"
    # Shared with the host's later processes through the pool.
    assert (Path(mirror.pool) / "42").read_bytes() == b"half and the rest"
    mirror.publish()
    assert mirror.counters.published == 1
    mirror.close_view()


def test_dead_views_are_swept(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    views = tmp_path / "local"
    dead = _mirror(store, views)
    dead_view = Path(dead.open_view())
    lock = Path(f"{dead_view}.lock")
    lock_fd = dead._view._lock_fd  # the view's, which the mirror holds as its part
    assert lock_fd is not None
    os.close(lock_fd)  # as if the process died: its lock is released
    old = lock.stat().st_mtime - 3600
    os.utime(lock, (old, old))
    alive = _mirror(store, views)
    alive.open_view()
    assert not dead_view.exists() and not lock.exists()
    alive.close_view()
