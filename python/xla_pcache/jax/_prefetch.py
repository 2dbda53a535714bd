"""JAX: loading ahead. The executables a workload's plan names are read, decompressed and
deserialized on a thread pool as soon as the process's first cache read comes, and JAX's
later reads take them from there instead of doing that work one program at a time on the
main thread.

The hook is JAX's ``compilation_cache.get_executable_and_time``, which ``compiler.py`` calls
through the module attribute in every JAX this package supports. Its arguments changed
twice (``FORMS``): ``(cache_key, compile_options, backend)`` up to 0.6, the executable's
devices added in 0.7, host callbacks (with a default) in 0.11. The wrapper is installed only
when the function has one of those signatures and the helpers loading needs are there
(``read_form``); on any other JAX it is not installed, one warning says so, and reads go as
before. At run time it steps aside (calls JAX's function unchanged) whenever JAX's cache is
not this package's own store cache with a session (the verification wrapper of
``jax_compilation_cache_check_contents`` sits there, or another cache), or the read passes
host callbacks.

A read JAX makes goes to ``Prefetch.read``: the first one starts the session's thread, which
reads the plan (``_plan``) and queues its entries, and waits for that (at most
``PLAN_WAIT_S``) so that it too can be served; worker threads take the entries in the plan's
order, each read through the store without counting a lookup (``get(count=False)``: the
store's one gate, checksums, signatures and trust), decompressed and split by JAX's own
functions and deserialized by the backend with the plan's compile options and devices
(XLA's deserialize releases the GIL). An entry whose producer recorded the options and
devices it was compiled for (``_plan.META_LOAD_DIGEST``) is loaded only with those. A read of
a key whose executable is loaded takes it only when its own compile options, as JAX's cache
key sees them (JAX's ``_hash_serialized_compile_options``: dump flags and the autotune
cache's path left out, device assignment kept), and its devices are the ones it was loaded
with; it waits for one still loading, and one not started yet is loaded next, past the
memory bound, while it waits; anything else (not planned, failed, other options) goes JAX's
own way. A taken executable counts the hit the store would have counted; one loaded and
never taken is wasted (released, counted) when the run stops asking (``IDLE_RELEASE_S``) or
at exit. Memory: loading waits while the executables loaded and not taken reach
``XLA_PCACHE_PREFETCH_MEMORY`` bytes. A failure in the background is a miss for that key
and a counter, never an exception in the program: a payload JAX's functions cannot
decompress is logged at debug level (JAX's own read of the key meets it and warns), any
other failure is one warning per kind. The session's threads are daemons and the exit hook
waits for loads in progress at most ``CLOSE_WAIT_S``.

The session also records what this process read (key, options, devices) and, when that
names a key its plan did not (a new program, or no plan yet), writes the plan again after
``QUIET_S`` without reads and at exit: the plan of the run that diverged replaces the
variant of its arguments (``Store.replace``: every tier's copy too). A try that finds no
newly stored key to add (a program still compiling) writes nothing; ``FRUITLESS_WRITES`` such
tries in a row leave it to the exit. A read-only process writes none, nor does a bucket
path's host that writes nothing to the bucket (``BucketStore.bucket_ro``): the plan is
the writers' record of the workload, and one kept only in that host's local store would
stand in front of theirs there.

Every key the session gives the store carries this process's runtime build
(``xla_pcache.builds``), as the store cache's do: the plan's own (a plan per build: it names
the keys that build's JAX computed, with options that build's jaxlib serialized) and each
planned entry's, so that nothing another build compiled is ever loaded ahead.
"""

from __future__ import annotations

import atexit
import collections
import enum
import hashlib
import importlib
import inspect
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from xla_pcache import _testhook, builds
from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax import _plan
from xla_pcache.jax._patch import restore
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")

# The forms of get_executable_and_time this wrapper knows, by parameter names.
FORMS: dict[tuple[str, ...], int] = {
    ("cache_key", "compile_options", "backend"): 1,
    ("cache_key", "compile_options", "backend", "executable_devices"): 2,
    ("cache_key", "compile_options", "backend", "executable_devices", "host_callbacks"): 3,
}
_TARGET = "get_executable_and_time"
_WRAPPED = "__xla_pcache_prefetch__"

