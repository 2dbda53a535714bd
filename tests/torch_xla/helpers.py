"""Helpers of the torch_xla tests, and of the tier tests that run torch_xla
(``tests.torch_xla.helpers``): the install() worker (``torch_xla_worker.py``) and the program
that knows nothing of xla_pcache (``torch_xla_program.py``), each in a fresh process, and
what torch_xla's own counters must say of a run."""

from __future__ import annotations

import importlib.metadata
import json
import os
import site
import subprocess
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store, build_key
from xla_pcache.torch_xla import CANNOT_LOAD_ISSUE

from tests.helpers import clean_env, finish_worker, run_worker, start_worker

WORKER = Path(__file__).with_name("torch_xla_worker.py")
PROGRAM = Path(__file__).with_name("torch_xla_program.py")

# The program is configured by the import hook of a real install, as users' programs are.
NEEDS_THE_HOOK = [
    pytest.mark.torch_xla,
    pytest.mark.skipif(
        not any(
            os.path.isfile(os.path.join(d, "xla_pcache_autoload.pth"))
            for d in [*site.getsitepackages(), site.getusersitepackages()]
        ),
        reason="xla_pcache is not installed (no xla_pcache_autoload.pth): pip install -e .",
    ),
]


def loads() -> bool:
    """Whether this torch_xla's CPU client loads entries back. Measured (docs/torch_xla.md,
    "Versions"): up to 2.7, not from 2.8."""
    version = importlib.metadata.version("torch_xla")
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2]) < (2, 8)


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = clean_env(("XLA_", "PJRT_"))
    # The worker imports torch_xla before its explicit install(...) with test-specific
    # arguments; zero-code activation would set the cache up first at the import (see
    # docs/torch_xla.md), so it is off here: these tests are about install() itself.
    env.update({"PJRT_DEVICE": "CPU", "TF_CPP_MIN_LOG_LEVEL": "1", "XLA_PCACHE_DISABLE": "1"})
    env.update(extra or {})
    return env


def start_torch_xla(
    spec: dict[str, Any], env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """The install() worker running ``spec``, not waited for (``finish_worker``)."""
    return start_worker(str(WORKER), json.dumps(spec), env=worker_env(env))


def run_torch_xla(spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    return finish_worker(start_torch_xla(spec, env), timeout=300)


def program_env(tmp: Path, host: str, **env: str) -> dict[str, str]:
    """The program's environment: torch_xla on CPU, its host-local directory ``tmp/host`` (an
    empty one is a cold host), and ``env``."""
    return clean_env(
        ("XLA_", "PJRT_", "JAX_"),
        PJRT_DEVICE="CPU",
        TF_CPP_MIN_LOG_LEVEL="1",
        XLA_PCACHE_TORCH_XLA_LOCAL_DIR=str(tmp / host),
        **env,
    )


def run_program(
    tmp: Path, spec: dict[str, Any], env: dict[str, str] | None = None, host: str = "host-a"
) -> dict[str, Any]:
    """The program running ``spec`` in one fresh process on host ``host``; its report."""
    report = run_worker(str(PROGRAM), json.dumps(spec), env=program_env(tmp, host, **(env or {})))
    assert "Traceback" not in report["stderr"], report["stderr"][-4000:]
    return report


def cold(report: dict[str, Any], graphs: int = 1) -> None:
    c = report["counters"]
    assert (c["PersistentCacheMiss"], c["PersistentCacheHit"]) == (graphs, 0), c


def served(report: dict[str, Any], graphs: int = 1) -> None:
    """Every graph found in the cache: loaded where torch_xla can, else the diagnosed
    cannot-load outcome (found, failed to load, counted, told once)."""
    c = report["counters"]
    assert c["PersistentCacheMiss"] == 0, c
    if loads():
        assert c["PersistentCacheHit"] == graphs, c
        assert c["PersistentCacheDeserializeFailure"] == 0, c
    else:
        assert c["PersistentCacheHit"] == 0, c
        assert c["PersistentCacheDeserializeFailure"] == graphs, c
        if "stderr" in report:
            assert report["stderr"].count("cannot load them back") == 1, report["stderr"]
            assert CANNOT_LOAD_ISSUE in report["stderr"]


def entries(path: Path) -> dict[str, dict[str, Any]]:
    """torch_xla entries of the store at ``path``: torch_xla name -> entry."""
    with Store(str(path), read_only=True) as store:
        out = {}
        for e in store.entries():
            key = e["key"]
            if isinstance(key, str) and key.startswith("torch_xla/"):
                out[build_key.split(key)[0].removeprefix("torch_xla/")] = e
        assert store.verify()["problems"] == 0
        return out
