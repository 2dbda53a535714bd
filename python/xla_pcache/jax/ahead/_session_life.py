"""JAX: loading ahead, a session's life: begun once (at installation, or by the first read),
its thread reads the plan, waits for the backend and applies it, then keeps the session
(writes the plan when due, lets go of what the run stopped asking for) until it is closed,
by JAX's cache reset or at exit.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from xla_pcache import builds
from xla_pcache._text import package_logger
from xla_pcache.jax.ahead import _plan, _plan_name
from xla_pcache.jax.ahead._backend_wait import process_index
from xla_pcache.jax.ahead._loads import Slot, State
from xla_pcache.jax.ahead._plan_writer import run_failed
from xla_pcache.jax.ahead._pool import Pool
from xla_pcache.jax.ahead._recognition import Recognition

logger = package_logger("xla_pcache.jax")

# Seconds without a take, once loading is done, before what was loaded and not taken is
# released and counted wasted.
IDLE_RELEASE_S = 300.0
# How long the exit hook waits for loads in progress.
CLOSE_WAIT_S = 10.0


_sessions: weakref.WeakSet[SessionLife] = weakref.WeakSet()
_sessions_lock = threading.Lock()
_exit_registered = False


def _close_all_at_exit() -> None:
    with _sessions_lock:
        sessions = list(_sessions)
    for session in sessions:
        session.close(at_exit=True)


class SessionLife(Pool):
    """A session's beginning, its thread, and its end."""

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
            if self._loads_for is not None:
                self._loads = max(1, min(self._threads, self._loads_for(platform)))
            # A TPU runtime runs that many deserializes side by side, each at its own speed;
            # XLA's CPU client shares one pool among them all (``_loads.Meter``).
            self._meter.side_by_side = self._loads if platform == "tpu" else 1
            assert self._recog is not None
            self._recog.restrict(platform, count)
            wanted = {e.key for e in self._recog.wanted()}
            # What was fetched for variants of another platform is let go.
            self._drop([s for k, s in self._slots.items() if k not in wanted])
            # The order so far was worked out for every thread: now for as many as
            # deserialize at once.
            if not self._enqueue():
                self._reschedule()
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
