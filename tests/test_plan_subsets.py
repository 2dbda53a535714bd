"""Plans for programs whose reads are a subset of another's, and what a key-less writer of
the cache can make a victim waste with a plan. No JAX: runs are simulated with the modules
that decide (``_recognition`` says what is loaded ahead, ``_plan_writer`` what is written, a
real ``Store`` in a temporary directory holds the executables and the plan), each run as
``_prefetch`` drives them: what every candidate holds is loaded from the start, a read that
tells the candidates apart goes JAX's way and what its variant adds is loaded from then on,
and what was loaded and never read is wasted. The real-JAX ends of the same rules are in
tests/jax/test_prefetch_subsets.py.

The promises checked: a run that asked for much less than its candidates held keeps a
variant of its own at its whole end, so that a program wastes at most once per program and
plan, whatever was planted; programs that alternate settle (no write at every start); a run
stopped early, one of a read-only process and one cut short by a quiet spell write nothing
of the kind."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from xla_pcache import Store, builds
from xla_pcache._text import FirstWarning
from xla_pcache.jax.ahead import _plan
from xla_pcache.jax.ahead._plan_writer import PlanWriter
from xla_pcache.jax.ahead._recognition import Recognition

BUILD = builds.Build("jax", "0123456789abcdef" * 2)
PLAN_KEY = _plan.plan_key("subsets")


def _key(i: int) -> str:
    return f"jit_step_{i}-" + f"{i:064x}"


def _entries(keys: Iterable[int]) -> list[_plan.Entry]:
    return [_plan.Entry(_key(i), b"o", (0,)) for i in keys]


@dataclasses.dataclass
class Run:
    """What one simulated run did: executables loaded ahead, taken by a read, wasted;
    reads that went JAX's way; whether it wrote the plan."""

    loaded: int
    taken: int
    wasted: int
    own_way: int
    wrote: bool


class Cache:
    """A store holding every executable the programs read (the first thousand keys; the
    planted others are keys of nothing), and runs on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with Store(root) as store:
            for e in _entries(range(1000)):
                assert store.put(e.key + BUILD.suffix, b"executable")

    def plan(self) -> _plan.Plan | None:
        with Store(self.root, read_only=True) as store:
            blob = store.get(PLAN_KEY, count=False)
        return None if blob is None else _plan.decode(memoryview(blob))

    def plant(self, plan: _plan.Plan) -> None:
        """As a writer without a key would: through the store, at the plan's key."""
        with Store(self.root) as store:
            assert store.replace(PLAN_KEY, _plan.encode(plan))

    def run(self, reads: Iterable[int], *, whole: bool = True, read_only: bool = False) -> Run:
        """A process reading the keys ``reads`` in order; ``whole``: it ends as a program
        that ran to its end (not by an exception or Ctrl-C)."""
        plan = self.plan()
        recog = Recognition(plan.variants if plan is not None else ())
        recog.restrict("cpu", 1)
        with Store(self.root, read_only=read_only) as store:
            before = store.stats()["prefetch_plans_written"]
            writer = PlanWriter(
                store,
                enabled=not store.read_only,
                warn=FirstWarning(logging.getLogger("test"), "{key} {what}"),
                count=lambda counts: store.add_prefetch_counters(counts),
            )
            writer.bind(PLAN_KEY, "subsets", BUILD.digest, plan, "cpu", 1)
            planned = {e.key for e in recog.wanted()}
            taken = own_way = 0
            read: set[str] = set()
            for entry in _entries(reads):
                read.add(entry.key)
                writer.read(entry)
                new: set[str] = set()
                if recog.observe(entry.key):
                    # What the narrower candidates add is queued; the read that told them
                    # apart goes JAX's way (loading it now would be no sooner).
                    new = {e.key for e in recog.wanted()} - planned
                    planned |= new - {entry.key}
                if entry.key in planned and entry.key not in new:
                    taken += 1
                else:
                    own_way += 1
            writer.close(whole=whole)
            wrote = store.stats()["prefetch_plans_written"] > before
        return Run(len(planned), taken, len(planned - read), own_way, wrote)


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache")


B = list(range(25))
A = [0, 3, 4, 9, 12, 17, 20]  # 7 of B's 25, as `pytest -k` after the whole suite


