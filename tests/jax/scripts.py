"""Programs that know nothing of xla_pcache, run as scripts on a cache in fresh processes
(``tests.jax.scripts``): what the tests of loading and of compiling ahead share."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.config import Settings, read_signing_key

from tests.helpers import hooks_env, is_plan, keygen
from tests.jax.helpers import run_python, worker_env

# What a test of loading or compiling ahead keeps of its cold run: the program's script, the
# cache the run filled, the run's report.
Filled = tuple[Path, Path, dict[str, Any]]


def environment(cache: Path, hooks: Path | None = None, **env: str) -> dict[str, str]:
    """A program's environment: ``cache`` the cache, the prefetch report asked for, the test
    build's hold points in ``hooks`` (when given), and ``env``."""
    return worker_env(
        {
            "XLA_PERSISTENT_CACHE_PATH": str(cache),
            "TEST_PREFETCH_REPORT": "1",
            **(hooks_env(hooks) if hooks is not None else {}),
            **env,
        }
    )


def last_report(out: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def run(script: Path, cache: Path, **env: str) -> tuple[dict[str, Any], str]:
    """The program in a fresh process: the report it prints last and its stderr."""
    proc = run_python([sys.executable, str(script)], environment(cache, **env))
    return last_report(proc.stdout), proc.stderr


@contextlib.contextmanager
def started(script: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """The program started, not waited for (``wait_for_hook``, ``finish``); killed on
    the way out if it is still running."""
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def wait_for_hook(proc: subprocess.Popen[str], hooks: Path, pattern: str, what: str) -> None:
    """Until a hold point matching ``pattern`` is reached in ``hooks`` or ``proc`` ended;
    fails saying ``what`` never came after two minutes."""
    deadline = time.monotonic() + 120
    while not list(hooks.glob(pattern)) and proc.poll() is None:
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def finish(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    """The program's report and stderr once it exited, which must be with 0."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-4000:]
    return last_report(out), err


def cold_run(factory: pytest.TempPathFactory, name: str, program: str) -> Filled:
    """``program`` written as a script in a fresh directory and run once on an empty cache
    there."""
    d = factory.mktemp(name)
    script = d / "workload.py"
    script.write_text(program)
    cache = d / "cache"
    cold, _ = run(script, cache)
    return script, cache, cold


def copy(filled: Filled, tmp_path: Path) -> Path:
    """A copy of the filled cache, for one test to change."""
    dst = tmp_path / "cache"
    shutil.copytree(filled[1], dst, symlinks=True)
    return dst


def counters(cache: Path) -> dict[str, int]:
    """The cache's counters over every process that wrote any."""
    with Store(cache, read_only=True) as store:
        return {k: v for k, v in store.stats().items() if isinstance(v, int)}


def plan(cache: Path) -> tuple[str, bytes]:
    """The one plan in the store: its key and bytes."""
    with Store(cache, read_only=True, settings=Settings()) as store:
        keys = store.keys()
        (key,) = [k for k in keys if is_plan(k)]
        blob = store.get(key)
        assert blob is not None
        return str(key), bytes(blob)


def ci_key(tmp_path: Path) -> tuple[str, list[tuple[str, bytes]], tuple[str, bytes]]:
    """A key ``xla-pcache keygen`` made, ``ci-1``: the public key as
    ``XLA_PCACHE_TRUSTED_KEYS`` holds it, the trusted keys a Store takes, and the signing key
    a Store signs with."""
    private, public = keygen(tmp_path, "ci-1")
    name, raw = public.split(":", 1)
    signer = read_signing_key(private)
    return public, [(name, base64.b64decode(raw))], (signer.name, signer.private)
