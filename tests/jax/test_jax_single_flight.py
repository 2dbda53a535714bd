"""Single flight in the JAX adapter, against the real jax on CPU (fresh subprocesses).

The cross-host behaviour (six processes, one compile; a killed holder) is tested on the
sshfs bed in ``tests/reliability/test_single_flight.py``; these check the rules on one
machine: the put releases the claim, a program JAX will not put is released as soon as its
compile returns (so nobody waits for it), read-only processes and ``compile_wait=0`` claim
nothing, and ``uninstall()`` unwraps JAX.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store

from tests.jax.helpers import finish_jax, hits, open_barrier, results, run_jax, runs, start_jax

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed"),
]


def _stats(root: Path) -> dict[str, Any]:
    with Store(root, read_only=True) as store:
        return store.stats()


def test_the_put_releases_the_claim(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    report = run_jax(
        [
            {"op": "install", "path": str(root)},
            {"op": "claims", "path": str(root)},
            *runs(1),
            {"op": "claims", "path": str(root)},
        ]
    )
    before, after = report["claims"]
    assert before["wrapped"] and after["wrapped"]
    assert after["files"] == {}, "the published program's claim must be gone"
    stats = _stats(root)
    # The program's put, its module record's and its process's prefetch plan (entries too,
    # never claimed).
    assert stats["claims"] == 1 and stats["puts"] == 2 + stats["prefetch_plans_written"], stats
    assert stats["claims_abandoned"] == 0 and stats["claim_waits"] == 0, stats


def test_a_program_jax_does_not_put_is_released_when_its_compile_returns(
    tmp_path: Path,
) -> None:
    """Below ``jax_persistent_cache_min_compile_time_secs`` JAX never puts: the claim is
    retired as soon as the compile returns, so two processes released together both
    compile (no hit), and neither waits out its compile wait."""
    root = tmp_path / "cache"
    go = tmp_path / "go"
    config = {"op": "config", "name": "jax_persistent_cache_min_compile_time_secs", "value": 1e6}

    def steps(ready: Path) -> list[dict[str, Any]]:
        return [
            {"op": "install", "path": str(root), "compile_wait": 600},
            config,
            {"op": "wait", "ready": str(ready), "file": str(go)},
            *runs(3, layers=8),
            {"op": "claims", "path": str(root)},
        ]

    ready = [tmp_path / "ready-0", tmp_path / "ready-1"]
    procs = [start_jax(steps(r)) for r in ready]
    open_barrier(procs, ready, go)
    # A waiter stuck until its 600 s compile wait ran out would fail this timeout.
    reports = [finish_jax(p, timeout=240) for p in procs]
    for report in reports:
        assert hits(report) == [0]
        (claims,) = report["claims"]
        # What is left on disk right after the compile returned: retired claims at most.
        assert all(c.split()[-1] == "retired" for c in claims["files"].values()), claims
    assert results(reports[0]) == results(reports[1])
    stats = _stats(root)
    assert stats["puts"] == 0 and stats["entries"] == 0, stats
    assert stats["claims"] >= 1 and stats["claims"] == stats["claims_abandoned"], stats
    assert stats["claim_wait_timeouts"] == 0, stats


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_compile_wait_zero_turns_single_flight_off(tmp_path: Path, how: str) -> None:
    root = tmp_path / "cache"
    install: dict[str, Any] = {"op": "install", "path": str(root)}
    env = None
    if how == "argument":
        install["compile_wait"] = 0
    else:
        env = {"XLA_PCACHE_COMPILE_WAIT": "0"}
    report = run_jax([install, *runs(1), {"op": "claims", "path": str(root)}], env)
    (claims,) = report["claims"]
    # JAX's compile call is wrapped all the same (each compile's context: the key's capture
    # for the put), and claims nothing.
    assert claims["wrapped"] and not claims["dir_exists"], claims
    assert _stats(root)["claims"] == 0


def test_read_only_never_claims_and_uninstall_unwraps(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    Store(root).close()
    report = run_jax(
        [
            {"op": "install", "path": str(root), "read_only": True},
            *runs(1),
            {"op": "claims", "path": str(root)},
            {"op": "uninstall"},
            {"op": "claims", "path": str(root)},
        ]
    )
    during, after = report["claims"]
    assert during["wrapped"] and not during["dir_exists"], during
    assert not after["wrapped"]
