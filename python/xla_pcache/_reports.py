"""The reports ``Store`` methods return (``stats()``, ``entries()``, ``evict()``, ``verify()``):
plain dicts built by the binding, described here as TypedDicts. A real module rather than a part
of the stub, so that tests/test_stubs.py holds them against what the runtime returns."""

# No `from __future__ import annotations`: TypedDict reads NotRequired from real annotations.
from collections.abc import Mapping
from typing import NotRequired, TypedDict

from xla_pcache import _core

Key = str | bytes

# The counters the store keeps per remote tier, from the core (stats::TIER_COUNTER_NAMES):
# ``stats()`` reports each as ``remote_<tier>_<counter>``, and their sums as ``remote_<counter>``.
TIER_COUNTERS: tuple[str, ...] = tuple(_core.TIER_COUNTERS)
# Longest first: a key is read as the longest counter name it ends with.
_BY_LENGTH = sorted(TIER_COUNTERS, key=len, reverse=True)


def tier_counters(report: Mapping[str, object]) -> dict[str, dict[str, int]]:
    """The per-tier counters of a ``stats()`` report, by tier name then counter: only the
    tiers the report holds (the store names no tier it did not count). The store reports
    every counter of a tier it counted, so a name with fewer (``remote_get_errors``, a
    tier's own process counter) is no tier."""
    out: dict[str, dict[str, int]] = {}
    for key, value in report.items():
        if not key.startswith("remote_") or isinstance(value, bool) or not isinstance(value, int):
            continue
        rest = key.removeprefix("remote_")
        for counter in _BY_LENGTH:
            tier = rest.removesuffix(f"_{counter}")
            if tier != rest and tier:
                out.setdefault(tier, {})[counter] = value
                break
    return {t: c for t, c in out.items() if len(c) == len(TIER_COUNTERS)}


class Stats(TypedDict):
    """What ``Store.stats()`` returns: the counters summed over every process that used the
    cache, and what they are about."""

    hits: int
    misses: int
    puts: int
    put_exists: int
    corrupt: int
    errors: int
    evictions: int
    evicted_bytes: int
    bytes_written: int
    bytes_read: int
    too_large: int
    claims: int
    claim_takeovers: int
    claims_abandoned: int
    claim_waits: int
    claim_wait_ms: int
    claim_wait_timeouts: int
    puts_refused: int
    unsafe_paths: int
    unreadable: int
    compile_saved_ms: int
    # The remote tiers' counters, summed over the tiers and over every process: present only
    # once some tier counted (a store without tiers reports none). Each tier's own are keys
    # ``remote_<tier>_<counter>`` (``<counter>`` one of TIER_COUNTERS), not declared here since
    # the tiers' names are data: ``tier_counters()`` reads them.
    remote_hits: NotRequired[int]
    remote_misses: NotRequired[int]
    remote_rejected: NotRequired[int]
    remote_errors: NotRequired[int]
    remote_puts: NotRequired[int]
    remote_put_exists: NotRequired[int]
    remote_read_bytes: NotRequired[int]
    remote_written_bytes: NotRequired[int]
    remote_get_ms: NotRequired[int]
    remote_backfills: NotRequired[int]
    # Entries a store with trusted keys would not serve (a miss each, never loaded), and
    # what a trusting import rejected.
    untrusted: int
    # Lookups served from JAX's own cache files (each also a hit).
    adopted: int
    # Misses of a key another build of the framework's runtime has an entry for (each also
    # a miss; xla_pcache.builds).
    other_build: int
    # Loading ahead (the JAX adapter): entries plans named, loaded ahead, taken by a read
    # (each also a hit), loaded and never taken, failed, the time the reads saved, plans
    # written and refused.
    prefetch_planned: int
    prefetch_loaded: int
    prefetch_used: int
    prefetch_wasted: int
    prefetch_errors: int
    prefetch_saved_ms: int
    prefetch_plans_written: int
    prefetch_plans_refused: int
    # Process starts that hashed the runtime's binaries with no record to keep their
    # identities in (xla_pcache.builds: every such start pays the hash again).
    build_rehashes: int
    # Compiling ahead (the JAX adapter): programs compiled ahead from their module records,
    # those handed to JAX's compile, module records refused.
    prefetch_compiled: int
    prefetch_compiled_used: int
    prefetch_modules_refused: int
    # Lookups that met an entry of a later release's format, in the directory or a tier
    # (each a miss; the entry is left for that release).
    newer_format: int
    hit_rate: float | None
    entries: int
    bytes: int
    max_size: int | None
    # The cache's stored max age (`xla-pcache config --max-age`), seconds.
    max_age_s: float | None
    processes: int
    view_age_s: float | None
    view_fresh: bool
    path: str
    filesystem: str
    read_only: bool
    mmap_reads: bool


class StoredBudget(TypedDict):
    """The cache's stored budget (its CONFIG file; ``Store.cache_settings()``): ``max_size``
    in bytes, ``max_age_s`` in seconds; None where not set."""

    max_size: int | None
    max_age_s: float | None


class Entry(TypedDict):
    """One entry of ``Store.entries()``."""

    key: Key
    name: str
    size: int
    disk_bytes: int
    created: float
    last_use: float | None
    hits: int
    meta: dict[str, str]
    # The name of the key that signed the entry, or None when it is unsigned.
    signer: str | None


class EvictReport(TypedDict):
    """What ``Store.evict()`` did."""

    removed: int
    bytes: int
    dropped: int
    added: int
    names: list[str]
    skipped: str | None
    skipped_files: list[str]
    interrupted: bool


class VerifyReport(TypedDict):
    """What ``Store.verify()`` found (and repaired when asked)."""

    entries: int
    bytes: int
    corrupt: list[str]
    foreign: list[str]
    # Entries of a later release's format: indexed (budgeted), never removed by a repair.
    newer_format: list[str]
    unindexed: int
    dangling: int
    stale_tmp: int
    stale_trash: int
    problems: int
    repaired: bool
    skipped_files: list[str]
    interrupted: bool
