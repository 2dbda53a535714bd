"""JAX: compiling ahead. What a program's compile takes is recorded when JAX compiles it (a
module record, ``_module_record``); when a later run's plan names an executable the store no
longer has (evicted by the budget, pruned, or made by another build of the runtime), its
program is compiled from the record on a thread pool while the run goes on, and handed to
JAX when JAX compiles that program: only for a module, compile options and devices
byte-identical to the record's.

Recording. JAX's compile function is wrapped (``_compile_hook``); each compile under this
package's store cache serializes the module it is handed (as JAX itself does for its key) and
keeps it, with the serialized options and the devices, for the put that follows on the same
thread (``_compile_and_write_cache`` compiles, then puts): ``stored`` writes the record under
the put's key (``record_key``) beside the executable. A program JAX does not put (below its
thresholds, another process than 0) is not recorded; nor a program with host callbacks, one
over the record's bounds, or anything in a read-only process.

Compiling ahead. The session of loading ahead (``_prefetch``) calls ``absent`` for each
entry it was to load that the store does not have (only what the run's candidate variants
all hold, then the one left's: never every variant's programs); once the backend is up
(``backend_up``, as loads wait for it), a worker reads its record through the store (its one
gate: checksums, signatures, trust; a record a trusting store would not serve is never
seen), decodes it strictly (``_module_record.decode``: a record refused is counted and
warned about once), and compiles it on the session's backend as JAX would have. When JAX then
compiles, the wrapper computes the digest of what JAX hands its backend (module bytecode,
serialized options, device ids) and takes a compiled program only of that digest (waiting for
one still compiling); anything else compiles as before. So a planted or stale record can at
worst make a worker compile a program no one runs: what JAX runs is what JAX would have
compiled. The put that follows stores it as any entry (JAX's own write path: signed when the
store signs), with the compile time the worker measured.

Bounds. ``threads`` workers (non-daemon, below), each one program at a time; a compile starts
only while the job has more memory available than ``reserve`` (the least of Linux's
``MemAvailable`` and each cgroup limit over the process less its use, ``_memory``), and at
most one compiled program per worker is held until JAX takes it. A failure in the
background is a counter and one warning per kind, never an exception in the program.

The end. XLA cannot stop a compile, and a daemon thread that returns from one into a
finalizing interpreter aborts the process (measured: Python 3.11, JAX 0.10.2, exit status
134). So the workers are not daemons: when the interpreter begins to shut down they start
nothing more (``threading``'s shutdown callbacks, before it joins its threads), and the exit
waits for the compiles in flight, each at most what JAX's own compile of that program takes.
They exist only while there is something to compile.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable
from typing import Any

from xla_pcache import _memory, _testhook, build_key
from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax import _compile_hook, _plan
from xla_pcache.jax._module_record import (
    META_KIND,
    META_MODULE,
    Record,
    RecordError,
    decode,
    encode,
    program_name,
    record_key,
)
from xla_pcache.misslog import META_COMPILE_TIME
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")

# How long JAX's compile waits for the same program still compiling ahead before compiling
# it itself (it would take as long again: only a stuck compile reaches this).
HANDOVER_WAIT_S = 600.0
# How long a miss of a key whose record a worker is reading waits for it to be compiling
# (a local read; a bucket path's fetch).
PREPARE_WAIT_S = 10.0
# How often a worker waiting for memory, or for its compiled programs to be taken, looks
# again (and whether the interpreter is shutting down).
POLL_S = 1.0
# Seconds without a compiled program taken, with every worker's place held, before what was
# compiled and not taken is let go and nothing more is compiled (the run stopped asking).
IDLE_RELEASE_S = 300.0
# Records touched at the end, at most (the keys a plan's variant holds).
MAX_TOUCHED = 4096

_local = threading.local()
# Set by the wrapper at each compile it sees (the pending put's state when it records nothing).
_SEEN = object()


class _State(enum.Enum):
    COMPILING = "compiling"
    READY = "ready"
    TAKEN = "taken"
    FAILED = "failed"
    RELEASED = "released"


class _Slot:
    __slots__ = ("compile_s", "executable", "key", "state")

    def __init__(self, key: str) -> None:
        self.key = key
        self.state = _State.COMPILING
        self.executable: Any = None
        self.compile_s = 0.0


@dataclasses.dataclass(slots=True, eq=False)
class _Pending:
    """A compile just made on this thread, for the put that follows it."""

    owner: CompileAhead
    name: str | None
    digest: bytes
    record: Record | None
    # Set when the executable was compiled ahead: the time that compile took.
    compile_s: float | None


_live: weakref.WeakSet[CompileAhead] = weakref.WeakSet()
_live_lock = threading.Lock()
_registered = False
_shutting_down = False


def _stop_all() -> None:
    """The interpreter is shutting down: start no compile more (before it joins threads)."""
    global _shutting_down
    _shutting_down = True
    with _live_lock:
        live = list(_live)
    for ahead in live:
        ahead.stop()


def _register(ahead: CompileAhead) -> None:
    global _registered
    with _live_lock:
        _live.add(ahead)
        if _registered:
            return
        _registered = True
    # Closed by its session (at exit too); here only told to start nothing more, before the
    # interpreter joins its threads.
    register = getattr(threading, "_register_atexit", None)
    if callable(register):
        try:
            register(_stop_all)
        except RuntimeError:  # already shutting down
            _stop_all()


def _main_alive() -> bool:
    return not _shutting_down and threading.main_thread().is_alive()


def available_memory() -> int | None:
    """The memory this job has available (the host's, and its cgroups' limits less their
    use: ``_memory``), or None."""
    return _memory.available()


class CompileAhead:
    """Recording and compiling ahead for one loading-ahead session (``xla_pcache.jax`` makes
    one with each session, which closes it; the store cache JAX uses holds it as ``ahead``,
    where the compile wrapper finds it)."""

    def __init__(
        self,
        store: Store,
        xc: Any,
        *,
        form: int,
        threads: int,
        reserve: int,
        writes: bool,
        meta: dict[str, str] | None = None,
    ) -> None:
        self._store = store
        self._xc = xc
        # Options as JAX's cache key sees them: what records keep, compiles ahead use and
        # hand-overs compare.
        self._normalize = _compile_hook.options_normalizer()
        self._form = form
        self._threads = max(1, threads)
        self._reserve = max(0, reserve)
        # The runtime build an executable's store key carries (not a record's), known with
        # the backend (``backend_up``).
        self._build: str | None = None
        # A read-only store (or one told so) records nothing and touches nothing.
        self._writes = writes and not store.read_only
        self._meta = {k: v for k, v in (meta or {}).items() if k in ("framework_version",)}
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._warn = FirstWarning(
            logger, "compiling {key} ahead failed ({what}); it is compiled as before"
        )
        self._backend: Any = None
        self._closed = False
        # What to compile ahead, in the plan's order (a heap of (place, key)): ``_waiting``
        # holds the keys in it not yet taken; ``_queued`` every key ever given.
        self._queue: list[tuple[int, str]] = []
        self._waiting: set[str] = set()
        self._queued: set[str] = set()
        # Keys a worker took from the queue and has not yet started compiling (or dropped).
        self._preparing: set[str] = set()
        self._workers = 0
        # Compiles ahead by the digest of their inputs; the digests JAX compiled itself; the
        # keys JAX put (compiled, ahead or not); the digest of each record read, by key.
        self._slots: dict[bytes, _Slot] = {}
        self._main: set[bytes] = set()
        self._done: set[str] = set()
        self._read: dict[str, bytes] = {}
        self._held = 0
        self._memory_waits = 0
        self._warned_refused = False
        self._last_take = time.monotonic()
        _register(self)

    # ------------------------------------------------------------ from the loading session

    def absent(self, key: str, place: int | None) -> None:
        """An executable the session was to load that the store does not have: compile its
        program ahead, from its record, once the backend is up; ``place`` is its place in
        the order the recorded run read it (the loading threads find entries absent in any
        order). Returns at once."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            if self._closed or key in self._queued or key in self._done:
                return
            if not self._waiting:
                self._last_take = time.monotonic()
            self._queued.add(key)
            self._waiting.add(key)
            at = place if place is not None else _plan.MAX_ENTRIES + len(self._queued)
            heapq.heappush(self._queue, (at, key))
        self._start()

    def backend_up(self, backend: Any, build: str | None, wanted: Collection[str]) -> None:
        """The session's backend is up (JAX's compile of a program is handed the result
        only on it), with the runtime ``build`` (its digest): compiling can start. Of the keys
        given so far, only those the session still wants are compiled (the variants of
        another platform are no candidates)."""
        with self._cond:
            if self._backend is None:
                self._backend, self._build = backend, build
            elif backend is not self._backend:
                return
            self._waiting &= set(wanted)
            self._cond.notify_all()
        self._start()

    def _start(self) -> None:
        """Workers for what waits, once there is a backend, up to ``threads``."""
        with self._cond:
            start = 0
            if self._backend is not None and not self._closed:
                start = max(0, min(self._threads - self._workers, len(self._waiting)))
            self._workers += start
            self._cond.notify_all()
        for _ in range(start):
            # Not a daemon (see the module's docstring); nor inheriting the session's flag.
            thread = threading.Thread(
                target=self._work, name="xla_pcache-compile-ahead", daemon=False
            )
            try:
                thread.start()
            except RuntimeError as exc:  # the interpreter is shutting down
                with self._cond:
                    self._workers -= 1
                    self._cond.notify_all()
                logger.debug("xla_pcache: no thread to compile ahead: %s", exc)

    # ------------------------------------------------------------ JAX's compile, on its thread

    def missed(self, key: str) -> None:
        """JAX's read of ``key`` missed: JAX compiles it next, on this thread. Not yet taken
        by a worker, it is JAX's alone (no compile ahead of it); being read by one, this waits
        (bounded) until it is compiling, so that JAX's compile finds it."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            given = key in self._queued and key not in self._done
        if given:
            # A test lets the workers take what they were given first (nothing outside a
            # test build).
            _testhook.hold("compile-ahead-take")
        with self._cond:
            if key not in self._queued or key in self._done:
                return
            # For the compile that follows: the key it is of (``_let_go``).
            _local.missed = (self, key)
            if key in self._waiting:
                self._waiting.discard(key)
                self._done.add(key)
                return
            self._cond.wait_for(lambda: key not in self._preparing or self._closed, PREPARE_WAIT_S)

    def compiling(
        self,
        original: Callable[..., Any],
        form: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """JAX's compile ``original(*args, **kwargs)``: the program compiled ahead from
        byte-identical inputs when there is one, else JAX's; never an exception of ours."""
        prepared = None
        if os.getpid() == self._pid:
            try:
                prepared = self._prepare(_compile_hook.bind(form, args, kwargs))
            except Exception as exc:
                self._warn("reading what JAX compiles", "", exc)
        _local.pending = _SEEN
        if prepared is None:
            return original(*args, **kwargs)
        digest, name, record, backend = prepared
        with self._cond:
            active = self._active()
        if active:
            # A test lets the workers finish first (nothing outside a test build).
            _testhook.hold("compile-ahead-take")
        taken = None
        try:
            taken = self._take(digest, backend)
        except Exception as exc:
            self._warn("handing over", name or "", exc)
        if taken is not None:
            executable, compile_s = taken
            _local.pending = _Pending(self, name, digest, None, compile_s)
            self._count([("compiled_used", 1)])
            return executable
        self._let_go(name)
        executable = original(*args, **kwargs)
        if record is not None:
            _local.pending = _Pending(self, name, digest, record, None)
        return executable

    def _prepare(
        self, call: dict[str, Any] | None
    ) -> tuple[bytes, str | None, Record | None, Any] | None:
        if call is None or call["host_callbacks"]:
            return None  # callbacks are bound in the process: never recorded nor handed over
        with self._cond:
            wanted = self._writes or self._active()
        if not wanted:
            return None  # nothing to record nor to hand over: no cost
        module = call["module"]
        record = Record(
            _compile_hook.module_bytecode(module),
            self._normalize(call["options"]),
            _compile_hook.device_ids(call.get("executable_devices")),
        )
        if not record.within_bounds():
            return None
        kept = record if self._writes else None
        return record.digest(), _compile_hook.module_name(module), kept, call["backend"]

    def _let_go(self, name: str | None) -> None:
        """JAX compiles the key its read just missed, and nothing compiled ahead was of it:
        what was compiled ahead from that key's record (stale, or planted) is let go, so that
        it holds no worker's place."""
        missed = getattr(_local, "missed", None)
        _local.missed = None
        if not isinstance(missed, tuple) or missed[0] is not self:
            return
        key = missed[1]
        if name is not None and name != program_name(key):
            return
        with self._cond:
            # One still compiling is let go when it ends.
            self._done.add(key)
            self._waiting.discard(key)
            slot = self._slots.get(self._read.get(key, b""))
            if slot is not None and slot.state is _State.READY:
                slot.executable = None
                slot.state = _State.RELEASED
                self._held -= 1
                self._cond.notify_all()

    def _active(self) -> bool:
        """Whether compiling ahead has work or results (under the lock)."""
        return bool(self._waiting or self._slots or self._workers)

    def _take(self, digest: bytes, backend: Any) -> tuple[Any, float] | None:
        with self._cond:
            slot = self._slots.get(digest)
            if slot is None or backend is not self._backend:
                if self._active():
                    # No worker is to compile what JAX compiles now.
                    self._main.add(digest)
                return None
            self._cond.wait_for(
                lambda: slot.state is not _State.COMPILING or self._closed, HANDOVER_WAIT_S
            )
            if slot.state is not _State.READY:
                self._main.add(digest)
                return None
            executable, compile_s = slot.executable, slot.compile_s
            slot.executable = None
            slot.state = _State.TAKEN
            self._held -= 1
            self._last_take = time.monotonic()
            self._cond.notify_all()
            return executable, compile_s

    def stored(self, key: str, meta: dict[str, str]) -> dict[str, str]:
        """For JAX's put of ``key`` (on the thread that compiled it): its metadata, with the
        compile time of a program compiled ahead; and the record of what was compiled,
        written beside it. Never raises."""
        pending = getattr(_local, "pending", None)
        _local.pending = None
        if pending is None:
            pending = self._unseen(key)
        if not isinstance(pending, _Pending) or pending.owner is not self:
            return meta
        if pending.name is not None and pending.name != program_name(key):
            return meta  # not this put's compile (JAX puts right after it compiles)
        with self._cond:
            if key in self._queued:
                self._done.add(key)
                self._waiting.discard(key)
            # A record read this run that is not what JAX compiled: stale, or planted. What
            # was compiled from it is let go (JAX compiled the key's program).
            read = self._read.get(key, pending.digest)
            stale = read != pending.digest
            slot = self._slots.get(read) if stale else None
            if slot is not None and slot.state is _State.READY:
                slot.executable = None
                slot.state = _State.RELEASED
                self._held -= 1
                self._cond.notify_all()
        if pending.compile_s is not None:
            return {**meta, META_COMPILE_TIME: f"{pending.compile_s:.6f}"}
        if pending.record is not None and self._writes:
            self._write_record(key, pending.record, stale=stale)
        return meta

    def _unseen(self, key: str) -> _Pending | None:
        """For the put of a compile the wrapper did not see (``_compile_hook.unseen_call``):
        its record, from JAX's own frame. Never raises."""
        try:
            call = _compile_hook.unseen_call(self._form, key)
            prepared = self._prepare(call) if os.getpid() == self._pid else None
        except Exception as exc:
            self._warn("reading what JAX compiled", key, exc)
            return None
        if prepared is None:
            return None
        digest, name, record, _backend = prepared
        return _Pending(self, name, digest, record, None)

    def _write_record(self, key: str, record: Record, *, stale: bool) -> None:
        """Put ``record`` under ``key``'s record key: in place of a record that was read and
        compiled something JAX did not compile (stale, or planted), else only when none is
        there (first writer wins, as for entries)."""
        rkey = record_key(key)
        try:
            data = encode(record)
            meta = {"kind": META_KIND, "framework": "jax", META_MODULE: program_name(key)}
            meta.update(self._meta)
            if stale:
                self._store.replace(rkey, data, meta=meta)
            elif rkey not in self._store:
                self._store.put(rkey, data, meta=meta)
        except Exception as exc:
            self._warn("recording", key, exc)

    # ------------------------------------------------------------ the workers

    def _work(self) -> None:
        counted = False
        try:
            while True:
                with self._cond:
                    key = self._next()
                    if key is None:
                        # In the same hold of the lock as the empty queue was seen: a key
                        # given meanwhile finds this worker gone and starts another.
                        counted = True
                        self._workers -= 1
                        idle = not self._workers and not self._waiting
                        self._cond.notify_all()
                        break
                try:
                    self._compile_ahead(key)
                except Exception as exc:
                    self._warn("compiling", key, exc)
                    self._count([("errors", 1)])
                finally:
                    self._prepared(key)
        finally:
            if not counted:
                with self._cond:
                    self._workers -= 1
                    self._cond.notify_all()
        if idle:
            _testhook.reached("compile-ahead-idle")

    def _next(self) -> str | None:
        """The next key to compile (under the lock), once the memory bound allows; None: the
        queue is done, or the run or the interpreter ended."""
        waited = False
        while True:
            if self._closed or not self._waiting or not _main_alive():
                return None
            if self._held >= self._threads:
                if time.monotonic() - self._last_take > IDLE_RELEASE_S:
                    # The run stopped asking: what it did not take is let go, and that is all.
                    self._release_ready()
                    self._waiting.clear()
                    return None
            else:
                available = available_memory() if self._reserve else None
                if available is None or available > self._reserve:
                    _, key = heapq.heappop(self._queue)
                    if key not in self._waiting:
                        continue
                    self._waiting.discard(key)
                    self._preparing.add(key)
                    return key
                if not waited:
                    waited = True
                    self._memory_waits += 1
                    logger.debug(
                        "xla_pcache: compiling ahead waits for memory (%d bytes available, "
                        "%d kept free)",
                        available,
                        self._reserve,
                    )
            self._cond.wait(POLL_S)

    def _prepared(self, key: str) -> None:
        """``key`` is compiling, or will not be: a miss of it waits no more."""
        with self._cond:
            if key in self._preparing:
                self._preparing.discard(key)
                self._cond.notify_all()

    def _compile_ahead(self, key: str) -> None:
        store, backend = self._store, self._backend
        if build_key.join(key, self._build) in store:
            return  # it is back (another process compiled it)
        blob = store.get(record_key(key), count=False)
        if blob is None:
            return  # never recorded, or not one this store would serve
        try:
            record = decode(memoryview(blob))
            # Its options as this process's JAX sees them: whatever a writer put there that
            # only says where XLA writes dumps or caches is not compiled with.
            try:
                options = self._normalize(self._xc.CompileOptions.ParseFromString(record.options))
            except Exception as exc:
                raise RecordError(f"its compile options cannot be read ({exc})") from exc
            record = Record(record.module, options, record.devices)
        except RecordError as exc:
            with self._cond:
                self._read[key] = b"refused"
            self._refused(key, exc)
            return
        finally:
            del blob
        digest = record.digest()
        with self._cond:
            self._read[key] = digest
            if self._closed or digest in self._slots or digest in self._main:
                return  # JAX compiled it, or it is compiling, or already ahead
            slot = _Slot(key)
            self._slots[digest] = slot
            self._preparing.discard(key)
            self._cond.notify_all()
        try:
            executable, compile_s = _compile_hook.compile_record(
                backend, self._form, record, self._xc
            )
        except Exception as exc:
            with self._cond:
                slot.state = _State.FAILED
                self._cond.notify_all()
            self._warn("compiling", key, exc)
            self._count([("errors", 1)])
            return
        with self._cond:
            if self._closed or key in self._done:
                slot.state = _State.RELEASED
            else:
                slot.executable, slot.compile_s = executable, compile_s
                slot.state = _State.READY
                self._held += 1
            self._cond.notify_all()
        self._count([("compiled", 1)])

    def _release_ready(self) -> None:
        """Let go every compiled program not taken (under the lock)."""
        for slot in self._slots.values():
            if slot.state is _State.READY:
                slot.executable = None
                slot.state = _State.RELEASED
        self._held = 0
        self._cond.notify_all()

    def _refused(self, key: str, exc: RecordError) -> None:
        """A record ``decode`` refused: counted, and one warning a process (then debug)."""
        with self._cond:
            first = not self._warned_refused
            self._warned_refused = True
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "xla_pcache: the module record of %r in %s is refused (%s); its program is "
            "compiled as before%s",
            key,
            self._store.path,
            exc,
            " (further refusals are logged at debug level)" if first else "",
        )
        self._count([("modules_refused", 1)])

    # ------------------------------------------------------------ the end

    def stop(self) -> None:
        """Start nothing more (the interpreter is shutting down); what is in flight ends."""
        with self._cond:
            self._queue.clear()
            self._waiting.clear()
            self._cond.notify_all()

    def close(self, used: Iterable[str] = ()) -> None:
        """Stop compiling ahead, let go what was compiled and not taken, and touch the
        records of the keys the run ``used`` (after its hits: a record is then younger than
        its executable, and is evicted after it). Idempotent; the compiles in flight end on
        their threads."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._waiting.clear()
            self._release_ready()
            self._cond.notify_all()
        with _live_lock:
            _live.discard(self)
        if not self._writes:
            return
        try:
            for key in itertools.islice(used, MAX_TOUCHED):
                self._store.touch(record_key(key))
            self._store.flush()
        except Exception as exc:
            logger.debug("xla_pcache: touching the module records failed: %s", exc)

    def _count(self, counts: list[tuple[str, int]]) -> None:
        try:
            self._store.add_prefetch_counters([(c, n) for c, n in counts if n])
        except Exception as exc:
            logger.debug("xla_pcache: counting %s failed: %s", counts, exc)

    def report(self) -> dict[str, Any]:
        """What compiling ahead did in this process (for tests and the bench)."""
        with self._cond:
            states = collections.Counter(s.state.value for s in self._slots.values())
            return {
                "states": dict(states),
                "queued": len(self._waiting),
                "held": self._held,
                "compiled_by_jax": len(self._main),
                "records_read": len(self._read),
                "memory_waits": self._memory_waits,
                "reserve": self._reserve,
            }
