"""A directory JAX's own cache filled, adopted by xla_pcache: real JAX, fresh processes.

Each test first lets JAX alone fill a directory (``JAX_COMPILATION_CACHE_DIR``, xla_pcache
off with ``XLA_PCACHE_DISABLE=1``). The filling run sets JAX's own
``jax_persistent_cache_min_compile_time_secs`` to 0: the test programs compile in
milliseconds and JAX's default (1 s) would store none of them; it stands for a user whose
JAX cache holds entries, which is what is being adopted. The runs through xla_pcache then
use the README's set-up only (``XLA_PERSISTENT_CACHE_PATH``, beside the user's
``JAX_COMPILATION_CACHE_DIR``), activated without code by the ``jax_plugins`` hook.

Both formats JAX writes are checked: zstd (``zstandard`` installed) and zlib (a process
that cannot import it, as JAX then falls back to zlib).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import xla_pcache
from helpers import clean_env
from xla_pcache import Store

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed"),
]

WORKER = Path(__file__).with_name("jax_worker.py")
PROGRAMS = list(range(10))
PACKAGE_ROOT = Path(xla_pcache.__file__).resolve().parent.parent
PURELIB = PACKAGE_ROOT / "xla_pcache.data" / "purelib"


@pytest.fixture(params=["zstd", "zlib"])
def compression(request: pytest.FixtureRequest) -> str:
    if request.param == "zstd":
        import zstandard  # noqa: F401  (JAX compresses with zstd only when it is there)
    return str(request.param)


def _plugin_path(tmp_path: Path) -> str:
    """A ``jax_plugins`` namespace module calling the autoload hook, as the installed entry
    point does: activation from the environment alone, also under a bare PYTHONPATH."""
    plugins = tmp_path / "plugins" / "jax_plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    (plugins / "xla_pcache_test_hook.py").write_text(
        "from _xla_pcache_autoload import initialize  # noqa: F401\n"
    )
    return os.pathsep.join([str(plugins.parent), str(PACKAGE_ROOT), str(PURELIB)])


def run(
    programs: list[int], env: dict[str, str], compression: str, tmp_path: Path
) -> dict[str, Any]:
    full = clean_env(("JAX_",), JAX_PLATFORMS="cpu", PYTHONPATH=_plugin_path(tmp_path), **env)
    if compression == "zlib":
        full["TEST_JAX_NO_ZSTD"] = "1"
    steps = [{"op": "run", "program": p, "layers": 2} for p in programs]
    proc = subprocess.run(
        [sys.executable, str(WORKER), json.dumps({"steps": steps})],
        capture_output=True,
        text=True,
        env=full,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == [], "\n".join(e["traceback"] for e in report["errors"])
    report["stderr"] = proc.stderr
    return report


def fill(jax_dir: Path, programs: list[int], compression: str, tmp_path: Path) -> dict[str, Any]:
    """JAX alone fills ``jax_dir``; its threshold at 0 (see the module docstring)."""
    env = {
        "JAX_COMPILATION_CACHE_DIR": str(jax_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "XLA_PCACHE_DISABLE": "1",
    }
    report = run(programs, env, compression, tmp_path)
    assert sum(r["hit"] for r in report["runs"]) == 0
    return report


def cache_files(jax_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(jax_dir) if n.endswith("-cache"))


def jax_files(jax_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(jax_dir) if n.endswith(("-cache", "-atime")))


def hits(report: dict[str, Any]) -> int:
    return sum(1 for r in report["runs"] if r["hit"])


def results(report: dict[str, Any]) -> dict[int, list[float]]:
    return {r["program"]: r["result"] for r in report["runs"]}


def store_keys(path: Path) -> list[str]:
    with Store(path, read_only=True) as store:
        keys = store.keys()
    return sorted(str(k) for k in keys)


def test_jax_cache_is_served_from_the_first_run_and_kept_once(
    tmp_path: Path, compression: str
) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    filled = fill(jax_dir, PROGRAMS, compression, tmp_path)
    assert len(cache_files(jax_dir)) == len(PROGRAMS)
    env = {"XLA_PERSISTENT_CACHE_PATH": str(ours), "JAX_COMPILATION_CACHE_DIR": str(jax_dir)}

    first = run(PROGRAMS, env, compression, tmp_path)
    assert hits(first) >= 0.9 * len(PROGRAMS), first["runs"]
    assert results(first) == results(filled)
    # Each hit moved JAX's entry into the store: kept once, counted in the store's budget.
    assert len(cache_files(jax_dir)) == len(PROGRAMS) - hits(first)
    assert len(jax_files(jax_dir)) == len(cache_files(jax_dir))  # no atime file left behind
    assert len(store_keys(ours)) >= hits(first)
    assert not any(r["level"] == "WARNING" for r in first["log"]), first["log"]
    # Adopted entries are entries like any other: the key's components (for explain) and
    # JAX's compile time, computed under the adapter's key.
    with Store(ours, read_only=True) as store:
        keys = store.keys()
        metas = [store.get(k).meta for k in keys]  # type: ignore[union-attr]
    for meta in metas:
        assert meta["adopted_from"] == "jax_cache"
        assert meta["framework"] == "jax"
        assert "key_components" in meta and "compile_time_s" in meta, meta

    second = run(PROGRAMS, env, compression, tmp_path)
    assert hits(second) == len(store_keys(ours)) >= 0.9 * len(PROGRAMS)
    assert results(second) == results(filled)


def test_store_in_jax_own_directory(tmp_path: Path, compression: str) -> None:
    """Only JAX_COMPILATION_CACHE_DIR: the store opens in the directory JAX filled."""
    jax_dir = tmp_path / "jax-cache"
    filled = fill(jax_dir, PROGRAMS, compression, tmp_path)
    first = run(PROGRAMS, {"JAX_COMPILATION_CACHE_DIR": str(jax_dir)}, compression, tmp_path)
    assert hits(first) >= 0.9 * len(PROGRAMS), first["runs"]
    assert results(first) == results(filled)
    assert len(cache_files(jax_dir)) == len(PROGRAMS) - hits(first)
    assert len(store_keys(jax_dir)) >= hits(first)


def test_read_only_store_serves_jax_entries_and_moves_nothing(tmp_path: Path) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    fill(jax_dir, PROGRAMS, "zlib", tmp_path)
    Store(ours).close()
    before = jax_files(jax_dir)
    env = {
        "XLA_PERSISTENT_CACHE_PATH": str(ours),
        "XLA_PERSISTENT_CACHE_READ_ONLY": "1",
        "JAX_COMPILATION_CACHE_DIR": str(jax_dir),
    }
    report = run(PROGRAMS, env, "zlib", tmp_path)
    assert hits(report) >= 0.9 * len(PROGRAMS)
    assert jax_files(jax_dir) == before
    assert store_keys(ours) == []


def test_corrupt_jax_entry_is_a_miss_and_not_adopted(tmp_path: Path, compression: str) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    others = [p for p in PROGRAMS if p != 3]
    fill(jax_dir, others, compression, tmp_path)
    before = set(cache_files(jax_dir))
    fill(jax_dir, [3], compression, tmp_path)
    (bad,) = set(cache_files(jax_dir)) - before
    data = (jax_dir / bad).read_bytes()
    torn = data[: len(data) // 2]  # as a file JAX was still writing
    (jax_dir / bad).write_bytes(torn)

    env = {"XLA_PERSISTENT_CACHE_PATH": str(ours), "JAX_COMPILATION_CACHE_DIR": str(jax_dir)}
    report = run(PROGRAMS, env, compression, tmp_path)
    by_program = {r["program"]: r["hit"] for r in report["runs"]}
    assert by_program[3] == 0
    assert sum(by_program[p] for p in others) >= 0.9 * len(others)
    # Left as it was, not adopted; one warning names it.
    assert cache_files(jax_dir) == [bad]
    assert (jax_dir / bad).read_bytes() == torn
    warnings = [r["msg"] for r in report["log"] if r["level"] == "WARNING"]
    assert len(warnings) == 1 and "adoption" in warnings[0], report["log"]


def test_import_from_jax(tmp_path: Path, compression: str) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    filled = fill(jax_dir, PROGRAMS, compression, tmp_path)
    junk = "jit_step-" + "0" * 64 + "-cache"
    (jax_dir / junk).write_bytes(b"not a value JAX wrote")
    env = clean_env(("JAX_",), PYTHONPATH=str(PACKAGE_ROOT))
    if compression == "zlib":
        env["TEST_JAX_NO_ZSTD"] = "1"
    code = (
        "import os, sys\n"
        "if os.environ.get('TEST_JAX_NO_ZSTD'):\n"
        "    sys.modules['zstandard'] = None; sys.modules['compression.zstd'] = None\n"
        "from xla_pcache.cli import main\n"
        "sys.argv = ['xla-pcache', *sys.argv[1:]]\n"
        "main()\n"
    )
    cmd = [sys.executable, "-c", code, "import", "--from-jax", str(jax_dir), "--path", str(ours)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    version = importlib.metadata.version("jax")
    if tuple(int(x) for x in version.split(".")[:2]) < (0, 11):
        # Before 0.11 JAX's own keys hold its directory's path: moved entries would never be
        # found under the adapter's keys, so the command refuses and moves nothing.
        assert proc.returncode == 2, proc.stdout
        assert "nothing was moved" in proc.stderr and "JAX_COMPILATION_CACHE_DIR" in proc.stderr
        assert len(cache_files(jax_dir)) == len(PROGRAMS) + 1
        assert not ours.exists() or store_keys(ours) == []
        return
    assert proc.returncode == 1, proc.stderr  # 1: one file was bad
    assert f"adopted {len(PROGRAMS)}, already present 0, skipped as bad 1" in proc.stdout
    assert cache_files(jax_dir) == [junk]
    assert len(store_keys(ours)) == len(PROGRAMS)

    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert "adopted 0, already present 0, skipped as bad 1" in again.stdout, again.stderr

    report = run(PROGRAMS, {"XLA_PERSISTENT_CACHE_PATH": str(ours)}, compression, tmp_path)
    assert hits(report) >= 0.9 * len(PROGRAMS), report["runs"]
    assert results(report) == results(filled)
