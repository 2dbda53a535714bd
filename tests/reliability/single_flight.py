"""Single-flight scenarios on the two-host bed: a fleet of JAX processes, on both mounts,
starting the same program at the same instant on an empty cache.

``test_single_flight.py`` asserts on what these return and ``bench/single_flight.py``
prints the figures for docs/benchmarks.md; both run exactly this code. Each worker
(``jax_compile_worker.py``) is a separate process that prepares everything, then waits for
a start file, so that the compiles start together.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from scenarios import collect, worker_env
from testbed import TwoHosts
from xla_pcache import Store

from tests.helpers import hooks_env

WORKER = Path(__file__).with_name("jax_compile_worker.py")
# Loops in the worker's program: about 4 s of XLA CPU compile on an idle core.
PROGRAM_SIZE = 360
RUN_TIMEOUT_S = 600.0
CLAIM_COUNTERS = (
    "claims",
    "claim_takeovers",
    "claims_abandoned",
    "claim_waits",
    "claim_wait_ms",
    "claim_wait_timeouts",
    "puts",
    "prefetch_plans_written",
    "put_exists",
    "hits",
)


def _start(
    name: str, cache: Path, workdir: Path, go: Path, size: int, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    cfg = {
        "path": str(cache),
        "size": size,
        "ready": str(workdir / f"{name}.ready"),
        "go": str(go),
        "out": str(workdir / f"{name}.json"),
    }
    config = workdir / f"{name}.config.json"
    config.write_text(json.dumps(cfg))
    log = (workdir / f"{name}.log").open("wb")
    try:
        return subprocess.Popen(
            [sys.executable, str(WORKER), str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=worker_env({"JAX_PLATFORMS": "cpu", **env}),
        )
    finally:
        log.close()


def _wait_ready(procs: dict[str, subprocess.Popen[bytes]], workdir: Path) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    pending = set(procs)
    while pending:
        for name in list(pending):
            if (workdir / f"{name}.ready").exists():
                pending.discard(name)
            elif procs[name].poll() is not None:
                log = (workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"worker {name} exited before the start line:\n{log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {sorted(pending)} never got ready")
        time.sleep(0.02)


def _hook_marks(hooks: Path, point: str, procs: dict[str, subprocess.Popen[bytes]]) -> set[str]:
    """The workers that marked ``point`` (the core's test hook writes ``<point>.<pid>``);
    an exited worker is an error, named with its log."""
    marked = set()
    for name, proc in procs.items():
        if (hooks / f"{point}.{proc.pid}").exists():
            marked.add(name)
        elif proc.poll() is not None:
            raise RuntimeError(f"worker {name} exited before reaching {point}")
    return marked


def _reached_by_all(hooks: Path, point: str, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    while len(_hook_marks(hooks, point, procs)) < len(procs):
        time.sleep(0.01)


def _reached_by_one(hooks: Path, point: str, procs: dict[str, subprocess.Popen[bytes]]) -> str:
    while not (marked := _hook_marks(hooks, point, procs)):
        time.sleep(0.01)
    assert len(marked) == 1, f"{sorted(marked)} all claimed the program"
    return marked.pop()


def _claim_stats(root: Path) -> dict[str, Any]:
    with Store(root, read_only=True) as store:
        stats = store.stats()
        kinds = [e["meta"].get("kind") for e in store.entries()]
    counted: dict[str, Any] = {k: stats.get(k) for k in CLAIM_COUNTERS}
    # What each put was: the executable, the workload's plan, the program's module record.
    counted["module_records"] = kinds.count("module-record")
    return counted


def _summary(results: dict[str, dict[str, Any]], root: Path) -> dict[str, Any]:
    done = [r for r in results.values() if "value" in r]
    # Seconds from the publish to each waiter's end of wait (all processes on one machine,
    # so their monotonic clocks agree; this is for the figures, nothing asserts on it).
    published = [r["go_mono"] + t for r in done for t in r.get("puts", [])]
    notice = sorted(
        round(r["go_mono"] + r["misses"][-1][1] - min(published), 3)
        for r in done
        if r["hits"] and r.get("misses") and published
    )
    return {
        "notice_s": notice,
        "results": results,
        "values": sorted({r["value"] for r in done}),
        "compiles": sum(r["writes"] for r in done),
        "hits": sum(r["hits"] for r in done),
        "slowest_s": max((r["wall"] for r in done), default=None),
        "walls_s": {n: round(r["wall"], 3) for n, r in results.items() if "value" in r},
        "stats": _claim_stats(root),
    }


def _fresh_cache(bed: TwoHosts) -> str:
    name = f"single-flight-{uuid.uuid4().hex[:8]}"
    (bed.export / name).mkdir()
    return name


def fleet(
    bed: TwoHosts,
    workdir: Path,
    *,
    per_host: int = 3,
    size: int = PROGRAM_SIZE,
    compile_wait: float = 300.0,
    claim_lease: float = 30.0,
    hooks: Path | None = None,
) -> dict[str, Any]:
    """``per_host`` processes on each mount start the same program at once on an empty
    cache. ``compile_wait=0`` is the same run without single flight.

    With ``hooks`` (a directory for the core's test hooks, as the tests run it), the one
    that claims the program is held inside its claim until every other has said it waits
    on it: the waiting is then certain, whatever the program's compile time and the
    machine's speed. Without (the bench's figures), the program's compile time alone
    makes the others come while it compiles."""
    workdir.mkdir(parents=True, exist_ok=True)
    cache = _fresh_cache(bed)
    env = {
        "XLA_PCACHE_COMPILE_WAIT": str(compile_wait),
        "XLA_PCACHE_CLAIM_LEASE": str(claim_lease),
    }
    if hooks is not None:
        hooks.mkdir(parents=True, exist_ok=True)
        env.update(hooks_env(hooks))
    go = workdir / "go"
    procs = {
        f"{host}{i}": _start(f"{host}{i}", mount / cache, workdir, go, size, env)
        for host, mount in (("a", bed.host_a), ("b", bed.host_b))
        for i in range(per_host)
    }
    try:
        _wait_ready(procs, workdir)
        go.touch()
        if hooks is not None:
            holder = _reached_by_one(hooks, "claimed", procs)
            _reached_by_all(hooks, "claim-wait", {n: p for n, p in procs.items() if n != holder})
            (hooks / "claimed.go").touch()
        results = collect(procs, workdir, RUN_TIMEOUT_S)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return _summary(results, bed.export / cache)


def alone(bed: TwoHosts, workdir: Path, *, size: int = PROGRAM_SIZE) -> dict[str, float]:
    """One process on an empty cache (a cold compile), then one on the other mount (a hit):
    the yardstick of the fleet's slowest wall time."""
    workdir.mkdir(parents=True, exist_ok=True)
    cache = _fresh_cache(bed)
    walls: dict[str, float] = {}
    for name, mount in (("cold", bed.host_a), ("hit", bed.host_b)):
        go = workdir / f"go-{name}"
        go.touch()
        procs = {name: _start(name, mount / cache, workdir, go, size, {})}
        result = collect(procs, workdir, RUN_TIMEOUT_S)[name]
        if "value" not in result:
            raise RuntimeError(f"the {name} run failed: {result}")
        walls[name] = result["wall"]
        walls[f"{name}_hits"] = result["hits"]
    return walls


def killed_holder(
    bed: TwoHosts,
    workdir: Path,
    *,
    waiters: int = 5,
    size: int = PROGRAM_SIZE,
    claim_lease: float = 3.0,
    kill_after_s: float = 1.5,
    hooks: Path | None = None,
) -> dict[str, Any]:
    """A holder starts compiling alone; once its claim is on disk the waiters start (on
    both mounts), and ``kill_after_s`` later the holder is SIGKILLed. The waiters must take
    the claim over after ``claim_lease`` and one of them compile.

    With ``hooks`` (as the tests run it) the holder is held inside its claim, and killed
    once every waiter has said it waits on it (not after ``kill_after_s``): alive at the
    kill, with the waiters waiting, whatever the machine's speed."""
    workdir.mkdir(parents=True, exist_ok=True)
    cache = _fresh_cache(bed)
    env = {"XLA_PCACHE_COMPILE_WAIT": "300", "XLA_PCACHE_CLAIM_LEASE": str(claim_lease)}
    if hooks is not None:
        hooks.mkdir(parents=True, exist_ok=True)
        env.update(hooks_env(hooks))
    go_holder, go = workdir / "go-holder", workdir / "go"
    holder = _start("holder", bed.host_a / cache, workdir, go_holder, size, env)
    procs = {
        f"w{i}": _start(
            f"w{i}", (bed.host_a if i % 2 else bed.host_b) / cache, workdir, go, size, env
        )
        for i in range(waiters)
    }
    claims = bed.export / cache / "locks" / "claims"
    try:
        _wait_ready({"holder": holder, **procs}, workdir)
        go_holder.touch()
        deadline = time.monotonic() + 120
        while not (claims.is_dir() and any(p.suffix == ".lease" for p in claims.iterdir())):
            if holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the holder never claimed the program")
            time.sleep(0.01)
        go.touch()
        started = time.monotonic()
        if hooks is not None:
            _reached_by_all(hooks, "claimed", {"holder": holder})
            _reached_by_all(hooks, "claim-wait", procs)
        else:
            time.sleep(kill_after_s)
        holder_alive = holder.poll() is None
        os.kill(holder.pid, signal.SIGKILL)
        killed_at = time.monotonic() - started
        holder.wait(30)
        if hooks is not None:
            # The waiter that takes the claim over compiles at once.
            (hooks / "claimed.go").touch()
        results = collect(procs, workdir, RUN_TIMEOUT_S)
    finally:
        for proc in [holder, *procs.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    summary = _summary(results, bed.export / cache)
    summary.update(
        holder_alive_at_kill=holder_alive,
        holder_status=holder.returncode,
        killed_at_s=round(killed_at, 3),
        claim_lease_s=claim_lease,
    )
    return summary
