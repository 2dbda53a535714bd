"""Compiling ahead with real JAX: an unmodified program of six jitted functions, each run a
fresh process configured by the environment alone (``XLA_PERSISTENT_CACHE_PATH``; loading and
compiling ahead are on by default). The program prints its results, JAX's hit and miss
counts and, asked to (``TEST_PREFETCH_REPORT=1``), ``xla_pcache.jax.prefetch_report()``.

What is checked: a run records each program as JAX's key sees it (records of one program are
the same bytes from any checkout path); after the executables are removed (the plan and the
records kept) the next run compiles every one of them ahead in its compiler process, the first
one JAX asks for included, and JAX's reads take them, computing what a cold run computes, in a
read-only worker too (which stores nothing), and the writer puts them back; a record whose key
is not the key it is stored under (another program's, another JAX's, a planted one) or that
cannot be decoded costs no compile, is counted and warned about once a kind, and is replaced by
the run's own; under trusted keys only signed records are compiled, and a signing writer's
puts are signed; a run never waits at exit for a compile (a compiler process that never ends
is killed, and reaped), nor does a read-only worker, and a key the run went past and never
read leaves the plan; a compiler process that dies, stops, or writes what is not a reply is
lost, with one warning, and JAX compiles as before; a fork of the program leaves the compiler
alone; the plan and the records a run used outlive its executables under the budget; with two
programs behind the script, a run compiles ahead only what its recognised variant holds.

Runs that compile ahead are held (``run_held``): JAX's reads of what is with the compiler
process wait (a test build's hold point) until nothing planned is being fetched or compiled,
so that what each record became does not depend on how fast the compiler process started.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache._testhook import VAR
from xla_pcache.config import Settings
from xla_pcache.jax.ahead import _plan, _record

from tests.helpers import (
    cli_out,
    executables,
    hooks_env,
    is_beside,
    is_module_record,
    is_plan,
)
from tests.jax import scripts
from tests.jax.helpers import JAX_ONLY, jax_keys, run_python
from tests.memory_roots import MIB, limited_job

pytestmark = JAX_ONLY

# Knows nothing of xla_pcache but the report it prints when asked. TEST_CHANGE=1 changes
# programs 3 to 5 (another constant baked in); TEST_SLOW=1 runs first a program whose compile
# takes seconds; TEST_CALLBACK=1 runs last a program with a host callback; TEST_FORK=1 forks
# a child that exits at once after the first program.
PROGRAM = """
import json, os
import numpy as np
import jax, jax.numpy as jnp
from jax._src import monitoring

events = []
monitoring.register_event_listener(lambda event, **kw: events.append(event))
change = os.environ.get("TEST_CHANGE") == "1"
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
out = []
if os.environ.get("TEST_SLOW") == "1":
    def slow(a):
        for i in range(120):
            a = jnp.sin(a @ a.T + i) * 0.5
        return a
    out.append(np.asarray(jax.jit(slow)(x)).tolist())
for k in range(6):
    c = k + 1 + (100 if change and k >= 3 else 0)
    f = jax.jit(lambda a, c=c: jnp.tanh(a @ a.T * c).sum(axis=0) + c)
    out.append(np.asarray(f(x)).tolist())
    if k == 0 and os.environ.get("TEST_FORK") == "1":
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
if os.environ.get("TEST_CALLBACK") == "1":
    seen = []
    def told(a):
        jax.debug.callback(lambda v: seen.append(float(v)), a.sum())
        return a * 2
    out.append(np.asarray(jax.jit(told)(x)).tolist())
    jax.effects_barrier()
    out.append(seen)
report = {
    "out": out,
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": events.count("/jax/compilation_cache/cache_misses"),
}
if os.environ.get("TEST_PREFETCH_REPORT") == "1":
    import xla_pcache.jax as xj
    report["prefetch"] = xj.prefetch_report()
