"""``XLA_PCACHE_ON_MISS`` with real JAX, each run a fresh process: ``error`` fails the jitted
call of a program the cache lacks, naming the variable and the program; ``warn`` logs one
warning per miss with its reason; a cached program runs in every mode."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import clean_env
from tests.jax.helpers import JAX_ONLY

pytestmark = JAX_ONLY

PROGRAM = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s")
    import jax, jax.numpy as jnp, numpy as np
    from xla_pcache import jax as xj
    from xla_pcache.on_miss import CacheMissError
    xj.install(sys.argv[1])
    scale = int(sys.argv[2])

    @jax.jit
    def scaled_sine(x):
        return jnp.sin(x) * scale

    try:
        print("RESULT", float(scaled_sine(np.float32(1.0))))
    except CacheMissError as exc:
        print("MISS-ERROR", type(exc).__name__, exc)
        sys.exit(3)
    # JAX's own option is put back when the adapter goes.
    xj.uninstall()
    print("RAISE-OPTION", jax.config.values.get("jax_raise_persistent_cache_errors"))
    """
)


def run(root: Path, scale: int, mode: str | None) -> subprocess.CompletedProcess[str]:
    env = clean_env(("JAX_",), JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    if mode is not None:
        env["XLA_PCACHE_ON_MISS"] = mode
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(root), str(scale)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def miss_warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if "cache miss for program" in line]


def test_error_fails_a_miss_and_a_cached_program_runs(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    missed = run(root, 3, "error")
    assert missed.returncode == 3, missed.stderr[-3000:]
    line = next(x for x in missed.stdout.splitlines() if x.startswith("MISS-ERROR"))
    assert "CacheMissError" in line
    assert "XLA_PCACHE_ON_MISS=error" in line
    assert "jit_scaled_sine" in line
    # Nothing was compiled into the cache by the failed run.
    assert not any(p.is_file() for p in (root / "entries").rglob("*"))

    warm = run(root, 3, None)
    assert warm.returncode == 0, warm.stderr[-3000:]
    expected = next(x for x in warm.stdout.splitlines() if x.startswith("RESULT"))

    served = run(root, 3, "error")
    assert served.returncode == 0, served.stderr[-3000:]
    assert expected in served.stdout
    assert "RAISE-OPTION False" in served.stdout
    # Another program still fails: its constant differs.
    other = run(root, 4, "error")
    assert other.returncode == 3, other.stderr[-3000:]


def test_warn_logs_one_warning_per_miss_with_its_reason(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    first = run(root, 5, "warn")
    assert first.returncode == 0, first.stderr[-3000:]
    (line,) = miss_warnings(first)
    assert "jit_scaled_sine" in line
    # explain's one-line reason.
    assert "no entry of this program yet" in line.lower(), line
    again = run(root, 5, "warn")
    assert again.returncode == 0
    assert miss_warnings(again) == []
    # A changed program misses, and the reason names what differs from the nearest entry.
    changed = run(root, 6, "warn")
    (line,) = miss_warnings(changed)
    assert "nearest entry" in line, line


def test_a_malformed_mode_is_refused_naming_the_variable(tmp_path: Path) -> None:
    result = run(tmp_path / "cache", 1, "sometimes")
    assert result.returncode != 0
    assert "XLA_PCACHE_ON_MISS" in result.stderr
