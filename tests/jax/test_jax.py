"""xla_pcache.jax against the real jax on CPU, each JAX process a fresh subprocess.

The worker (``jax_worker.py``) runs a list of steps and reports, per jitted program, whether
JAX counted a persistent-cache hit (its ``/jax/compilation_cache/cache_hits`` event) and the
program's result. The test process itself never imports jax.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.jax import SUPPORTED_JAX

from tests.helpers import executables, is_plan
from tests.jax.helpers import (
    JAX_ONLY,
    finish_jax,
    hits,
    open_barrier,
    results,
    run_jax,
    runs,
    start_jax,
    store_keys,
    worker_env,
)

pytestmark = JAX_ONLY


def pcache_warnings(report: dict[str, Any]) -> list[str]:
    return [r["msg"] for r in report["log"] if r["level"] in ("WARNING", "ERROR", "CRITICAL")]


def tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under root with size, mtime and content digest."""
    out: dict[str, tuple[int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root) + "/"] = (0, st.st_mtime_ns, "")
        for name in filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            digest = hashlib.sha256(Path(full).read_bytes()).hexdigest()
            out[os.path.relpath(full, root)] = (st.st_size, st.st_mtime_ns, digest)
    return out


def entry_file(root: Path, key: str) -> Path:
    with Store(root, read_only=True) as store:
        names = [e["name"] for e in store.entries() if e["key"] == key]
    assert len(names) == 1, names
    (path,) = root.glob(f"entries/*/{names[0]}")
    return path


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[str]]:
    """A cache written by one JAX process that compiled programs 0 and 1 in turn; also
    the key each program added."""
    root = tmp_path_factory.mktemp("populated") / "cache"
    order: list[str] = []
    report = run_jax([{"op": "install", "path": str(root)}, *runs(0), {"op": "inspect"}])
    order.append(next(iter(store_keys(root))))
    report1 = run_jax([{"op": "install", "path": str(root)}, *runs(1)])
    order.append(next(iter(store_keys(root) - set(order))))
    report["runs"] += report1["runs"]
    return root, report, order


def copy_of(populated: tuple[Path, dict[str, Any], list[str]], tmp_path: Path) -> Path:
    dst = tmp_path / "cache"
    shutil.copytree(populated[0], dst, symlinks=True)
    return dst


def test_miss_then_hit_in_a_fresh_process(
    populated: tuple[Path, dict[str, Any], list[str]], tmp_path: Path
) -> None:
    root, first, order = populated
    assert hits(first) == [0, 0]
    assert [r["miss"] for r in first["runs"]] == [1, 1]
    assert first["inspect"][0]["base_type"] == "StoreCache"
    assert first["inspect"][0]["is_cache_interface"]
    # The program's executable and its module record (docs/jax.md, "Compiling ahead").
    assert first["inspect"][0]["len"] == 2
    assert pcache_warnings(first) == [] and first["warnings"] == []
    assert len(store_keys(root)) == 2
    assert all(k.startswith("jit_step-") for k in order)

    with Store(root, read_only=True) as store:
        metas = [e["meta"] for e in executables(store)]
    for meta in metas:
        assert isinstance(meta, dict)
        assert meta["framework"] == "jax"
        assert meta["framework_version"] == _version("jax")
        assert meta["jaxlib_version"] == _version("jaxlib")
        assert meta["backend"] == "cpu"

    second = run_jax([{"op": "install", "path": str(copy_of(populated, tmp_path))}, *runs(0, 1)])
    assert hits(second) == [1, 1]
    assert [r["miss"] for r in second["runs"]] == [0, 0]
    assert results(second) == results(first)
    assert pcache_warnings(second) == [] and second["warnings"] == []


def test_environment_variables_configure_install(
    populated: tuple[Path, dict[str, Any], list[str]], tmp_path: Path
) -> None:
    """install() with no arguments takes the path and read-only flag from the environment;
    a read-only process gets hits, writes no new program and leaves the tree unchanged."""
    root = copy_of(populated, tmp_path)
    before = tree(root)
    report = run_jax(
        [{"op": "install"}, *runs(0, 1, 7), {"op": "inspect"}],
        env={"XLA_PERSISTENT_CACHE_PATH": str(root), "XLA_PERSISTENT_CACHE_READ_ONLY": "1"},
    )
    assert hits(report) == [1, 1, 0]
    assert results(report)[0] == results(populated[1])[0]
    assert report["inspect"][0]["path"] == str(root)
    assert tree(root) == before
    assert pcache_warnings(report) == [] and report["warnings"] == []