# Seconds without a read before a changed plan is written (and again at exit); tries in a
# row that find nothing new to write before only the exit's is left.
QUIET_S = 5.0
FRUITLESS_WRITES = 3
# Seconds without a take, once loading is done, before what was loaded and not taken is
# released and counted wasted.
IDLE_RELEASE_S = 300.0
# How long a read waits for its executable still loading before going JAX's own way, and
# how long the first read waits for the plan to be read.
LOAD_WAIT_S = 120.0
PLAN_WAIT_S = 2.0
# How long the exit hook waits for loads in progress.
CLOSE_WAIT_S = 10.0
# Reads whose options are kept for the put after a miss (JAX puts right after it compiles).
_RECENT_READS = 256


def read_form(cc: Any) -> int | str:
    """The form (1, 2, 3) of this JAX's ``get_executable_and_time``, or why it is not one
    loading ahead can stand in for."""
    fn = getattr(cc, _TARGET, None)
    fn = getattr(fn, _WRAPPED, fn)
    if not callable(fn):
        return f"jax._src.compilation_cache has no {_TARGET}"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return f"the signature of {_TARGET} cannot be read ({exc})"
    names = tuple(params)
    form = FORMS.get(names)
    if form is None:
        return f"{_TARGET}{names} is not a form this release knows"
    if form == 3 and params["host_callbacks"].default is inspect.Parameter.empty:
        return f"{_TARGET}'s host_callbacks has no default"
    missing = [
        n
        for n in ("decompress_executable", "extract_executable_and_time")
        if not callable(getattr(cc, n, None))
    ]
    try:
        xc = _xla_client()
    except (ImportError, AttributeError):
        return "jax._src.lib.xla_client cannot be imported"
    if not callable(getattr(getattr(xc, "CompileOptions", None), "ParseFromString", None)):
        missing.append("xla_client.CompileOptions.ParseFromString")
    if form >= 2 and not callable(getattr(xc, "DeviceList", None)):
        missing.append("xla_client.DeviceList")
    if missing:
        return f"this JAX lacks {', '.join(missing)}"
    return form


def _options_digester() -> Callable[[Any, Any], Any] | None:
    """JAX's ``cache_key._hash_serialized_compile_options(hash_obj, options)``, or None."""
    try:
        module = importlib.import_module("jax._src.cache_key")
    except ImportError:
        return None
    fn = getattr(module, "_hash_serialized_compile_options", None)
    return fn if callable(fn) else None


def _xla_client() -> Any:
    """JAX's handle on jaxlib's client module (CompileOptions, DeviceList)."""
    return importlib.import_module("jax._src.lib").xla_client


def install_hook(cc: Any) -> bool:
    """Wrap ``cc.get_executable_and_time`` (once). False, with one warning, on a JAX whose
    function is not one of ``FORMS``: reads then go as before."""
    current = getattr(cc, _TARGET, None)
    if getattr(current, _WRAPPED, None) is not None:
        return True
    form = read_form(cc)
    if isinstance(form, str):
        logger.warning(
            "xla_pcache: loading ahead is off: %s (reads go JAX's own way; "
            "XLA_PCACHE_PREFETCH=0 silences this)",
            form,
        )
        return False
    assert callable(current)  # read_form found it
    setattr(cc, _TARGET, _wrap(current, form, cc))
    return True


def uninstall_hook(cc: Any) -> None:
    """Put JAX's own function back if ours is in place."""
    restore(cc, _TARGET, _WRAPPED)


def _wrap(original: Callable[..., Any], form: int, cc: Any) -> Callable[..., Any]:
    names = next(n for n, f in FORMS.items() if f == form)

    def get_executable_and_time(*args: Any, **kwargs: Any) -> Any:
        session = getattr(
            _jax_cache(cc, args[2] if len(args) > 2 else kwargs.get("backend")), "prefetch", None
        )
        if not isinstance(session, Prefetch):
            return original(*args, **kwargs)
        return session.read(original, names, args, kwargs)

    get_executable_and_time.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(get_executable_and_time, _WRAPPED, original)
    return get_executable_and_time


