"""The reports ``Store`` methods return (``stats()``, ``entries()``, ``evict()``, ``verify()``):
plain dicts built by the binding, described here as TypedDicts. A real module rather than a part
of the stub, so that tests/test_stubs.py holds them against what the runtime returns."""

from __future__ import annotations

from typing import TypedDict

Key = str | bytes


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
    # The remote tiers' counters (counted by xla_pcache.chain), summed over the tiers, then
    # per kind of tier.
    remote_hits: int
    remote_misses: int
    remote_rejected: int
    remote_errors: int
    remote_puts: int
    remote_put_exists: int
    remote_read_bytes: int
    remote_written_bytes: int
    remote_get_ms: int
    remote_backfills: int
    remote_redis_hits: int
    remote_redis_misses: int
    remote_redis_rejected: int
    remote_redis_errors: int
    remote_redis_puts: int
    remote_redis_put_exists: int
    remote_redis_read_bytes: int
    remote_redis_written_bytes: int
    remote_redis_get_ms: int
    remote_redis_backfills: int
    remote_s3_hits: int
    remote_s3_misses: int
    remote_s3_rejected: int
    remote_s3_errors: int
    remote_s3_puts: int
    remote_s3_put_exists: int
    remote_s3_read_bytes: int
    remote_s3_written_bytes: int
    remote_s3_get_ms: int
    remote_s3_backfills: int
    remote_gs_hits: int
    remote_gs_misses: int
    remote_gs_rejected: int
    remote_gs_errors: int
    remote_gs_puts: int
    remote_gs_put_exists: int
    remote_gs_read_bytes: int
    remote_gs_written_bytes: int
    remote_gs_get_ms: int
    remote_gs_backfills: int
    remote_az_hits: int
    remote_az_misses: int
    remote_az_rejected: int
    remote_az_errors: int
    remote_az_puts: int
    remote_az_put_exists: int
    remote_az_read_bytes: int
    remote_az_written_bytes: int
    remote_az_get_ms: int
    remote_az_backfills: int
    hit_rate: float | None
    entries: int
    bytes: int
    max_size: int | None
    processes: int
    view_age_s: float | None
    view_fresh: bool
    path: str
    filesystem: str
    read_only: bool
    mmap_reads: bool


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
    unindexed: int
    dangling: int
    stale_tmp: int
    stale_trash: int
    problems: int
    repaired: bool
    skipped_files: list[str]
    interrupted: bool
