"""Zero-code activation: an unmodified JAX program, configured by the environment alone.

Needs a real install of the package (entry points and the files shipped at the root of
site-packages), as ``pip install -e .`` or the wheel gives; a bare PYTHONPATH checkout has
neither, and these tests then fail. CI runs them in every JAX venv of the supported range,
with the wheel installed there. The programs run with the README's set-up: the cache path
and nothing about what is cached.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import clean_env, cli, tree_state

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed"),
]


@pytest.fixture(autouse=True)
def _installed() -> None:
    assert any(
        ep.value == "_xla_pcache_autoload"
        for ep in importlib.metadata.entry_points(group="jax_plugins")
    ), "xla_pcache is not installed (no jax_plugins entry point): pip install it"


# Knows nothing of xla_pcache: counts JAX's own persistent-cache hit events.
PROGRAM = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax._src import monitoring
    hits = []
    monitoring.register_event_listener(
        lambda event, **kw: hits.append(event)
        if event == "/jax/compilation_cache/cache_hits" else None)
    value = float(jax.jit(lambda x: jnp.sin(x).sum() * 3)(jnp.arange(8.0)))
    print(value, len(hits))
    """
)


def run_program(env: dict[str, str]) -> tuple[float, int, str]:
    base = clean_env(("JAX_",), JAX_PLATFORMS="cpu", **env)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        env=base,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    value, hits = proc.stdout.split()
    return float(value), int(hits), proc.stderr


def test_environment_alone_gives_cold_then_hit_in_an_xla_pcache_store(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"XLA_PERSISTENT_CACHE_PATH": str(cache)}
    cold, cold_hits, _ = run_program(env)
    warm, warm_hits, _ = run_program(env)
    assert (cold_hits, cold) == (0, warm)
    assert warm_hits > 0
    assert (cache / "FORMAT").read_text().startswith("xla_pcache-format")
    verify = cli("verify", "--path", str(cache))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "no problems found" in verify.stdout

    before = tree_state(cache)
    ro, ro_hits, _ = run_program({**env, "XLA_PERSISTENT_CACHE_READ_ONLY": "1"})
    assert (ro, ro_hits > 0) == (warm, True)
    assert tree_state(cache) == before


def test_disable_turns_activation_off(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"XLA_PERSISTENT_CACHE_PATH": str(cache), "XLA_PCACHE_DISABLE": "1"}
    run_program(env)
    assert not cache.exists()


def test_an_unusable_directory_is_one_warning_and_the_program_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    _, hits, stderr = run_program({"XLA_PERSISTENT_CACHE_PATH": str(blocker)})
    assert hits == 0
    assert "Traceback" not in stderr
    assert stderr.count("xla_pcache: cannot open the cache") == 1, stderr
