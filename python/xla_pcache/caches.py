"""The cache types torch_xla has in C++ (``AbstractCache``, ``Cache``, ``PersistentCache``).

``ComputationCache`` is the interface; ``MemoryCache`` is an in-process LRU of live objects;
``PersistentCache`` puts a ``MemoryCache`` over the Rust ``Store`` and turns objects into
bytes and back with the caller's ``serialize`` and ``deserialize``.

A cache must never crash the program it serves: a payload that fails to deserialize, or
an object that fails to serialize, is logged and counted, never raised.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from xla_pcache._closing import Closing
from xla_pcache._core import CacheError
from xla_pcache._text import package_logger
from xla_pcache.cache_path import open_store, route, warn_unserved
from xla_pcache.config import PATH_VAR, Settings, parse_capacity
from xla_pcache.store import Store

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from xla_pcache._core import Blob

logger = package_logger(__name__)

T = TypeVar("T")
Key = str | bytes
Stats = dict[str, int | float | str | None]

# None is a legal value to keep in memory, so absence needs its own marker.
_MISSING: Any = object()


def check_key(key: object) -> Key:
    """Return ``key`` if it is a non-empty str or bytes; raise otherwise."""
    if not isinstance(key, str | bytes):
        raise TypeError(f"cache keys must be str or bytes, not {type(key).__name__}")
    if not key:
        raise ValueError("cache keys must not be empty")
    return key


def _memory_key(key: object) -> bytes:
    # The store names an entry by the key's bytes ("k" and b"k" are one entry); the memory
    # layer of a PersistentCache must agree, or erase("k") could leave b"k" alive in memory.
    checked = check_key(key)
    return checked.encode() if isinstance(checked, str) else checked


class ComputationCache(ABC, Generic[T]):
    """A key -> object cache (torch_xla's ``AbstractCache``). Keys are non-empty str or bytes."""

    @abstractmethod
    def get(self, key: Key) -> T | None:
        """The object under ``key``, or None."""

    @abstractmethod
    def add(self, key: Key, value: T) -> None:
        """Keep ``value`` under ``key``, replacing any object held in memory."""

    @abstractmethod
    def erase(self, key: Key) -> bool:
        """Forget ``key``; True if anything was removed."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every key."""

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int:
        """Objects held in memory (torch_xla's ``GetNumInMemoryCachedGraph``)."""

    @abstractmethod
    def stats(self) -> Stats:
        """Counters, as a flat dict for logging or JSON."""


class MemoryCache(ComputationCache[T]):
    """A thread-safe LRU of live objects, bounded by count.

    ``capacity`` defaults to ``XLA_COMPILATION_CACHE_SIZE`` (2048 when unset); 0 keeps nothing.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is None:
            capacity = Settings.from_env().memory_capacity
        self._capacity = parse_capacity(capacity, "capacity")
        self._items: OrderedDict[Key, T] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._adds = 0
        self._evictions = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def get(self, key: Key) -> T | None:
        check_key(key)
        with self._lock:
            try:
                value = self._items[key]
            except KeyError:
                self._misses += 1
                return None
            self._items.move_to_end(key)
            self._hits += 1
            return value

    def add(self, key: Key, value: T) -> None:
        check_key(key)
        with self._lock:
            self._adds += 1
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
                self._evictions += 1

    def erase(self, key: Key) -> bool:
        check_key(key)
        with self._lock:
            return self._items.pop(key, _MISSING) is not _MISSING

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __contains__(self, key: object) -> bool:
        checked = check_key(key)
        with self._lock:
            return checked in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def stats(self) -> Stats:
        with self._lock:
            return {
                "kind": "memory",
                "entries": len(self._items),
                "capacity": self._capacity,
                "hits": self._hits,
                "misses": self._misses,
                "adds": self._adds,
                "evictions": self._evictions,
            }


class PersistentCache(ComputationCache[T], Closing):
    """Objects in memory over a persistent ``Store`` at ``path`` (torch_xla's ``PersistentCache``).

    ``get`` looks in memory, then in the store, and deserializes what it finds. ``deserialize``
    receives the store's ``Blob``, a read-only buffer over the payload (no copy is made): call
    ``bytes(blob)`` if the object must outlive the blob or needs ``bytes``. ``serialize`` returns
    any bytes-like object. A ``deserialize`` that raises makes a miss: counted, logged, and the
    entry removed unless ``read_only``. ``read_only`` caches never write to ``path``; ``add``
    then only fills memory. ``max_size`` is the store's byte budget (int or ``"50G"``).
    ``meta`` (such as ``{"framework": "jax", "framework_version": "0.10.2"}``) is recorded in
    each entry written. ``settings`` gives what is not passed: the memory capacity, the budget,
    ``read_only`` and the store's other settings; an argument passed wins over it. Without it,
    ``Store``'s rule holds (the environment for all but the budget and ``read_only``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        serialize: Callable[[T], Buffer],
        deserialize: Callable[[Blob], T],
        *,
        read_only: bool | None = None,
        max_size: int | str | None = None,
        memory_capacity: int | None = None,
        meta: Mapping[str, str] | None = None,
        settings: Settings | None = None,
    ) -> None:
        cfg = Settings.from_env() if settings is None else settings
        self._memory: MemoryCache[T] = MemoryCache(
            cfg.memory_capacity if memory_capacity is None else memory_capacity
        )
        # A bucket (gs://, s3://, az://) is served by a host-local store with the bucket
        # behind it; any other URL is a ValueError naming ``path``.
        self._store = open_store(path, settings, max_size=max_size, read_only=read_only)
        self._serialize = serialize
        self._deserialize = deserialize
        self._meta = dict(meta) if meta else None
        self._lock = threading.Lock()
        self._counts = {
            "memory_hits": 0,
            "store_hits": 0,
            "misses": 0,
            "deserialize_failures": 0,
            "serialize_failures": 0,
            "writes": 0,
        }

    @property
    def store(self) -> Store:
        return self._store

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def read_only(self) -> bool:
        return self._store.read_only

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def get(self, key: Key) -> T | None:
        value = self._memory.get(_memory_key(key))
        if value is not None:
            self._count("memory_hits")
            return value
        blob = self._store.get(key)
        if blob is None:
            self._count("misses")
            return None
        try:
            value = self._deserialize(blob)
        except Exception:
            self._deserialize_failed(key)
            return None
        self._count("store_hits")
        self._memory.add(_memory_key(key), value)
        return value

    def _deserialize_failed(self, key: Key) -> None:
        self._count("deserialize_failures")
        self._count("misses")
        # The bytes may come from another framework version or a backend that cannot load
        # them (torch_xla on CPU); deleting lets the next compile write a loadable entry.
        logger.warning(
            "xla_pcache: could not deserialize entry %r in %s; treating it as a miss%s",
            key,
            self._store.path,
            "" if self.read_only else " and removing it",
            exc_info=True,
        )
        if not self.read_only:
            try:
                self._store.delete(key)
            except CacheError:
                logger.warning("xla_pcache: could not remove entry %r", key, exc_info=True)

    def add(self, key: Key, value: T) -> None:
        self._memory.add(_memory_key(key), value)
        if self.read_only:
            return
        try:
            data = self._serialize(value)
        except Exception:
            self._count("serialize_failures")
            logger.warning(
                "xla_pcache: could not serialize the value for %r; kept in memory only",
                key,
                exc_info=True,
            )
            return
        try:
            stored = self._store.put(key, data, meta=self._meta)
        except (CacheError, OSError):
            logger.warning("xla_pcache: could not store %r", key, exc_info=True)
            return
        if stored:
            self._count("writes")

    def erase(self, key: Key) -> bool:
        removed = self._memory.erase(_memory_key(key))
        if not self.read_only:
            removed = self._store.delete(key) or removed
        return removed

    def clear(self) -> None:
        """Forget every object in memory and, unless read-only, delete every stored entry
        (but a later release's, which that release reads: ``Store.clear``)."""
        self._memory.clear()
        if not self.read_only:
            self._store.clear()

    def __contains__(self, key: object) -> bool:
        checked = _memory_key(key)
        return checked in self._memory or checked in self._store

    def __len__(self) -> int:
        return len(self._memory)

    def stats(self) -> Stats:
        """This process's counters, the memory layer's (``memory_*``) and the store's
        (``store_*``, aggregated across every process that used the cache)."""
        with self._lock:
            result: Stats = {"kind": "persistent", "path": self.path, **self._counts}
        result["hits"] = int(result["memory_hits"] or 0) + int(result["store_hits"] or 0)
        for name, value in self._memory.stats().items():
            if name != "kind":
                result[f"memory_{name}"] = value
        store_stats: Stats = dict(self._store.stats())  # type: ignore[arg-type]
        for name, value in store_stats.items():
            result[f"store_{name}"] = value
        return result

    def close(self) -> None:
        self._store.close()


def _identity(value: Any) -> Any:
    return value


def from_env(
    serialize: Callable[[Any], Buffer] | None = None,
    deserialize: Callable[[Blob], Any] | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    meta: Mapping[str, str] | None = None,
) -> ComputationCache[Any]:
    """The cache the environment asks for.

    A ``PersistentCache`` when ``XLA_PERSISTENT_CACHE_PATH`` is set (honouring
    ``XLA_PERSISTENT_CACHE_READ_ONLY``, ``XLA_PERSISTENT_CACHE_MAX_SIZE`` and
    ``XLA_COMPILATION_CACHE_SIZE``), else a ``MemoryCache`` of ``XLA_COMPILATION_CACHE_SIZE``
    objects. Without ``serialize``/``deserialize`` the persistent cache stores bytes-like
    values as they are and ``get`` returns ``bytes`` (one copy of the payload); pass
    ``deserialize=lambda blob: blob`` to get the zero-copy ``Blob`` instead.
    Raises ``ValueError`` naming the variable when one is malformed.
    """
    settings = Settings.from_env(environ)
    if settings.path is None:
        return MemoryCache(settings.memory_capacity)
    where = route(settings.path)
    if where.kind == "unserved":
        warn_unserved(where, PATH_VAR, "a MemoryCache instead")
        return MemoryCache(settings.memory_capacity)
    return PersistentCache(
        settings.path,
        serialize if serialize is not None else _identity,
        deserialize if deserialize is not None else bytes,
        meta=meta,
        settings=settings,
    )
