"""What JAX's ``CacheInterface`` asks of a cache, on a ``Store``: ``StoreCache`` is this class
with JAX's interface as a second base (``xla_pcache.jax`` builds it on first use)."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Callable
from typing import Any

from xla_pcache import builds, explain
from xla_pcache import on_miss as _on_miss
from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax import _adopt, _build, _keyparts, _module_diff, _single_flight
from xla_pcache.jax.ahead import _plan, _prefetch
from xla_pcache.jax.ahead._recording import Recorder
from xla_pcache.misslog import META_COMPILE_TIME
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")


class _StoreCacheImpl:
    """What JAX's ``CacheInterface`` asks for, on top of a ``Store``.

    JAX hands over values already compressed (with its compile time inside), so they are
    stored as given. Any store failure is a logged miss: the cache must never break a
    compilation.

    The store's key is JAX's key with the runtime's build (``build``, default this
    process's: ``xla_pcache.builds``): only entries compiled by the same jaxlib and PJRT
    plugin binaries are ever read.
    """

    _path: pathlib.Path
    # Loading ahead for this cache (``_prefetch``): what the wrapped
    # ``get_executable_and_time`` looks for on JAX's cache; None: reads go JAX's way.
    prefetch: _prefetch.Prefetch | None = None
    # What records each program this cache puts, for compiling ahead
    # (``ahead._recording``); None: nothing is recorded.
    recorder: Recorder | None = None

    def __init__(
        self,
        store: Store,
        meta: dict[str, str] | None = None,
        *,
        verified: bool = False,
        single_flight: _single_flight.SingleFlight | None = None,
        adopter: _adopt.Adopter | None = None,
        on_miss: str = "compile",
        build: builds.Build | None = None,
    ) -> None:
        self._store = store
        # A get's only cost of the build: its key joined with it (``Build.store_key``).
        self._build = build if build is not None else _build.build()
        # Another build's entry of a missed key: counted and explained (other_build).
        self._others = builds.OtherBuilds(self._build)
        # Serves a miss from a directory JAX's own cache filled, adopting the entry.
        self._adopter = adopter
        # XLA_PCACHE_ON_MISS: what a miss does besides compiling (see on_miss.py).
        self._on_miss = on_miss
        # Claims or waits on a miss (see _single_flight); None: every miss compiles.
        self._flight = single_flight
        self._path = pathlib.Path(store.path)
        self._meta = dict(meta or {})
        # Whether JAX's verification wrapper sits above us: it forces a recompile after a
        # hit on purpose, so a put after a hit then says nothing about the entry.
        self._verified = verified
        # Keys this process was served. JAX only puts a key it was served when it could not
        # use the value (decompression or deserialization failed), so that put replaces it.
        self._served: set[str] = set()
        self._lock = threading.Lock()
        self._warn = FirstWarning(logger, "{what} of {key} failed, treating it as a miss")

    @property
    def store(self) -> Store:
        return self._store

    def get(self, key: str) -> memoryview | None:
        _check_key(key)
        skey = self._build.store_key(key)
        if self._adopter is not None:
            # Before the store's get, which would count a miss: a lookup JAX's own files
            # answer is a hit (and adopted), and only one the store has no file for is.
            adopted = self._adopter.take(
                self._store,
                skey,
                self._adopted_meta(key),
                self._warn,
                jax_key=key,
                not_before_ns=self._build.installed_ns,
            )
            if adopted is not None:
                with self._lock:
                    self._served.add(key)
                return memoryview(adopted)
        try:
            blob = self._store.get(skey)
        except Exception as exc:
            self._warn("read", key, exc)
            return None
        if blob is None and self._flight is not None:
            try:
                blob = self._flight.after_miss(skey)
            except Exception as exc:
                self._warn("read", key, exc)
                return None
        if blob is None:
            # Misses only: the hit path above records nothing.
            new, parts = _keyparts.missed(key)
            # Where the computation changed: its module against the nearest record's.
            differ = _module_diff.Differ(self._store, _keyparts.computation())
            self._missed(key, skey, parts, new, differ)
            return None
        with self._lock:
            self._served.add(key)
        # A read-only view of the verified payload, without a copy: every JAX version that
        # has these hooks only decompresses the value or tests it against None, and both
        # zlib and zstd read any buffer. The view keeps the entry's mapping alive.
        return memoryview(blob)

    def _adopted_meta(self, key: str) -> Callable[[Any], dict[str, str]]:
        """The producer's metadata and the key's components, for an entry adopted under
        ``key`` (``_adopt.adopted_meta`` adds the rest)."""
        return lambda read: self._put_meta(key, read.value)

    def _put_meta(
        self, key: str, value: Any, found: _keyparts.Capture | None = None
    ) -> dict[str, str]:
        meta = _keyparts.put_meta(self._meta, key, value, found)
        return builds.meta_with_component(meta, self._build)

    def put(self, key: str, value: bytes) -> None:
        _check_key(key)
        if self._store.read_only:
            return
        with self._lock:
            replace = key in self._served and not self._verified
            self._served.discard(key)
        try:
            skey = self._build.store_key(key)
            if replace:
                # JAX has already warned that it could not read the entry.
                logger.info(
                    "xla_pcache: JAX could not use the cached executable %r and compiled it "
                    "again; replacing the entry",
                    skey,
                )
                self._store.delete(skey)
            found = _keyparts.put_capture(key)
            meta = self._put_meta(key, value, found)
            # What loading ahead checks a plan against: the options and devices of this
            # process's read of the key, which missed.
            prefetch = self.prefetch
            digest = None if prefetch is None else prefetch.load_digest(key, len(value))
            if digest is not None:
                meta[_plan.META_LOAD_DIGEST] = digest
            self._store.put(skey, value, meta=meta)
        except Exception as exc:
            self._warn("write", key, exc)
            return
        if self.recorder is not None:
            # The program's module record beside it.
            self.recorder.stored(key, found)

    def served_ahead(self, key: str) -> None:
        """JAX's read of ``key`` is served what was compiled ahead: the miss it is for the
        store, counted, explained and warned about as ``get`` does one (on JAX's thread,
        inside its compile call), without a claim: nothing is left to compile. Never
        raises."""
        try:
            self._store.count_misses(1)
            self._missed(key, self._build.store_key(key), _keyparts.components(key), True)
        except Exception as exc:
            logger.debug("xla_pcache: recording the miss of %r failed: %s", key, exc)

    def _missed(
        self,
        key: str,
        skey: str,
        parts: dict[str, Any] | None,
        new: bool,
        differ: _module_diff.Differ | None = None,
    ) -> None:
        """A miss of ``key`` (``new``: not JAX's verification wrapper reading it again):
        counted against other builds' entries, recorded for ``explain`` (with ``differ``:
        where the computation changed, its module against the nearest record's), and handled
        as ``XLA_PCACHE_ON_MISS`` says (``CacheMissError`` in "error" mode: install() made JAX
        let it through)."""
        if new:
            self._others.count(self._store, key)
            explain.record_miss(
                self._store, skey, builds.with_component(parts, self._build), "jax", differ
            )
        if self._on_miss != "compile":
            _on_miss.handle(
                self._on_miss,
                self._store,
                skey,
                program=_keyparts.module_name(key),
                framework="jax",
                parts=builds.with_component(
                    parts if parts is not None else _keyparts.components(key), self._build
                ),
                module_diff=differ,
            )

    def put_ahead(self, key: str, value: bytes, compile_s: float, load_digest: str) -> None:
        """Put what was compiled ahead for ``key`` and taken by JAX's read of it: JAX's own
        value, with the compile's time and the load digest of the options and devices it
        was compiled for (a put of loading ahead's, never a read-only store's)."""
        if self._store.read_only:
            return
        try:
            meta = dict(self._meta)
            meta[META_COMPILE_TIME] = f"{compile_s:.6f}"
            meta[_plan.META_LOAD_DIGEST] = load_digest
            meta = builds.meta_with_component(meta, self._build)
            self._store.put(self._build.store_key(key), value, meta=meta)
        except Exception as exc:
            self._warn("write", key, exc)

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        """Remove every entry from the store (as JAX's in-memory test cache does), but a
        later release's (``Store.clear``)."""
        with self._lock:
            self._served.clear()
        self._store.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._store.path!r})"


def _check_key(key: str) -> None:
    if not isinstance(key, str):
        raise TypeError(f"cache keys are str, not {type(key).__name__}")
    if not key:
        raise ValueError("cache key must not be empty")
