"""xla_pcache: a persistent, bounded, multi-process and NFS-safe compilation cache for XLA.

``Stats``, ``Entry``, ``EvictReport`` and ``VerifyReport`` (what ``Store.stats()``,
``entries()``, ``evict()`` and ``verify()`` return: plain dicts at run time) are names for
type checkers only: import them under ``if typing.TYPE_CHECKING:``.
"""

from typing import TYPE_CHECKING

from xla_pcache._core import (
    FORMAT_VERSION,
    Blob,
    CacheError,
    FormatError,
    Hasher,
    ReadOnlyError,
    entry_name,
    hash_key,
)
from xla_pcache._core import __version__ as __version__
from xla_pcache.cache_path import open_store
from xla_pcache.caches import ComputationCache, MemoryCache, PersistentCache, from_env
from xla_pcache.config import Settings, default_cache_path, settings_from_env
from xla_pcache.store import Store

if TYPE_CHECKING:
    from xla_pcache._reports import Entry as Entry
    from xla_pcache._reports import EvictReport as EvictReport
    from xla_pcache._reports import Stats as Stats
    from xla_pcache._reports import VerifyReport as VerifyReport

__all__ = [
    "FORMAT_VERSION",
    "Blob",
    "CacheError",
    "ComputationCache",
    "FormatError",
    "Hasher",
    "MemoryCache",
    "PersistentCache",
    "ReadOnlyError",
    "Settings",
    "Store",
    "default_cache_path",
    "entry_name",
    "from_env",
    "hash_key",
    "open_store",
    "settings_from_env",
]
