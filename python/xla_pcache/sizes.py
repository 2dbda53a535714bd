"""Byte sizes and durations as people write them: ``"500M"``, ``"1.5T"``, ``"7d"``."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from xla_pcache import _core

_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)

# The core's bound (2^63-1: a budget of 8 EiB is unbounded in practice), read from it.
MAX_SIZE: int = _core.MAX_SIZE
# The store's own bound (about 31 years: longer than any timeout, grace period or age anyone
# means, and far below what its clocks and deadlines can hold), read from the core.
MAX_DURATION_S: float = _core.MAX_DURATION_S


def parse_size(value: int | str | None, *, name: str = "size") -> int | None:
    """Bytes from an int or a string such as ``"1048576"``, ``"500M"``, ``"50G"``, ``"1.5T"``.

    Suffixes are binary (K = 1024). ``None`` means no limit. Anything else that is not a
    size from 0 to ``MAX_SIZE`` (an empty string included) raises ``ValueError`` quoting the
    value, or ``TypeError`` for a bool, float or other type; ``name`` says what it was.
    (Environment variables are read by ``config``, where an empty value means unset.)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{name} must be an int or a string like '50G', not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        result = value
    else:
        if value.strip() == "":
            # An API caller passing "" most likely lost a setting on the way: refusing it is
            # safer than an unbounded cache filling a shared disk.
            raise ValueError(f"invalid {name} {value!r}: empty (leave it out for no limit)")
        m = _SIZE_RE.match(value)
        if m is None:
            raise ValueError(
                f"invalid {name} {value!r}: expected bytes or a number with a K/M/G/T/P suffix, "
                "such as '500M', '50G' or '1.5T'"
            )
        # Decimal: exact for any number of digits ("9" * 40 must not round or overflow).
        result = int(Decimal(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])
    if result > MAX_SIZE:
        shown = f"{value!r}" if len(str(value)) <= 40 else f"{str(value)[:37]!r}..."
        raise ValueError(f"invalid {name} {shown}: more than the maximum of {MAX_SIZE:,} bytes")
    return result


def format_size(n: int | float | None) -> str:
    """``1536`` -> ``"1.5K"``; ``None`` -> ``"unbounded"``."""
    if n is None:
        return "unbounded"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            return f"{int(value)}B" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"  # pragma: no cover


def parse_duration(value: float | int | str, *, name: str = "duration") -> float:
    """Seconds from a number or a string such as ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``.

    Anything but a number or string from 0 to ``MAX_DURATION_S`` (1e9 s, about 31 years) raises
    ``ValueError`` (negative, NaN, infinite, too large, malformed) or ``TypeError`` (a bool
    or another type), naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(
            f"{name} must be a number of seconds or a string like '7d', not {type(value).__name__}"
        )
    if isinstance(value, int | float):
        # Compared before any conversion: an int too large for a float must not overflow.
        if (isinstance(value, float) and not math.isfinite(value)) or value < 0:
            raise ValueError(f"invalid {name} {value!r}: must be a non-negative number of seconds")
        seconds = float(value) if value <= MAX_DURATION_S else math.inf
    else:
        m = _DURATION_RE.match(value)
        if m is None:
            raise ValueError(
                f"invalid {name} {value!r}: expected seconds or a number with an s/m/h/d/w "
                "suffix, such as '30m' or '7d'"
            )
        seconds = float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
    if not seconds <= MAX_DURATION_S:
        shown = f"{value!r}" if len(str(value)) <= 40 else f"{str(value)[:37]!r}..."
        raise ValueError(
            f"invalid {name} {shown}: more than the maximum of {MAX_DURATION_S:.0f} seconds "
            "(about 31 years)"
        )
    return seconds
