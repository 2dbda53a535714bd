"""JAX: loading ahead, what a session did: each read served counted (the main-thread time it
spared, ``saved_ms``), and the session's report (``xla_pcache.jax.prefetch_report``).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.jax.ahead import _loads, _plan
from xla_pcache.jax.ahead._loads import Slot, State
from xla_pcache.jax.ahead._session_state import SessionState

logger = package_logger("xla_pcache.jax")


class SessionReport(SessionState):
    """A session's counts of what it served, and its report."""

    def _served(self, slot: Slot, start: float) -> None:
        """A read served from what was loaded ahead ended: the main-thread time it saved
        (one compiled ahead was a miss of the store, counted as what it is)."""
        end = time.perf_counter()
        spent = end - start
        try:
            with self._cond:
                self._clock.end(end)
                if slot.compiled:
                    counts = [("compiled_used", 1)]
                else:
                    saved = self._saved(slot, spent)
                    self._saved_s += saved
                    self._served_s += spent
                    if len(self._taken) < _plan.MAX_ENTRIES:
                        self._taken.append(self._load_report(slot, spent, saved))
                    counts = [("used", 1), ("saved_ms", round(saved * 1000))]
            self._count(counts)
        except Exception as exc:
            logger.debug("xla_pcache: counting a read served failed: %s", exc)

    def _saved(self, slot: Slot, spent: float) -> float:
        """What a read served from ``slot`` saved the main thread: what reading it there
        costs, less the time the read took (its wait and this bookkeeping). What reading it
        costs is what it cost when a run last read it on the main thread (the plan's
        ``read_us``, at most what its load took here: a plan is untrusted), else what its
        load took here (``_loads.Steps.cost``)."""
        steps = slot.steps
        if slot.entry.read_us is not None:
            cost = min(slot.entry.read_us / 1e6, steps.wall)
        else:
            cost = steps.cost
        return max(0.0, cost - spent)

    def _load_report(self, slot: Slot, spent: float, saved: float) -> dict[str, Any]:
        steps = slot.steps
        return {
            "key": slot.entry.key,
            "read": self._reads,
            "at_s": None if slot.entry.at_us is None else slot.entry.at_us / 1e6,
            "size": slot.size,
            "read_s": None if slot.entry.read_us is None else slot.entry.read_us / 1e6,
            "started_s": round(slot.started_at - self._t0, 4) if slot.started_at else None,
            "loaded_s": round(slot.loaded_at - self._t0, 4),
            "spent_s": round(spent, 6),
            "saved_s": round(saved, 6),
            "cost_s": round(steps.cost, 6),
            **{k: round(v, 6) for k, v in dataclasses.asdict(steps).items()},
        }

    def compiled_states(self) -> dict[str, int]:
        """What became of the planned executables compiled ahead, or with the compiler."""
        with self._cond:
            return dict(
                collections.Counter(
                    s.state.value
                    for s in self._slots.values()
                    if s.compiled or s.state is State.COMPILING
                )
            )

    def report(self, loads: bool = False) -> dict[str, Any]:
        """What this session did, by key state (for tests and the bench); with ``loads``,
        each read served and what its load took (``_load_report``)."""
        with self._cond:
            states = collections.Counter(s.state.value for s in self._slots.values())
            recog = self._recog
            return {
                "workload": self._workload,
                "plan_key": self._key,
                # Whether it began before the first read (at activation or install()).
                "began": "before the first read" if self._early else "at the first read",
                "planned": len(self._slots),
                "states": dict(states),
                # The plan's variants, and how many were still candidates for this run.
                "variants": recog.variants if recog is not None else 0,
                "candidates": recog.candidates if recog is not None else 0,
                **self._writer.report(),
                "in_flight": self._in_flight,
                **_loads.waits_report(self._waits),
                # The main-thread time the takes spared (``prefetch_saved_ms``), the time
                # the reads served took, and their loads' CPU and wall time on the workers.
                "saved_s": round(self._saved_s, 4),
                "served_s": round(self._served_s, 4),
                "load_cpu_s": round(self._taken_cpu_s, 4),
                "load_wall_s": round(self._taken_wall_s, 4),
                # Reads that went JAX's way and hit: how many, and their time on the main
                # thread (each kept in the plan, when it is written, as its entry's cost).
                "main_reads": self._main_reads,
                "main_reads_s": round(self._main_reads_s, 4),
                **({"loads": list(self._taken)} if loads else {}),
            }
