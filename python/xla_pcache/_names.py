"""One gate for names that come from outside this process: an entry name used as an object
key or a Redis key, a claim name on a bucket. Whatever reaches a tier's paths was either made
by ``entry_name`` here or read from a bucket another writer controls; either way it is usable
only as an ``EntryName``, whose only constructor checks its shape, so a name with ``/``,
``..``, NUL, controls or any length but 32 cannot name an object outside the tier's prefix.
The type annotations of the functions that build keys take ``EntryName``, so mypy refuses an
unchecked ``str`` there."""

from __future__ import annotations

import re

# The store's entry names: xxh3-128 of the key, 32 lower-case hex digits.
_ENTRY_NAME = re.compile(r"[0-9a-f]{32}")
ENTRY_NAME_LEN = 32


class EntryName(str):
    """An entry name known to have the shape the store gives its names."""

    __slots__ = ()

    def __new__(cls, value: object) -> EntryName:
        if isinstance(value, EntryName):
            return value
        if not isinstance(value, str):
            raise TypeError(f"an entry name is a str, got {type(value).__name__}")
        if len(value) != ENTRY_NAME_LEN or not _ENTRY_NAME.fullmatch(value):
            shown = value[:40].encode("unicode_escape").decode("ascii")
            raise ValueError(f"not an entry name (32 lower-case hex digits): {shown!r}")
        return super().__new__(cls, value)


def entry_name_or_none(value: object) -> EntryName | None:
    """``EntryName(value)``, or None for what is not one (a name read from a listing that
    another writer planted: skipped, never used)."""
    try:
        return EntryName(value)
    except (TypeError, ValueError):
        return None