def test_a_subset_program_wastes_once_and_then_loads_only_its_own(cache: Cache) -> None:
    assert cache.run(B).wrote
    first = cache.run(A)
    # B's variant was the only candidate: 25 loaded, 7 used, 18 wasted, once; A keeps its own.
    assert (first.loaded, first.taken, first.wasted, first.wrote) == (25, 7, 18, True)
    for _ in range(2):
        again = cache.run(A)
        assert (again.loaded, again.taken, again.wasted, again.wrote) == (7, 7, 0, False)
    # B still loads ahead all but the read that tells it from A; nothing written.
    b = cache.run(B)
    assert (b.loaded, b.taken, b.wasted, b.own_way, b.wrote) == (24, 24, 0, 1, False)
    plan = cache.plan()
    assert plan is not None and [len(v.entries) for v in plan.variants] == [7, 25]


def test_programs_that_alternate_settle(cache: Cache) -> None:
    # A subset, its whole, another subset of it, and a prefix (evaluation switched off),
    # each run in turn: every program's first run is the only one that writes, and after it
    # none wastes anything.
    prefix = B[:10]
    programs = [B, A, B[5:20], prefix]
    writes = wastes = 0
    for turn in range(4):
        for reads in programs:
            run = cache.run(reads)
            writes += run.wrote
            wastes += run.wasted > 0
            if turn > 0:
                assert not run.wrote and run.wasted == 0, (turn, reads)
    assert writes == len(programs) and wastes == len(programs) - 1


def test_a_run_stopped_early_keeps_no_variant_of_its_prefix(cache: Cache) -> None:
    # A crash or Ctrl-C after 3 programs (the exit hook sees the exception: not whole),
    # and a run killed or a session closed by reset_cache: no variant of the 3, so the next
    # whole run loads all 25 ahead from its start.
    cache.run(B)
    for _ in range(3):
        stopped = cache.run(B[:3], whole=False)
        assert (stopped.wasted, stopped.wrote) == (22, False)
    whole = cache.run(B)
    assert (whole.loaded, whole.taken, whole.own_way, whole.wrote) == (25, 25, 0, False)
    plan = cache.plan()
    assert plan is not None and len(plan.variants) == 1


def test_a_quiet_spell_writes_no_subset(cache: Cache) -> None:
    # A long training run reads 2 of its 25 programs, then computes for hours before its
    # evaluation's: the write after a quiet spell is for runs that read what no variant
    # holds, never a subset (which only the run's whole end can tell).
    cache.run(B)
    plan = cache.plan()
    with Store(cache.root) as store:
        writer = PlanWriter(
            store,
            enabled=True,
            warn=FirstWarning(logging.getLogger("test"), "{key} {what}"),
            count=lambda counts: store.add_prefetch_counters(counts),
        )
        writer.bind(PLAN_KEY, "subsets", BUILD.digest, plan, "cpu", 1)
        for entry in _entries(B[:2]):
            writer.read(entry)
        assert writer.due() is None and not writer.dirty
        writer.write()
        assert store.stats()["prefetch_plans_written"] == 1


def test_a_small_difference_keeps_no_variant(cache: Cache) -> None:
    # Under a quarter of what was held never asked for, or a single executable: the waste
    # is less than what a variant more costs its whole program (the read that tells them
    # apart), and nothing is written.
    cache.run(B)
    assert not cache.run(B[:19]).wrote  # 6 of 25 unasked: under a quarter
    small = _plan.Plan((_plan.Variant(1.0, "cpu", 1, tuple(_entries(range(3)))),))
    cache.plant(small)
    assert not cache.run([0, 1]).wrote  # one of three
    cache.run(B)
    assert cache.run(B[:18]).wrote  # 7 of 25 unasked


def test_read_only_processes_waste_until_a_writer_runs_the_program(cache: Cache) -> None:
    cache.run(B)
    for _ in range(2):
        ro = cache.run(A, read_only=True)
        assert (ro.wasted, ro.wrote) == (18, False)
    assert cache.run(A).wrote
    ro = cache.run(A, read_only=True)
    assert (ro.wasted, ro.wrote) == (0, False)


