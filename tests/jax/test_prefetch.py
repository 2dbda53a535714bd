"""Loading ahead with real JAX: an unmodified program of six jitted functions, each run a fresh
process configured by the environment alone (``XLA_PERSISTENT_CACHE_PATH``; loading ahead is
on by default). The program prints its results and JAX's own persistent-cache hit count; asked
to (``TEST_PREFETCH_REPORT=1``) it also prints ``xla_pcache.jax.prefetch_report()``, what
loading ahead did in it, since a read-only process leaves no counters behind.

What is checked: a run records its plan and the next one takes every executable from the
threads that loaded it ahead (counted), computing what a run without loading ahead computes;
the plan says when each program was read and what reading it cost the main thread, and the
time counted saved is that cost less what the read took, bounded by JAX's own read times;
a changed program falls back for what changed and rewrites the plan; read-only workers use
plans and write none; a plan trusted by ``XLA_PCACHE_TRUSTED_KEYS`` that names untrusted
entries loads none of them; hostile plans are refused or load nothing a read takes; a JAX
whose cache read takes other arguments runs as before, with one warning.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.config import Settings
from xla_pcache.jax import _build as jax_build
from xla_pcache.jax.ahead import _plan

from tests.helpers import cli_out
from tests.jax import scripts
from tests.jax.helpers import COUNT_HITS, JAX_ONLY, jax_keys

pytestmark = JAX_ONLY

# Knows nothing of xla_pcache but the report it prints when asked (and waits on, asked to).
# TEST_CHANGE=1 changes programs 3 to 5 (another constant baked in); TEST_FUTURE_JAX=1
# replaces JAX's cache read by one of another signature, as a JAX release that changed it
# would have; TEST_BEFORE_READS=1 brings the backend up and waits, before any cache read,
# until loading ahead has loaded what it planned; TEST_SPIN=1 keeps the main thread busy in
# Python after the first read until loading ahead is done. It reports its main thread's CPU
# time and the whole process's.
PROGRAM = (
    COUNT_HITS
    + """
import resource, time
# JAX's own time of each cache read that hit, in order (its cache_retrieval_time_sec).
reads = []
monitoring.register_event_duration_secs_listener(
    lambda event, duration_secs, **kw: reads.append(duration_secs)
    if event == "/jax/compilation_cache/cache_retrieval_time_sec" else None)
if os.environ.get("TEST_FUTURE_JAX") == "1":
    from jax._src import compilation_cache as cc
    real = cc.get_executable_and_time
    def get_executable_and_time(cache_key, compile_options, backend, *devices, trace=None):
        return real(cache_key, compile_options, backend, *devices)
    cc.get_executable_and_time = get_executable_and_time
change = os.environ.get("TEST_CHANGE") == "1"
if os.environ.get("TEST_SPIN") == "1":
    # A thread waiting for the GIL gets it from a busy one every 50 ms, not 5.
    sys.setswitchinterval(0.05)

def loading_done():
    import xla_pcache.jax as xj
    r = xj.prefetch_report()
    pending = ("queued", "fetching", "fetched", "loading")
    return r is not None and r["planned"] > 0 and not any(s in r["states"] for s in pending)

if os.environ.get("TEST_BEFORE_READS") == "1":
    # The backend up, and no cache read yet: wait for loading ahead to load the plan.
    jax.devices()
    deadline = time.monotonic() + 120
    while not loading_done():
        assert time.monotonic() < deadline, "nothing loaded before the first read"
        time.sleep(0.01)
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
out = []
for k in range(6):
    c = k + 1 + (100 if change and k >= 3 else 0)
    f = jax.jit(lambda a, c=c: jnp.tanh(a @ a.T * c).sum(axis=0) + c)
    out.append(np.asarray(f(x)).tolist())
    if k == 0 and os.environ.get("TEST_SPIN") == "1":
        # After the first read: this thread holds the interpreter, busy, until the rest
        # is loaded; the other threads get the GIL only when it is taken from it.
        deadline = time.monotonic() + 120
        while not loading_done():
            assert time.monotonic() < deadline, "not loaded"
            sum(i * i for i in range(20000))
