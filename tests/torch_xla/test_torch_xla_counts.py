"""The store's figures for torch_xla agree with torch_xla's own: a program run cold, then
warm on the same host, then on a new host (an empty host-local directory), each a fresh
process. torch_xla looks its graphs up in a host-local view the store never sees, so its
misses, its hits and the compile time they saved reach the store through the adapter.

Also ``XLA_PCACHE_ON_MISS`` for torch_xla: its cache offers no hook before a compile, so a
miss is reported (``warn``) or fails the program (``error``) when the step that compiled it
returns (``torch_xla.sync()``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store

from tests.torch_xla.helpers import PROGRAM, loads, program_env, run_program

GRAPHS = ["add", "square"]

pytestmark = [
    pytest.mark.torch_xla,
    pytest.mark.skipif(
        importlib.util.find_spec("torch_xla") is None
        or not any(
            os.path.isfile(os.path.join(d, "xla_pcache_autoload.pth"))
            for d in [*site.getsitepackages(), site.getusersitepackages()]
        ),
        reason="torch_xla, or xla_pcache's install (xla_pcache_autoload.pth), is missing",
    ),
]


def _settings(store: Path, on_miss: str | None) -> dict[str, str]:
    env = {"XLA_PERSISTENT_CACHE_PATH": str(store)}
    if on_miss is not None:
        env["XLA_PCACHE_ON_MISS"] = on_miss
    return env


def start(
    tmp: Path, store: Path, host: str, on_miss: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The program, its outcome whatever it is (a miss may be an error)."""
    return subprocess.run(
        [sys.executable, str(PROGRAM), json.dumps({"graphs": GRAPHS})],
        capture_output=True,
        text=True,
        env=program_env(tmp, host, **_settings(store, on_miss)),
        timeout=600,
        check=False,
    )


def run(tmp: Path, store: Path, host: str, on_miss: str | None = None) -> dict[str, Any]:
    return run_program(tmp, {"graphs": GRAPHS}, _settings(store, on_miss), host)


def store_stats(store: Path) -> dict[str, Any]:
    with Store(str(store), read_only=True) as s:
        return dict(s.stats())


def entry_compile_ms(store: Path) -> float:
    with Store(str(store), read_only=True) as s:
        return sum(float(e["meta"]["compile_time_s"]) * 1000 for e in s.entries())


def test_hits_misses_and_compile_time_saved_agree_with_torch_xla(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cold = run(tmp_path, store, "host-a")
    c = cold["counters"]
    assert c["PersistentCacheMiss"] == len(GRAPHS) and c["PersistentCacheHit"] == 0, c
    stats = store_stats(store)
    # torch_xla's misses are the store's (no longer a 100 % hit rate for a cold process).
    assert (stats["hits"], stats["misses"], stats["puts"]) == (0, len(GRAPHS), len(GRAPHS))
    # Every entry carries the compile time torch_xla measured for it.
    recorded = entry_compile_ms(store)
    assert recorded == pytest.approx(cold["compile_ns"] / 1e6, abs=len(GRAPHS) * 0.001)
    assert recorded > 0

    warm = run(tmp_path, store, "host-a")
    w = warm["counters"]
    stats = store_stats(store)
    if not loads():
        # torch_xla >= 2.8 on CPU cannot load its executables: no hit, nothing saved.
        assert w["PersistentCacheDeserializeFailure"] == len(GRAPHS), w
        assert stats["hits"] == 0 and stats["compile_saved_ms"] == 0, stats
        return
    assert (w["PersistentCacheHit"], w["PersistentCacheMiss"]) == (len(GRAPHS), 0), w
    assert warm["compile_ns"] == 0  # nothing compiled
    assert (stats["hits"], stats["misses"]) == (len(GRAPHS), len(GRAPHS)), stats
    assert stats["compile_saved_ms"] == pytest.approx(recorded, abs=len(GRAPHS))

    # A new host: its host-local copy is filled from the store, then torch_xla loads from it;
    # each hit counts once.
    new_host = run(tmp_path, store, "host-b")
    n = new_host["counters"]
    assert (n["PersistentCacheHit"], n["PersistentCacheMiss"]) == (len(GRAPHS), 0), n
    stats = store_stats(store)
    assert (stats["hits"], stats["misses"]) == (2 * len(GRAPHS), len(GRAPHS)), stats
    assert stats["compile_saved_ms"] == pytest.approx(2 * recorded, abs=2 * len(GRAPHS))
    assert cold["results"] == warm["results"] == new_host["results"]


def test_on_miss_error_fails_the_step_and_a_cached_program_runs(tmp_path: Path) -> None:
    store = tmp_path / "store"
    missed = start(tmp_path, store, "host-a", "error")
    assert missed.returncode != 0
    assert "CacheMissError" in missed.stderr, missed.stderr[-4000:]
    assert "XLA_PCACHE_ON_MISS=error" in missed.stderr
    assert "torch_xla program 'graph " in missed.stderr
    cold = run(tmp_path, store, "host-a")
    assert cold["counters"]["PersistentCacheMiss"] == len(GRAPHS) - 1  # one was stored
    if not loads():
        return  # nothing can be served from the cache on this torch_xla
    served = run(tmp_path, store, "host-a", "error")
    assert served["counters"]["PersistentCacheHit"] == len(GRAPHS)
    assert served["results"] == cold["results"]
    assert "CacheMissError" not in served["stderr"]


def test_on_miss_warn_logs_one_warning_per_missed_graph(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = run(tmp_path, store, "host-a", "warn")
    lines = [x for x in first["stderr"].splitlines() if "cache miss for program" in x]
    assert len(lines) == len(GRAPHS), first["stderr"][-4000:]
    assert all("torch_xla" in x for x in lines)
