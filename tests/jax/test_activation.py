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
from pathlib import Path

import pytest

from tests.helpers import clean_env, cli, run_python, tree_state
from tests.jax.helpers import ACTIVATION_PROGRAM, JAX_ONLY, run_program

pytestmark = JAX_ONLY


@pytest.fixture(autouse=True)
def _installed() -> None:
    assert any(
        ep.value == "_xla_pcache_autoload"
        for ep in importlib.metadata.entry_points(group="jax_plugins")
    ), "xla_pcache is not installed (no jax_plugins entry point): pip install it"


def run_activated(env: dict[str, str]) -> tuple[float, int, str]:
    """``ACTIVATION_PROGRAM`` with the README's set-up: JAX on CPU and ``env``."""
    return run_program(ACTIVATION_PROGRAM, env=clean_env(("JAX_",), JAX_PLATFORMS="cpu", **env))


def test_environment_alone_gives_cold_then_hit_in_an_xla_pcache_store(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"XLA_PERSISTENT_CACHE_PATH": str(cache)}
    cold, cold_hits, _ = run_activated(env)
    warm, warm_hits, _ = run_activated(env)
    assert (cold_hits, cold) == (0, warm)
    assert warm_hits > 0
    assert (cache / "FORMAT").read_text().startswith("xla_pcache-format")
    verify = cli("verify", "--path", str(cache))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "no problems found" in verify.stdout

    before = tree_state(cache)
    ro, ro_hits, _ = run_activated({**env, "XLA_PERSISTENT_CACHE_READ_ONLY": "1"})
    assert (ro, ro_hits > 0) == (warm, True)
    assert tree_state(cache) == before


def test_disable_turns_activation_off(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"XLA_PERSISTENT_CACHE_PATH": str(cache), "XLA_PCACHE_DISABLE": "1"}
    run_activated(env)
    assert not cache.exists()


def test_an_unusable_directory_is_one_warning_and_the_program_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    _, hits, stderr = run_activated({"XLA_PERSISTENT_CACHE_PATH": str(blocker)})
    assert hits == 0
    assert "Traceback" not in stderr
    assert stderr.count("xla_pcache: cannot open the cache") == 1, stderr


def test_activation_on_a_directory_loads_no_bucket_tier_or_command_module(tmp_path: Path) -> None:
    # Activation runs in every JAX process the variables reach: on a directory it loads none
    # of what only a bucket, a remote tier, a bundle or the command needs.
    code = """
        import sys
        import jax

        jax.devices()
        import xla_pcache.jax as xj

        assert xj._installed is not None, "not activated"
        heavy = (
            "xla_pcache.tiers", "xla_pcache.bucket.upkeep", "xla_pcache.bundle",
            "xla_pcache.cli", "obstore", "redis", "rich", "typer",
        )
        print(sorted(m for m in sys.modules if m.startswith(heavy)))
    """
    env = clean_env(("JAX_",), JAX_PLATFORMS="cpu", XLA_PERSISTENT_CACHE_PATH=str(tmp_path))
    out = run_python(code, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]"], out.stdout
