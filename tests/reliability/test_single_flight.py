"""Single flight across two "hosts" (the sshfs bed): one compile per program for a fleet.

Six JAX processes, three on each mount, start the same program at the same instant on an
empty cache; and a holder is SIGKILLed while compiling. The core's test hooks hold the
claimant inside its claim until the others have said they wait on it, so the waiting is
certain with a small program on any machine. Scenarios in ``single_flight.py``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import single_flight
from testbed import TwoHosts

pytestmark = [pytest.mark.netfs, pytest.mark.timeout(900)]
# Loops in the program: a fraction of a second to compile (the hooks, not the compile time,
# make the others wait).
SIZE = 20


@pytest.fixture(autouse=True)
def _needs_jax() -> None:
    # As for the beds: a skip on a developer's machine, a failure in CI (which installs jax).
    if importlib.util.find_spec("jax") is None:
        if os.environ.get("CI"):
            pytest.fail("jax is not installed (CI installs the jax extra)", pytrace=False)
        pytest.skip("jax is not installed")


def _failures(run: dict[str, Any]) -> list[str]:
    return [f"{n}: {r.get('exceptions')}" for n, r in run["results"].items() if "value" not in r]


def test_six_processes_two_hosts_one_compile(two_hosts: TwoHosts, tmp_path: Path) -> None:
    run = single_flight.fleet(two_hosts, tmp_path, size=SIZE, hooks=tmp_path / "hooks")
    assert not _failures(run), _failures(run)
    assert len(run["values"]) == 1, f"all six must compute the same value: {run['values']}"
    assert run["compiles"] == 1, run
    assert run["hits"] == 5, f"the five others must hit JAX's persistent cache: {run}"
    stats = run["stats"]
    # One executable put and one module record (first writer wins); the workload's
    # loading-ahead plan, a put of its own, is written by whichever processes found it
    # missing or different as they ended.
    assert stats["claims"] == 1 and stats["module_records"] == 1, stats
    assert stats["puts"] - stats["prefetch_plans_written"] - stats["module_records"] == 1, stats
    assert 1 <= stats["prefetch_plans_written"] <= 6, stats
    assert stats["claim_waits"] == 5, stats
    assert stats["claim_takeovers"] == 0 and stats["claim_wait_timeouts"] == 0, stats
    assert stats["claims_abandoned"] == 0, stats


def test_killed_holder_is_taken_over(two_hosts: TwoHosts, tmp_path: Path) -> None:
    run = single_flight.killed_holder(two_hosts, tmp_path, size=SIZE, hooks=tmp_path / "hooks")
    assert run["holder_alive_at_kill"], "the holder finished before it could be killed"
    assert run["holder_status"] == -9
    assert not _failures(run), _failures(run)
    assert len(run["values"]) == 1, run["values"]
    assert run["compiles"] == 1, f"exactly one waiter must compile after the takeover: {run}"
    assert run["hits"] == 4, run
    stats = run["stats"]
    assert stats["claim_takeovers"] == 1, stats
    # The taker's claim, and the holder's if its counters reached its journal before the kill.
    assert stats["claims"] in (1, 2), stats
    assert stats["claim_wait_timeouts"] == 0, stats
