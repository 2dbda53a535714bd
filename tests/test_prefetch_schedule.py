"""The order loading ahead loads a plan in (``xla_pcache.jax.ahead._schedule``), the clock that says
when a run reads each program, and the fit of what a deserialize costs (``_loads.Costs``).
Pure functions of numbers: no JAX, no timing."""

from __future__ import annotations

import itertools
import random

import pytest
from xla_pcache.jax.ahead import _loads, _schedule

# The bench's LM on a TPU, as a plan would say it (seconds from the first read): two dozen
# small initialisation programs read in the first 0.6 s, the first training step at 0.98 s,
# whose load takes longer than that, then the evaluation and the greedy steps and the
# training steps of the longer lengths.
SMALL = [round(0.026 * i, 3) for i in range(23)]
NEEDS = [*SMALL, 0.98, *(1.2 + 0.1 * i for i in range(11))]
COSTS = [0.2] * 23 + [1.1] + [0.3] * 11
FIRST_STEP = 23


def test_a_late_needed_big_load_starts_ahead_of_small_ones_when_its_deadline_says_so() -> None:
    read_order = list(range(len(NEEDS)))
    order = _schedule.order(NEEDS, COSTS, workers=8)
    # In the read order the training step starts after the small ones, and its read waits
    # for it: the run's wait is half a second.
    assert _schedule.lateness(read_order, NEEDS, COSTS, 8) == pytest.approx(0.52)
    # Its deadline (0.98 s) less its cost (1.1 s) is before any small one's: it starts
    # with the first threads, the small ones on the others, and the wait is halved.
    assert order.index(FIRST_STEP) < 8
    assert _schedule.lateness(order, NEEDS, COSTS, 8) <= 0.26
    assert sorted(order) == read_order
    # The small ones keep their read order among themselves.
    small = [i for i in order if i < FIRST_STEP]
    assert small == sorted(small)


def test_one_thread_loads_in_the_order_of_need() -> None:
    # On one thread the order of need is best (Jackson's rule): moving the big load first
    # would make every small read wait for it.
    order = _schedule.order(NEEDS, COSTS, workers=1)
    assert order == list(range(len(NEEDS)))


def test_a_big_load_needed_late_keeps_its_place() -> None:
    # The same big load read at 30 s: there is time for it after the small ones.
    needs = [*SMALL, 30.0]
    costs = [0.2] * 23 + [1.1]
    assert _schedule.order(needs, costs, workers=8) == list(range(24))


def test_nothing_known_is_the_read_order_and_gaps_are_filled() -> None:
    # No cost known (a plan's first run, before any deserialize ended): the read order.
    assert _schedule.order([3.0, 1.0, 2.0], [None, None, None], 4) == [1, 2, 0]
    # An unknown need is the need before it (entries come in the order they were read),
    # an unknown cost the middle of the known ones.
    order = _schedule.order([0.0, None, 5.0, None], [0.1, None, 10.0, 0.1], 2)
    assert order[0] == 2 and sorted(order) == [0, 1, 2, 3]
    assert _schedule.order([], [], 8) == []
    with pytest.raises(ValueError, match="length"):
        _schedule.order([1.0], [], 1)


def test_threads_still_loading_are_busy() -> None:
    # Two threads, one busy for 5 s more: the urgent load goes to the free one, and the
    # wait counts the busy thread's end.
    needs, costs = [1.0, 1.0], [1.0, 1.0]
    assert _schedule.lateness([0, 1], needs, costs, 2) == pytest.approx(0.0)
    assert _schedule.lateness([0, 1], needs, costs, 2, busy=[5.0]) == pytest.approx(1.0)
    assert _schedule.lateness([0, 1], needs, costs, 2, busy=[5.0, 5.0, 5.0]) == pytest.approx(5.0)


def test_the_wait_is_the_largest_lateness_once_earlier_waits_are_added() -> None:
    # Read 0 waits 1 s (its load ends at 2 s, it is read at 1 s); read 1, due at 1.5 s,
    # comes at 2.5 s and finds its load (ended at 2.5 s) done: the run waited 1 s in all.
    assert _schedule.lateness([0, 1], [1.0, 1.5], [2.0, 0.5], 1) == pytest.approx(1.0)
    # Every order of a few loads: the result is a permutation and never waits longer
    # than the read order, on any number of threads.
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(2, 7)
        needs = sorted(round(rng.uniform(0, 3), 2) for _ in range(n))
        costs = [round(rng.uniform(0.01, 2), 2) for _ in range(n)]
        for workers in (1, 2, 3, 8):
            order = _schedule.order(needs, costs, workers)
            assert sorted(order) == list(range(n))
            got = _schedule.lateness(order, needs, costs, workers)
            assert got <= _schedule.lateness(range(n), needs, costs, workers) + 1e-9
            if n <= 5 and workers == 1:
                best = min(
                    _schedule.lateness(p, needs, costs, 1) for p in itertools.permutations(range(n))
                )
                assert got == pytest.approx(best)


