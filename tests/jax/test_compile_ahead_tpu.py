"""Compiling ahead for a TPU, on this host without one: JAX with its TPU runtime (``jax[tpu]``,
libtpu from the package index) under ``JAX_PLATFORMS=cpu``, in fresh processes.

A user's ahead-of-time step compiles a program for a compile-only topology, activated by the
environment alone: its put records the program with its target (platform, device kind, the
topology as told from the devices). A compiler process for that target (``_link.Link``, as a
session starts it: ``JAX_PLATFORMS=cpu``, ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``) makes a
compile-only client of that topology, computes JAX's key of the record there, finds it the key
the record is stored under, and compiles it; under a made-up key it compiles nothing. On a TPU
VM the same keys hold (measured on a v5e: the TPU read what a compile-only client compiled):
what this checks is that the record, the target and the key travel whole.
"""

from __future__ import annotations

import json
import secrets
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import clean_env
from tests.jax.helpers import run_python
from tests.jax.tpu import AOT_PROGRAM, LIBTPU_SHARED, TPU_TOPOLOGY

pytestmark = TPU_TOPOLOGY

# The record the store holds, handed to a compiler process for its target under its own key
# and under a made-up one: what became of each.
CHECK = textwrap.dedent(
    """
    import json, sys, threading
    from xla_pcache import Store
    from xla_pcache.config import Settings
    from xla_pcache.jax.ahead import _record
    from xla_pcache.jax.ahead._link import Link

    with Store(sys.argv[1], read_only=True, settings=Settings()) as store:
        (rkey,) = [k for k in store.keys() if _record.is_record_key(k)]
        data = bytes(store.get(rkey, count=False))
    record = _record.decode(data)
    key = rkey.removeprefix(_record.KEY_PREFIX)

    class Events:
        def __init__(self):
            self.answers, self.finished = {}, threading.Event()
        def started(self, key):
            pass
        def done(self, done):
            self.answers[done.key] = [done.status, done.detail, len(done.executable)]
            if len(self.answers) == 2:
                self.finished.set()
        def lost(self, link, why, keys):
            self.answers["lost"] = why
            self.finished.set()
        def idle(self):
            pass

    events = Events()
    link = Link(record.target, events, threads=2, reserve=0)
    assert link.submit(key, data, 0) and link.submit(sys.argv[2], data, 1)
    assert events.finished.wait(600), "the compiler process never answered"
    link.close()
    print(json.dumps({
        "key": key, "target": record.target.to_json(), "parts": dict(record.parts),
        "answers": events.answers, "ready": link.ready,
    }))
    """
)


def _env(cache: Path, tmp: Path) -> dict[str, str]:
    return clean_env(
        ("JAX_", "LIBTPU_", "TPU_", "XLA_FLAGS"),
        JAX_PLATFORMS="cpu",
        XLA_PERSISTENT_CACHE_PATH=str(cache),
        XDG_CACHE_HOME=str(tmp / "xdg"),
        **LIBTPU_SHARED,
    )


@pytest.mark.parametrize(
    ("topology", "chips", "count"), [("v5e:1x1", "1,1,1", 1), ("v5e:2x2", "2,2,1", 4)]
)
def test_a_tpu_program_compiles_ahead_for_its_topology_under_its_key_only(
    tmp_path: Path, topology: str, chips: str, count: int
) -> None:
    cache = tmp_path / "cache"
    env = _env(cache, tmp_path)
    proc = run_python([sys.executable, "-c", AOT_PROGRAM, topology, chips], env)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    made_up = f"jit_step-{secrets.token_hex(32)}"
    out = run_python([sys.executable, "-c", CHECK, str(cache), made_up], env)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    target = result["target"]
    assert (target["platform"], target["device_kind"], target["device_count"]) == (
        "tpu",
        "TPU v5 lite",
        count,
    )
    assert (target["topology"], target["chips_per_host"]) == (
        topology,
        [int(n) for n in chips.split(",")],
    )
    assert result["ready"]["platform"] == "tpu", result
    assert "TPU v5 lite" in result["ready"]["platform_version"]
    answers = result["answers"]
    assert "lost" not in answers, answers
    status, detail, size = answers[result["key"]]
    assert (status, detail) == ("compiled", "") and size > 0, answers
    # Under a key no program has: JAX's key of the record there is not it; nothing compiled.
    status, detail, size = answers[made_up]
    assert status == "key mismatch" and size == 0, answers
    assert result["key"] in detail