def test_subsets_within_the_bound_of_variants_settle(cache: Cache) -> None:
    # Eight programs and a subset of each: sixteen variants, all kept, nothing rewritten.
    programs = [list(range(100 * p, 100 * p + 8)) for p in range(8)]
    programs += [p[:2] for p in programs]
    for reads in programs:
        cache.run(reads)
    plan = cache.plan()
    assert plan is not None and len(plan.variants) == _plan.MAX_VARIANTS
    for reads in programs:
        run = cache.run(reads)
        assert not run.wrote and run.wasted == 0, reads


# ----------------------------------------------------------------------------- planted plans

JUNK = range(5000, 7000)  # 2,000 real-looking keys of nothing the victim reads
VICTIM = list(range(7))


def _planted(*variants: Iterable[int], written: float | None = None) -> _plan.Plan:
    when = time.time() + 86400 * 365 if written is None else written
    return _plan.Plan(
        tuple(
            _plan.Variant(when + i, "cpu", 1, tuple(_entries(keys)))
            for i, keys in enumerate(variants)
        )
    )


def test_a_planted_variant_holding_the_victims_keys_costs_one_run(cache: Cache) -> None:
    # The victim's 7 among 2,000 others, dated a year ahead: 2,007 loaded, once. The
    # victim's run keeps a variant of its own and outvotes the planted one from then on.
    cache.plant(_planted([*VICTIM, *JUNK]))
    first = cache.run(VICTIM)
    assert (first.loaded, first.wasted, first.wrote) == (2007, 2000, True)
    for _ in range(2):
        run = cache.run(VICTIM)
        assert (run.loaded, run.taken, run.wasted, run.wrote) == (7, 7, 0, False)
    plan = cache.plan()
    assert plan is not None
    assert [len(v.entries) for v in plan.variants] == [7, 2007]
    assert plan.variants[0].written >= plan.variants[1].written


def test_many_planted_variants_cost_one_run_and_each_replanting_one_more(cache: Cache) -> None:
    # Sixteen variants, each the victim's keys and the same 2,000 others: one run wastes
    # them, its own variant then leaves only its keys in what every candidate holds. Planted
    # again (the plan replaced whole), one run more.
    sixteen = [[*VICTIM, *JUNK, 9000 + i] for i in range(_plan.MAX_VARIANTS)]
    for _ in range(2):
        cache.plant(_planted(*sixteen))
        first = cache.run(VICTIM)
        assert (first.wasted, first.wrote) == (2000, True)
        run = cache.run(VICTIM)
        assert (run.loaded, run.wasted, run.wrote) == (7, 0, False)
    # Variants that each lack one of the victim's keys: what they all hold is bounded by
    # the victim's run from its first write on.
    lacking = [[*(k for k in VICTIM if k != i), *JUNK] for i in range(3)]
    cache.plant(_planted(*lacking))
    assert cache.run(VICTIM).wrote
    run = cache.run(VICTIM)
    assert (run.wasted, run.wrote) == (0, False)


def test_planted_subsets_cost_reads_never_waste_nor_writes(cache: Cache) -> None:
    # A chain of planted prefixes of the victim's program (its first key, its first two,
    # ...): each of its runs reads past one at a time, each such read going JAX's way, at
    # most one per variant; nothing loaded is wasted and nothing is written, so the plan
    # stays as planted (what any planted variant sharing the victim's keys has cost).
    cache.run(B)
    plan = cache.plan()
    assert plan is not None
    chain = _planted(*(B[:n] for n in range(1, _plan.MAX_VARIANTS)))
    cache.plant(_plan.Plan((*chain.variants, *plan.variants)))
    run = cache.run(B)
    assert run.wasted == 0 and not run.wrote
    assert run.own_way <= _plan.MAX_VARIANTS


def test_a_planted_variant_under_the_share_costs_at_most_its_share_each_start(
    cache: Cache,
) -> None:
    # The bound the share sets, for a writer who keeps under it: a variant of the victim's
    # 7 and 2 others (2 of 9, under a quarter) costs those 2 at each start and is never
    # outvoted; one more (3 of 10) and it costs them once.
    cache.plant(_planted([*VICTIM, 900, 901]))
    for _ in range(2):
        run = cache.run(VICTIM)
        assert (run.wasted, run.wrote) == (2, False)
    cache.plant(_planted([*VICTIM, 900, 901, 902]))
    assert cache.run(VICTIM).wrote
    run = cache.run(VICTIM)
    assert (run.wasted, run.wrote) == (0, False)
