"""One adapter per peer, each driving the peer through its own public API.

Every adapter has ``put(key, value)``, ``get(key) -> buffer-like | None`` and ``close()``.
``budget`` is a byte budget for the peers that have one (None: unbounded, or as large as the
peer allows). Keys are short ASCII strings, safe as file names for every peer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

# A budget so large that it never evicts, for peers that must be given one.
HUGE = 1 << 50


class Peer:
    name: ClassVar[str]
    label: ClassVar[str]
    bounded: ClassVar[bool] = True

    def __init__(self, path: Path, budget: int | None = None, **opts: Any) -> None:
        self.path = path

    def put(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


class XlaPcache(Peer):
    name = "xla_pcache"
    label = "xla_pcache Store"

    def __init__(self, path: Path, budget: int | None = None, **opts: Any) -> None:
        from xla_pcache import Store

        super().__init__(path)
        self.store = Store(path, max_size=budget)

    def put(self, key: str, value: bytes) -> None:
        self.store.put(key, value)

    def get(self, key: str) -> Any:
        return self.store.get(key)  # a Blob: buffer protocol, checksum already verified

    def close(self) -> None:
        self.store.close()


class JaxLRUBounded(Peer):
    name = "jax_lru_bounded"
    label = "JAX LRUCache (bounded)"

    def __init__(self, path: Path, budget: int | None = None, **opts: Any) -> None:
        from jax._src.lru_cache import LRUCache

        super().__init__(path)
        # max_size > 0: eviction on, every get/put under a filelock, put rescans the dir.
        self.cache = LRUCache(str(path), max_size=budget or HUGE)

    def put(self, key: str, value: bytes) -> None:
        self.cache.put(key, value)

    def get(self, key: str) -> Any:
        return self.cache.get(key)


class JaxLRUUnbounded(Peer):
    name = "jax_lru_unbounded"
    label = "JAX LRUCache (unbounded)"
    bounded = False

    def __init__(self, path: Path, budget: int | None = None, **opts: Any) -> None:
        from jax._src.lru_cache import LRUCache

        super().__init__(path)
        # max_size=-1: no eviction, no lock; writes with Path.write_bytes in place.
        self.cache = LRUCache(str(path), max_size=-1)

    def put(self, key: str, value: bytes) -> None:
        self.cache.put(key, value)

    def get(self, key: str) -> Any:
        return self.cache.get(key)


class DiskCache(Peer):
    name = "diskcache"
    label = "diskcache.Cache"

    def __init__(
        self, path: Path, budget: int | None = None, small_in_files: bool = False, **opts: Any
    ) -> None:
        import diskcache

        super().__init__(path)
        settings: dict[str, Any] = {
            "size_limit": budget or HUGE,
            # LRU like the others (diskcache's default is least-recently-stored).
            "eviction_policy": "least-recently-used",
        }
        if small_in_files:
            # Values under 32 KB live inside SQLite and count 0 bytes toward size_limit;
            # one file per value makes the budget bite, as it would for real executables.
            settings["disk_min_file_size"] = 0
        self.cache = diskcache.Cache(str(path), **settings)

    def put(self, key: str, value: bytes) -> None:
        self.cache.add(key, value)  # first writer wins, like the others

    def get(self, key: str) -> Any:
        return self.cache.get(key)

    def close(self) -> None:
        self.cache.close()


class TorchXlaDir(Peer):
    name = "torch_xla_dir"
    label = "file per key, in place (torch_xla style)"
    bounded = False

    def put(self, key: str, value: bytes) -> None:
        # As torch_xla's PersistentCache: open, write, close, in place, no rename, no lock.
        with open(self.path / key, "wb") as f:
            f.write(value)

    def get(self, key: str) -> Any:
        p = self.path / key
        if not os.path.exists(p):
            return None
        with open(p, "rb") as f:
            return f.read()


ALL: list[type[Peer]] = [XlaPcache, JaxLRUBounded, JaxLRUUnbounded, DiskCache, TorchXlaDir]
BY_NAME: dict[str, type[Peer]] = {p.name: p for p in ALL}
BUDGETED: list[type[Peer]] = [p for p in ALL if p.bounded]
