"""Compiling ahead with real JAX: an unmodified program of six jitted functions, each run a
fresh process configured by the environment alone (``XLA_PERSISTENT_CACHE_PATH``; loading and
compiling ahead are on by default). The program prints its results, JAX's hit and miss
counts and, asked to (``TEST_PREFETCH_REPORT=1``), ``xla_pcache.jax.prefetch_report()``.

What is checked: a run records each program's module beside its executable; after the
executables are removed (the plan and the records kept) the next run compiles them ahead and
JAX's compiles take them, computing what a cold run computes, in a read-only worker too
(which stores nothing); a record of another program, or of other options, is compiled and
never handed to JAX, and hostile records are counted refusals, after which the run's own
records replace them; under trusted keys only signed records are compiled; a run that ends
while a compile ahead is in flight waits for it and exits cleanly; the plan and the records a
run used outlive its executables under the budget; with two programs behind the script, a run
compiles ahead only what its recognised variant holds, never the other's programs; a job
limited below a quarter of the host's memory compiles ahead within its own limit.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.config import Settings
from xla_pcache.jax import _module_record, _plan

from tests.helpers import (
    cli_out,
    executables,
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
# takes seconds; TEST_EXIT_EARLY=1 runs only the first of the six and ends once loading ahead
# reports a compile ahead in flight (it exits with it still compiling).
PROGRAM = """
import json, os, time
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
early = os.environ.get("TEST_EXIT_EARLY") == "1"
for k in range(1 if early else 6):
    c = k + 1 + (100 if change and k >= 3 else 0)
    f = jax.jit(lambda a, c=c: jnp.tanh(a @ a.T * c).sum(axis=0) + c)
    out.append(np.asarray(f(x)).tolist())
report = {
    "out": out,
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": events.count("/jax/compilation_cache/cache_misses"),
}
if os.environ.get("TEST_PREFETCH_REPORT") == "1":
    import xla_pcache.jax as xj
    if early:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = ((xj.prefetch_report() or {}).get("compile_ahead") or {}).get("states", {})
            if states.get("compiling"):
                break
            time.sleep(0.01)
    report["prefetch"] = xj.prefetch_report()
print(json.dumps(report))
"""
N = 6


def run_held(script: Path, cache: Path, hooks: Path, **env: str) -> tuple[dict[str, Any], str]:
    """``run_script``, with JAX's first compile held until compiling ahead has done all it
    was given (a thread per planned program): what each record became does not depend on
    whether the run's own compiles came first."""
    shutil.rmtree(hooks, ignore_errors=True)
    hooks.mkdir()
    # The other points a test build holds at (a compile claim taken) go on at once.
    (hooks / "claimed.go").touch()
    full = scripts.environment(cache, hooks, XLA_PCACHE_COMPILE_AHEAD_THREADS=str(N), **env)
    with scripts.started(script, full) as proc:
        scripts.wait_for_hook(
            proc, hooks, "compile-ahead-idle.*", "compiling ahead never went idle"
        )
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


def records(cache: Path, settings: Settings | None = None) -> dict[str, _module_record.Record]:
    """The module records the store serves (``settings``: with which keys trusted), by the
    JAX key they are of."""
    with Store(cache, read_only=True, settings=settings or Settings()) as store:
        out = {}
        keys = store.keys()
        for key in keys:
            blob = store.get(key) if is_module_record(key) else None
            if blob is not None:
                out[str(key).removeprefix(_module_record.KEY_PREFIX)] = _module_record.decode(
                    memoryview(blob)
                )
        return out


def remove_executables(cache: Path) -> None:
    """The executables deleted, as the budget or a prune would; the plan and records kept."""
    with Store(cache, settings=Settings()) as store:
        keys = store.keys()
        for key in keys:
            if not is_plan(key) and not is_module_record(key):
                assert store.delete(key)


def planned_keys(cache: Path) -> list[str]:
    (variant,) = _plan.decode(scripts.plan(cache)[1]).variants
    return [e.key for e in variant.entries]


