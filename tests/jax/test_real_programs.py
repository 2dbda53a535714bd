"""Real flax (linen and nnx), equinox and optax programs warm-start with the README's set-up.

``real_programs.py`` is run twice, each time in a fresh process, with
``XLA_PERSISTENT_CACHE_PATH`` as the only setting and no xla_pcache code in it: activation
comes from the installed package's entry point. The second run must hit on at least 90 % of
its programs, and the compile time JAX itself measured in it (its
``backend_compile_duration`` events) must be at most 15 % of the first run's: a ratio within
one test, not a comparison with a fixed time. These libraries are test dependencies: a
missing one fails the test.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store

from tests.helpers import clean_env, run_worker

pytestmark = [pytest.mark.jax, pytest.mark.timeout(900)]

PROGRAM = Path(__file__).with_name("real_programs.py")


def run_program(cache: Path) -> dict[str, Any]:
    env = clean_env(("JAX_", "XLA_"), XLA_PERSISTENT_CACHE_PATH=str(cache))
    report = run_worker(str(PROGRAM), env=env)
    stderr = report.pop("stderr")
    assert "xla_pcache" not in stderr, stderr[-4000:]  # no warning of ours
    return report


def test_the_libraries_and_the_entry_point_are_installed() -> None:
    for dist in ("flax", "optax", "equinox"):
        assert importlib.metadata.version(dist), dist
    entry_points = importlib.metadata.entry_points(group="jax_plugins")
    assert any(ep.value == "_xla_pcache_autoload" for ep in entry_points), (
        "xla_pcache is not installed with its jax_plugins entry point (pip install it)"
    )


def test_second_run_hits_and_compiles_a_fraction_of_the_first(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = run_program(cache)
    with Store(cache, read_only=True) as store:
        stored = len(store)
    warm = run_program(cache)

    # Several dozen programs (a program compiled twice in one process may hit already).
    assert cold["lookups"] > 20 and cold["hits"] < 0.1 * cold["lookups"], cold
    # Every program of the first run was stored, whatever its compile time (our threshold).
    assert stored >= 0.9 * (cold["lookups"] - cold["hits"]), (stored, cold)
    # Same programs, same results: a hit serves the program that was compiled.
    assert warm["lookups"] == cold["lookups"], (cold, warm)
    assert warm["losses"] == pytest.approx(cold["losses"], rel=1e-5), (cold, warm)
    assert warm["hits"] >= 0.9 * warm["lookups"], warm
    assert warm["compile_seconds"] <= 0.15 * cold["compile_seconds"], (cold, warm)
