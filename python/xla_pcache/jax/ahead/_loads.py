"""JAX: loading one planned executable ahead, in two steps: fetching it (read through the
store's gate, checked against what its producer compiled it for, decompressed and split by
JAX's own functions: no backend needed) and deserializing it with the backend. What the
session (``_prefetch``) keeps of each (``Slot``), and the CPU and wall time each step took
in CPU time (``CpuShare``): what the read would have cost the main thread; its wall time
there also counts waiting for the cores and the GIL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import importlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from xla_pcache.jax.ahead import _plan
from xla_pcache.store import Store


class EntryUnusable(Exception):
    """An entry whose payload JAX's own functions cannot decompress or split."""


class State(enum.Enum):
    QUEUED = "queued"
    FETCHING = "fetching"
    # Read and decompressed, waiting for the backend (or a worker) to deserialize it.
    FETCHED = "fetched"
    LOADING = "loading"
    LOADED = "loaded"
    TAKEN = "taken"
    # The main thread read it first, or it was read before the plan was.
    SKIPPED = "skipped"
    MISSING = "missing"
    # Absent from the store, with the compiler process (``ahead._compiling``).
    COMPILING = "compiling"
    FAILED = "failed"
    RELEASED = "released"


PENDING = (State.QUEUED, State.FETCHING, State.FETCHED, State.LOADING)


class Slot:
    """One planned executable and what is held of it. While a worker fetches or
    deserializes it (``FETCHING``, ``LOADING``) only that worker writes its fields."""

    __slots__ = (
        "blob",
        "compile_s",
        "compiled",
        "cpu_s",
        "dropped",
        "entry",
        "executable",
        "loaded_at",
        "nbytes",
        "options",
        "serialized",
        "state",
        "time",
        "urgent",
        "wall_s",
    )

    def __init__(self, entry: _plan.Entry) -> None:
        self.entry = entry
        # The digest of the plan's compile options as JAX's key sees them (once fetched).
        self.options = b""
        self.state = State.QUEUED
        self.urgent = False
        # Not wanted any more (its variant is not a candidate): let go once fetched.
        self.dropped = False
        self.serialized: Any = None
        self.executable: Any = None
        self.time: Any = None
        self.blob: Any = None
        self.nbytes = 0
        # The load's CPU time (``CpuShare``) and its wall time on the worker(s).
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.loaded_at = 0.0
        # Compiled ahead (its executable from the compiler process, not the store), in
        # how many seconds.
        self.compiled = False
        self.compile_s = 0.0


class CpuShare:
    """What each load step costs in CPU time, wherever it runs: the process's CPU time, less
    the main thread's, shared equally among the steps in progress.

    A load's own thread is not where its cost is: on CPU, XLA deserializes on its own thread
    pool while the calling thread waits (measured on jax 0.10.2: a read on the main thread
    spends 4 % of its CPU time in that thread, and about as much process CPU time as it
    takes wall time when the machine is idle). The wall time a step takes on a worker is
    no measure either: it also counts waiting for cores and for the GIL, which the main
    thread busy tracing holds (measured: 2-7 times the process CPU time). So every step's
    start and end samples the process's CPU time and the main thread's, and what the other
    threads used in between is shared by the steps then in progress. It counts the CPU time
    of whatever else the program runs off its main thread meanwhile (a computation's
    threads, a data loader) too, so each step's share is capped by its wall time: a load
    cannot have cost more than it took."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._main: int | None = None
        try:
            ident = threading.main_thread().ident
            if ident is not None:
                clock = time.pthread_getcpuclockid(ident)
                time.clock_gettime(clock)
                self._main = clock
        except (AttributeError, OSError):
            self._main = None  # no per-thread clocks here: each step's own thread is counted
        self._active: dict[int, float] = {}
        self._steps = itertools.count()
        self._last = self._sample()

    def _sample(self) -> float:
        """The CPU time of every thread but the main one."""
        main = time.clock_gettime(self._main) if self._main is not None else 0.0
        return time.process_time() - main

    def _advance(self) -> None:
        now = self._sample()
        if self._active:
            share = max(0.0, now - self._last) / len(self._active)
            for step in self._active:
                self._active[step] += share
        self._last = now

    @contextlib.contextmanager
    def timed(self, slot: Slot, *, own_thread: bool = False) -> Iterator[None]:
        """Adds the block's share of CPU time (at most its wall time) and its wall time to
        ``slot``. With ``own_thread`` (a step that runs on its own thread: the fetch, read
        and decompressed there) the step's own thread's CPU time is counted instead: a
        share would also count what other threads burn meanwhile (a TPU backend's start,
        7-10 s of many threads, overlaps the fetches), and the step still takes its slice
        of the others' time, so that none of it goes to the steps sharing it."""
        cpu, start = time.thread_time(), time.perf_counter()
        step = next(self._steps)
        if self._main is not None:
            with self._lock:
                self._advance()
                self._active[step] = 0.0
        try:
            yield
        finally:
            wall = time.perf_counter() - start
            used = time.thread_time() - cpu
            if self._main is not None:
                with self._lock:
                    self._advance()
                    share = self._active.pop(step)
                if not own_thread:
                    used = share
            slot.cpu_s += min(wall, used)
            slot.wall_s += wall