def plant(cache: Path, key: str, data: bytes, signing: tuple[str, bytes] | None = None) -> None:
    """``data`` as the record of ``key``, written as anyone who can write the cache would
    (signed with ``signing``, when given)."""
    with Store(cache, settings=Settings(), signing_key=signing) as store:
        assert store.replace(_module_record.record_key(key), data, meta={"kind": "x"})


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> scripts.Filled:
    """The program's script, a cache its cold run filled (plan and records too), with the
    records of the changed program's 3 to 5 added (from its own cold run), that run's
    report."""
    script, cache, cold = scripts.cold_run(tmp_path_factory, "compile_ahead", PROGRAM)
    other = cache.with_name("other")
    scripts.run(script, other, TEST_CHANGE="1")
    with (
        Store(other, read_only=True, settings=Settings()) as src,
        Store(cache, settings=Settings()) as dst,
    ):
        keys = src.keys()
        for key in keys:
            blob = src.get(key)
            if is_module_record(key) and blob is not None:
                dst.put(key, bytes(blob), meta=blob.meta)
    return script, cache, cold


def test_a_start_whose_executables_are_gone_compiles_them_ahead(
    filled: scripts.Filled, cache: Path
) -> None:
    script, _, cold = filled
    keys = planned_keys(cache)
    assert cold["misses"] == N and len(keys) == N
    # Each program JAX compiled and put has its record: module bytecode, options, devices.
    recorded = records(cache)
    assert set(keys) <= set(recorded) and len(recorded) == N + 3
    assert all(r.module.startswith(_module_record.MLIR_BYTECODE_MAGIC) for r in recorded.values())
    remove_executables(cache)
    assert not jax_keys(cache)

    # A read-only worker compiles ahead into its memory only: nothing written. (As the run
    # goes: a program JAX reaches before a worker took it is JAX's to compile.)
    before = sorted((p.relative_to(cache), p.stat().st_size) for p in cache.rglob("*"))
    ro, _ = scripts.run(script, cache, XLA_PERSISTENT_CACHE_READ_ONLY="1")
    assert ro["out"] == cold["out"] and ro["hits"] == 0
    used = counted(ro)
    assert 1 <= used["compiled_used"] == used["compiled"] <= N, used
    assert used["modules_refused"] == used["errors"] == 0
    assert sorted((p.relative_to(cache), p.stat().st_size) for p in cache.rglob("*")) == before

    # A writer: the same, and JAX's puts store what was compiled ahead, with its compile time.
    ahead, _ = scripts.run(script, cache)
    assert ahead["out"] == cold["out"] and (ahead["hits"], ahead["misses"]) == (0, N)
    used = counted(ahead)
    assert 1 <= used["compiled_used"] == used["compiled"] <= N, used
    assert used["modules_refused"] == used["errors"] == 0
    assert ahead["prefetch"]["compile_ahead"]["states"] == {"taken": used["compiled"]}
    assert ahead["prefetch"]["counters"]["prefetch_plans_written"] == 0
    assert jax_keys(cache) == set(keys)
    with Store(cache, read_only=True, settings=Settings()) as store:
        times = [float(e["meta"]["compile_time_s"]) for e in executables(store)]
    assert len(times) == N and all(t > 0 for t in times)
    assert records(cache) == recorded, "records are inputs: left as they were"

    # What the commands report, across the processes (the read-only one counts nothing).
    text = cli_out("stats", "--path", str(cache), "--format", "prometheus")
    n = used["compiled"]
    for name, value in (("compiled", n), ("compiled_used", n), ("modules_refused", 0)):
        line = f'xla_pcache_prefetch_{name}_total{{cache="{cache}",tier="local"}} {value}.0'
        assert line in text, text
    assert "programs compiled ahead" in cli_out("stats", "--path", str(cache))