report = {"out": out, "hits": len(hits), "reads": reads}
if os.environ.get("TEST_PREFETCH_REPORT") == "1":
    import xla_pcache.jax as xj
    report["prefetch"] = xj.prefetch_report(loads=True)
usage = resource.getrusage(resource.RUSAGE_SELF)
report["cpu_s"] = {"main": time.thread_time(), "process": usage.ru_utime + usage.ru_stime}
print(json.dumps(report))
"""
)
N = 6


def states(report: dict[str, Any]) -> dict[str, int]:
    prefetch = report["prefetch"]
    assert prefetch is not None
    result: dict[str, int] = prefetch["states"]
    return result


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> scripts.Filled:
    """The program's script, a cache its first (cold) run filled, that run's report."""
    return scripts.cold_run(tmp_path_factory, "prefetch", PROGRAM)


def test_the_next_run_takes_every_planned_executable_and_a_changed_program_updates_the_plan(
    filled: scripts.Filled, cache: Path
) -> None:
    script, _, cold = filled
    assert cold["hits"] == 0 and cold["prefetch"]["planned"] == 0
    # The cold run recorded what it read: one plan, of the six executables it put, in order.
    executables = jax_keys(cache)
    assert len(executables) == N
    key, data = scripts.plan(cache)
    assert key == cold["prefetch"]["plan_key"]
    (variant,) = _plan.decode(data).variants
    assert {e.key for e in variant.entries} == executables and len(variant.entries) == N
    assert scripts.counters(cache)["prefetch_plans_written"] == 1

    warm, _ = scripts.run(script, cache)
    assert states(warm) == {"taken": N}
    assert warm["prefetch"]["counters"] == {
        "prefetch_planned": N,
        "prefetch_loaded": N,
        "prefetch_used": N,
        "prefetch_wasted": 0,
        "prefetch_errors": 0,
        "prefetch_saved_ms": warm["prefetch"]["counters"]["prefetch_saved_ms"],
        "prefetch_plans_written": 0,
        "prefetch_plans_refused": 0,
        "prefetch_compiled": 0,
        "prefetch_compiled_used": 0,
        "prefetch_modules_refused": 0,
    }
    plain, _ = scripts.run(script, cache, XLA_PCACHE_PREFETCH="0")
    assert plain["prefetch"] is None
    # The same hits as a run without loading ahead, and the same results (as the cold run's).
    assert warm["hits"] == plain["hits"] == N
    assert warm["out"] == plain["out"] == cold["out"]
    stats = scripts.counters(cache)
    assert (stats["hits"], stats["prefetch_used"]) == (2 * N, N)
    assert scripts.plan(cache) == (key, data), "a run that read what its plan named leaves it"

    # Programs 3 to 5 changed: 0 to 2 come from the plan, the new ones compile, the three old
    # ones were loaded for nothing (wasted at exit), and the new run's variant joins the
    # plan. The old one stays: a run cannot tell an edited program from another
    # configuration of the same script, and two configurations that share most programs
    # would replace each other's variant at every run.
    changed, _ = scripts.run(script, cache, TEST_CHANGE="1")
    assert changed["hits"] == 3
    assert changed["out"][:3] == cold["out"][:3] and changed["out"][3:] != cold["out"][3:]
    after = scripts.counters(cache)
    assert after["prefetch_used"] - stats["prefetch_used"] == 3
    assert after["prefetch_wasted"] - stats["prefetch_wasted"] == 3
    assert after["prefetch_plans_written"] == 2
    new, old = _plan.decode(scripts.plan(cache)[1]).variants
    assert {e.key for e in new.entries} == jax_keys(cache) - executables | {
        e.key for e in variant.entries[:3]
    }
    assert old.entries == variant.entries
    # The next run loads what both variants hold (programs 0 to 2); its first changed
    # program's read tells it from the other and goes JAX's way, and the rest of its own
    # variant is loaded from then on. Nothing is wasted, nothing written.
    again, _ = scripts.run(script, cache, TEST_CHANGE="1")
    assert states(again) == {"taken": N - 1, "skipped": 1} and again["hits"] == N
    assert again["prefetch"]["candidates"] == 1 and again["out"] == changed["out"]

    # What the commands report: stats (JSON, Prometheus) and doctor, across the processes.
    final = scripts.counters(cache)
    used, wasted = final["prefetch_used"], final["prefetch_wasted"]
    assert (used, wasted, final["prefetch_plans_written"]) == (2 * N + 2, 3, 2)
    text = cli_out("stats", "--path", str(cache), "--format", "prometheus")
    assert f'xla_pcache_prefetch_used_total{{cache="{cache}",tier="local"}} {used}.0' in text
    assert f'xla_pcache_prefetch_wasted_total{{cache="{cache}",tier="local"}} {wasted}.0' in text
    assert "xla_pcache_prefetch_saved_seconds_total" in text
    table = cli_out("stats", "--path", str(cache))
    assert "loaded ahead and used (each also a hit)" in table
    doctor = json.loads(cli_out("doctor", "--path", str(cache), "--json"))
    assert doctor["prefetch"]["state"] == "on"
    assert doctor["cache"]["prefetch"]["used"] == used
    assert doctor["frameworks"]["jax"]["prefetch"] == "ok"


def test_a_compile_that_outlasts_the_quiet_time_is_still_planned(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    """The plan is written after reads go quiet; a changed program still compiling then
    (held here at its compile claim) is not stored yet: the tries in the quiet spells write
    nothing (no plan of what is already planned), and the plan is written at exit, with the
    new programs, once."""
    script, _, _ = filled
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    before = scripts.counters(cache)["prefetch_plans_written"]
    with scripts.started(script, scripts.environment(cache, hooks, TEST_CHANGE="1")) as proc:
        # The first changed program holds at its claim, before compiling; the session's
        # quiet-time try comes meanwhile.
        scripts.wait_for_hook(proc, hooks, "plan-write.*", "no try to write the plan")
        assert list(hooks.glob("claimed.*")) and proc.poll() is None
        (hooks / "claimed.go").touch()
        report, _ = scripts.finish(proc)
    assert report["hits"] == 3 and states(report)["taken"] == 3
    variant, _ = _plan.decode(scripts.plan(cache)[1]).variants
    assert len(variant.entries) == N
    assert {e.key for e in variant.entries[3:]} == jax_keys(cache) - jax_keys(filled[1])
    assert scripts.counters(cache)["prefetch_plans_written"] - before == 1


def test_loading_starts_with_the_backend_and_counts_the_main_threads_time_it_spared(
    filled: scripts.Filled, cache: Path
) -> None:
    script, _, cold = filled
    # The backend is up and JAX has read nothing: the plan is loaded already, in full, and
    # no read waits.
    early, _ = scripts.run(script, cache, TEST_BEFORE_READS="1")
    prefetch = early["prefetch"]
    assert prefetch["began"] == "before the first read"
    assert prefetch["states"] == {"taken": N} and prefetch["waited"] == 0
    assert early["out"] == cold["out"] and early["hits"] == N
    # No run read these on the main thread (the cold one compiled them): the time counted
    # saved is what each load took here, as the main thread would have spent it (its own
    # threads' CPU time, and the smaller of its share of the other threads' CPU time and of
    # the wall time for what XLA did elsewhere), less what the read took; never the load's
    # wall time on a worker, which waiting for the GIL inflates. In the second run the main
    # thread holds the GIL, busy, while one loading thread loads the rest after the first
    # read (as loading began there before this release): their wall time is many times
    # their CPU time. What is counted can never exceed the CPU time of every thread but the
    # main one.
    spun, _ = scripts.run(script, cache, TEST_SPIN="1", XLA_PCACHE_PREFETCH_THREADS="1")
    for report in (early, spun):
        counters = report["prefetch"]["counters"]
        assert counters["prefetch_used"] == N and report["out"] == cold["out"]
        others_ms = (report["cpu_s"]["process"] - report["cpu_s"]["main"]) * 1000
        saved = counters["prefetch_saved_ms"]
        assert 0 < saved <= others_ms + N, (saved, others_ms, report["prefetch"])
        assert saved <= report["prefetch"]["load_cpu_s"] * 1000 + N
        loads = report["prefetch"]["loads"]
        assert len(loads) == N and all(load["read_s"] is None for load in loads)
        for load in loads:
            assert load["saved_s"] == pytest.approx(
                max(0.0, load["cost_s"] - load["spent_s"]), abs=3e-6
            )
        assert abs(saved - sum(round(load["saved_s"] * 1000) for load in loads)) <= N


def test_at_most_the_loads_setting_deserialize_at_once(filled: scripts.Filled, cache: Path) -> None:
    script, _, cold = filled
    # Three threads, one deserialize at a time (a TPU's default is four): every load is
    # done before the first read, so no read asks for one past the bound, and each
    # deserialize begins after the one before it ended.
    run, _ = scripts.run(
        script,
        cache,
        TEST_BEFORE_READS="1",
        XLA_PCACHE_PREFETCH_THREADS="3",
        XLA_PCACHE_PREFETCH_LOADS="1",
    )
    prefetch = run["prefetch"]
    assert prefetch["states"] == {"taken": N} and run["out"] == cold["out"]
    spans = sorted((load["started_s"], load["loaded_s"]) for load in prefetch["loads"])
    assert len(spans) == N
    for (_, ended), (began, _) in itertools.pairwise(spans):
        assert began >= ended, spans


def test_the_time_saved_is_what_the_reads_cost_the_main_thread(
    filled: scripts.Filled, cache: Path
) -> None:
    script, _, cold = filled
    # The cold run's plan says when each program was read (the main thread's own work from
    # the first read, compiles left out) and each entry's stored size; no read cost, since
    # it read none (each was a miss).
    key, data = scripts.plan(cache)
    (variant,) = _plan.decode(data).variants
    ats = [e.at_us for e in variant.entries]
    assert ats[0] == 0 and all(a is not None for a in ats) and ats == sorted(ats)
    suffix = jax_build.build().suffix
    with Store(cache, read_only=True) as store:
        for e in variant.entries:
            blob = store.get(e.key + suffix, count=False)
            assert blob is not None and e.size == len(blob)
    assert all(e.read_us is None for e in variant.entries)

    # Without its plan a run reads every program on the main thread (JAX's way): each read's
    # cost is measured there, inside JAX's own measure of it, and written with its plan.
    with Store(cache) as store:
        assert store.delete(key)
    measured, _ = scripts.run(script, cache)
    assert measured["hits"] == N and measured["prefetch"]["planned"] == 0
    assert measured["prefetch"]["main_reads"] == N
    (variant,) = _plan.decode(scripts.plan(cache)[1]).variants
    off = measured["reads"]
    assert len(off) == N
    for entry, jax_s in zip(variant.entries, off, strict=True):
        assert entry.read_us is not None and 0 < entry.read_us <= jax_s * 1e6 + 1

    # The next run loads ahead: each read served saved what that read cost the main thread
    # (at most what its load took here) less what the read took. The sum is bounded by
    # JAX's own read times, without timing anything: at most what the reads cost with
    # loading ahead off, and at least that less what they took with it on, since each of
    # ours is inside JAX's measure of the same read.
    warm, _ = scripts.run(script, cache)
    loads, on = warm["prefetch"]["loads"], warm["reads"]
    assert warm["out"] == cold["out"] and len(loads) == len(on) == N
    saved = warm["prefetch"]["counters"]["prefetch_saved_ms"]
    costs = {e.key: e.read_us / 1e6 for e in variant.entries if e.read_us is not None}
    floor = 0.0
    for load, jax_on in zip(loads, on, strict=True):
        wall = load["fetch_wall"] + load["load_wall"]
        cost = min(costs[load["key"]], wall)
        assert load["read_s"] == pytest.approx(costs[load["key"]])
        assert load["spent_s"] <= jax_on
        assert load["saved_s"] == pytest.approx(max(0.0, cost - load["spent_s"]), abs=3e-6)
        floor += cost - jax_on
    assert abs(saved - sum(round(load["saved_s"] * 1000) for load in loads)) <= N
    assert floor * 1000 - N <= saved <= sum(off) * 1000 + N, (saved, off, on, loads)

    # A plan that claims an hour for each read counts no more than each load took.
    boasted = _plan.Variant(
        variant.written,
        variant.platform,
        variant.device_count,
        tuple(dataclasses.replace(e, read_us=_plan.MAX_READ_US) for e in variant.entries),
    )
    with Store(cache, settings=Settings()) as store:
        assert store.replace(
            key, _plan.encode(_plan.Plan((boasted,))), meta={"kind": _plan.META_KIND}
        )
    boast, _ = scripts.run(script, cache)
    walls = sum(load["fetch_wall"] + load["load_wall"] for load in boast["prefetch"]["loads"])
    assert boast["prefetch"]["counters"]["prefetch_saved_ms"] <= walls * 1000 + N


def test_read_only_processes_use_plans_and_write_none(filled: scripts.Filled, cache: Path) -> None:
    script, _, cold = filled
    ro = {"XLA_PERSISTENT_CACHE_READ_ONLY": "1"}
    used, _ = scripts.run(script, cache, **ro)
    assert states(used) == {"taken": N} and used["out"] == cold["out"]
    # Without a plan a read-only worker has every reason to write one, and writes none.
    key, _ = scripts.plan(cache)
    with Store(cache) as store:
        assert store.delete(key)
    before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    unplanned, _ = scripts.run(script, cache, **ro)
    assert unplanned["prefetch"]["planned"] == 0 and unplanned["hits"] == N
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == before
    with Store(cache, read_only=True) as store:
        assert store.get(key) is None


def test_a_trusted_plan_naming_untrusted_entries_loads_none_of_them(
    filled: scripts.Filled, cache: Path, tmp_path: Path
) -> None:
    script, _, cold = filled
    public, trusted, signing = scripts.ci_key(tmp_path)
    key, data = scripts.plan(cache)
    # The plan as a writer of the directory left it, unsigned: a trusting store never serves
    # it. Signed by the trusted key, it is served; the executables it names are unsigned.
    with Store(cache, settings=Settings(), trusted_keys=trusted) as store:
        assert store.get(key) is None
    with Store(cache, settings=Settings(), signing_key=signing) as store:
        assert store.replace(key, data, meta={"kind": _plan.META_KIND})
    trusting, _ = scripts.run(
        script,
        cache,
        XLA_PCACHE_TRUSTED_KEYS=public,
        XLA_PERSISTENT_CACHE_READ_ONLY="1",
    )
    assert trusting["prefetch"]["planned"] == N
    assert states(trusting) == {"missing": N}, "each refused by the store's gate"
    assert trusting["prefetch"]["counters"]["prefetch_loaded"] == 0
    assert trusting["hits"] == 0 and trusting["out"] == cold["out"]


def _hostile_entries(own: list[_plan.Entry], other: list[_plan.Entry]) -> list[_plan.Entry]:
    """Other programs' entries as their own plan names them; keys of nothing; the
    workload's own keys with other compile options (a field appended: parameters passed as
    a tuple, which XLA's CPU client aborts on if it ever loads an executable with them)."""
    nothing = [_plan.Entry(f"jit_other_{i}-" + f"{i:064x}", own[0].options, (0,)) for i in (1, 2)]
    altered = [_plan.Entry(e.key, e.options + b"\x10\x01", e.devices) for e in own]
    return other + nothing + altered


