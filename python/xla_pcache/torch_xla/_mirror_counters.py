"""What a host mirror did (its counters, in ``stats()``), and the failures it survived:
each counted, the first of a kind logged as a warning, the rest at debug."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

from xla_pcache._text import package_logger

logger = package_logger("xla_pcache.torch_xla")


@dataclass
class Counters:
    """What the mirror did; ``errors`` counts failures that were logged and survived."""

    published: int = 0
    already_stored: int = 0
    pending: int = 0
    materialized: int = 0
    removed_from_pool: int = 0
    linked: int = 0
    header_scans: int = 0
    errors: int = 0
    # Host directories an earlier release left open to the group, made 0700 and emptied.
    repaired: int = 0

    def __post_init__(self) -> None:
        # The kinds of failure already logged at warning level.
        self._warned: set[str] = set()

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def warn(self, what: str, exc: BaseException) -> None:
        """First failure of a kind at warning level, the rest at debug; always counted."""
        self.errors += 1
        kind = f"{what}:{type(exc).__name__}"
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(
            level,
            "xla_pcache.torch_xla: %s failed (%s: %s); the program goes on without it",
            what,
            type(exc).__name__,
            exc,
        )
