"""A tier marked ``?ro=1``, of any kind: read, never written (nor backfilled)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Buffer

    from xla_pcache.tiers.base import Spooled, Tier


class ReadOnly:
    """``tier`` behind the same interface, with every write dropped: what is read from it
    is counted by the tier as usual."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier
        self.url = tier.url

    def get(
        self,
        name: str,
        *,
        max_bytes: int | None = None,
        spool: Callable[[], Spooled] | None = None,
    ) -> Buffer | list[Buffer] | Spooled | None:
        return self.tier.get(name, max_bytes=max_bytes, spool=spool)

    def put_async(self, name: str, data: Buffer, *, own: bool = False) -> None:
        return None

    def count(self, counter: str, n: int = 1) -> None:
        self.tier.count(counter, n)

    def stats(self) -> dict[str, int | str]:
        return self.tier.stats()

    def flush(self) -> None:
        self.tier.flush()

    def close(self) -> None:
        self.tier.close()
