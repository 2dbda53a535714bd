"""JAX: loading ahead, the session's hand-over to and from compiling ahead (``_compiling``).
An entry the store lacks is handed to the compiler process from its record; what comes back
is queued as fetched, for the same workers to load; a read of a key the process has not
started takes it back, one it is compiling waits for it; what was compiled ahead and taken is
put as JAX would have put it; and what was compiled for a run that went past it is named for
the plan's writer (``PlanWriter.unread``).
"""

from __future__ import annotations

import bisect
import importlib

from xla_pcache import _testhook
from xla_pcache.jax.ahead import _plan
from xla_pcache.jax.ahead._compiling import entry_value
from xla_pcache.jax.ahead._loads import PENDING, Slot, State
from xla_pcache.jax.ahead._session_state import SessionState, loading_order

# How long a read waits for its program compiling ahead (the compiler process stuck is found
# sooner: ``ahead._link.STALL_S``).
COMPILE_WAIT_S = 600.0


class Handover(SessionState):
    """The session's side of compiling ahead (``_compiling.Owner``, and what its reads and
    workers hand over)."""

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
            bisect.insort(self._fetched, slot, key=loading_order)
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
                bisect.insort(self._fetched, slot, key=loading_order)
                self._jobs.notify()
            self._cond.wait_for(
                lambda: slot.state not in (*PENDING, State.COMPILING) or self._closed,
                COMPILE_WAIT_S,
            )

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