print(json.dumps(report))
"""
N = 6


def run_held(
    script: Path, cache: Path, hooks: Path, *, until: str = "compile-ahead-idle.*", **env: str
) -> tuple[dict[str, Any], str]:
    """``scripts.run``, with JAX's reads of what is with the compiler process held until
    ``until`` is marked (by default: nothing planned is being fetched or compiled)."""
    shutil.rmtree(hooks, ignore_errors=True)
    hooks.mkdir()
    # The other points a test build holds at (a compile claim taken) go on at once.
    (hooks / "claimed.go").touch()
    full = scripts.environment(cache, hooks, XLA_PCACHE_COMPILE_AHEAD_THREADS=str(N), **env)
    with scripts.started(script, full) as proc:
        scripts.wait_for_hook(proc, hooks, until, f"{until} never came")
        (hooks / "compile-ahead-take.go").touch()
        return scripts.finish(proc)


def counted(report: dict[str, Any]) -> dict[str, int]:
    """What this process counted of compiling ahead."""
    counters: dict[str, int] = report["prefetch"]["counters"]
    return {
        k.removeprefix("prefetch_"): v
        for k, v in counters.items()
        if k.startswith("prefetch_compiled") or k in ("prefetch_modules_refused", "prefetch_errors")
    }


def ahead(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = report["prefetch"]["compile_ahead"]
    return out


def record_bytes(cache: Path, settings: Settings | None = None) -> dict[str, bytes]:
    """The module records the store serves (``settings``: with which keys trusted), by the
    JAX key they are of."""
    with Store(cache, read_only=True, settings=settings or Settings()) as store:
        out = {}
        keys = store.keys()
        for key in keys:
            blob = store.get(key, count=False) if is_module_record(key) else None
            if blob is not None:
                out[str(key).removeprefix(_record.KEY_PREFIX)] = bytes(blob)
        return out


def records(cache: Path, settings: Settings | None = None) -> dict[str, _record.Record]:
    return {k: _record.decode(v) for k, v in record_bytes(cache, settings).items()}


def written(cache: Path) -> dict[str, float]:
    """When each record was written (a record rewritten is written again)."""
    with Store(cache, read_only=True, settings=Settings()) as store:
        return {str(e["key"]): e["created"] for e in store.entries() if is_module_record(e["key"])}


def remove_executables(cache: Path) -> None:
    """The executables deleted, as the budget or a prune would; the plan and records kept."""
    with Store(cache, settings=Settings()) as store:
        keys = store.keys()
        for key in keys:
            if not is_plan(key) and not is_module_record(key):
                assert store.delete(key)


def plan(cache: Path) -> _plan.Plan:
    return _plan.decode(scripts.plan(cache)[1])


def planned_keys(cache: Path) -> list[str]:
    (variant,) = plan(cache).variants
    return [e.key for e in variant.entries]


def plant(cache: Path, key: str, data: bytes, signing: tuple[str, bytes] | None = None) -> None:
    """``data`` as the record of ``key``, written as anyone who can write the cache would
    (signed with ``signing``, when given)."""
    with Store(cache, settings=Settings(), signing_key=signing) as store:
        assert store.replace(_record.record_key(key), data, meta={"kind": "x"})


def plant_first(cache: Path, key: str) -> None:
    """The plan's one variant with ``key`` named first (its compile options and devices the
    first entry's), as anyone who can write the cache would plant it."""
    key_, data = scripts.plan(cache)
    (variant,) = _plan.decode(data).variants
    first = variant.entries[0]
    planted = _plan.Variant(
        variant.written, variant.platform, variant.device_count,
        (_plan.Entry(key, first.options, first.devices), *variant.entries),
    )  # fmt: skip
    with Store(cache, settings=Settings()) as store:
        assert store.replace(key_, _plan.encode(_plan.Plan((planted,))), meta={"kind": "x"})


