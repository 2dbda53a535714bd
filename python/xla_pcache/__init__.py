"""xla_pcache: a persistent, bounded, multi-process and NFS-safe compilation cache for XLA."""

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
from xla_pcache.caches import ComputationCache, MemoryCache, PersistentCache, from_env
from xla_pcache.config import Settings, default_cache_path, settings_from_env
from xla_pcache.store import Store

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
    "settings_from_env",
]
