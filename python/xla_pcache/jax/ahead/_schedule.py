"""JAX: the order loading ahead loads a plan's executables in, so that each is loaded by the
time the run reads it.

Each planned executable has a *need* time, when the recorded run read it (the main thread's
own work from its first read: its reads and compiles left out, ``_prefetch``), and a *cost*,
how long its load takes on a worker. A read whose load has not ended waits, and every later
read comes that much later: the run's whole wait is the largest lateness of any load (its
end less its need time), not the sum of them. So the order that keeps the largest lateness
small is wanted. On one thread that is the order of need (Jackson's rule); on several, a
large load needed soon must start before small ones needed sooner, on a thread of its own,
or it ends late however early the small ones end (the first training step, read after two
dozen small initialisation programs).

``order`` simulates the candidates on the worker threads (each load to the thread free
first): the read order, the order of latest start (need less cost), and the read order with
the load ending latest moved forward as long as that helps; the best is kept, the read
order on a tie. Pure: the session (``_prefetch``) calls it with what it knows.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence

# Moves of the latest load forward, at most, and the plans large enough that only the two
# plain orders are simulated (each simulation is a pass over the plan).
_MOVES = 8
_SEARCH_MAX = 512


def _threads(workers: int, busy: Sequence[float]) -> list[float]:
    """When each thread is free: those busy when their load ends, the others now."""
    n = max(1, workers)
    free = sorted(max(0.0, b) for b in busy)[:n]
    free += [0.0] * (n - len(free))
    heapq.heapify(free)
    return free


def _ends(
    order: Sequence[int], costs: Sequence[float], workers: int, busy: Sequence[float]
) -> list[float]:
    """When each load of ``order`` ends, each started on the thread free first."""
    free = _threads(workers, busy)
    ends = []
    for i in order:
        end = heapq.heappop(free) + costs[i]
        heapq.heappush(free, end)
        ends.append(end)
    return ends


def lateness(
    order: Sequence[int],
    needs: Sequence[float],
    costs: Sequence[float],
    workers: int,
    busy: Sequence[float] = (),
) -> float:
    """The run's whole wait (seconds) when loads start in ``order`` on ``workers`` threads
    (``busy``: when those still loading are free) from time 0 and read ``i`` comes at
    ``needs[i]`` plus the waits before it: the largest lateness of any load, at least 0."""
    ends = _ends(order, costs, workers, busy)
    return max([0.0, *(end - needs[i] for end, i in zip(ends, order, strict=True))])


def _moved(
    order: list[int],
    needs: Sequence[float],
    costs: Sequence[float],
    workers: int,
    busy: Sequence[float],
) -> list[int]:
    """``order`` with the load ending latest moved forward while that lowers the wait: each
    time to the best of the places 1, 2, 4, ... ahead and the front."""
    best = lateness(order, needs, costs, workers, busy)
    for _ in range(_MOVES):
        if best <= 0:
            break
        ends = _ends(order, costs, workers, busy)
        late = max(range(len(order)), key=lambda p: ends[p] - needs[order[p]])
        places = {0}
        ahead = 1
        while ahead < late:
            places.add(late - ahead)
            ahead *= 2
        places.discard(late)
        tried = []
        for at in sorted(places):
            candidate = [*order[:at], order[late], *order[at:late], *order[late + 1 :]]
            tried.append((lateness(candidate, needs, costs, workers, busy), candidate))
        if not tried:
            break
        wait, candidate = min(tried, key=lambda t: t[0])
        if wait >= best:
            break
        best, order = wait, candidate
    return order


def order(
    needs: Sequence[float | None],
    costs: Sequence[float | None],
    workers: int,
    busy: Sequence[float] = (),
) -> list[int]:
    """The indices of the loads, in the order to start them. ``needs[i]``: when the run reads
    load ``i`` (seconds from now), None where unknown (taken as the need before it: the
    loads come in the order the recorded run read them); ``costs[i]``: how long it takes on
    a worker, None where unknown (taken as the middle of the known ones; none known: the
    read order); ``busy``: when the threads still loading are free."""
    n = len(needs)
    if n != len(costs):
        raise ValueError("needs and costs differ in length")
    need: list[float] = []
    last = 0.0
    for value in needs:
        last = value if value is not None else last
        need.append(last)
    known = [c for c in costs if c is not None]
    middle = statistics.median(known) if known else 0.0
    cost = [c if c is not None else middle for c in costs]
    by_read = sorted(range(n), key=lambda i: (need[i], i))
    if not known or n < 2:
        return by_read
    by_start = sorted(range(n), key=lambda i: (need[i] - cost[i], need[i], i))
    candidates = [by_read, by_start]
    if n <= _SEARCH_MAX:
        candidates.append(_moved(by_read, need, cost, workers, busy))
    waits = [lateness(c, need, cost, workers, busy) for c in candidates]
    return candidates[min(range(len(candidates)), key=lambda k: (waits[k], k))]


class Clock:
    """When a run reads each program, as the main thread's own work: seconds of it from the
    run's first read, its reads and compiles left out, so that a cold run (each read a miss,
    each program compiled after it) and a warm one (each read served) say the same of the
    same program. A read's end resumes the clock; a miss's compile comes after its read, and
    the put of the program JAX compiled (``compiled``) resumes it instead. Reads on several
    threads at once stop it until the last ends. Times are ``time.perf_counter()``'s; the
    caller serialises the calls."""

    def __init__(self) -> None:
        self._work = 0.0
        self._resumed: float | None = None
        self._reading = 0
        self._missed: str | None = None

    def begin(self, now: float) -> float:
        """A read begins: the clock's time."""
        if self._reading == 0 and self._resumed is not None:
            self._work += now - self._resumed
        self._reading += 1
        self._resumed = None
        return self._work

    def time(self, now: float) -> float:
        """The clock's time now."""
        if self._reading == 0 and self._resumed is not None:
            return self._work + now - self._resumed
        return self._work

    def end(self, now: float, missed: str | None = None) -> None:
        """A read ends; ``missed``: its key, when JAX compiles it next."""
        self._reading = max(0, self._reading - 1)
        if self._reading == 0:
            self._resumed = now
        self._missed = missed

    def compiled(self, key: str, now: float) -> None:
        """JAX puts ``key``, which it compiled after its read missed: the time since that
        read ended was the compile's."""
        if key == self._missed and self._reading == 0:
            self._missed = None
            self._resumed = now
