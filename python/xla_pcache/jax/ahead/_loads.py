"""JAX: loading one planned executable ahead, in two steps: fetching it (read through the
store's gate, checked against what its producer compiled it for, decompressed and split by
JAX's own functions: no backend needed) and deserializing it with the backend. What the
session (``_prefetch``) keeps of each (``Slot``), what each step took (``Meter``), and how
long a deserialize is expected to take (``Costs``, for the order of loading).
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
        "dropped",
        "entry",
        "executable",
        "loaded_at",
        "nbytes",
        "options",
        "rank",
        "serialized",
        "size",
        "started_at",
        "state",
        "steps",
        "time",
        "urgent",
    )

    def __init__(self, entry: _plan.Entry) -> None:
        self.entry = entry
        # The digest of the plan's compile options as JAX's key sees them (once fetched).
        self.options = b""
        self.state = State.QUEUED
        self.urgent = False
        # Its place in the order of loading (``_schedule``).
        self.rank = 0
        # Not wanted any more (its variant is not a candidate): let go once fetched.
        self.dropped = False
        self.serialized: Any = None
        self.executable: Any = None
        self.time: Any = None
        self.blob: Any = None
        self.nbytes = 0
        # The entry's stored bytes: the plan's until it is fetched.
        self.size = entry.size
        # What each step took (``Meter``), and when deserializing began and ended.
        self.steps = Steps()
        self.started_at = 0.0
        self.loaded_at = 0.0
        # Compiled ahead (its executable from the compiler process, not the store), in
        # how many seconds.
        self.compiled = False
        self.compile_s = 0.0


@dataclasses.dataclass
class Steps:
    """What a load's two steps took (``Meter``): the fetch's wall and own CPU time; the
    deserialize's wall time, its own thread's CPU time, its share of the other threads' CPU
    time (``load_cpu``) and its share of the wall time (``load_alone``, ``Meter``)."""

    fetch_wall: float = 0.0
    fetch_cpu: float = 0.0
    load_wall: float = 0.0
    load_own: float = 0.0
    load_cpu: float = 0.0
    load_alone: float = 0.0

    @property
    def wall(self) -> float:
        return self.fetch_wall + self.load_wall

    @property
    def cpu(self) -> float:
        """The CPU time the load took: the fetch's and the deserialize's own threads', and
        the deserialize's share of the other threads' (none of it the main thread's)."""
        return self.fetch_cpu + self.load_own + self.load_cpu

    @property
    def cost(self) -> float:
        """What the load would have cost the main thread, from what it took here: the
        fetch's and the deserialize's own threads' CPU time, and what XLA did for the
        deserialize elsewhere: the smaller of its share of the other threads' CPU time and
        of the wall time it did not spend on its own thread. Where XLA deserializes on the
        calling thread, the first part is all of it; where it deserializes on a pool of
        its own (its CPU client: the calling thread spends 4 % of the CPU time), the pool's
        work is shared by the loads in progress. The CPU share also counts whatever else
        runs off the main thread meanwhile (a computation's threads, a TPU runtime's), the
        wall share whatever the load waited for (the cores, the GIL); each is at least the
        pool's work, so the smaller is the nearer."""
        rest = min(self.load_cpu, max(0.0, self.load_alone - self.load_own))
        return self.fetch_cpu + self.load_own + rest


class Meter:
    """What each load step costs, measured on the loading threads.

    The fetch (the store's read, JAX's decompression and split) runs on its own thread:
    its CPU time is that thread's. The deserialize may not (on CPU, XLA deserializes on its
    own thread pool while the calling thread waits: measured on jax 0.10.2, the calling
    thread spends 4 % of the CPU time), so it is measured three ways: its own thread's CPU
    time; its share of the CPU time of the other threads (every thread but the main one
    and the loading ones: what they used while it ran, shared equally by the deserializes
    then in progress); and its share of the wall time: all of it while no more than
    ``side_by_side`` deserialize (a TPU runtime runs a few side by side, each as fast as
    alone), else shared the same way. Where the platform has no per-thread clocks, only the
    own thread's time is counted, a floor.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._main = self._clock(threading.main_thread())
        # The loading threads' clocks and their last readings: their CPU time is their own
        # steps', not shared (a thread that ended keeps its last: the process's counts it).
        self._loaders: dict[int, float] = {}
        # Each deserialize in progress: its share of the others' CPU time and of the wall.
        self._active: dict[int, list[float]] = {}
        self._steps = itertools.count()
        # How many deserializes the backend runs side by side, each as fast as alone: its
        # share of the wall is all of it while no more run (a TPU runtime's), else theirs
        # divided among them (XLA's CPU client: one pool for every deserialize).
        self.side_by_side = 1
        self._last_cpu = self._sample()
        self._last_wall = time.perf_counter()

    @staticmethod
    def _clock(thread: threading.Thread) -> int | None:
        try:
            ident = thread.ident
            if ident is None:
                return None
            clock = time.pthread_getcpuclockid(ident)
            time.clock_gettime(clock)
            return clock
        except (AttributeError, OSError):
            return None

    def loader(self) -> None:
        """The calling thread loads: its CPU time is counted as its steps' own."""
        clock = self._clock(threading.current_thread())
        if clock is not None:
            with self._lock:
                self._advance()
                self._loaders[clock] = 0.0
                self._last_cpu = self._sample()

    def _sample(self) -> float:
        """The CPU time of every thread but the main one and the loading ones."""
        if self._main is None:
            return 0.0
        cpu = time.process_time() - time.clock_gettime(self._main)
        for clock in list(self._loaders):
            with contextlib.suppress(OSError):  # ended: its last reading stands
                self._loaders[clock] = time.clock_gettime(clock)
            cpu -= self._loaders[clock]
        return cpu

    def _advance(self) -> None:
        cpu, wall = self._sample(), time.perf_counter()
        if self._active:
            n = len(self._active)
            cpu_share = max(0.0, cpu - self._last_cpu) / n
            wall_share = max(0.0, wall - self._last_wall) * min(1.0, self.side_by_side / n)
            for shares in self._active.values():
                shares[0] += cpu_share
                shares[1] += wall_share
        self._last_cpu, self._last_wall = cpu, wall

    @contextlib.contextmanager
    def fetching(self, steps: Steps) -> Iterator[None]:
        cpu, start = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            wall = time.perf_counter() - start
            steps.fetch_wall += wall
            steps.fetch_cpu += min(wall, time.thread_time() - cpu)

    @contextlib.contextmanager
    def deserializing(self, steps: Steps) -> Iterator[None]:
        cpu, start = time.thread_time(), time.perf_counter()
        step = next(self._steps)
        with self._lock:
            self._advance()
            self._active[step] = [0.0, 0.0]
        try:
            yield
        finally:
            wall = time.perf_counter() - start
            own = min(wall, time.thread_time() - cpu)
            with self._lock:
                self._advance()
                share, alone = self._active.pop(step)
            steps.load_wall += wall
            steps.load_own += own
            steps.load_cpu += share
            steps.load_alone += alone


class Costs:
    """How long a deserialize takes on a worker, from the entry's stored bytes: a fixed
    part and a part per byte, fitted (least squares, kept as running sums) to the
    deserializes this process finished (their wall time: what the order of loading needs
    to know, waiting for the others included)."""

    def __init__(self) -> None:
        self._n = 0
        self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._fixed = 0.0
        self._per_byte: float | None = None

    @property
    def samples(self) -> int:
        return self._n

    def add(self, size: int | None, wall: float) -> None:
        if size is None or size <= 0:
            return
        x = float(size)
        self._n += 1
        self._sx += x
        self._sy += wall
        self._sxx += x * x
        self._sxy += x * wall
        n, mx, my = self._n, self._sx / self._n, self._sy / self._n
        var = self._sxx - n * mx * mx
        slope = (self._sxy - n * mx * my) / var if var > 1e-9 * self._sxx else 0.0
        if n < 3 or slope <= 0 or my - slope * mx < 0:
            # Too few or too alike to fit a line: all of it per byte.
            self._fixed, self._per_byte = 0.0, self._sy / self._sx
        else:
            self._fixed, self._per_byte = my - slope * mx, slope

    def predict(self, size: int | None) -> float | None:
        """The expected wall time of a deserialize of ``size`` stored bytes; None before any
        finished, or for an entry whose size is not known."""
        if self._per_byte is None or size is None:
            return None
        return self._fixed + self._per_byte * size


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


class Normalizer:
    """``normalized`` once per distinct serialized options: JAX's digest is Python work
    (a deep copy of the options and a few dozen fields cleared), and a plan's entries, like
    a run's reads, share a few option sets. Equal bytes are equal options, so equal
    digests; the same options serialized otherwise are only digested again."""

    _MAX = 1024

    def __init__(self, digest: Callable[[Any, Any], Any] | None) -> None:
        self._digest = digest
        self._known: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def of(self, serialized: bytes, options: Any = None) -> bytes:
        """The digest of the options ``serialized`` (parsed from it unless ``options``, the
        same options as an object, is given)."""
        with self._lock:
            known = self._known.get(serialized)
        if known is not None:
            return known
        if options is None:
            options = xla_client().CompileOptions.ParseFromString(serialized)
        digest = normalized(self._digest, options)
        with self._lock:
            if len(self._known) >= self._MAX:
                self._known.clear()
            self._known[serialized] = digest
        return digest


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
    normal: Normalizer,
) -> Fetched | None:
    """``entry`` read (``store_key``: its key with the build, ``build_key.join``) and decompressed;
    None when the store has no such entry. ``ValueError`` when its producer compiled it for
    other options or devices than the plan's, ``EntryUnusable`` when JAX cannot decompress
    or split it."""
    blob = store.get(store_key, count=False)
    if blob is None:
        return None
    options = normal.of(entry.options)
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