def test_a_plan_of_thousands_is_ordered() -> None:
    rng = random.Random(3)
    n = 4096
    needs = sorted(rng.uniform(0, 100) for _ in range(n))
    costs = [rng.uniform(0, 1) for _ in range(n)]
    order = _schedule.order(needs, costs, 8)
    assert sorted(order) == list(range(n))
    assert _schedule.lateness(order, needs, costs, 8) <= _schedule.lateness(
        range(n), needs, costs, 8
    )


def test_the_clock_counts_the_main_threads_work_between_reads() -> None:
    clock = _schedule.Clock()
    # The first read is at 0, whenever it comes.
    assert clock.begin(100.0) == 0.0
    clock.end(100.5, missed="a")  # it missed: JAX compiles it now
    assert clock.time(101.0) == pytest.approx(0.5)
    # The compile took 30 s; its put resumes the clock: none of it is the run's work.
    clock.compiled("a", 131.0)
    assert clock.begin(131.25) == pytest.approx(0.25)
    clock.end(131.5)  # a hit: the clock resumes at its end
    # A put of another key (not the last miss) does not resume it.
    clock.compiled("b", 140.0)
    assert clock.begin(132.0) == pytest.approx(0.75)
    # Reads on two threads at once: the clock stops until the last ends.
    assert clock.begin(132.0) == pytest.approx(0.75)
    clock.end(133.0)
    assert clock.time(134.0) == pytest.approx(0.75)
    clock.end(135.0)
    assert clock.time(136.0) == pytest.approx(1.75)


def test_what_a_deserialize_costs_is_fitted_to_those_that_ended() -> None:
    costs = _loads.Costs()
    assert costs.predict(1000) is None  # nothing known yet
    costs.add(1000, 0.01)
    assert costs.predict(5000) == pytest.approx(0.05)  # one: all of it per byte
    costs.add(None, 5.0)  # no size: not a sample
    assert costs.samples == 1
    for size in (2000, 10_000, 100_000):
        costs.add(size, 0.005 + size * 1e-6)
    # Enough of them: a fixed part and a part per byte.
    assert costs.predict(50_000) == pytest.approx(0.055, rel=0.2)
    assert costs.predict(None) is None


def test_what_a_load_saved_is_its_own_time_and_the_smaller_share_of_the_rest() -> None:
    # On its own thread (a deserialize that runs where it is called): its own CPU time.
    own = _loads.Steps(fetch_cpu=0.01, load_wall=2.0, load_own=1.6, load_cpu=3.0, load_alone=0.3)
    assert own.cost == pytest.approx(1.61)
    # On XLA's pool: the smaller of its share of the others' CPU time (what a computation
    # running beside it inflates) and of the wall time (what waiting inflates).
    pool = _loads.Steps(
        fetch_cpu=0.002, load_wall=0.5, load_own=0.001, load_cpu=0.2, load_alone=0.1
    )
    assert pool.cost == pytest.approx(0.002 + 0.001 + 0.099)
    busy = _loads.Steps(load_wall=0.5, load_own=0.0, load_cpu=0.05, load_alone=0.4)
    assert busy.cost == pytest.approx(0.05)
    # Never more than the load took.
    for steps in (own, pool, busy):
        assert steps.cost <= steps.wall


@pytest.mark.parametrize("side_by_side", [1, 2])
def test_a_deserializes_share_of_the_wall_counts_the_backends_side_by_side(
    side_by_side: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clock the test moves: load A runs 1 s alone, 2 s beside load B, 1 s alone again.
    now = [0.0]
    monkeypatch.setattr(_loads.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(_loads.time, "thread_time", lambda: 0.0)
    meter = _loads.Meter()
    meter._sample = lambda: 0.0  # type: ignore[method-assign]
    meter.side_by_side = side_by_side
    a, b = _loads.Steps(), _loads.Steps()
    with meter.deserializing(a):
        now[0] += 1.0
        with meter.deserializing(b):
            now[0] += 2.0
        now[0] += 1.0
    assert (a.load_wall, b.load_wall) == (4.0, 2.0)
    # XLA's CPU client shares one pool: two at once each had half of it. A TPU runtime
    # that runs two side by side at full speed: each had all of it.
    if side_by_side == 1:
        assert (a.load_alone, b.load_alone) == (pytest.approx(3.0), pytest.approx(1.0))
    else:
        assert (a.load_alone, b.load_alone) == (pytest.approx(4.0), pytest.approx(2.0))
