"""JAX: loading ahead, what a session holds: its store and build, the one lock and its three
conditions, each planned executable's slot and the queues it waits in, the plan and what it
was told, the backend, the clock, the tallies its report reads, and the one way it counts.
Each part of the session is a class over this state, working on it under the lock: the
hand-over to compiling ahead (``_handover``), the loading pool (``_pool``), the session's life
(``_session_life``), its report (``_session_report``), and JAX's reads (``_prefetch``).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from xla_pcache import builds
from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax.ahead import _plan, _schedule
from xla_pcache.jax.ahead._compiling import CompileAhead
from xla_pcache.jax.ahead._loads import Costs, Meter, Normalizer, Slot, options_digester
from xla_pcache.jax.ahead._plan_writer import PlanWriter
from xla_pcache.jax.ahead._recognition import Recognition
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")


def loading_order(slot: Slot) -> tuple[bool, int]:
    """The order of loading: what a read waits for first, then the schedule's."""
    return (not slot.urgent, slot.rank)


class SessionState:
    """What one session of loading ahead holds (``_prefetch.Prefetch``)."""

    def __init__(
        self,
        store: Store,
        cc: Any,
        *,
        threads: int,
        memory: int,
        loads: Callable[[str], int] | None = None,
        name: str | None,
        jax_version: str,
        form: int,
        build: builds.Build | Callable[[], builds.Build | None],
        write_plans: bool = True,
    ) -> None:
        self.store = store
        # The store's keys of this build (``xla_pcache.builds``): the plan's and every
        # entry's it names, so that nothing another build compiled is ever loaded. Given as
        # a function, it is found on the session's thread; ``_own_build``: its digest, once
        # known.
        self._build = build
        self._own_build = build.digest if isinstance(build, builds.Build) else None
        self._cc = cc
        self._threads = max(1, threads)
        # How many of the threads deserialize at once, by the backend's platform (None:
        # all); known once the backend is (``_loads``).
        self._loads_for = loads
        self._loads = self._threads
        # Deserializing now (at most ``_loads``, but for those a read waits for).
        self._deserializing = 0
        self._memory = memory
        self._name = name
        self._jax_version = jax_version
        self._form = form
        self._pid = os.getpid()
        self._normal = Normalizer(options_digester())
        self._meter = Meter()
        # One lock, two conditions: ``_cond`` for what readers, the upkeep and close wait
        # on (a slot's state, the plan, the backend), ``_jobs`` for the loading threads,
        # one woken per job: a thread woken for nothing takes the GIL for nothing.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._jobs = threading.Condition(lock)
        # And the upkeep's (``_tend``): woken by a plan falling due and by the end.
        self._upkeep = threading.Condition(lock)
        self._warn = FirstWarning(
            logger, "loading {key} ahead failed ({what}), it is read as before"
        )
        # A read-only store, or a caller's say (a bucket path's read-only host), writes none.
        self._writer = PlanWriter(
            store,
            enabled=write_plans and not store.read_only,
            warn=self._warn,
            count=self._count,
        )
        # Whether a store cache JAX uses holds this session (``xla_pcache.jax._factory``).
        self.attached = False
        self._began = False
        self._early = False
        self._closed = False
        # No more loading (the run stopped asking).
        self._ended = False
        self._backend: Any = None
        self._wait_backend: Callable[[Callable[[float], bool]], Any] | None = None
        self._process = 0
        self._key: str | None = None
        self._workload = ""
        self._plan: _plan.Plan | None = None
        # None until the plan is read; ``_applied`` once the backend is known and applied.
        self._recog: Recognition | None = None
        self._order: dict[str, int] = {}
        # Compiling ahead what the store lacks (None: nothing is); closed with the session.
        self.ahead: CompileAhead | None = None
        # Where an executable compiled ahead and taken is put: the store cache JAX uses
        # (``_store_cache.put_ahead``); None: nowhere.
        self.put_ahead: Callable[[str, bytes, float, str], None] | None = None
        # What records a read served what was compiled ahead as the store's miss it is.
        self.served_ahead: Callable[[str], None] | None = None
        # Executables compiled ahead and taken, to put: key, value parts, load digest.
        self._puts: list[tuple[str, bytes, float, str]] = []
        self._applied = False
        self._waited = False
        self._slots: dict[str, Slot] = {}
        self._queue: list[Slot] = []
        self._fetched: list[Slot] = []
        self._in_flight = 0
        self._busy = 0
        # Keys read before the plan or the backend was applied: read JAX's way, not loaded.
        self._passed: set[str] = set()
        self._early_reads: list[str] = []
        # The key each thread is reading (from the clock's tick to the read's end).
        self._reading: dict[int, str] = {}
        # The latest reads' compile options as JAX's key sees them (``_normalized``) and
        # devices, by key, for the puts of what they missed.
        self._wanted: collections.OrderedDict[str, tuple[bytes, tuple[int, ...]]] = (
            collections.OrderedDict()
        )
        self._last_read = time.monotonic()
        self._last_take = time.monotonic()
        self._workers: list[threading.Thread] = []
        self._thread: threading.Thread | None = None
        # When the run reads each program (``_schedule.Clock``).
        self._clock = _schedule.Clock()
        # What deserializes take here (for the order), and how many had finished when the
        # order was last worked out.
        self._costs = Costs()
        self._ordered_at = 0
        # Reads that went JAX's way and hit: how many, and their time on the main thread.
        self._main_reads = 0
        self._main_reads_s = 0.0
        # For the report: each taken read's position, wait and load's end; the time spared,
        # the loads' CPU and wall time, and each taken load (``_loads.Steps``).
        self._t0 = time.perf_counter()
        self._waits: list[tuple[int, float, float]] = []
        self._reads = 0
        self._saved_s = 0.0
        self._served_s = 0.0
        self._taken_cpu_s = 0.0
        self._taken_wall_s = 0.0
        self._taken: list[dict[str, Any]] = []

    def _count(self, counts: list[tuple[str, int]]) -> None:
        try:
            self.store.add_prefetch_counters([(c, n) for c, n in counts if n])
        except Exception as exc:
            logger.debug("xla_pcache: counting %s failed: %s", counts, exc)
