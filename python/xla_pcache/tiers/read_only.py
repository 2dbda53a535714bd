"""A read-only tier: what a tier is when its URL says ``?ro=1`` (or ``?read_only=``), or when
a read-only process opens a bucket path's chain (every tier then is one). The choice is made
once, where the chain opens its tiers (``chain.open_chain``); from there on the tier is of
this type, and what it does not have it cannot do.

``ReadOnlyTier`` serves reads from the tier it wraps and has no write: no ``put_async``, no
compile claims, no writer thread to run work on. The chain writes (puts and backfills) only
the tiers that can be written, listed once when it is made, so it checks no mode on a write;
``read_only`` stays readable for what reports the chain (doctor, stats, ``describe``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xla_pcache.tiers.base import Fetched, Spool, Tier


class ReadOnlyTier:
    """``tier`` read, never written: ``get``, ``stats``, ``flush`` and ``close`` are the
    wrapped tier's; there is no way to write through it. Its counters are the wrapped
    tier's (a read-only tier counts its reads as any tier does, and has no writes to
    count)."""

    read_only = True

    def __init__(self, tier: Tier) -> None:
        self._tier = tier
        self.url = tier.url

    def get(self, name: str, *, max_bytes: int | None, spool: Spool | None) -> Fetched:
        return self._tier.get(name, max_bytes=max_bytes, spool=spool)

    def stats(self) -> dict[str, int | str]:
        return self._tier.stats()

    def flush(self) -> None:
        self._tier.flush()

    def close(self) -> None:
        self._tier.close()