def test_hostile_plans_are_refused_or_load_nothing_a_read_takes(
    filled: scripts.Filled, cache: Path
) -> None:
    script, _, cold = filled
    key, data = scripts.plan(cache)
    (own,) = _plan.decode(data).variants

    def plant(body: bytes) -> None:
        with Store(cache, settings=Settings()) as store:
            assert store.replace(key, body, meta={"kind": _plan.META_KIND})

    # Thousands of keys: refused whole, with one warning, before anything is read.
    many = {
        "format": _plan.FORMAT,
        "version": _plan.VERSION,
        "variants": [
            {
                "written": 1.0,
                "platform": "cpu",
                "device_count": 1,
                "options": [],
                "devices": [[0]],
                "entries": [
                    [f"jit_f{i}-" + f"{i:064x}", 0, 0, None, None, None] for i in range(5000)
                ],
            }
        ],
    }
    plant(json.dumps(many).encode())
    refused, err = scripts.run(script, cache)
    assert err.count("prefetch plan") == 1 and "is refused" in err, err
    assert refused["prefetch"]["planned"] == 0 and refused["out"] == cold["out"]
    assert refused["prefetch"]["counters"]["prefetch_plans_refused"] == 1
    # The run wrote its own plan in its place.
    (rewritten,) = _plan.decode(scripts.plan(cache)[1]).variants
    assert [e.key for e in rewritten.entries] == [e.key for e in own.entries]

    # Well-formed, naming other programs' entries and the workload's keys under other
    # options: an entry is loaded only with the options and devices it was compiled for
    # (its load digest), and nothing loaded is handed to a read it was not read for.
    scripts.run(script, cache, TEST_CHANGE="1")
    changed = _plan.decode(scripts.plan(cache)[1]).variants[0]
    other = [e for e in changed.entries if e.key not in {o.key for o in own.entries}]
    assert len(other) == 3
    entries = tuple(_hostile_entries(list(own.entries), other))
    hostile = _plan.Variant(2.0, own.platform, own.device_count, entries)
    plant(_plan.encode(_plan.Plan((hostile,))))
    before = scripts.counters(cache)
    tricked, err = scripts.run(script, cache)
    assert tricked["out"] == cold["out"] and tricked["hits"] == N
    assert states(tricked) == {"loaded": 3, "failed": N, "missing": 2}
    assert err.count("compiled for") == 1, err  # one warning for the kind, not one each
    after = scripts.counters(cache)
    delta = {k: after[k] - before[k] for k in after if k.startswith("prefetch_") or k == "hits"}
    assert delta["hits"] == N and delta["prefetch_used"] == 0
    assert (delta["prefetch_loaded"], delta["prefetch_wasted"]) == (3, 3)
    assert delta["prefetch_errors"] == N

    # A variant of other programs dated a year ahead, alone in the plan: the one candidate,
    # so a run loads it, once, for nothing. That run's reads are not in it: it writes its
    # own beside it, and the planted one is never newer than that again (else it would be
    # the last dropped and the one whose order runs follow).
    ahead = _plan.Variant(time.time() + 365 * 86400, own.platform, own.device_count, tuple(other))
    plant(_plan.encode(_plan.Plan((ahead,))))
    once, _ = scripts.run(script, cache)
    assert once["out"] == cold["out"] and once["hits"] == N
    assert once["prefetch"]["planned"] == len(other)
    variants = _plan.decode(scripts.plan(cache)[1]).variants
    latest = max(variants, key=lambda v: v.written)
    assert variants[0] is latest and len(variants) == 2
    assert [e.key for e in latest.entries] == [e.key for e in own.entries]
    # From then on the run is told from the planted variant by its first read: nothing of
    # the planted one is loaded again.
    again, _ = scripts.run(script, cache)
    assert again["out"] == cold["out"] and "loaded" not in states(again)
    assert states(again) == {"taken": N - 1, "skipped": 1}


def test_a_jax_whose_cache_read_changed_runs_as_before(filled: scripts.Filled, cache: Path) -> None:
    script, _, cold = filled
    plan = scripts.plan(cache)
    future, err = scripts.run(script, cache, TEST_FUTURE_JAX="1")
    assert future["prefetch"] is None
    assert future["hits"] == N and future["out"] == cold["out"]
    (line,) = [line for line in err.splitlines() if "loading ahead is off" in line]
    assert "get_executable_and_time" in line
    assert scripts.plan(cache) == plan