def _jax_cache(cc: Any, backend: Any) -> Any:
    """JAX's cache: at the process's first read JAX has not built it yet (its own read
    builds it first thing, ``_get_cache``), so it is built here the same way, once."""
    cache = getattr(cc, "_cache", None)
    if cache is not None or backend is None:
        return cache
    build = getattr(cc, "_get_cache", None)
    unsupported = getattr(cc, "_UNSUPPORTED_RUNTIMES", ())
    if not callable(build) or getattr(backend, "runtime_type", None) in unsupported:
        return None  # JAX's read says why it has no cache, once
    try:
        return build(backend)
    except Exception:
        return None  # JAX's own read meets it again and handles it as it does


class _EntryUnusable(Exception):
    """An entry whose payload JAX's own functions cannot decompress or split."""


class _State(enum.Enum):
    QUEUED = "queued"
    LOADING = "loading"
    LOADED = "loaded"
    TAKEN = "taken"
    # The main thread read it first, or it was read before the plan was.
    SKIPPED = "skipped"
    MISSING = "missing"
    FAILED = "failed"
    RELEASED = "released"


class _Slot:
    __slots__ = (
        "blob",
        "entry",
        "executable",
        "load_s",
        "loaded_at",
        "nbytes",
        "options",
        "state",
        "time",
        "urgent",
    )

    def __init__(self, entry: _plan.Entry) -> None:
        self.entry = entry
        # The digest of the plan's compile options as JAX's key sees them (once loaded).
        self.options = b""
        self.state = _State.QUEUED
        self.urgent = False
        self.executable: Any = None
        self.time: Any = None
        self.blob: Any = None
        self.nbytes = 0
        self.load_s = 0.0
        self.loaded_at = 0.0


_sessions: weakref.WeakSet[Prefetch] = weakref.WeakSet()
_sessions_lock = threading.Lock()
_exit_registered = False


def _close_all_at_exit() -> None:
    with _sessions_lock:
        sessions = list(_sessions)
    for session in sessions:
        session.close()


