"""Store.claim / Store.wait_for (single flight) across real processes on a local disk.

The cross-host versions, through two sshfs mounts and with JAX, are in
``tests/reliability/test_single_flight.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from xla_pcache import Store

from tests.helpers import hooks_env

# One process: waits for the start file, claims the key, "compiles" if it won, puts, and
# prints how its claim ended. Under the core's test hooks (XLA_PCACHE_TEST_HOOKS) a
# claimant that wins is held inside `claim` until the test lets it go (`claimed.go`), and
# one that waits says so (`claim-wait.<pid>`): the test decides what happens when, never
# the machine's speed.
CLAIMANT = textwrap.dedent(
    """
    import json, os, sys, time
    from xla_pcache import Store
    root, go = sys.argv[1], sys.argv[2]
    store = Store(root, claim_lease=float(sys.argv[3]))
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.002)
    claim = store.claim("program", wait=60)
    if claim.state == "claimed":
        print("claimed", flush=True)
        store.put("program", b"executable")
    blob = store.get("program")
    store.close()
    value = None if blob is None else bytes(blob).decode()
    print(json.dumps({"state": claim.state, "took_over": claim.took_over,
                      "waited": claim.waited, "value": value}))
    """
)


def _claimants(
    root: Path, go: Path, hooks: Path, n: int, lease: float
) -> list[subprocess.Popen[str]]:
    hooks.mkdir(exist_ok=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMANT, str(root), str(go), str(lease)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **hooks_env(hooks)},
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


def _reached(hooks: Path, point: str, procs: list[subprocess.Popen[str]]) -> None:
    """Waits until each of ``procs`` has marked ``point`` (a file the core's test hook
    writes), or one of them has exited."""
    pending = {p.pid: p for p in procs}
    while pending:
        for pid, p in list(pending.items()):
            if (hooks / f"{point}.{pid}").exists():
                del pending[pid]
            else:
                assert p.poll() is None, p.communicate()
        time.sleep(0.005)


def _outcome(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_one_of_four_processes_compiles_the_others_wait(tmp_path: Path) -> None:
    root, go, hooks = tmp_path / "cache", tmp_path / "go", tmp_path / "hooks"
    Store(root).close()
    procs = _claimants(root, go, hooks, 4, lease=30)
    go.touch()
    # One holds the claim (held by the hook), the three others wait on it.
    while not (held := [p for p in procs if (hooks / f"claimed.{p.pid}").exists()]):
        assert all(p.poll() is None for p in procs)
        time.sleep(0.005)
    waiters = [p for p in procs if p is not held[0]]
    _reached(hooks, "claim-wait", waiters)
    (hooks / "claimed.go").touch()
    outcomes = [_outcome(p) for p in procs]
    states = sorted(str(o["state"]) for o in outcomes)
    assert states == ["claimed", "published", "published", "published"], outcomes
    assert all(o["value"] == "executable" for o in outcomes)
    with Store(root, read_only=True) as store:
        stats = store.stats()
    assert stats["claims"] == 1 and stats["puts"] == 1 and stats["claim_waits"] == 3, stats
    assert not list((root / "locks" / "claims").glob("*.lease")), "the put released the claim"


def test_a_killed_holder_is_taken_over_by_one_waiter(tmp_path: Path) -> None:
    root, go, hooks = tmp_path / "cache", tmp_path / "go", tmp_path / "hooks"
    Store(root).close()
    go_holder = tmp_path / "go-holder"
    holder = _claimants(root, go_holder, hooks, 1, lease=1.0)[0]
    waiters = _claimants(root, go, hooks, 3, lease=1.0)
    go_holder.touch()
    _reached(hooks, "claimed", [holder])  # held inside claim, its lease heartbeated
    go.touch()
    _reached(hooks, "claim-wait", waiters)  # the waiters are waiting on a live holder
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate(timeout=10)
    assert holder.returncode == -signal.SIGKILL
    # The waiter that takes the claim over goes on at once.
    (hooks / "claimed.go").touch()
    outcomes = [_outcome(p) for p in waiters]
    states = sorted(str(o["state"]) for o in outcomes)
    assert states == ["claimed", "published", "published"], outcomes
    assert [o["took_over"] for o in outcomes if o["state"] == "claimed"] == [True], outcomes
    assert all(o["value"] == "executable" for o in outcomes)


def test_retired_claim_sends_waiters_to_compile_and_read_only_never_claims(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    store = Store(root)
    ro = Store(root, read_only=True)
    assert ro.claim("k", wait=5).state == "unclaimed"
    assert not (root / "locks" / "claims").exists(), "read-only stores write nothing"
    with store.claim("k", wait=0) as claim:
        assert claim.state == "claimed" and claim.held
        # Held by another: a zero wait is one look, answered while the claim is still held.
        assert ro.claim("k", wait=0).state == "timed_out"
        assert claim.held
    assert not claim.held
    # Left without a put: retired; a later waiter is told nobody is compiling it.
    assert ro.wait_for("k", 5).state == "unclaimed"
    assert store.claim("k", wait=0).state == "claimed", "a retired claim is taken at once"
    with pytest.raises(ValueError, match="wait"):
        store.claim("j", wait=-1)
    with pytest.raises(TypeError):
        store.claim(3, wait=1)  # type: ignore[arg-type]
    store.close()
    ro.close()
