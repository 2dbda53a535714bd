"""The user-facing commands ``xla-pcache demo`` and ``xla-pcache doctor``, run as a user
runs them (``python -m xla_pcache ...``), against real JAX on CPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from xla_pcache import Store
from xla_pcache.cli._doctor import FRAMEWORKS, probe_key

from tests.helpers import cli

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")


def _cli(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    # JAX on CPU whatever the machine has, and no table wrapped.
    return cli(*args, timeout=600, JAX_PLATFORMS="cpu", COLUMNS="200", **variables)


@pytest.mark.jax
@needs_jax
def test_demo_warm_run_hits_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    proc = _cli("demo", "--path", str(root), "--keep")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {
        line.split()[1]: line
        for line in proc.stdout.splitlines()
        if line.startswith("│ cold") or line.startswith("│ warm")
    }
    assert "miss" in rows["cold"] and "hit" in rows["warm"], proc.stdout
    # Which run was faster is the bench's business (bench/warm_start.py): here, that the
    # warm run was served by the cache.
    assert "hits=1" in proc.stdout
    with Store(root, read_only=True) as store:
        entries = store.entries()
    demo_entries = [e for e in entries if str(e["key"]).startswith("jit_xla_pcache_demo_")]
    assert len(demo_entries) == 1, entries
    meta = demo_entries[0]["meta"]
    assert isinstance(meta, dict) and meta["framework"] == "jax"
    # The warm run saved what the cold one recorded, and says so.
    saved_line = next(line for line in proc.stdout.splitlines() if "Compile time saved" in line)
    with Store(root, read_only=True) as store:
        saved_ms = store.stats()["compile_saved_ms"]
    assert isinstance(saved_ms, int) and saved_ms > 0
    assert abs(saved_ms - float(meta["compile_time_s"]) * 1000) <= 1, (saved_ms, meta)
    assert "by the warm run" in saved_line, proc.stdout


@pytest.mark.jax
@needs_jax
def test_doctor_probes_once_and_remembers(tmp_path: Path) -> None:
    """The jax probe runs for real the first time and is read back the second; torch_xla's
    answer is planted in the cache under its probe key, so it is read back, never run."""
    root = tmp_path / "cache"
    torch_xla = FRAMEWORKS["torch_xla"]
    planted = {"backend": "planted", "serialize": True, "load": False}
    versions: dict[str, str | None] = {}
    for dist in torch_xla.versions:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    with Store(root) as store:
        key = probe_key(torch_xla, versions, "cpu", torch_xla.build().digest)
        store.put(key, json.dumps(planted).encode())

    reports = []
    for _ in range(2):
        proc = _cli("doctor", "--path", str(root), "--json", PJRT_DEVICE="CPU")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reports.append(json.loads(proc.stdout))
    first, second = reports
    jax_first, jax_second = first["frameworks"]["jax"], second["frameworks"]["jax"]
    assert jax_first["remembered"] is False and jax_second["remembered"] is True
    for report in (jax_first, jax_second):
        assert report["serialize"] is True and report["load"] is True
        assert report["backend"] == "cpu" and report["adapter"] == "ok"
    assert first["config"]["path"] == str(root)
    assert first["problems"] == []
    # The build in force: what the adapter's keys here end with, the jaxlib object named.
    build = FRAMEWORKS["jax"].build()
    assert jax_first["build"]["digest"] == build.digest
    assert jax_first["build"]["roles"]["jaxlib"] == build.roles()["jaxlib"]
    text = _cli("doctor", "--path", str(root), PJRT_DEVICE="CPU").stdout
    assert f"  jax: build {build.digest}" in text
    assert f"    jaxlib: {build.roles()['jaxlib']['file']} " in text
    if importlib.util.find_spec("torch_xla") is not None:
        assert first["frameworks"]["torch_xla"]["backend"] == "planted"
        assert first["frameworks"]["torch_xla"]["remembered"] is True


def test_doctor_says_what_jax_stores_and_where_each_setting_comes_from(tmp_path: Path) -> None:
    """About the settings themselves: each threshold's value and source (JAX's own variable
    wins over ours; ours from its variable or its default; JAX's own when disabled)."""
    env = {
        "XLA_PERSISTENT_CACHE_PATH": str(tmp_path / "cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2",
        "XLA_PCACHE_MIN_COMPILE_TIME": "0",
        "XLA_PCACHE_MIN_ENTRY_SIZE": "4K",
    }
    proc = _cli("doctor", "--json", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    caching = json.loads(proc.stdout)["jax_caching"]
    assert caching == {
        "jax_persistent_cache_min_compile_time_secs": {
            "value": "2",
            "source": "JAX's variable JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        },
        "jax_persistent_cache_min_entry_size_bytes": {
            "value": 4096,
            "source": "xla_pcache's XLA_PCACHE_MIN_ENTRY_SIZE",
        },
    }
    text = _cli("doctor", **{**env, "XLA_PCACHE_MIN_ENTRY_SIZE": ""}).stdout
    assert "jax_persistent_cache_min_entry_size_bytes = 0 (from xla_pcache's default)" in text
    disabled = _cli("doctor", "--json", XLA_PCACHE_DISABLE="1")
    caching = json.loads(disabled.stdout)["jax_caching"]
    assert caching["jax_persistent_cache_min_compile_time_secs"] == {
        "value": 1.0,
        "source": "JAX's default (XLA_PCACHE_DISABLE=1)",
    }
