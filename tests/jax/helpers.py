"""Helpers of the JAX tests, and of the tier tests that run JAX (``tests.jax.helpers``): the
worker (``jax_worker.py``) started and read, and programs that know nothing of xla_pcache,
run in fresh processes. The test process itself never imports jax."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store, entry_name
from xla_pcache.config import Settings
from xla_pcache.jax import _build as jax_build
from xla_pcache.jax.ahead import _plan, _plan_name

from tests.helpers import (
    clean_env,
    executable_keys,
    executables,
    finish_worker,
    start_worker,
)

WORKER = Path(__file__).with_name("jax_worker.py")
# The README's set-up: nothing about what is cached; the tests that check a threshold set
# their own and say why.
STEP_ENV = {"JAX_PLATFORMS": "cpu"}
# Every JAX test module's marks: in the jax group, and skipped where JAX is not installed
# (tests/test_no_skips.py fails CI for any skip).
JAX_ONLY = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed"),
]


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's environment: none of the shell's JAX settings, JAX on CPU, and ``extra``."""
    env = clean_env(("JAX_",), **STEP_ENV)
    env.update(extra or {})
    return env


def start_jax(
    steps: list[dict[str, Any]], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[str]:
    """The worker running ``steps``, not waited for (``finish_jax``)."""
    return start_worker(str(WORKER), json.dumps({"steps": steps}), env=worker_env(env), cwd=cwd)


def finish_jax(proc: subprocess.Popen[str], timeout: float = 300) -> dict[str, Any]:
    return finish_worker(proc, timeout)


def run_jax(steps: list[dict[str, Any]], env: dict[str, str] | None = None) -> dict[str, Any]:
    return finish_jax(start_jax(steps, env))


def open_barrier(procs: list[subprocess.Popen[str]], ready: list[Path], go: Path) -> None:
    """Opens the start barrier once every worker says it is ready; a worker that exits first
    fails the test with its output instead of leaving the others to start alone."""
    while not all(r.exists() for r in ready):
        for proc in procs:
            if proc.poll() is not None:
                _, err = proc.communicate()
                pytest.fail(f"worker exited ({proc.returncode}) before the barrier:\n{err[-4000:]}")
        time.sleep(0.01)
    go.touch()


def worker_plan_name() -> str:
    """The entry name of the prefetch plan the worker's processes keep (the worker's script
    as placed in this repository, this JAX, process 0; whatever the runtime build): a bucket
    lists it among the entries."""
    version = importlib.metadata.version("jax")
    name = f"script {_plan_name.place(str(WORKER))}"
    return entry_name(_plan.plan_key(_plan_name.workload(name, version, 0)))


def runs(*programs: int, layers: int = 2) -> list[dict[str, Any]]:
    return [{"op": "run", "program": p, "layers": layers} for p in programs]


def hits(report: dict[str, Any]) -> list[int]:
    return [r["hit"] for r in report["runs"]]


def results(report: dict[str, Any]) -> dict[int, list[float]]:
    return {r["program"]: r["result"] for r in report["runs"]}


def store_keys(root: Path) -> set[str]:
    """The keys of the executables in the store at ``root`` (its prefetch plans left out)."""
    with Store(root, read_only=True) as store:
        return set(map(str, executable_keys(store)))


def jax_keys(root: Path) -> set[str]:
    """JAX's keys of the executables in the store at ``root``, each checked to be of this
    JAX's runtime build (what a plan names: an entry's key less its build)."""
    suffix = jax_build.build().suffix
    keys = store_keys(root)
    assert all(k.endswith(suffix) for k in keys), keys
    return {k.removesuffix(suffix) for k in keys}


# The head of a program that knows nothing of xla_pcache: it counts in ``hits`` JAX's own
# persistent-cache hit events.
COUNT_HITS = """
import json, os, sys
import numpy as np
import jax, jax.numpy as jnp
from jax._src import monitoring

hits = []
monitoring.register_event_listener(
    lambda event, **kw: hits.append(event)
    if event == "/jax/compilation_cache/cache_hits" else None)
"""

# Prints its value and JAX's own persistent-cache hit count.
ACTIVATION_PROGRAM = COUNT_HITS + textwrap.dedent(
    """
    value = float(jax.jit(lambda x: jnp.sin(x).sum() * 3)(jnp.arange(8.0)))
    print(value, len(hits))
    """
)

# Prints its value and JAX's own persistent-cache hit count.
SIN_COS_PROGRAM = COUNT_HITS + textwrap.dedent(
    """
    f = {"sin": lambda x: jnp.sin(x).sum() * 3, "cos": lambda x: jnp.cos(x).sum() * 5}
    # A numpy argument: the jitted function is the only program compiled.
    value = float(jax.jit(f[sys.argv[1]])(np.arange(8.0, dtype=np.float32)))
    print(value, len(hits))
    """
)


def run_python(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A Python program (``argv`` after the interpreter; ``env`` all of its environment) in a
    fresh process, which must exit with 0: what it wrote."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_program(
    code: str, *args: str, env: dict[str, str], python: str = sys.executable
) -> tuple[float, int, str]:
    """A program printing its value and JAX's hit count (``ACTIVATION_PROGRAM``,
    ``SIN_COS_PROGRAM``) in a fresh process of ``python``: those two, and its stderr."""
    proc = run_python([python, "-c", code, *args], env)
    value, count = proc.stdout.split()
    return float(value), int(count), proc.stderr


def value_and_hits(program: str, **env: str) -> tuple[float, int]:
    """``SIN_COS_PROGRAM`` running ``program`` ("sin" or "cos"): its value and JAX's hit
    count. JAX's own threshold is 0, as the programs compile in milliseconds."""
    full = clean_env(
        ("JAX_",), JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **env
    )
    value, count, _ = run_program(SIN_COS_PROGRAM, program, env=full)
    return value, count


def scratch_programs(factory: pytest.TempPathFactory) -> dict[str, tuple[str, bytes, float]]:
    """Each ``SIN_COS_PROGRAM`` program's cache key, executable entry (payload) and true
    value, from an unsigned scratch cache."""
    out = {}
    for name in ("sin", "cos"):
        scratch = factory.mktemp(name)
        value, _ = value_and_hits(name, XLA_PERSISTENT_CACHE_PATH=str(scratch))
        with Store(scratch, settings=Settings()) as s:
            (entry,) = executables(s)
            blob = s.get(entry["key"])
            assert blob is not None
            out[name] = (str(entry["key"]), bytes(blob), value)
    assert out["sin"][2] != out["cos"][2]
    return out


def hidden_zstandard(tmp: Path) -> Path:
    """A directory whose ``zstandard`` fails to import, to put first on ``PYTHONPATH``: a host
    without zstandard (as the TPU machine is), where JAX compresses with zlib."""
    package = tmp / "no-zstandard" / "zstandard"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("raise ImportError('not on this host')\n")
    return package.parent


def without_zstandard(env: dict[str, str], tmp: Path) -> dict[str, str]:
    """``env`` with ``hidden_zstandard`` first on its ``PYTHONPATH``."""
    paths = [str(hidden_zstandard(tmp)), env.get("PYTHONPATH", "")]
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
