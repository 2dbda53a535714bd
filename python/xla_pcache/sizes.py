"""Byte sizes and durations as people write them: ``"500M"``, ``"1.5T"``, ``"7d"``."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_size(value: int | str | None, *, name: str = "size") -> int | None:
    """Bytes from an int or a string such as ``"1048576"``, ``"500M"``, ``"50G"``, ``"1.5T"``.

    Suffixes are binary (K = 1024). ``None`` and ``""`` mean no limit. Anything else that is
    not a non-negative size raises ``ValueError`` quoting the value; ``name`` says what it was.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{name} must be an int or a string like '50G', not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        return value
    if value.strip() == "":
        return None
    m = _SIZE_RE.match(value)
    if m is None:
        raise ValueError(
            f"invalid {name} {value!r}: expected bytes or a number with a K/M/G/T suffix, "
            "such as '500M', '50G' or '1.5T'"
        )
    number = float(m.group(1))
    result = number * _SIZE_UNITS[m.group(2).upper()]
    if not math.isfinite(result):
        raise ValueError(f"invalid {name} {value!r}: too large")
    return int(result)


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
    """Seconds from a number or a string such as ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number or a string like '7d'")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"invalid {name} {value!r}")
        return float(value)
    m = _DURATION_RE.match(value)
    if m is None:
        raise ValueError(
            f"invalid {name} {value!r}: expected seconds or a number with an s/m/h/d/w suffix, "
            "such as '30m' or '7d'"
        )
    return float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
