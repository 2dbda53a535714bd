"""The remote tiers behind a store's directory, as one family (as sccache's ``src/cache``).

- ``base``: the interface every tier offers (``Tier``), the one parser of a tier URL's mode
  options, and the bookkeeping every kind shares (``TierBase``: counters, back-off after a
  failure, the background writer);
- one module per kind: ``redis`` (a Redis server), ``objstore`` (S3, GCS, Azure through
  obstore, with compile claims on the bucket);
- ``read_only``: what a tier marked ``?ro=1`` is once opened (``ReadOnlyTier``: its reads,
  no write);
- ``chain``: the tiers in order (``fetch(names, accept)`` with backfill, write-through to
  the tiers that can be written; what it found, with the core's verdict on each value it
  refused: ``Fetch``), and the counters kept per tier name.

``xla_pcache.store.Store`` reaches the tiers only through the names below; they are opened
on the first miss or put that needs them, so a store that is only looked at (``xla-pcache
stats``) starts no client, thread or exit hook. A bucket that is a cache path, and its
upkeep, are not a tier's: they live in ``xla_pcache.bucket``, which uses the objstore tier
(no tier imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xla_pcache.tiers.base import Spooled, Tier, TierURL, redact, split_chain

if TYPE_CHECKING:
    from xla_pcache.tiers.chain import (
        Chain,
        Fetch,
        Refused,
        check_chain,
        hide_chain_secrets,
        open_chain,
        redact_chain,
    )

# The chain imports every kind of tier and its client's modules: it is imported when one of
# its names is first asked for, so that a module that only redacts a URL or parses a tier's
# options (a directory's ``file:`` URL) does not pay for it.
_CHAIN_NAMES = frozenset(
    {"Chain", "Fetch", "Refused", "check_chain", "hide_chain_secrets", "open_chain", "redact_chain"}
)


def __getattr__(name: str) -> Any:
    if name in _CHAIN_NAMES:
        from xla_pcache.tiers import chain

        return getattr(chain, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Chain",
    "Fetch",
    "Refused",
    "Spooled",
    "Tier",
    "TierURL",
    "check_chain",
    "hide_chain_secrets",
    "open_chain",
    "redact",
    "redact_chain",
    "split_chain",
]