def xla_client() -> Any:
    """JAX's handle on jaxlib's client module (CompileOptions, DeviceList)."""
    return importlib.import_module("jax._src.lib").xla_client


def options_digester() -> Callable[[Any, Any], Any] | None:
    """JAX's ``cache_key._hash_serialized_compile_options(hash_obj, options)``, or None."""
    try:
        module = importlib.import_module("jax._src.cache_key")
    except ImportError:
        return None
    fn = getattr(module, "_hash_serialized_compile_options", None)
    return fn if callable(fn) else None


def normalized(digest: Callable[[Any, Any], Any] | None, options: Any) -> bytes:
    """``options`` as JAX's cache key sees them: JAX's own digest of the serialized options
    less the fields it says do not change what is compiled (dump flags, the path of XLA's
    autotune cache, which follows the cache's path on jax >= 0.11), device assignment kept;
    the serialized options themselves on a JAX without it."""
    if digest is None:
        return bytes(options.SerializeAsString())
    h = hashlib.sha256()
    digest(h, options)
    return h.digest()


@dataclasses.dataclass
class Fetched:
    serialized: Any
    compile_time: Any
    blob: Any
    options: bytes


def fetch(
    entry: _plan.Entry,
    store: Store,
    store_key: str,
    cc: Any,
    digest: Callable[[Any, Any], Any] | None,
) -> Fetched | None:
    """``entry`` read (``store_key``: its key with the build, ``build_key.join``) and decompressed;
    None when the store has no such entry. ``ValueError`` when its producer compiled it for
    other options or devices than the plan's, ``EntryUnusable`` when JAX cannot decompress
    or split it."""
    blob = store.get(store_key, count=False)
    if blob is None:
        return None
    options = normalized(digest, xla_client().CompileOptions.ParseFromString(entry.options))
    bound = blob.meta.get(_plan.META_LOAD_DIGEST)
    if bound is not None and bound != _plan.load_digest(options, entry.devices):
        raise ValueError(
            "the plan's compile options or devices for it are not the ones it was compiled for"
        )
    try:
        serialized, compile_time = cc.extract_executable_and_time(
            cc.decompress_executable(memoryview(blob))
        )
    except Exception as exc:
        raise EntryUnusable(f"{type(exc).__name__}: {exc}") from exc
    return Fetched(serialized, compile_time, blob, options)


def deserialize(slot: Slot, backend: Any, form: int) -> Any:
    """``slot``'s fetched executable deserialized by ``backend`` with the plan's compile
    options and devices (``form``: that of JAX's ``get_executable_and_time``)."""
    xc = xla_client()
    made_for = slot.blob.meta.get("backend") if slot.blob is not None else None
    if made_for is not None and made_for != str(backend.platform):
        raise ValueError(f"the entry was made for {made_for}")
    options = xc.CompileOptions.ParseFromString(slot.entry.options)
    if form == 1:
        return backend.deserialize_executable(slot.serialized, options)
    by_id = {int(d.id): d for d in backend.devices()}
    unknown = [d for d in slot.entry.devices if d not in by_id]
    if unknown:
        raise ValueError(f"no device of id {unknown[0]} here")
    devices = xc.DeviceList(tuple(by_id[d] for d in slot.entry.devices))
    return backend.deserialize_executable(slot.serialized, devices, options)


def waits_report(waits: list[tuple[int, float, float]]) -> dict[str, Any]:
    """Of the reads served from what was loaded ahead (each its place among the reads, what
    it waited and when its load ended after the session began, in seconds): how many waited,
    in all and the longest, and when the last load ended."""
    return {
        "waited": sum(1 for _, w, _ in waits if w > 0.001),
        "waited_s": round(sum(w for _, w, _ in waits), 4),
        "longest_wait": max(
            ((n, round(w, 4)) for n, w, _ in waits), key=lambda t: t[1], default=None
        ),
        "last_load_s": round(max((t for _, _, t in waits), default=0.0), 4),
    }
