"""JAX: loading ahead. The executables a workload's plan names are read, decompressed and
deserialized on a thread pool from the backend's start, and JAX's later reads take them from
there instead of doing that work one program at a time on the main thread.

A session (``Prefetch``) begins at installation (``begin``: activation runs inside JAX's
backend start, before the backend exists) or else at JAX's first cache read (``_read_hook``).
Its thread reads the plan at once (its name needs no backend, ``_plan_name.workload``), and its
workers fetch what the plan's candidates all hold (``_recognition``) and decompress it while
the backend comes up (on a bucket path the fetch is the download); once JAX's default backend
is up (``_backend_wait``, or the first read's) the candidates are the variants of its
platform and device count, and the workers deserialize (``_loads``), each by the time the
run will read it as far as the threads allow (``_schedule``: from when the recorded run read
it and how long this process's deserializes take). Each read narrows the candidates; with
one left, its whole list is loaded.

A read takes a loaded executable only when its compile options (as JAX's cache key sees
them), devices and backend are the ones it was loaded with; it waits for one loading, and
has one not started loaded next; anything else goes JAX's own way. A taken executable counts
the hit the store would have, and the main-thread time it spared (``_saved``); one never
taken is wasted when the run stops asking (``IDLE_RELEASE_S``) or at exit. Fetching waits
while ``XLA_PCACHE_PREFETCH_MEMORY`` bytes are held. A failure in the background is a miss
and a counter, never an exception.

An entry the store lacks is handed to compiling ahead (``_compiling``): its record goes to a
compiler process, and what comes back (a serialized executable, the key verified by JAX's
own key function there) is loaded by the same workers as an entry fetched, served at JAX's
read of its key with the same checks (counted ``compiled_used``, a miss to the store), and
put into the store as JAX would have put it. A read of a key the compiler process has not
started takes it back (JAX compiles it now); one it is compiling waits for it. The session
kills the compiler process first thing when it closes, so no exit waits for a compile, and
what a run went past without reading, whose executable the store lacks, leaves its plan
(``PlanWriter.unread``).

What the run read is timed on the session's *clock*: the main thread's own work since its
first read, its reads and compiles left out (a read's end, or a miss's put, resumes it), so
that a cold run's plan says when a warm run will read each program.

The loading threads hold the GIL as little as they can (the main thread traces and lowers
meanwhile, holding it): a thread is woken only when there is work for it (``_jobs``), the
options' digest is worked out once per option set (``_loads.Normalizer``), and the store's
read, the decompression and XLA's deserialize release it.

What the run read is recorded, and the plan written when it differs from what is stored
(``_plan_writer``). Every key the session gives the store carries this process's runtime
build (``xla_pcache.builds``), so that nothing another build compiled is ever loaded ahead;
the plan's key does not (one plan per workload, whatever the build).
"""

from __future__ import annotations

import atexit
import bisect
import collections
import dataclasses
import importlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from xla_pcache import _testhook, build_key, builds
from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax.ahead import _loads, _plan, _plan_name, _schedule
from xla_pcache.jax.ahead._backend_wait import process_index
from xla_pcache.jax.ahead._compiling import CompileAhead, entry_value
from xla_pcache.jax.ahead._loads import (
    PENDING,
    Costs,
    EntryUnusable,
    Meter,
    Normalizer,
    Slot,
    State,
    options_digester,
)
from xla_pcache.jax.ahead._plan_writer import PlanWriter, run_failed
from xla_pcache.jax.ahead._recognition import Recognition
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")

# Seconds without a take, once loading is done, before what was loaded and not taken is
# released and counted wasted.
IDLE_RELEASE_S = 300.0
# How long a read waits for its executable still loading before going JAX's own way, and
# how long the first read waits for the plan to be read and the backend applied.
LOAD_WAIT_S = 120.0
PLAN_WAIT_S = 2.0
# How long the exit hook waits for loads in progress.
CLOSE_WAIT_S = 10.0
# How long a read waits for its program compiling ahead (the compiler process stuck is found
# sooner: ``ahead._link.STALL_S``).
COMPILE_WAIT_S = 600.0
# Reads whose options are kept for the put after a miss (JAX puts right after it compiles).
_RECENT_READS = 256
# What a deserialize is taken to cost per stored byte before this process finished one (a
# TPU's take about a tenth of this, a CPU's about as much): only the first threads' first
# loads follow it; the order is worked out again as deserializes finish (after the 1st,
# 2nd, 4th, 8th, ...).
_PRIOR_S_PER_BYTE = 1e-6