def gone(pid: int) -> bool:
    """Whether process ``pid`` is gone (not even a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("X",)
    except FileNotFoundError:
        return True


def compiler_pids(report: dict[str, Any]) -> list[int]:
    return [p["pid"] for p in ahead(report)["processes"] if p["pid"] is not None]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> scripts.Filled:
    """The program's script, a cache its cold run filled (plan and records too), with the
    records of the changed program's 3 to 5 and of the slow program added (from their own
    cold runs), that run's report."""
    script, cache, cold = scripts.cold_run(tmp_path_factory, "compile_ahead", PROGRAM)
    for name, env in (("other", {"TEST_CHANGE": "1"}), ("slow", {"TEST_SLOW": "1"})):
        other = cache.with_name(name)
        scripts.run(script, other, **env)
        with (
            Store(other, read_only=True, settings=Settings()) as src,
            Store(cache, settings=Settings()) as dst,
        ):
            keys = src.keys()
            for key in keys:
                blob = src.get(key)
                if is_module_record(key) and blob is not None and key not in dst:
                    dst.put(key, bytes(blob), meta=blob.meta)
    return script, cache, cold


def test_a_start_whose_executables_are_gone_compiles_them_ahead(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    keys = planned_keys(cache)
    assert cold["misses"] == N and len(keys) == N
    # Each program JAX compiled and put has its record, as JAX's key sees the program: the
    # module JAX hashed (no locations: no path of the script in it), options, devices, and
    # the target it was compiled for.
    recorded = records(cache)
    assert set(keys) <= set(recorded) and len(recorded) == N + 3 + 1
    for key in keys:
        record = recorded[key]
        assert record.module.startswith(_record.MLIR_BYTECODE_MAGIC)
        assert str(script).encode() not in record.module and b"workload" not in record.module
        assert (record.target.platform, record.target.device_count, record.devices) == (
            "cpu", 1, (0,),
        )  # fmt: skip
        assert dict(record.parts)["jax_lib version"]
    remove_executables(cache)
    assert not jax_keys(cache)

    # A read-only worker compiles ahead into its memory only: nothing written. Every
    # program, the first one JAX asks for included.
    before = sorted((p.relative_to(cache), p.stat().st_size) for p in cache.rglob("*"))
    ro, _ = run_held(script, cache, tmp_path / "hooks", XLA_PERSISTENT_CACHE_READ_ONLY="1")
    assert ro["out"] == cold["out"]
    assert counted(ro) == {"compiled": N, "compiled_used": N, "modules_refused": 0, "errors": 0}
    assert sorted((p.relative_to(cache), p.stat().st_size) for p in cache.rglob("*")) == before

    # A writer: the same, and what JAX's reads took is put back, with its compile time.
    # JAX's reads were served (its events count hits); the store counts them as misses.
    held, _ = run_held(script, cache, tmp_path / "hooks")
    assert held["out"] == cold["out"] and (held["hits"], held["misses"]) == (N, 0)
    assert counted(held) == {"compiled": N, "compiled_used": N, "modules_refused": 0, "errors": 0}
    assert ahead(held)["states"] == {"taken": N}
    assert held["prefetch"]["counters"]["prefetch_plans_written"] == 0
    assert jax_keys(cache) == set(keys)
    with Store(cache, read_only=True, settings=Settings()) as store:
        metas = [e["meta"] for e in executables(store)]
    assert len(metas) == N and all(float(m["compile_time_s"]) > 0 for m in metas)
    assert all(m[_plan.META_LOAD_DIGEST] for m in metas)
    assert records(cache) == recorded, "records are inputs: left as they were"
    # Its compiler process is gone once it exited (killed, and reaped).
    assert all(gone(pid) for pid in compiler_pids(held))

    # What the commands report, across the processes (the read-only one counts nothing).
    text = cli_out("stats", "--path", str(cache), "--format", "prometheus")
    for name, value in (("compiled", N), ("compiled_used", N), ("modules_refused", 0)):
        line = f'xla_pcache_prefetch_{name}_total{{cache="{cache}",tier="local"}} {value}.0'
        assert line in text, text
    assert "programs compiled ahead" in cli_out("stats", "--path", str(cache))

    # The next run loads what was put, as any warm start.
    warm, _ = scripts.run(script, cache)
    assert warm["out"] == cold["out"] and warm["hits"] == N
    assert warm["prefetch"]["counters"]["prefetch_used"] == N
    assert counted(warm)["compiled"] == 0


def test_one_program_from_two_checkouts_writes_one_record_each_and_hands_over(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """The same script at another path (another checkout, a container's /app): its
    programs' records are the same bytes, so either path's compiles hand over to the other's,
    and neither rewrites a record."""
    script, _, cold = filled
    other = tmp_path / "elsewhere" / "checkout" / "workload.py"
    other.parent.mkdir(parents=True)
    shutil.copy(script, other)
    keys = planned_keys(cache)
    # Cold at the other path, on a cache of its own: the very records, byte for byte.
    fresh = tmp_path / "fresh"
    scripts.run(other, fresh)
    theirs, mine = record_bytes(fresh), record_bytes(cache)
    assert set(theirs) == set(keys) and all(theirs[k] == mine[k] for k in keys)

    # On the shared cache: the other path's first run (its plan, its hits), then with the
    # executables gone, every program compiled ahead from the first path's records.
    at = written(cache)
    first, _ = scripts.run(other, cache)
    assert first["hits"] == N
    remove_executables(cache)
    moved, _ = run_held(other, cache, tmp_path / "hooks")
    assert moved["out"] == cold["out"]
    used = counted(moved)
    assert used["compiled_used"] == used["compiled"] == N, used
    assert used["modules_refused"] == 0
    # And at a third path (the plan is found there too): whether a program's compile ahead
    # or JAX's own ends first, what is put has the record that is there already, and none
    # is written again.
    third = tmp_path / "third" / "workload.py"
    third.parent.mkdir()
    shutil.copy(script, third)
    remove_executables(cache)
    own, _ = scripts.run(third, cache)
    assert own["out"] == cold["out"] and own["hits"] + own["misses"] == N
    assert written(cache) == at, "a record was written again"


def _notebook_client(cache: Path, hooks: Path | None, script: Path) -> tuple[Any, Any]:
    """The program as a notebook's one cell, and a client that runs it in a real kernel
    (``python -m ipykernel_launcher -f <new connection file>``), as Jupyter does."""
    import nbformat
    from nbclient import NotebookClient

    source = script.read_text()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(hooks)}}
    )
    return nb, client