class Prefetch:
    """Loading ahead for one store cache JAX uses (``_factory`` makes one per cache; the
    wrapper finds it as the cache's ``prefetch``)."""

    # Compiling ahead (``_compile_ahead.CompileAhead``, set by ``_factory``): told the plan's
    # keys, and each planned executable the store does not have. None: nothing compiles ahead.
    ahead: Any = None

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
        build: builds.Build,
        write_plans: bool = True,
    ) -> None:
        self._store = store
        # The store's keys of this build (``xla_pcache.builds``): the plan's and every
        # entry's it names, so that nothing another build compiled is ever loaded.
        self._suffix = build.suffix
        # A read-only store, or a caller's say (a bucket path's read-only host), writes none.
        self._write_plans = write_plans and not store.read_only
        self._cc = cc
        self._threads = max(1, threads)
        self._memory = memory
        self._name = name
        self._jax_version = jax_version
        self._form = form
        self._pid = os.getpid()
        self._digest_options = _options_digester()
        self._cond = threading.Condition()
        self._warn = FirstWarning(
            logger, "loading {key} ahead failed ({what}), it is read as before"
        )
        self._started = False
        self._closed = False
        self._backend: Any = None
        self._key: str | None = None
        self._args = ""
        self._workload = ""
        # Plan state: None until read; the keys of the variant in use (empty: none).
        self._planned: frozenset[str] | None = None
        self._slots: dict[str, _Slot] = {}
        self._queue: collections.deque[_Slot] = collections.deque()
        self._in_flight = 0
        self._loading = 0
        # What this process read, in order (the next plan), and whether it names a key the
        # plan in use did not; the keys whose reads went JAX's own way.
        self._seen: dict[str, _plan.Entry] = {}
        self._passed: set[str] = set()
        # The latest reads' compile options as JAX's key sees them (``_normalized``) and
        # devices, by key, for the puts of what they missed.
        self._wanted: collections.OrderedDict[str, tuple[bytes, tuple[int, ...]]] = (
            collections.OrderedDict()
        )
        self._dirty = False
        # When the plan was last written or tried, and how many tries in a row found
        # nothing new to write.
        self._last_write = 0.0
        self._fruitless = 0
        self._last_read = time.monotonic()
        self._last_take = time.monotonic()
        self._workers: list[threading.Thread] = []
        self._thread: threading.Thread | None = None
        # Where the reads this session served waited (for the report): when the session
        # started, and each taken read's position, wait and when its load ended.
        self._t0 = time.perf_counter()
        self._waits: list[tuple[int, float, float]] = []

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
        try:
            taken = self._before(names, args, kwargs)
        except Exception as exc:
            self._warn("a read", str(args[0] if args else kwargs.get("cache_key")), exc)
            taken = None
        if taken is not None:
            return taken
        return original(*args, **kwargs)

    def _before(self, names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if os.getpid() != self._pid or len(args) > len(names):
            return None  # a forked child (no threads of ours), or a call we do not know
        call = dict(zip(names, args, strict=False))
        if set(call) & set(kwargs) or not set(kwargs) <= set(names):
            return None
        call.update(kwargs)
        if call.get("host_callbacks") or "cache_key" not in call or "backend" not in call:
            return None  # host callbacks are bound at load: JAX's own way, never planned
        key = call["cache_key"]
        if not isinstance(key, str):
            return None
        options = call["compile_options"].SerializeAsString()
        devices: tuple[int, ...] = ()
        if self._form >= 2:
            devices = tuple(int(d.id) for d in call["executable_devices"])
        entry = _plan.Entry(key, bytes(options), devices)
        wanted = self._normalized(call["compile_options"])
        with self._cond:
            if self._closed:
                return None
            self._last_read = time.monotonic()
            # What a plan could hold, no more: a process that reads more keeps its start.
            if key not in self._seen and len(self._seen) < _plan.MAX_ENTRIES:
                self._seen[key] = entry
                self._fruitless = 0
                if self._planned is not None and key not in self._planned:
                    self._mark_dirty()
            # For the put that may follow this read's miss (its load digest).
            self._wanted[key] = (wanted, devices)
            self._wanted.move_to_end(key)
            while len(self._wanted) > _RECENT_READS:
                self._wanted.popitem(last=False)
            if not self._started:
                # The plan is read first (one local read, or a fetch from the tiers, on the
                # session's thread), so that this read too can be served by it.
                self._start(call["backend"])
                self._cond.wait_for(lambda: self._planned is not None, PLAN_WAIT_S)
            slot = self._slots.get(key)
            if slot is None:
                if self._planned is None:
                    self._passed.add(key)  # read before the plan: not to be loaded later
                return None
            start = time.perf_counter()
            if slot.state is _State.QUEUED:
                # Asked for before its turn: loaded next, past the memory bound (it is taken
                # at once), while this read waits as for one loading.
                self._queue.remove(slot)
                self._queue.appendleft(slot)
                slot.urgent = True
                self._cond.notify_all()
            self._cond.wait_for(
                lambda: slot.state not in (_State.QUEUED, _State.LOADING), LOAD_WAIT_S
            )
            waited = time.perf_counter() - start
            if slot.state is _State.QUEUED:
                slot.state = _State.SKIPPED  # never started (workers stuck): read JAX's way
            if slot.state is not _State.LOADED:
                return None
            if slot.options != wanted or slot.entry.devices != devices:
                # Same key, other options or devices: never handed to this read.
                self._release(slot)
                self._count([("wasted", 1)])
                return None
            result = (slot.executable, slot.time)
            blob, saved = slot.blob, max(0.0, slot.load_s - waited)
            if len(self._waits) < _plan.MAX_ENTRIES:
                self._waits.append((len(self._seen), waited, slot.loaded_at - self._t0))
            self._release(slot, _State.TAKEN)
            self._last_take = time.monotonic()
        try:
            self._store.count_hit(blob)
        except Exception as exc:
            logger.debug("xla_pcache: counting a hit loaded ahead failed: %s", exc)
        self._count([("used", 1), ("saved_ms", round(saved * 1000))])
        return result

    def load_digest(self, key: str) -> str | None:
        """For the put of ``key`` after this process's read of it missed: the digest of the
        options and devices that read asked for (``_plan.META_LOAD_DIGEST``)."""
        with self._cond:
            read = self._wanted.pop(key, None)
        return None if read is None else _plan.load_digest(*read)

    def _normalized(self, options: Any) -> bytes:
        """``options`` as JAX's cache key sees them: JAX's own digest of the serialized
        options less the fields it says do not change what is compiled (dump flags, the
        path of XLA's autotune cache, which follows the cache's path on jax >= 0.11), device
        assignment kept; the serialized options themselves on a JAX without it."""
        digest = self._digest_options
        if digest is None:
            return bytes(options.SerializeAsString())
        h = hashlib.sha256()
        digest(h, options)
        return h.digest()

    def _mark_dirty(self) -> None:
        if not self._dirty and self._write_plans:
            self._dirty = True
            self._cond.notify_all()

    def _release(self, slot: _Slot, state: _State = _State.RELEASED) -> None:
        """Drop what ``slot`` holds (under the lock)."""
        self._in_flight -= slot.nbytes
        slot.nbytes = 0
        slot.executable = slot.blob = slot.time = None
        slot.state = state
        self._cond.notify_all()

    def _end_queue(self) -> None:
        """Load nothing more (under the lock)."""
        for slot in self._queue:
            if slot.state is _State.QUEUED:
                slot.state = _State.SKIPPED
        self._queue.clear()
        self._cond.notify_all()

    def _count(self, counts: list[tuple[str, int]]) -> None:
        try:
            self._store.add_prefetch_counters([(c, n) for c, n in counts if n])
        except Exception as exc:
            logger.debug("xla_pcache: counting %s failed: %s", counts, exc)

    # -------------------------------------------------------------- the session's thread

    def _start(self, backend: Any) -> None:
        """On the first read (under the lock): the backend is up; start reading the plan."""
        global _exit_registered
        self._started = True
        self._backend = backend
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
            self._read_plan()
        except Exception as exc:
            self._warn("reading the plan", self._key or "", exc)
            with self._cond:
                self._planned = frozenset()
                self._mark_dirty()
                self._cond.notify_all()
        self._tend()

    def _read_plan(self) -> None:
        backend = self._backend
        _, args = _plan.entry_point()
        self._args = _plan.args_digest(args)
        self._workload = _plan.workload(
            self._name,
            self._jax_version,
            str(backend.platform),
            int(backend.device_count()),
            int(backend.process_index()),
        )
        self._key = _plan.plan_key(self._workload) + self._suffix
        plan = self._fetch_plan()
        variant = plan.choose(self._args) if plan is not None else None
        entries = variant.entries if variant is not None else ()
        with self._cond:
            self._planned = frozenset(e.key for e in entries)
            if any(k not in self._planned for k in self._seen):
                self._mark_dirty()
            for e in entries:
                slot = _Slot(e)
                if e.key in self._passed or self._closed:
                    slot.state = _State.SKIPPED
                else:
                    self._queue.append(slot)
                self._slots[e.key] = slot
            queued = len(self._queue)
            workers = [
                threading.Thread(target=self._work, name=f"xla_pcache-prefetch-{i}", daemon=True)
                for i in range(min(self._threads, queued))
            ]
            self._workers = workers
            self._cond.notify_all()
        if self.ahead is not None:
            self.ahead.planned([e.key for e in entries])
        if entries:
            self._count([("planned", len(entries))])
            logger.debug(
                "xla_pcache: loading %d of the %d executables %s read ahead, on %d threads",
                queued,
                len(entries),
                self._workload,
                len(workers),
            )
        for w in workers:
            w.start()

    def _fetch_plan(self, *, again: bool = False) -> _plan.Plan | None:
        """The plan in the store, or None; a plan refused is one warning and a counter (not
        ``again``, when this process re-reads it to write its own in its place)."""
        assert self._key is not None
        blob = self._store.get(self._key, count=False)
        if blob is None:
            return None
        try:
            return _plan.decode(memoryview(blob))
        except _plan.PlanError as exc:
            if again:
                return None
            logger.warning(
                "xla_pcache: the prefetch plan of %s in %s is refused (%s); nothing is loaded "
                "ahead from it",
                self._workload,
                self._store.path,
                exc,
            )
            self._count([("plans_refused", 1)])
            return None

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._closed
                        or not self._queue
                        or self._in_flight < self._memory
                        or self._queue[0].urgent
                    )
                )
                if self._closed or not self._queue:
                    return
                slot = self._queue.popleft()
                if slot.state is not _State.QUEUED:
                    continue
                slot.state = _State.LOADING
                self._loading += 1
            try:
                self._load(slot)
            except _EntryUnusable as exc:
                # The entry's own bytes: JAX's read of the key meets them and says so itself.
                logger.debug("xla_pcache: %r is not loaded ahead: %s", slot.entry.key, exc)
                self._failed(slot)
            except Exception as exc:
                self._warn("loading", slot.entry.key, exc)
                self._failed(slot)
            finally:
                with self._cond:
                    self._loading -= 1
                    self._cond.notify_all()

    def _failed(self, slot: _Slot) -> None:
        with self._cond:
            slot.state = _State.FAILED
        self._count([("errors", 1)])

    def _load(self, slot: _Slot) -> None:
        """Read, decompress and deserialize ``slot``'s entry (off the lock)."""
        xc = _xla_client()
        start = time.perf_counter()
        entry, backend, cc = slot.entry, self._backend, self._cc
        blob = self._store.get(entry.key + self._suffix, count=False)
        if blob is None:
            with self._cond:
                slot.state = _State.MISSING
            if self.ahead is not None:
                self.ahead.absent(entry.key, backend)
            return
        made_for = blob.meta.get("backend")
        if made_for is not None and made_for != str(backend.platform):
            raise ValueError(f"the entry was made for {made_for}")
        options = xc.CompileOptions.ParseFromString(entry.options)
        normalized = self._normalized(options)
        bound = blob.meta.get(_plan.META_LOAD_DIGEST)
        if bound is not None and bound != _plan.load_digest(normalized, entry.devices):
            raise ValueError(
                "the plan's compile options or devices for it are not the ones it was compiled for"
            )
        try:
            serialized, compile_time = cc.extract_executable_and_time(
                cc.decompress_executable(memoryview(blob))
            )
        except Exception as exc:
            raise _EntryUnusable(f"{type(exc).__name__}: {exc}") from exc
        if self._form == 1:
            executable = backend.deserialize_executable(serialized, options)
        else:
            by_id = {int(d.id): d for d in backend.devices()}
            unknown = [d for d in entry.devices if d not in by_id]
            if unknown:
                raise ValueError(f"no device of id {unknown[0]} here")
            devices = xc.DeviceList(tuple(by_id[d] for d in entry.devices))
            executable = backend.deserialize_executable(serialized, devices, options)
        with self._cond:
            if self._closed:
                slot.state = _State.RELEASED
                return
            slot.executable, slot.time, slot.blob = executable, compile_time, blob
            slot.options = normalized
            slot.nbytes = len(serialized)
            slot.loaded_at = time.perf_counter()
            slot.load_s = slot.loaded_at - start
            slot.state = _State.LOADED
            self._in_flight += slot.nbytes
        self._count([("loaded", 1)])

    def _tend(self) -> None:
        """After the plan is read: write it when it changed and reads went quiet, release
        what was loaded and not taken once the run stops asking; until closed."""
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                deadlines = []
                write = False
                if self._dirty and self._fruitless < FRUITLESS_WRITES:
                    due = max(self._last_read, self._last_write) + QUIET_S
                    write = now >= due
                    deadlines.append(due)
                release: list[_Slot] = []
                held = [s for s in self._slots.values() if s.state is _State.LOADED]
                if held and not self._loading:
                    due = max(self._last_take, self._last_read) + IDLE_RELEASE_S
                    if now >= due:
                        # The run stopped asking: the plan ends here, what it loaded and
                        # was not taken is let go, and nothing more is loaded.
                        release = held
                        for slot in held:
                            self._release(slot)
                        self._end_queue()
                    else:
                        deadlines.append(due)
                if not write and not release:
                    timeout = max(0.05, min(deadlines) - now) if deadlines else None
                    self._cond.wait(timeout)
                    continue
            if release:
                self._count([("wasted", len(release))])
            if write:
                self._write_plan()

    # -------------------------------------------------------------- writing the plan

    def _write_plan(self) -> None:
        """Write what this process read as its arguments' variant of the plan, when that
        names a stored executable the plan in use does not."""
        with self._cond:
            if not self._dirty or self._key is None:
                return
            self._last_write = time.monotonic()
            seen = list(self._seen.values())
            planned = self._planned or frozenset()
        _testhook.reached("plan-write")
        store = self._store
        try:
            # Only what the store holds: a miss JAX did not put (below its thresholds) is
            # not worth loading ahead, and one still compiling is written by a later try.
            entries = tuple(e for e in seen if e.key + self._suffix in store)
            variant = _plan.bounded(_plan.Variant(self._args, time.time(), entries))
            keys = frozenset(e.key for e in variant.entries)
            if keys <= planned or not self._write_plans:
                with self._cond:
                    # Reads not stored (yet, or ever) keep it dirty: a few more tries after
                    # quiet spells, and the one at exit.
                    self._fruitless += 1
                return
            current = self._fetch_plan(again=True)
            same = current is not None and any(
                v.args == variant.args and v.entries == variant.entries for v in current.variants
            )
            # A fleet that starts one job at once reads the same programs in every process:
            # the first to write says it for all, the others write nothing.
            if not same:
                data = _plan.encode(_plan.merged(current, variant))
                meta = {"kind": _plan.META_KIND, "framework": "jax", "workload": self._workload}
                if store.replace(self._key, data, meta=meta):
                    self._count([("plans_written", 1)])
            with self._cond:
                self._planned = keys
                self._fruitless = 0
                self._dirty = any(k not in keys for k in self._seen)
        except Exception as exc:
            self._warn("writing the plan", self._key, exc)

    # -------------------------------------------------------------- the end

    def close(self) -> None:
        """Stop loading, wait (bounded) for loads in progress, release what was not taken
        (wasted), and write the plan if it changed. Idempotent; what JAX's cache reset and
        the exit hook call."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._end_queue()
            self._cond.wait_for(lambda: self._loading == 0, CLOSE_WAIT_S)
            held = [s for s in self._slots.values() if s.state is _State.LOADED]
            for slot in held:
                self._release(slot)
            write = self._dirty
        self._count([("wasted", len(held))])
        if write:
            self._write_plan()
        with _sessions_lock:
            _sessions.discard(self)
        try:
            self._store.flush()
        except Exception as exc:
            logger.debug("xla_pcache: flushing the counters failed: %s", exc)

    def report(self) -> dict[str, Any]:
        """What this session did, by key state (for tests and the bench)."""
        with self._cond:
            states = collections.Counter(s.state.value for s in self._slots.values())
            return {
                "workload": self._workload,
                "plan_key": self._key,
                "planned": len(self._slots),
                "states": dict(states),
                "seen": len(self._seen),
                "in_flight": self._in_flight,
                # Reads served from what was loaded ahead that waited for it: how many, in
                # all and the longest (seconds), and when the last load ended after the
                # first read.
                "waited": sum(1 for _, w, _ in self._waits if w > 0.001),
                "waited_s": round(sum(w for _, w, _ in self._waits), 4),
                "longest_wait": max(
                    ((n, round(w, 4)) for n, w, _ in self._waits), key=lambda t: t[1], default=None
                ),
                "last_load_s": round(max((t for _, _, t in self._waits), default=0.0), 4),
            }
