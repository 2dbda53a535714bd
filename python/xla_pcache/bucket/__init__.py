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

from xla_pcache.bucket.store import (
    BucketStore,
    chain_for,
    local_name,
    local_path,
    location,
    own_local_store,
)
from xla_pcache.bucket.torch_xla_pull import PULL_ENTRIES, PULL_FETCHES, PULL_MARKERS, PULL_MISSES

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