def test_corrupted_entries_are_recompiled_and_replaced(
    populated: tuple[Path, dict[str, Any], list[str]], tmp_path: Path
) -> None:
    """Program 0's entry has a flipped payload byte (the store's checksum catches it);
    program 1's entry is well-formed but holds bytes JAX cannot decompress (only JAX can
    tell). Both recompile with the right result, and a later lookup of each hits."""
    root = copy_of(populated, tmp_path)
    key0, key1 = populated[2]
    path0 = entry_file(root, key0)
    data = bytearray(path0.read_bytes())
    data[-1] ^= 0xFF
    path0.write_bytes(bytes(data))
    with Store(root) as store:
        blob = store.get(key1)
        assert blob is not None
        meta = blob.meta
        assert store.delete(key1)
        assert store.put(key1, b"not an executable", meta=meta)

    report = run_jax(
        [
            {"op": "install", "path": str(root)},
            *runs(0, 1),
            {"op": "clear_caches"},
            *runs(0, 1),
        ]
    )
    assert hits(report) == [0, 0, 1, 1]
    expected = results(populated[1])
    for run in report["runs"]:
        assert run["result"] == expected[run["program"]]
    # One warning each: the store's for the checksum failure (a miss, so JAX never saw
    # the entry), JAX's for the payload it could not decompress.
    (store_warning,) = pcache_warnings(report)
    assert "checksum" in store_warning
    replaced = [r["msg"] for r in report["log"] if "replacing the entry" in r["msg"]]
    assert len(replaced) == 1 and key1 in replaced[0]
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "Error reading persistent compilation cache entry" in report["warnings"][0]
    with Store(root, read_only=True) as store:
        replaced_blob = store.get(key1)
        assert replaced_blob is not None and bytes(replaced_blob) != b"not an executable"
        assert store.get(key0) is not None
    assert store_keys(root) == {key0, key1}


def test_keys_do_not_depend_on_the_cache_path(tmp_path: Path) -> None:
    """Fill a cache, move its directory, and hit from the new path. Program 1 runs with
    JAX's default XLA side caches turned back on, as the control: on jax 0.10 its key
    embeds the path, so it hits at the old path and misses at the new one."""
    old, new = tmp_path / "mount-a" / "cache", tmp_path / "mount-b" / "cache"
    default = {"op": "config", "name": "jax_persistent_cache_enable_xla_caches"}
    xla_caches_on = {**default, "value": "xla_gpu_per_fusion_autotune_cache_dir"}
    xla_caches_off = {**default, "value": "none"}
    first = run_jax(
        [
            {"op": "install", "path": str(old)},
            {"op": "inspect"},
            *runs(0),
            xla_caches_on,
            *runs(1),
            {"op": "clear_caches"},
            *runs(1),
        ]
    )
    path_in_key = tuple(int(p) for p in _version("jax").split(".")[:2]) < (0, 11)
    # install() turns the side caches off only where their path is part of the key.
    assert (first["inspect"][0]["xla_caches"] == "none") == path_in_key
    assert hits(first) == [0, 0, 1]
    new.parent.mkdir()
    old.rename(new)
    second = run_jax(
        [
            {"op": "install", "path": str(new)},
            *runs(0),
            xla_caches_on,
            *runs(1),
            xla_caches_off,
            {"op": "clear_caches"},
            *runs(0),
        ]
    )
    assert hits(second) == [1, 0 if path_in_key else 1, 1]
    assert results(second)[0] == results(first)[0]


