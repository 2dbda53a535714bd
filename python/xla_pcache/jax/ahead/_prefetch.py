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
the hit the store would have, and the main-thread time it spared (``_session_report``); one
never taken is wasted when the run stops asking (``_session_life.IDLE_RELEASE_S``) or at
exit. Fetching waits while ``XLA_PCACHE_PREFETCH_MEMORY`` bytes are held. A failure in the
background is a miss and a counter, never an exception.

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

What the run read is recorded, and the plan written when it differs from what is stored
(``_plan_writer``). Every key the session gives the store carries this process's runtime
build (``xla_pcache.builds``), so that nothing another build compiled is ever loaded ahead;
the plan's key does not (one plan per workload, whatever the build).

The session is one object, a class for each part over what it holds (``_session_state``):
the hand-over to and from compiling ahead (``_handover``), the loading pool and its order
(``_pool``), its life from the beginning to the close (``_session_life``), what it served
and its report (``_session_report``), and here JAX's read of a key.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.jax.ahead import _plan
from xla_pcache.jax.ahead._loads import PENDING, Slot, State
from xla_pcache.jax.ahead._session_life import SessionLife
from xla_pcache.jax.ahead._session_report import SessionReport
from xla_pcache.jax.ahead._session_state import loading_order

logger = package_logger("xla_pcache.jax")

# How long a read waits for its executable still loading before going JAX's own way, and
# how long the first read waits for the plan to be read and the backend applied.
LOAD_WAIT_S = 120.0
PLAN_WAIT_S = 2.0
# Reads whose options are kept for the put after a miss (JAX puts right after it compiles).
_RECENT_READS = 256


class Prefetch(SessionLife, SessionReport):
    """Loading ahead for one store (``xla_pcache.jax`` makes one at installation and hands
    it to the store cache JAX builds; the hook finds it as the cache's ``prefetch``)."""

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
                bisect.insort(pending, slot, key=loading_order)
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