def _run_notebook(script: Path, cache: Path, hooks: Path | None = None) -> dict[str, Any]:
    """The program run as a notebook by a kernel; with ``hooks``, held as ``run_held``."""
    nb, client = _notebook_client(cache, hooks or cache.parent, script)
    env = scripts.environment(cache, hooks, XLA_PCACHE_COMPILE_AHEAD_THREADS=str(N))
    if hooks is None:
        client.execute(env=env, cwd=str(cache.parent))
    else:
        shutil.rmtree(hooks, ignore_errors=True)
        hooks.mkdir()
        (hooks / "claimed.go").touch()
        failed: list[BaseException] = []

        def execute() -> None:
            # A loop of this thread's own, closed at the end (as the main thread's is).
            try:
                asyncio.run(client.async_execute(env=env, cwd=str(cache.parent)))
            except BaseException as exc:
                failed.append(exc)

        runner = threading.Thread(target=execute, daemon=True)
        runner.start()
        deadline = time.monotonic() + 300
        while not list(hooks.glob("compile-ahead-idle.*")) and runner.is_alive():
            assert time.monotonic() < deadline, "compiling ahead never went idle"
            time.sleep(0.02)
        (hooks / "compile-ahead-take.go").touch()
        runner.join(300)
        assert not failed, failed
    (output,) = [o for o in nb.cells[-1].outputs if o.get("name") == "stdout"]
    result: dict[str, Any] = json.loads(output["text"].strip().splitlines()[-1])
    return result