def test_jax_conventions_keep_working(tmp_path: Path) -> None:
    """install() takes its path from jax_compilation_cache_dir when nothing else names one;
    thresholds stay the user's; set_cache_dir/reset_cache reach the store at the new path;
    the verification wrapper wraps the store; uninstall restores JAX's factory."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    report = run_jax(
        [
            {"op": "config", "name": "jax_persistent_cache_min_compile_time_secs", "value": 60},
            # No path and no XLA_PERSISTENT_CACHE_PATH: install() takes JAX's own setting.
            {"op": "config", "name": "jax_compilation_cache_dir", "value": str(a)},
            {"op": "install"},
            *runs(0),
            {"op": "inspect"},
            {"op": "config", "name": "jax_persistent_cache_min_compile_time_secs", "value": 0},
            {"op": "set_cache_dir", "path": str(b)},
            *runs(1),
            {"op": "inspect"},
            # The verification wrapper (and its option) exist only on newer JAX.
            {
                "op": "config",
                "name": "jax_compilation_cache_check_contents",
                "value": True,
                "optional": True,
            },
            {"op": "set_cache_dir", "path": str(c)},
            *runs(2),
            {"op": "inspect"},
            {
                "op": "config",
                "name": "jax_compilation_cache_check_contents",
                "value": False,
                "optional": True,
            },
            {"op": "uninstall"},
            {"op": "set_cache_dir", "path": str(tmp_path / "jax-own")},
            *runs(3),
            {"op": "inspect"},
        ]
    )
    first, second, third, fourth = report["inspect"]
    # A 60 s threshold keeps program 0 out; install() did not lower it.
    assert first["min_compile_time"] == 60
    assert first["cache_dir"] == str(a) and first["path"] == str(a)
    assert first["base_type"] == "StoreCache"
    assert store_keys(a) == set()
    assert second["base_type"] == "StoreCache" and second["path"] == str(b)
    assert len(store_keys(b)) == 1
    if "jax_compilation_cache_check_contents" in report.get("missing_options", []):
        assert third["cache_type"] == third["base_type"] == "StoreCache"
    else:
        assert third["cache_type"] == "VerificationCache" and third["base_type"] == "StoreCache"
    assert len(store_keys(c)) == 1
    assert fourth["base_type"] == "LRUCache"
    assert fourth["factory_module"] == "jax._src.compilation_cache"
    assert fourth["xla_caches"] == "xla_gpu_per_fusion_autotune_cache_dir"
    assert any(name.endswith("-cache") for name in os.listdir(tmp_path / "jax-own"))
    assert hits(report) == [0, 0, 0, 0]
    assert pcache_warnings(report) == [] and report["warnings"] == []


def test_cache_contract(tmp_path: Path) -> None:
    """JAX's cache contract; and on a jax without the factory hook, install() fails with
    one CacheError that names the supported versions."""
    report = run_jax(
        [
            {"op": "contract", "path": str(tmp_path / "c")},
            {"op": "unsupported", "path": str(tmp_path / "u")},
        ]
    )
    assert report["unsupported"].startswith(f"CacheError: xla_pcache.jax supports {SUPPORTED_JAX}")
    assert "compilation_cache.get_file_cache" in report["unsupported"]
    assert not (tmp_path / "u").exists()
    contract = report["contract"]
    assert contract["is_cache_interface"]
    assert contract["missing"] is None
    assert contract["empty_get"].startswith("ValueError")
    assert contract["empty_put"].startswith("ValueError")
    assert contract["after_two_puts"] == "first"
    # A zero-copy view of the payload, which JAX only decompresses; never writable.
    assert contract["get_type"] == "memoryview" and contract["get_readonly"]
    assert contract["len"] == 2
    assert contract["len_after_clear"] == 0
    assert contract["get_after_clear"] is None


def test_cache_failures_degrade_to_misses(tmp_path: Path) -> None:
    """A cache that cannot be opened, or whose directory vanishes under a running process,
    costs compilations, never the program: results stay right and JAX sees no error."""
    bad, good = tmp_path / "a-file", tmp_path / "cache"
    bad.write_text("not a directory")
    report = run_jax(
        [
            {"op": "install", "path": str(bad)},
            *runs(0),
            {"op": "install", "path": str(good)},
            *runs(1),
            {"op": "break", "path": str(good)},
            {"op": "clear_caches"},
            *runs(1, 2),
        ]
    )
    assert hits(report) == [0, 0, 0, 0]
    expected = run_jax(runs(0, 1, 2), env={"JAX_ENABLE_COMPILATION_CACHE": "false"})
    assert results(report) == results(expected)
    assert report["warnings"] == []
    assert sum("cannot open the cache" in w for w in pcache_warnings(report)) == 1


def test_importing_xla_pcache_does_not_import_jax() -> None:
    code = (
        "import sys, xla_pcache, xla_pcache.jax, xla_pcache.cli._demo, xla_pcache.cli._doctor\n"
        "assert 'jax' not in sys.modules, 'jax was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=worker_env(), timeout=60)


def test_concurrent_compiles_of_the_same_programs(tmp_path: Path) -> None:
    """Two processes released together compile the same programs: both succeed with the
    same results, one entry per program remains, and each then reads every entry back
    whole (a hit, after JAX's in-memory caches are cleared)."""
    root = tmp_path / "cache"
    go = tmp_path / "go"
    programs = (10, 11, 12)

    def steps(ready: Path) -> list[dict[str, Any]]:
        return [
            {"op": "install", "path": str(root)},
            {"op": "wait", "ready": str(ready), "file": str(go)},
            *runs(*programs, layers=8),
            {"op": "clear_caches"},
            *runs(*programs, layers=8),
        ]

    ready = [tmp_path / "ready-0", tmp_path / "ready-1"]
    procs = [start_jax(steps(r)) for r in ready]
    # Open the barrier once both are past their imports, so their compilations overlap.
    open_barrier(procs, ready, go)
    reports = [finish_jax(p) for p in procs]
    for report in reports:
        assert hits(report)[len(programs) :] == [1] * len(programs)
        assert pcache_warnings(report) == [] and report["warnings"] == []
    assert results(reports[0]) == results(reports[1])
    assert len(store_keys(root)) == len(programs)
    with Store(root, read_only=True) as store:
        report = store.verify()
    assert report["corrupt"] == [] and report["problems"] == 0, report


def test_small_budget_holds_and_recent_programs_hit(tmp_path: Path) -> None:
    """Thirteen programs through a budget of about ten programs (on jax 0.10 each ~8 KB of
    payload, 12 KB on disk, and its module record). Program 0 is compiled first but read
    back from the cache (a use) after program 7, so least-recently-used eviction takes
    programs 1, 2, ... first: the store stays within budget, and program 0 and the latest
    programs hit in the next process while program 1 does not."""
    root = tmp_path / "cache"
    # Entry sizes differ between JAX versions (about 12 KB on disk on 0.10, less on older
    # ones): the budget is counted in programs of this JAX, measured on program 0 (its
    # executable and its module record).
    sizing = tmp_path / "sizing"
    run_jax([{"op": "install", "path": str(sizing)}, *runs(0)])
    with Store(sizing, read_only=True) as store:
        one = sum(e["disk_bytes"] for e in store.entries() if not is_plan(e["key"]))
    assert isinstance(one, int) and one > 0
    budget = one * 32 // 3
    install = {"op": "install", "path": str(root), "max_size": budget}
    first = run_jax(
        [install, *runs(*range(8)), {"op": "clear_caches"}, *runs(0), *runs(*range(8, 13))]
    )
    assert hits(first) == [0] * 8 + [1] + [0] * 5
    with Store(root, read_only=True) as store:
        stats = store.stats()
        assert isinstance(stats["bytes"], int)
        assert 0 < stats["bytes"] <= budget, stats
        assert 6 <= len(store_keys(root)) < 13, stats
    second = run_jax([install, *runs(0, 12, 11, 10, 1)])
    assert hits(second) == [1, 1, 1, 1, 0]
    assert results(second)[0] == results(first)[0]
    with Store(root, read_only=True) as store:
        stats = store.stats()
        assert isinstance(stats["bytes"], int)
        assert stats["bytes"] <= budget, stats


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


# what is cached ------------------------------------------------------------------------------

MIN_TIME = "jax_persistent_cache_min_compile_time_secs"
MIN_SIZE = "jax_persistent_cache_min_entry_size_bytes"


def test_jax_defaults_are_the_ones_the_adapter_knows() -> None:
    """The adapter tells a user's explicit setting from JAX's default by comparing with the
    defaults it knows; they must be this JAX's (no xla_pcache in the process)."""
    from xla_pcache.jax._thresholds import THRESHOLDS

    report = run_jax([{"op": "thresholds"}], {"XLA_PCACHE_DISABLE": "1"})
    (seen,) = report["thresholds"]
    assert seen["in_force"] == {}
    assert seen["config"] == {t.option: t.jax_default for t in THRESHOLDS}


def test_small_programs_are_stored_with_only_the_path_set(tmp_path: Path) -> None:
    """JAX's own 1 s threshold would keep programs that compile faster out; the store's
    default (0) caches every program, and says where the setting came from."""
    root = tmp_path / "cache"
    first = run_jax([{"op": "install", "path": str(root)}, *runs(0, 1), {"op": "thresholds"}])
    assert len(store_keys(root)) == 2
    (seen,) = first["thresholds"]
    assert seen["config"] == {MIN_TIME: 0.0, MIN_SIZE: 0}
    assert seen["in_force"] == {
        MIN_TIME: {"value": 0.0, "source": "xla_pcache's default"},
        MIN_SIZE: {"value": 0, "source": "xla_pcache's default"},
    }
    second = run_jax([{"op": "install", "path": str(root)}, *runs(0, 1)])
    assert hits(second) == [1, 1]


def test_store_variables_set_the_thresholds(tmp_path: Path) -> None:
    """About the settings themselves: XLA_PCACHE_MIN_COMPILE_TIME and _MIN_ENTRY_SIZE reach
    JAX's options; a threshold above every compile keeps the programs out."""
    root = tmp_path / "cache"
    report = run_jax(
        [{"op": "install", "path": str(root)}, *runs(0), {"op": "thresholds"}],
        {"XLA_PCACHE_MIN_COMPILE_TIME": "10m", "XLA_PCACHE_MIN_ENTRY_SIZE": "1K"},
    )
    (seen,) = report["thresholds"]
    assert seen["config"] == {MIN_TIME: 600.0, MIN_SIZE: 1024}
    assert seen["in_force"][MIN_TIME]["source"] == "xla_pcache's XLA_PCACHE_MIN_COMPILE_TIME"
    assert seen["in_force"][MIN_SIZE]["source"] == "xla_pcache's XLA_PCACHE_MIN_ENTRY_SIZE"
    assert store_keys(root) == set()


def test_a_users_own_jax_setting_wins(tmp_path: Path) -> None:
    """About the settings themselves: JAX's variable, or jax.config.update before
    installation to a value other than JAX's default, is the user's choice and is kept; an
    update after installation simply replaces ours; uninstall restores what it replaced."""
    root = tmp_path / "cache"
    by_env = run_jax(
        [{"op": "install", "path": str(root)}, *runs(0), {"op": "thresholds"}],
        {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "600", "XLA_PCACHE_MIN_COMPILE_TIME": "0"},
    )
    (seen,) = by_env["thresholds"]
    assert seen["config"][MIN_TIME] == 600.0
    assert seen["in_force"][MIN_TIME]["source"] == (
        "JAX's variable JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
    )
    assert seen["in_force"][MIN_SIZE]["source"] == "xla_pcache's default"
    assert store_keys(root) == set()

    by_config = run_jax(
        [
            {"op": "config", "name": MIN_TIME, "value": 600.0},
            {"op": "config", "name": MIN_SIZE, "value": 10},
            {"op": "install", "path": str(root)},
            *runs(0),
            {"op": "thresholds"},
            {"op": "config", "name": MIN_TIME, "value": 0.0},
            *runs(1),
            {"op": "uninstall"},
            {"op": "thresholds"},
        ]
    )
    seen, after = by_config["thresholds"]
    assert seen["config"] == {MIN_TIME: 600.0, MIN_SIZE: 10}
    assert {v["source"] for v in seen["in_force"].values()} == {"jax.config.update by the program"}
    assert len(store_keys(root)) == 1  # program 1, after the user lowered the threshold
    assert after["config"] == {MIN_TIME: 0.0, MIN_SIZE: 10}  # the user's, not restored

    restored = run_jax(
        [{"op": "install", "path": str(root)}, {"op": "uninstall"}, {"op": "thresholds"}]
    )
    assert restored["thresholds"][0]["config"] == {MIN_TIME: 1.0, MIN_SIZE: 0}