def test_a_record_of_another_program_or_options_is_never_handed_to_jax(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    keys = planned_keys(cache)
    recorded = records(cache)
    others = [recorded[k] for k in sorted(set(recorded) - set(keys))]
    assert len(others) == 3  # the changed program's 3 to 5
    remove_executables(cache)
    own = recorded[keys[3]]
    # Under the first two keys, other programs' records (well-formed: they compile); under
    # the fourth, its own module with a field appended to its options (parameters passed as
    # a tuple: an executable XLA's CPU client would abort on if JAX ran it); a record that is
    # not one, one over the bound, and MLIR bytecode that is not a module.
    plant(cache, keys[0], _module_record.encode(others[0]))
    plant(cache, keys[1], _module_record.encode(others[1]))
    plant(cache, keys[2], b"not a module record")
    tupled = _module_record.Record(own.module, own.options + b"\x10\x01", own.devices)
    plant(cache, keys[3], _module_record.encode(tupled))
    plant(cache, keys[4], b"\0" * (_module_record.MAX_RECORD_BYTES + 1))
    garbage = _module_record.Record(_module_record.MLIR_BYTECODE_MAGIC + b"\xff" * 64, b"", (0,))
    plant(cache, keys[5], _module_record.encode(garbage))

    tricked, err = run_held(script, cache, tmp_path / "hooks")
    assert tricked["out"] == cold["out"] and tricked["misses"] == N
    assert counted(tricked) == {
        "compiled": 3,
        "compiled_used": 0,
        "modules_refused": 2,
        "errors": 1,
    }
    assert err.count("module record") == 1 and "is refused" in err, err
    assert err.count("ahead failed") == 1, err

    # JAX's puts wrote the run's own records in place of what was read and not compiled
    # again: the next start without executables compiles every program ahead and uses it.
    assert records(cache) == recorded
    remove_executables(cache)
    healed, _ = run_held(script, cache, tmp_path / "hooks")
    assert healed["out"] == cold["out"]
    assert counted(healed) == {"compiled": N, "compiled_used": N, "modules_refused": 0, "errors": 0}


def test_trusted_keys_compile_only_from_signed_records(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    public, trusted, signing = scripts.ci_key(tmp_path)
    keys = planned_keys(cache)
    recorded = records(cache)
    remove_executables(cache)
    # The plan and the first three records signed by the trusted key; the others as any
    # writer of the directory left them, unsigned.
    with Store(cache, settings=Settings(), signing_key=signing) as store:
        keys_now = store.keys()
        (plan,) = [k for k in keys_now if is_plan(k)]
        data = store.get(plan)
        assert data is not None
        assert store.replace(plan, bytes(data), meta={"kind": _plan.META_KIND})
    for key in keys[:3]:
        plant(cache, key, _module_record.encode(recorded[key]), signing)
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


def test_a_run_that_ends_while_compiling_ahead_waits_for_it_and_exits_cleanly(
    filled: scripts.Filled, tmp_path: Path
) -> None:
    """XLA cannot stop a compile, and a daemon thread returning from one into a finalizing
    interpreter aborts the process: the exit waits for it, starting nothing more."""
    script, _, _ = filled
    cache = tmp_path / "cache"
    scripts.run(script, cache, TEST_SLOW="1")
    remove_executables(cache)
    # One thread: the slow program first (the plan's order), while the run compiles its one
    # program itself and ends.
    ended, err = scripts.run(
        script, cache, TEST_EXIT_EARLY="1", XLA_PCACHE_COMPILE_AHEAD_THREADS="1"
    )
    # The slow one still compiling when the run ended (its one program compiled ahead or by
    # JAX, as the threads loading the plan found it absent first or not).
    assert ended["prefetch"]["compile_ahead"]["states"].get("compiling") == 1, ended["prefetch"]
    assert "Fatal" not in err and "terminate" not in err, err[-4000:]
    assert ended["misses"] == 1


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
    (plan,) = [k for k in entries if is_plan(k)]
    used = [_module_record.record_key(k) for k in keys]
    ran = [e["last_use"] or 0.0 for k, e in entries.items() if not is_beside(k)]
    assert len(ran) == N
    assert entries[plan]["hits"] == 1 and (entries[plan]["last_use"] or 0.0) > max(ran)
    assert all((entries[r]["last_use"] or 0.0) > max(ran) for r in used)
    # A budget that holds the plan and those records alone: the executables go, and the
    # records no run used (the other program's), and what it takes to start again stays.
    keep = entries[plan]["disk_bytes"] + sum(entries[r]["disk_bytes"] for r in used)
    with Store(cache, settings=Settings()) as store:
        store.evict(max_size=keep)
        kept = store.keys()  # a list (Store is not a mapping)
        left = {str(k) for k in kept}
    assert left == {plan, *used}


def test_only_what_the_run_is_recognised_to_need_is_compiled_ahead(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """Two programs behind one script (the changed one differs in programs 3 to 5), their
    executables gone: a run of the first compiles ahead what both variants hold, then, once
    its reads told it apart, its own; never the other program's."""
    script, _, cold = filled
    changed, _ = scripts.run(script, cache, TEST_CHANGE="1")
    assert changed["hits"] == 3 and changed["misses"] == 3
    with Store(cache, read_only=True, settings=Settings()) as store:
        keys = store.keys()
        (plan,) = [k for k in keys if is_plan(k)]
        blob = store.get(plan)
        assert blob is not None
        variants = _plan.decode(memoryview(blob)).variants
    assert len(variants) == 2
    mine = planned_keys(filled[1])  # the first program's, its cold run's variant
    (other,) = [[e.key for e in v.entries] for v in variants if v.entries[3].key not in mine]
    assert mine[:3] == other[:3] and not set(mine[3:]) & set(other[3:])
    remove_executables(cache)

    ahead, _ = run_held(script, cache, tmp_path / "hooks")
    assert ahead["out"] == cold["out"]
    used = counted(ahead)
    # The three shared, then (after the read of program 3, which told the variants apart and
    # went JAX's way) what only this program's variant holds; nothing compiled for nothing.
    assert 3 <= used["compiled"] == used["compiled_used"] <= N - 1, used
    assert used["modules_refused"] == used["errors"] == 0
    assert ahead["prefetch"]["planned"] == N
    assert set(jax_keys(cache)) == set(mine)


def test_a_job_limited_below_a_quarter_of_the_host_compiles_ahead_within_its_limit(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """A job limited to 900 MiB on a host of more than four times that (a real nested cgroup
    where this machine lets the test make one, else a root laid out as the kernel does): the
    limit is found on the job's cgroup and a quarter of it is kept free, not a quarter of the
    host's (more than the job has: nothing would ever be compiled ahead), so the programs
    are compiled ahead and taken. Asked to keep 1 GiB free, more than the job has, it
    compiles nothing ahead and the run computes as before."""
    script, _, cold = filled
    remove_executables(cache)
    with limited_job(tmp_path, 900 * MIB) as job:
        assert job.host_total > 4 * job.limit, job

        def run(**env: str) -> dict[str, Any]:
            argv = job.argv(sys.executable, str(script))
            proc = run_python(argv, scripts.environment(cache, **job.env, **env))
            return scripts.last_report(proc.stdout)

        ahead = run()
        assert ahead["out"] == cold["out"] and ahead["hits"] == 0
        assert ahead["prefetch"]["compile_ahead"]["reserve"] == 225 * MIB
        used = counted(ahead)
        assert 1 <= used["compiled_used"] == used["compiled"] <= N, used
        assert used["errors"] == 0, used

        remove_executables(cache)
        kept = run(XLA_PCACHE_COMPILE_AHEAD_MEMORY="1G")
    assert kept["out"] == cold["out"] and kept["hits"] == 0
    assert kept["prefetch"]["compile_ahead"]["reserve"] == 1 << 30
    assert counted(kept)["compiled"] == 0 and not kept["prefetch"]["compile_ahead"]["states"]
