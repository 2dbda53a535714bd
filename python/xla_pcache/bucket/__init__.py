"""A bucket as the cache path, and its upkeep (docs/remote.md, "A cache in a bucket").

- ``store``: the host-local store that serves a bucket path (``BucketStore``), the
  directory it lives in and its chain, with the bucket as its last tier (the objstore tier
  reads and writes its entries);
- the upkeep, behind its one door ``upkeep.Bucket``: the objects' names (``layout``), the
  requests (``objects``), the one reader of what is there (``reader``, its listings walked
  by ``listing``), the stored budget (``stored_budget``), a use record (``use_record``), the
  hosts' records of their uses and the writers' prune (``recorder``), the prune lease
  (``prune_lease``), what a prune reads (``prune_fold``), the prune (``prune``), and how a
  torch_xla host start lists the markers (``marker_listing``).

The bucket uses the tiers (``xla_pcache.tiers``); no tier uses the bucket.
"""

from __future__ import annotations

from typing import Any

from xla_pcache.bucket.store import (
    BucketStore,
    chain_for,
    local_name,
    local_path,
    location,
    own_local_store,
)
from xla_pcache.bucket.torch_xla_pull import PULL_ENTRIES, PULL_FETCHES, PULL_MARKERS, PULL_MISSES


def __getattr__(name: str) -> Any:
    # The names an earlier release had here for opening a cache path, kept for code that
    # imported them: both are now the one door, ``xla_pcache.open_store``, taken from the
    # package (whole by the time this module's attributes are asked for; the door imports
    # this module).
    if name in ("open_path", "open_store"):
        import sys
        import warnings

        open_store: Any = sys.modules["xla_pcache"].open_store
        warnings.warn(
            f"xla_pcache.bucket.{name} is xla_pcache.open_store now",
            DeprecationWarning,
            stacklevel=2,
        )
        return open_store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PULL_ENTRIES",
    "PULL_FETCHES",
    "PULL_MARKERS",
    "PULL_MISSES",
    "BucketStore",
    "chain_for",
    "local_name",
    "local_path",
    "location",
    "own_local_store",
]
