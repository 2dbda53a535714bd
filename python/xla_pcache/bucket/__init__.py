"""A bucket as the cache path, and its upkeep (docs/remote.md, "A cache in a bucket").

- ``store``: the host-local store that serves a bucket path (``BucketStore``), the
  directory it lives in and its chain, with the bucket as its last tier (the objstore tier
  reads and writes its entries);
- the upkeep, behind its one door ``upkeep.Bucket``: the objects' names (``layout``), the
  requests (``objects``), the one reader of what is there (``reader``, its listings walked
  by ``listing``), the stored budget (``stored_budget``), a use record (``use_record``), the
  hosts' records of their uses and the writers' prune (``recorder``), the prune lease
  (``prune_lease``), what a prune reads (``prune_fold``), the prune (``prune``), what a
  prune cut short reaches by name (``prune_reach``), which of an entry's markers a prune
  keeps (``prune_markers``), and how a host start lists the markers (``marker_listing``).

The bucket uses the tiers (``xla_pcache.tiers``); no tier uses the bucket. It knows no
framework: an adapter reaches it through ``BucketStore``'s typed methods.
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

__all__ = [
    "BucketStore",
    "chain_for",
    "local_name",
    "local_path",
    "location",
    "own_local_store",
]