_sessions: weakref.WeakSet[Prefetch] = weakref.WeakSet()
_sessions_lock = threading.Lock()
_exit_registered = False


def _first(slot: Slot) -> tuple[bool, int]:
    """The order of loading: what a read waits for first, then the schedule's."""
    return (not slot.urgent, slot.rank)


def _close_all_at_exit() -> None:
    with _sessions_lock:
        sessions = list(_sessions)
    for session in sessions:
        session.close(at_exit=True)


class Prefetch:
    """Loading ahead for one store (``xla_pcache.jax`` makes one at installation and hands
    it to the store cache JAX builds; the hook finds it as the cache's ``prefetch``)."""

    def __init__(
        self,
        store: Store,
        cc: Any,
        *,
        threads: int,
        memory: int,
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

    # -------------------------------------------------------------- beginning

    def begin(
        self,
        backend: Any = None,
        *,
        wait_backend: Callable[[Callable[[float], bool]], Any] | None = None,
    ) -> None:
        """Start the session's thread (once): it reads the plan now, fetches what can be
        fetched, and loads once the backend is known: ``backend``, what ``wait_backend``
        finds (``_backend_wait.wait``: JAX's default backend once up, never starting it), or
        the backend of the first read."""
        with self._cond:
            if not self._began and not self._closed:
                self._early = True
                self._begin(backend, wait_backend)

    def _begin(self, backend: Any, wait_backend: Any) -> None:
        global _exit_registered
        self._began = True
        self._backend = backend
        self._wait_backend = wait_backend
        self._t0 = time.perf_counter()
        thread = threading.Thread(target=self._run, name="xla_pcache-prefetch", daemon=True)
        self._thread = thread
        with _sessions_lock:
            _sessions.add(self)
            if not _exit_registered:
                atexit.register(_close_all_at_exit)
                _exit_registered = True
        thread.start()

    def _run(self) -> None:
        try:
            build = self._build if isinstance(self._build, builds.Build) else self._build()
            if build is None:
                # No build, no store key: nothing to load or write (reads go JAX's way).
                with self._cond:
                    self._applied = True
                    self._cond.notify_all()
                return
            self._own_build = build.digest
            with self._cond:
                backend = self._backend
            self._process = int(backend.process_index()) if backend else process_index()
            self._read_plan()
            backend = self._await_backend()
            if backend is None:
                return
            self._backend_up(backend)
        except Exception as exc:
            self._warn("reading the plan", self._key or "", exc)
            with self._cond:
                self._applied = True
                self._cond.notify_all()
        self._tend()

    def _read_plan(self) -> None:
        self._workload = _plan_name.workload(self._name, self._jax_version, self._process)
        self._key = _plan.plan_key(self._workload)
        plan = self._fetch_plan()
        with self._cond:
            self._plan = plan
            self._recog = Recognition(plan.variants if plan is not None else ())
            for key in self._early_reads:
                self._recog.observe(key)
            self._enqueue()
            self._cond.notify_all()

    def _fetch_plan(self) -> _plan.Plan | None:
        """The plan in the store, or None; a plan refused is one warning and a counter."""
        assert self._key is not None
        try:
            blob = self.store.get(self._key, count=False)
        except Exception as exc:
            self._warn("reading the plan", self._key, exc)
            return None
        if blob is None:
            return None
        try:
            return _plan.decode(memoryview(blob))
        except _plan.PlanError as exc:
            logger.warning(
                "xla_pcache: the prefetch plan of %s in %s is refused (%s); nothing is loaded "
                "ahead from it",
                self._workload,
                self.store.path,
                exc,
            )
            self._count([("plans_refused", 1)])
            return None

    def _await_backend(self) -> Any:
        """The backend: given, brought by the first read, or found up by ``wait_backend``;
        None once closed."""
        probe = self._wait_backend

        def stop(pause: float) -> bool:
            with self._cond:
                self._cond.wait_for(lambda: self._backend is not None or self._closed, pause)
                return self._backend is not None or self._closed

        found = probe(stop) if probe is not None and not stop(0) else None
        with self._cond:
            if self._backend is None and found is not None:
                self._backend = found
            self._cond.wait_for(lambda: self._backend is not None or self._closed)
            return None if self._closed else self._backend

    def _backend_up(self, backend: Any) -> None:
        """Deserializing can start: the candidates are the plan's variants of this platform
        and device count (under another process index than foreseen, the plan is read
        again, under the right name)."""
        platform, count = str(backend.platform), int(backend.device_count())
        index = int(backend.process_index())
        if index != self._process:
            with self._cond:
                self._drop(list(self._slots.values()))
            self._process = index
            self._read_plan()
        with self._cond:
            assert self._recog is not None
            self._recog.restrict(platform, count)
            wanted = {e.key for e in self._recog.wanted()}
            # What was fetched for variants of another platform is let go.
            self._drop([s for k, s in self._slots.items() if k not in wanted])
            self._enqueue()
            self._applied = True
            self._cond.notify_all()
            self._jobs.notify(len(self._fetched))
            planned, variants = len(self._slots), self._recog.variants
        if self.ahead is not None:
            self.ahead.backend_up(platform)
        assert self._key is not None
        self._writer.bind(self._key, self._workload, self._own_build, self._plan, platform, count)
        if variants:
            logger.debug(
                "xla_pcache: %s: %d executables to load ahead so far, of %d variants",
                self._workload,
                planned,
                variants,
            )

    # -------------------------------------------------------------- the queue (under the lock)

    def _enqueue(self) -> set[str]:
        """Queue what the candidates all hold and is not queued yet, and order the queue as
        the reference's list; the keys newly queued."""
        if self._recog is None or self._ended or self._closed:
            return set()
        new: set[str] = set()
        for entry in self._recog.wanted():
            if entry.key in self._slots or entry.key in self._passed:
                continue
            slot = Slot(entry)
            self._slots[entry.key] = slot
            self._queue.append(slot)
            new.add(entry.key)
        if new:
            self._order = self._recog.order()
            self._reschedule()
            self._count([("planned", len(new))])
            alive = sum(1 for w in self._workers if w.is_alive())
            for _ in range(min(self._threads, len(self._slots)) - alive):
                worker = threading.Thread(
                    target=self._work,
                    name=f"xla_pcache-prefetch-{len(self._workers)}",
                    daemon=True,
                )
                self._workers.append(worker)
                worker.start()
            self._jobs.notify(len(new))
        return new

    def _reschedule(self) -> None:
        """Order what is still to load (``_schedule``): each slot's need is when the
        recorded run read it, less the clock now; its cost what deserializes of its size
        take here (before any finished, ``_PRIOR_S_PER_BYTE``); the threads still
        deserializing are busy for what is left of theirs."""
        pending = [s for s in (*self._queue, *self._fetched) if not s.urgent]
        self._ordered_at = self._costs.samples
        if not pending:
            return
        now_s = self._clock.time(time.perf_counter())
        position = self._order

        def cost(size: int | None) -> float | None:
            if self._costs.samples:
                return self._costs.predict(size)
            return None if size is None else size * _PRIOR_S_PER_BYTE

        ordered = sorted(pending, key=lambda s: position.get(s.entry.key, len(position)))
        needs = [None if s.entry.at_us is None else s.entry.at_us / 1e6 - now_s for s in ordered]
        busy = []
        now = time.perf_counter()
        for s in self._slots.values():
            if s.state is State.LOADING and s.started_at:
                left = (cost(s.size) or 0.0) - (now - s.started_at)
                busy.append(max(0.0, left))
        ranks = _schedule.order(needs, [cost(s.size) for s in ordered], self._threads, busy)
        for rank, i in enumerate(ranks):
            ordered[i].rank = rank
        self._queue.sort(key=_first)
        self._fetched.sort(key=_first)

    def _drop(self, slots: list[Slot]) -> None:
        """Let go of those of ``slots`` not started or only fetched (not counted wasted:
        never loaded); one being fetched is let go when it is."""
        for slot in slots:
            slot.dropped = True
            if slot.state is State.QUEUED:
                self._queue.remove(slot)
                slot.state = State.SKIPPED
            elif slot.state is State.COMPILING and self.ahead is not None:
                if self.ahead.cancel(slot.entry.key) != "compiling":
                    slot.state = State.SKIPPED
            elif slot.state is State.FETCHED:
                self._fetched.remove(slot)
                self._release(slot, State.SKIPPED)

    def _job(self, pop: bool) -> tuple[Slot, bool] | None:
        """The next slot to work on and whether to fetch it (else deserialize it): the first
        in the order of those fetched (once the backend is up) and of those to fetch (while
        the memory bound allows, or asked for)."""
        ready = self._applied and self._backend is not None
        load = self._fetched[0] if ready and self._fetched else None
        fetch = self._queue[0] if self._queue else None
        if fetch is not None and not (fetch.urgent or self._in_flight < self._memory):
            fetch = None
        if load is not None and (fetch is None or _first(load) <= _first(fetch)):
            return (self._fetched.pop(0) if pop else load), False
        if fetch is not None:
            return (self._queue.pop(0) if pop else fetch), True
        return None

    def _release(self, slot: Slot, state: State = State.RELEASED) -> None:
        """Drop what ``slot`` holds."""
        freed = slot.nbytes
        self._in_flight -= freed
        slot.nbytes = 0
        slot.executable = slot.blob = slot.time = slot.serialized = None
        slot.state = state
        self._cond.notify_all()
        if freed and self._queue:
            self._jobs.notify()

    def _end_queue(self) -> None:
        """Load nothing more."""
        self._ended = True
        self._drop([s for s in self._slots.values() if s.state is State.FETCHED])
        for slot in self._queue:
            slot.state = State.SKIPPED
        self._queue.clear()
        self._cond.notify_all()
        self._jobs.notify_all()

    # -------------------------------------------------------------- the read, on JAX's thread

    def read(
        self,
        original: Callable[..., Any],
        names: tuple[str, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``get_executable_and_time(*args, **kwargs)``: from what was loaded ahead when it
        matches, else JAX's ``original``; never an exception of ours."""
        start = time.perf_counter()
        try:
            taken = self._before(names, args, kwargs, start)
        except Exception as exc:
            self._warn("a read", str(args[0] if args else kwargs.get("cache_key")), exc)
            taken = None
        if taken is not None:
            result, slot = taken
            self._served(slot, start)
            return result
        start = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException:
            self._read_ended(None, start)
            raise
        self._read_ended(result, start)
        return result

    def _read_ended(self, result: Any, start: float) -> None:
        """A read that went JAX's way ended (``result``: what JAX's read returned, None for
        an exception; ``start``: when JAX's read began): a hit is what reading the key
        costs the main thread (kept for the plan, ``_plan.Entry.read_us``); a miss is
        compiled next, and its put resumes the clock."""
        end = time.perf_counter()
        try:
            hit = isinstance(result, tuple) and bool(result) and result[0] is not None
            with self._cond:
                key = self._reading.pop(threading.get_ident(), None)
                if key is None:
                    return  # not on the clock (a read this session stepped aside for)
                self._clock.end(end, None if hit else key)
            if hit:
                with self._cond:
                    self._main_reads += 1
                    self._main_reads_s += end - start
                self._writer.measured(key, read_us=round((end - start) * 1e6))
        except Exception as exc:
            logger.debug("xla_pcache: timing a read failed: %s", exc)

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

    def _before(
        self, names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any], start: float
    ) -> tuple[Any, Slot] | None:
        if os.getpid() != self._pid or len(args) > len(names):
            return None  # a forked child (no threads of ours), or a call we do not know
        call = dict(zip(names, args, strict=False))
        if set(call) & set(kwargs) or not set(kwargs) <= set(names):
            return None
        call.update(kwargs)
        if call.get("host_callbacks") or "cache_key" not in call or "backend" not in call:
            return None  # host callbacks are bound at load: JAX's own way, never planned
        key, backend = call["cache_key"], call["backend"]
        if not isinstance(key, str):
            return None
        options = bytes(call["compile_options"].SerializeAsString())
        devices: tuple[int, ...] = ()
        if self._form >= 2:
            devices = tuple(int(d.id) for d in call["executable_devices"])
        wanted = self._normal.of(options, call["compile_options"])
        with self._cond:
            if self._closed:
                return None
            at = self._clock.begin(start)
            self._reading[threading.get_ident()] = key
            self._last_read = time.monotonic()
            self._reads += 1
            if not self._began:
                self._begin(backend, None)
            if self._backend is None:
                self._backend = backend
                self._cond.notify_all()
            if backend is not self._backend:
                return None  # another backend's program: neither planned nor recorded
            # For the put that may follow this read's miss (its load digest).
            self._wanted[key] = (wanted, devices)
            self._wanted.move_to_end(key)
            while len(self._wanted) > _RECENT_READS:
                self._wanted.popitem(last=False)
            was_due = self._writer.dirty
            self._writer.read(_plan.Entry(key, options, devices, at_us=round(at * 1e6)))
            if self._writer.dirty and not was_due:
                self._upkeep.notify_all()
            if not self._applied and not self._waited:
                # The plan is read first (one local read, or a fetch from the tiers, on the
                # session's thread), so that this read too can be served by it; once.
                self._waited = True
                self._cond.wait_for(lambda: self._applied or self._closed, PLAN_WAIT_S)
            if self._recog is None or not self._applied:
                if self._recog is not None:
                    self._recog.observe(key)
                elif len(self._early_reads) < _plan.MAX_ENTRIES:
                    self._early_reads.append(key)
                self._passed.add(key)  # read before the plan: not to be loaded later
                return None
            new = self._enqueue() if self._recog.observe(key) else set()
            slot = self._slots.get(key)
            if slot is None:
                return None
            if key in new:
                # Wanted from this read on (it told the run's variant): read JAX's way now.
                self._drop([slot])
                return None
            waiting = time.perf_counter()
            if slot.state in (State.QUEUED, State.FETCHED):
                # Asked for before its turn: loaded next, past the memory bound (it is taken
                # at once), while this read waits as for one loading.
                pending = self._queue if slot.state is State.QUEUED else self._fetched
                pending.remove(slot)
                slot.urgent = True
                bisect.insort(pending, slot, key=_first)
                self._jobs.notify()
            elif slot.state is State.FETCHING:
                slot.urgent = True  # deserialized as soon as it is fetched
            self._cond.wait_for(lambda: slot.state not in PENDING, LOAD_WAIT_S)
            compiling = slot.state is State.COMPILING
        if compiling:
            self._await_compiled(slot)
        with self._cond:
            waited = time.perf_counter() - waiting
            # Never started (workers stuck): read JAX's way.
            self._drop([slot])
            if slot.state is not State.LOADED:
                return None
            if slot.options != wanted or slot.entry.devices != devices:
                # Same key, other options or devices: never handed to this read.
                self._release(slot)
                self._count([("wasted", 1)])
                return None
            self._reading.pop(threading.get_ident(), None)
            result = (slot.executable, slot.time)
            blob = slot.blob
            compiled = slot.compiled
            if compiled:
                # A miss of the store, compiled ahead: put as JAX would have put it.
                if self._puts_ahead():
                    digest = _plan.load_digest(slot.options, slot.entry.devices)
                    self._puts.append((key, slot.serialized, slot.compile_s, digest))
                    self._upkeep.notify_all()
            else:
                self._taken_cpu_s += slot.steps.cpu
                self._taken_wall_s += slot.steps.wall
                if len(self._waits) < _plan.MAX_ENTRIES:
                    self._waits.append((self._reads, waited, slot.loaded_at - self._t0))
            self._release(slot, State.TAKEN)
            self._last_take = time.monotonic()
        if compiled:
            if self.served_ahead is not None:
                self.served_ahead(key)
            return result, slot
        self._writer.measured(key, size=slot.size)
        try:
            self.store.count_hit(blob)
        except Exception as exc:
            logger.debug("xla_pcache: counting a hit loaded ahead failed: %s", exc)
        return result, slot

    def _await_compiled(self, slot: Slot) -> None:
        """JAX reads ``slot``'s key while it is with the compiler process: taken back when
        the process has not started it (JAX compiles it now, as fast), else waited for, and
        loaded first once compiled. Off the session's lock."""
        # A test lets the compiler process finish first (nothing outside a test build).
        _testhook.hold("compile-ahead-take")
        answer = self.ahead.cancel(slot.entry.key) if self.ahead is not None else None
        with self._cond:
            if slot.state is State.COMPILING and answer != "compiling":
                slot.state = State.SKIPPED  # taken back, or never given: JAX compiles it
                return
            slot.urgent = True
            if slot.state is State.FETCHED:
                self._fetched.remove(slot)
                bisect.insort(self._fetched, slot, key=_first)
                self._jobs.notify()
            self._cond.wait_for(
                lambda: slot.state not in (*PENDING, State.COMPILING) or self._closed,
                COMPILE_WAIT_S,
            )

    def load_digest(self, key: str, size: int | None = None) -> str | None:
        """For the put of ``key`` after this process's read of it missed: the digest of the
        options and devices that read asked for (``_plan.META_LOAD_DIGEST``). The put comes
        right after JAX's compile: the clock resumes here, and the entry's ``size`` (its
        stored bytes) is kept for the plan."""
        now = time.perf_counter()
        with self._cond:
            read = self._wanted.pop(key, None)
            self._clock.compiled(key, now)
        if size is not None:
            self._writer.measured(key, size=size)
        return None if read is None else _plan.load_digest(*read)

    def _count(self, counts: list[tuple[str, int]]) -> None:
        try:
            self.store.add_prefetch_counters([(c, n) for c, n in counts if n])
        except Exception as exc:
            logger.debug("xla_pcache: counting %s failed: %s", counts, exc)

    # -------------------------------------------------------------- the workers

    def _work(self) -> None:
        self._meter.loader()
        while True:
            with self._jobs:
                self._jobs.wait_for(lambda: self._closed or self._job(False) is not None)
                if self._closed:
                    return
                job = self._job(True)
                assert job is not None
                slot, fetch = job
                slot.state = State.FETCHING if fetch else State.LOADING
                self._busy += 1
                if self._job(False) is not None:
                    self._jobs.notify()  # more work than this thread: the next one
            try:
                if fetch and not self._fetch(slot):
                    continue
                self._deserialize(slot)
            except EntryUnusable as exc:
                # The entry's own bytes: JAX's read of the key meets them and says so itself.
                logger.debug("xla_pcache: %r is not loaded ahead: %s", slot.entry.key, exc)
                self._failed(slot)
            except Exception as exc:
                self._warn("loading", slot.entry.key, exc)
                self._failed(slot)
            finally:
                with self._cond:
                    self._busy -= 1
                    if self._busy == 0:
                        self._cond.notify_all()

    def _failed(self, slot: Slot) -> None:
        with self._cond:
            self._release(slot, State.FAILED)
        self._count([("errors", 1)])

    def _fetch(self, slot: Slot) -> bool:
        """Read and decompress ``slot``'s entry (no backend needed; off the lock): whether
        this thread deserializes it now (the backend is up, and nothing fetched comes
        before it), else it waits among the fetched, or is let go."""
        with self._meter.fetching(slot.steps):
            key = build_key.join(slot.entry.key, self._own_build)
            got = _loads.fetch(slot.entry, self.store, key, self._cc, self._normal)
        if got is None:
            # Compiled ahead from its record when it has one; its read waits for that, or
            # goes JAX's way.
            with self._cond:
                slot.state = State.COMPILING if self.ahead is not None else State.MISSING
                self._cond.notify_all()
            if not self._entry_absent(slot):
                with self._cond:
                    if slot.state is State.COMPILING:
                        slot.state = State.MISSING
                    self._cond.notify_all()
            self._idle_check()
            return False
        with self._cond:
            if self._closed:
                slot.state = State.RELEASED
                self._cond.notify_all()
                return False
            slot.serialized, slot.time, slot.blob = got.serialized, got.compile_time, got.blob
            slot.options = got.options
            slot.nbytes = len(got.serialized)
            slot.size = len(got.blob)
            self._in_flight += slot.nbytes
            if self._ended or slot.dropped:
                self._release(slot, State.SKIPPED)
                return False
            ready = self._applied and self._backend is not None
            if ready and not (self._fetched and _first(self._fetched[0]) < _first(slot)):
                slot.state = State.LOADING
                return True
            slot.state = State.FETCHED
            bisect.insort(self._fetched, slot, key=_first)
            if ready:
                self._jobs.notify()
        return False

    def _entry_absent(self, slot: Slot) -> bool:
        """A planned entry the store does not hold (evicted, pruned, or never stored for
        this build): whether it is compiled ahead from its record."""
        if self.ahead is None:
            return False
        try:
            entry = slot.entry
            slot.options = self._normal.of(entry.options)
            with self._cond:
                place = self._order.get(entry.key, _plan.MAX_ENTRIES)
            return self.ahead.submit(entry, place, slot.options)
        except Exception as exc:
            self._warn("compiling ahead", slot.entry.key, exc)
            return False

    # -------------------------------------------------------------- from compiling ahead

    def compiled(self, key: str, serialized: bytes, compile_s: float) -> None:
        """The compiler process compiled ``key``: loaded as an entry fetched, unless the
        run no longer wants it."""
        with self._cond:
            slot = self._slots.get(key)
            if slot is None or slot.state is not State.COMPILING:
                return
            if self._closed or self._ended or slot.dropped:
                slot.state = State.RELEASED
                self._cond.notify_all()
                return
            slot.serialized, slot.time = serialized, int(compile_s)
            slot.compiled, slot.compile_s = True, compile_s
            slot.nbytes = len(serialized)
            self._in_flight += slot.nbytes
            slot.state = State.FETCHED
            bisect.insort(self._fetched, slot, key=_first)
            self._cond.notify_all()
            self._jobs.notify()
        self._idle_check()

    def not_compiled(self, keys: list[str]) -> None:
        """Keys compiling ahead handed back: JAX compiles them as before."""
        with self._cond:
            for key in keys:
                slot = self._slots.get(key)
                if slot is not None and slot.state is State.COMPILING:
                    slot.state = State.MISSING
            self._cond.notify_all()
        self._idle_check()

    def compile_idle(self) -> None:
        self._idle_check()

    def may_compile(self) -> bool:
        """Whether what is fetched and not taken leaves room for more (read without the
        lock: the compiler process's thread asks it holding its own)."""
        return self._in_flight < self._memory

    def _idle_check(self) -> None:
        """A test waits until nothing planned is being fetched or compiled (nothing
        outside a test build)."""
        if not _testhook.enabled():
            return
        busy = (State.QUEUED, State.FETCHING, State.COMPILING)
        with self._cond:
            idle = self._applied and not any(s.state in busy for s in self._slots.values())
        if idle:
            _testhook.reached("compile-ahead-idle")

    def _puts_ahead(self) -> bool:
        """Whether what is compiled ahead and taken is put (not by a read-only process)."""
        return self.put_ahead is not None and self.ahead is not None and self.ahead.writes

    def _put_compiled(self, key: str, serialized: bytes, compile_s: float, digest: str) -> None:
        """Put what was compiled ahead and taken, where JAX would have put its own compile:
        process 0, at or over its thresholds (never raises)."""
        put = self.put_ahead
        if put is None or self._process != 0:
            return
        try:
            values = importlib.import_module("jax").config.values
            if compile_s < float(values.get("jax_persistent_cache_min_compile_time_secs", 0)):
                return
            value = entry_value(self._cc, serialized, compile_s)
            if len(value) < int(values.get("jax_persistent_cache_min_entry_size_bytes", 0)):
                return
            put(key, value, compile_s, digest)
            self._writer.measured(key, size=len(value))
        except Exception as exc:
            self._warn("putting what was compiled ahead", key, exc)

    def _deserialize(self, slot: Slot) -> None:
        """Deserialize ``slot``'s fetched executable with the backend (off the lock)."""
        slot.started_at = time.perf_counter()
        with self._meter.deserializing(slot.steps):
            executable = _loads.deserialize(slot, self._backend, self._form)
        with self._cond:
            if not (slot.compiled and self._puts_ahead()):
                slot.serialized = None  # one compiled ahead is put once taken
            if self._closed:
                self._release(slot)
                return
            slot.executable = executable
            slot.loaded_at = time.perf_counter()
            slot.state = State.LOADED
            self._costs.add(slot.size, slot.steps.load_wall)
            if self._costs.samples >= 2 * self._ordered_at or self._costs.samples == 1:
                self._reschedule()
            self._cond.notify_all()
        if not slot.compiled:
            self._count([("loaded", 1)])

    # -------------------------------------------------------------- the session's upkeep

    def _tend(self) -> None:
        """Once the backend is applied: write the plan when it is due, release what was
        loaded and not taken once the run stops asking; until closed."""
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                deadlines = []
                due = self._writer.due()
                write = due is not None and now >= due
                if due is not None and not write:
                    deadlines.append(due)
                release: list[Slot] = []
                idle = max(self._last_take, self._last_read) + IDLE_RELEASE_S
                if now >= idle and not self._busy:
                    held = [s for s in self._slots.values() if s.state is State.LOADED]
                    if held or self._fetched:
                        # The run stopped asking: the plan ends here, what it loaded and
                        # was not taken is let go, and nothing more is loaded.
                        release = held
                        for slot in held:
                            self._release(slot)
                        self._end_queue()
                elif not self._ended:
                    deadlines.append(max(idle, now + 1.0))
                puts, self._puts = self._puts, []
                if not write and not release and not puts:
                    timeout = max(0.05, min(deadlines) - now) if deadlines else None
                    self._upkeep.wait(timeout)
                    continue
            for put in puts:
                self._put_compiled(*put)
            if release:
                self._count([("wasted", len(release))])
            if write:
                self._writer.write()

    # -------------------------------------------------------------- the end

    def close(self, *, at_exit: bool = False) -> None:
        """Stop loading, wait (bounded) for loads in progress, release what was not taken
        (wasted), and write the plan if it changed (or, ``at_exit`` of a run that ended
        without an exception, if the run keeps a variant of its own). Idempotent; what
        JAX's cache reset and the exit hook call."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            if self._closed:
                return
        if self.ahead is not None:
            # First: the compiler process is killed (the exit waits for no compile).
            self.ahead.close()
        with self._cond:
            if self._closed:
                return
            self._end_queue()
            self._closed = True
            self._cond.notify_all()
            self._jobs.notify_all()
            self._upkeep.notify_all()
            self._cond.wait_for(lambda: self._busy == 0, CLOSE_WAIT_S)
            held = [s for s in self._slots.values() if s.state is State.LOADED]
            for slot in held:
                self._release(slot)
            puts, self._puts = self._puts, []
            # What the compiler process (killed) had: JAX compiles it, if a read still comes.
            unread = self._compiled_unread()
            for slot in self._slots.values():
                if slot.state is State.COMPILING:
                    slot.state = State.MISSING
        for put in puts:
            self._put_compiled(*put)
        self._count([("wasted", len(held))])
        if unread:
            self._writer.unread(unread)
        # The plan written if it changed, or noted as used (it ages with what it names).
        self._writer.close(whole=at_exit and not run_failed())
        if self.ahead is not None:
            self.ahead.touch(self._writer.keys_read())
        with _sessions_lock:
            _sessions.discard(self)
        try:
            self.store.flush()
        except Exception as exc:
            logger.debug("xla_pcache: flushing the counters failed: %s", exc)

    def _compiled_unread(self) -> frozenset[str]:
        """Keys whose executables the store lacks, compiled ahead (or compiling, or refused)
        for nothing: never read, though the run read keys its plan names after them (a run
        stopped early, which never got there, drops none). Under the lock."""
        read = self._writer.keys_read()
        order = self._order
        last = max((order[k] for k in read if k in order), default=-1)
        seen = set(read)
        return frozenset(
            k
            for k, s in self._slots.items()
            if (s.compiled or s.state in (State.COMPILING, State.MISSING))
            and k not in seen
            and order.get(k, last) < last
        )

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