def test_notebooks_of_one_program_hand_over(filled: scripts.Filled, tmp_path: Path) -> None:
    """A notebook's cells live under the kernel's own temporary directory
    (``/tmp/ipykernel_<pid>``), another at every start: the next kernel's compiles still hand
    over, from the records the first wrote."""
    script, _, cold = filled
    cache = tmp_path / "cache"
    first = _run_notebook(script, cache)
    assert first["out"] == cold["out"] and first["misses"] == N
    mine = record_bytes(cache)
    assert mine == {k: v for k, v in record_bytes(filled[1]).items() if k in mine}
    remove_executables(cache)
    at = written(cache)
    second = _run_notebook(script, cache, tmp_path / "hooks")
    assert second["out"] == cold["out"]
    used = counted(second)
    assert used["compiled_used"] == used["compiled"] == N, used
    assert written(cache) == at


def test_a_record_whose_key_is_not_its_key_costs_no_compile_and_is_replaced(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    keys = planned_keys(cache)
    recorded = records(cache)
    others = [recorded[k] for k in sorted(set(recorded) - set(keys))]
    remove_executables(cache)
    own = recorded[keys[2]]
    # Under the first key, another program's record (well-formed: it compiles, under its own
    # key); a record that is not one; its own module with a field appended to its options
    # (parameters passed as a tuple: an executable XLA's CPU client would abort on if JAX
    # ran it); MLIR bytecode that is not a module; the module jax 0.4.36 lowered the last
    # program into, under the one before (its key is not this JAX's key of it: another
    # JAX's, or, on 0.4.36, another program's); one over the bound.
    plant(cache, keys[0], _record.encode(others[0]))
    plant(cache, keys[1], b"not a module record")
    tupled = _record.Record(own.module, own.options + b"\x10\x01", own.devices, own.target)
    plant(cache, keys[2], _record.encode(tupled))
    garbage = _record.Record(_record.MLIR_BYTECODE_MAGIC + b"\xff" * 64, b"", (0,), own.target)
    plant(cache, keys[3], _record.encode(garbage))
    old = _record.decode((Path(__file__).parent / "data" / "record-jax-0.4.36.bin").read_bytes())
    plant(cache, keys[4], _record.encode(old))
    plant(cache, keys[5], b"\0" * (_record.MAX_RECORD_BYTES + 1))

    tricked, err = run_held(script, cache, tmp_path / "hooks")
    assert tricked["out"] == cold["out"] and tricked["misses"] == N
    assert counted(tricked) == {
        "compiled": 0,
        "compiled_used": 0,
        "modules_refused": N,
        "errors": 0,
    }
    refused = ahead(tricked)["refused"]
    assert refused["key mismatch"] >= 2 and refused["undecodable"] >= 2, refused
    assert sum(refused.values()) == N
    # One warning a kind of refusal, each saying why.
    assert err.count("is refused (key mismatch") == 1, err
    assert err.count("is refused (undecodable") == 1, err

    # JAX's puts wrote the run's own records in place of those refused: the next start
    # without executables compiles every program ahead and uses it.
    assert records(cache) == recorded
    remove_executables(cache)
    healed, _ = run_held(script, cache, tmp_path / "hooks")
    assert healed["out"] == cold["out"]
    assert counted(healed) == {"compiled": N, "compiled_used": N, "modules_refused": 0, "errors": 0}


def test_a_planted_heavy_record_under_a_made_up_key_is_never_compiled(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """A heavy module (seconds of XLA's compile) planted under a key no program has, named
    first in the plan: refused at its key, never compiled; the programs compile ahead as
    before, and the run that went past the key drops it from the plan."""
    script, _, cold = filled
    keys = planned_keys(cache)
    (slow,) = [k for k in records(cache) if k.startswith("jit_slow-")]
    fake = f"jit_slow-{secrets.token_hex(32)}"
    plant(cache, fake, record_bytes(cache)[slow])
    plant_first(cache, fake)
    remove_executables(cache)
    run, _ = run_held(script, cache, tmp_path / "hooks")
    assert run["out"] == cold["out"]
    assert counted(run) == {"compiled": N, "compiled_used": N, "modules_refused": 1, "errors": 0}
    assert ahead(run)["refused"] == {"key mismatch": 1}
    assert planned_keys(cache) == keys, "the key the run went past is still planned"


def test_no_exit_waits_for_a_compile_and_a_key_never_read_leaves_the_plan(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """A record under its true key, of a program this workload never runs, named first in
    its plan, and a compiler process whose compiles never end: the run ends anyway (it never
    waits for a compile), its compiler process killed and reaped; a read-only worker too; and
    the writer, which went past the key and never read it, drops it from the plan."""
    script, _, cold = filled
    keys = planned_keys(cache)
    foreign = sorted(set(records(cache)) - set(keys))[0]
    plant_first(cache, foreign)
    remove_executables(cache)
    hooks = tmp_path / "hooks"
    for read_only in ("1", "0"):
        shutil.rmtree(hooks, ignore_errors=True)
        hooks.mkdir()
        (hooks / "claimed.go").touch()
        (hooks / "compile-ahead-take.go").touch()
        (hooks / "compiler-hang.go").touch()
        env = scripts.environment(
            cache,
            hooks,
            XLA_PCACHE_COMPILE_AHEAD_THREADS="1",
            XLA_PERSISTENT_CACHE_READ_ONLY=read_only,
        )
        with scripts.started(script, env) as proc:
            scripts.wait_for_hook(proc, hooks, "compiler-hung.*", "nothing compiled ahead")
            # The compiler process is in a compile that never ends: the run exits with 0,
            # having compiled its own programs, and takes it with it.
            report, _ = scripts.finish(proc)
        assert report["out"] == cold["out"]
        assert ahead(report)["states"] == {"compiling": 1}, ahead(report)
        (pid,) = compiler_pids(report)
        assert gone(pid), f"the compiler process {pid} outlived its program"
    assert planned_keys(cache) == keys


def test_a_compiler_process_that_dies_stops_or_talks_nonsense_is_lost_once(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    remove_executables(cache)
    for how in ("dies", "stops", "garbage"):
        hooks = tmp_path / how
        hooks.mkdir()
        (hooks / "claimed.go").touch()
        if how == "dies":
            (hooks / "compiler-hold.go").touch()
        if how == "stops":
            (hooks / "compiler-hang.go").touch()
        if how == "garbage":
            (hooks / "compiler-garbage.go").touch()
        env = scripts.environment(cache, hooks, XLA_PCACHE_COMPILE_AHEAD_THREADS=str(N))
        with scripts.started(script, env) as proc:
            if how == "dies":
                scripts.wait_for_hook(proc, hooks, "compiler-held.*", "no compiler process")
                (mark,) = hooks.glob("compiler-held.*")
                os.kill(int(mark.suffix[1:]), signal.SIGKILL)
            # Waits for nothing compiling (the process lost): for a process that stops,
            # until it burned no CPU time for ahead._link.STALL_S while compiling.
            scripts.wait_for_hook(proc, hooks, "compile-ahead-idle.*", "never lost")
            (hooks / "compile-ahead-take.go").touch()
            report, err = scripts.finish(proc)
        assert report["out"] == cold["out"], how
        used = counted(report)
        assert used["compiled_used"] == 0 and used["errors"] == 1, (how, used)
        assert err.count("compiler process for cpu is lost") == 1, err
        assert all(gone(pid) for pid in compiler_pids(report))
        remove_executables(cache)


def test_host_callbacks_and_a_fork_leave_compiling_ahead_as_it_was(
    filled: scripts.Filled, tmp_path: Path
) -> None:
    """A program with a host callback is never recorded (its callback is bound in the
    process); a fork of the program keeps nothing of its compiler process."""
    script, _, cold = filled
    cache = tmp_path / "cache"
    first, _ = scripts.run(script, cache, TEST_CALLBACK="1")
    assert first["out"][:N] == cold["out"] and len(first["out"][-1]) == 1
    assert len(records(cache)) == N
    remove_executables(cache)
    again, _ = run_held(script, cache, tmp_path / "hooks", TEST_CALLBACK="1", TEST_FORK="1")
    assert again["out"] == first["out"]
    assert counted(again)["compiled_used"] == N


def test_trusted_keys_compile_only_from_signed_records_and_a_signer_signs_its_puts(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    public, trusted, signing = scripts.ci_key(tmp_path)
    keys = planned_keys(cache)
    recorded = record_bytes(cache)
    remove_executables(cache)
    # The plan and the first three records signed by the trusted key; the others as any
    # writer of the directory left them, unsigned.
    with Store(cache, settings=Settings(), signing_key=signing) as store:
        keys_now = store.keys()
        (plan_key,) = [k for k in keys_now if is_plan(k)]
        data = store.get(plan_key)
        assert data is not None
        assert store.replace(plan_key, bytes(data), meta={"kind": _plan.META_KIND})
    for key in keys[:3]:
        plant(cache, key, recorded[key], signing)
    assert set(records(cache, Settings(trusted_keys=tuple(trusted)))) == set(keys[:3])

    trusting, _ = run_held(
        script,
        cache,
        tmp_path / "hooks",
        XLA_PCACHE_TRUSTED_KEYS=public,
        XLA_PERSISTENT_CACHE_READ_ONLY="1",
    )
    assert trusting["prefetch"]["planned"] == N and trusting["out"] == cold["out"]
    assert counted(trusting) == {
        "compiled": 3,
        "compiled_used": 3,
        "modules_refused": 0,
        "errors": 0,
    }

    # A writer that signs (and trusts its own key): what it compiled ahead and put is
    # signed, as JAX's own puts are.
    signer = tmp_path / "ci-1.key"
    signer_run, _ = run_held(
        script,
        cache,
        tmp_path / "hooks",
        XLA_PCACHE_TRUSTED_KEYS=public,
        XLA_PCACHE_SIGNING_KEY=str(signer),
    )
    assert signer_run["out"] == cold["out"]
    assert counted(signer_run)["compiled_used"] == 3
    with Store(cache, read_only=True, settings=Settings(trusted_keys=tuple(trusted))) as store:
        signers = {str(e["key"]): e["signer"] for e in executables(store)}
    assert len(signers) == N and set(signers.values()) == {"ci-1"}, signers


def test_the_plan_and_records_a_run_used_outlive_its_executables(
    filled: scripts.Filled, cache: Path
) -> None:
    """No lookup reads a plan or a module record while the executables they name are there: a
    run that used them records a use of each after its hits (``Store.touch``), so that the
    budget's eviction takes the executables first and what would compile them again last."""
    script, _, cold = filled
    keys = planned_keys(cache)
    warm, _ = scripts.run(script, cache)
    assert warm["out"] == cold["out"] and warm["hits"] == N
    assert warm["prefetch"]["counters"]["prefetch_plans_written"] == 0
    with Store(cache, read_only=True, settings=Settings()) as store:
        entries = {str(e["key"]): e for e in store.entries()}
    (plan_key,) = [k for k in entries if is_plan(k)]
    used = [_record.record_key(k) for k in keys]
    ran = [e["last_use"] or 0.0 for k, e in entries.items() if not is_beside(k)]
    assert len(ran) == N
    assert entries[plan_key]["hits"] == 1 and (entries[plan_key]["last_use"] or 0.0) > max(ran)
    assert all((entries[r]["last_use"] or 0.0) > max(ran) for r in used)
    # A budget that holds the plan and those records alone: the executables go, and the
    # records no run used (the other programs'), and what it takes to start again stays.
    keep = entries[plan_key]["disk_bytes"] + sum(entries[r]["disk_bytes"] for r in used)
    with Store(cache, settings=Settings()) as store:
        store.evict(max_size=keep)
        kept = store.keys()  # a list (Store is not a mapping)
        left = {str(k) for k in kept}
    assert left == {plan_key, *used}


def test_what_is_compiled_ahead_and_put_stays_within_the_budget(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    remove_executables(cache)
    with Store(cache, read_only=True, settings=Settings()) as store:
        beside = sum(e["disk_bytes"] for e in store.entries())
    # Room for what is beside the executables and about half of them.
    budget = beside + 6 * 1024
    run, _ = run_held(script, cache, tmp_path / "hooks", XLA_PERSISTENT_CACHE_MAX_SIZE=str(budget))
    assert run["out"] == cold["out"] and counted(run)["compiled_used"] == N
    with Store(cache, read_only=True, settings=Settings()) as store:
        total = sum(e["disk_bytes"] for e in store.entries())
    assert total <= budget


def test_only_what_the_run_is_recognised_to_need_is_compiled_ahead(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """Two programs behind one script (the changed one differs in programs 3 to 5), their
    executables gone: a run of the first compiles ahead what both variants hold, then, once
    its reads told it apart, its own; never the other program's."""
    script, _, cold = filled
    changed, _ = scripts.run(script, cache, TEST_CHANGE="1")
    assert changed["hits"] == 3 and changed["misses"] == 3
    variants = plan(cache).variants
    assert len(variants) == 2
    mine = planned_keys(filled[1])  # the first program's, its cold run's variant
    (other,) = [[e.key for e in v.entries] for v in variants if v.entries[3].key not in mine]
    assert mine[:3] == other[:3] and not set(mine[3:]) & set(other[3:])
    remove_executables(cache)

    run, _ = run_held(script, cache, tmp_path / "hooks")
    assert run["out"] == cold["out"]
    used = counted(run)
    # The three shared, then (after the read of program 3, which told the variants apart and
    # went JAX's way) what only this program's variant holds; nothing compiled for nothing.
    assert 3 <= used["compiled"] == used["compiled_used"] <= N - 1, used
    assert used["modules_refused"] == used["errors"] == 0
    assert run["prefetch"]["planned"] == N
    assert set(jax_keys(cache)) == set(mine)


def test_a_job_limited_below_a_quarter_of_the_host_compiles_ahead_within_its_limit(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """A job limited to 900 MiB on a host of more than four times that (a real nested cgroup
    where this machine lets the test make one, else a root laid out as the kernel does, which
    the compiler process reads too): the limit is found on the job's cgroup and a quarter of
    it is kept free, not a quarter of the host's (more than the job has: nothing would ever be
    compiled ahead), so the programs are compiled ahead and taken. Asked to keep 1 GiB free,
    more than the job has, it compiles nothing ahead and the run computes as before."""
    script, _, cold = filled
    remove_executables(cache)
    with limited_job(tmp_path, 900 * MIB) as job:
        assert job.host_total > 4 * job.limit, job
        env = dict(job.env)
        hooks = Path(env[VAR]) if VAR in env else tmp_path / "own-hooks"
        hooks.mkdir(exist_ok=True)
        env.update(hooks_env(hooks))
        (hooks / "claimed.go").touch()
        argv = job.argv(sys.executable, str(script))
        # Held as run_held holds it: the reads wait until nothing is being compiled.
        (hooks / "compile-ahead-take.go").unlink(missing_ok=True)
        full = scripts.environment(cache, None, XLA_PCACHE_COMPILE_AHEAD_THREADS=str(N), **env)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full
        )
        try:
            scripts.wait_for_hook(proc, hooks, "compile-ahead-idle.*", "never idle")
            (hooks / "compile-ahead-take.go").touch()
            ahead_run, _ = scripts.finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert ahead_run["out"] == cold["out"]
        assert ahead(ahead_run)["reserve"] == 225 * MIB
        used = counted(ahead_run)
        assert used["compiled_used"] == used["compiled"] == N, used
        assert ahead_run["hits"] == N and used["errors"] == 0, used

        # More kept free than the job has: nothing starts compiling, every read takes its
        # program back and JAX compiles it.
        remove_executables(cache)
        kept = scripts.last_report(
            run_python(
                argv, scripts.environment(cache, None, **env, XLA_PCACHE_COMPILE_AHEAD_MEMORY="1G")
            ).stdout
        )
    assert kept["out"] == cold["out"] and kept["hits"] == 0
    assert ahead(kept)["reserve"] == 1 << 30
    assert counted(kept)["compiled"] == 0 and not ahead(kept)["states"]
