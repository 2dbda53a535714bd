"""A variable's value parsed by its kind (the table's ``kind``: bool, count, size, duration,
choice, path, text): each parser takes the value and the variable's name, and a malformed
value is a ``ValueError`` naming the variable and quoting the value. An empty value never
reaches them: it counts as unset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from xla_pcache import _core
from xla_pcache._url import is_url
from xla_pcache.sizes import MAX_DURATION_S, parse_duration, parse_size

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(value: str, name: str) -> bool:
    """``1/0``, ``true/false``, ``yes/no``, ``on/off`` in any case; anything else is an error."""
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"invalid {name} {value!r}: expected 1/0, true/false, yes/no or on/off")


def parse_capacity(value: str | int, name: str) -> int:
    """A non-negative count of objects (0 keeps nothing in memory)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    if isinstance(value, int):
        count = value
    else:
        try:
            count = int(value.strip(), 10)
        except ValueError:
            raise ValueError(
                f"invalid {name} {value!r}: expected a whole number of objects, such as '2048'"
            ) from None
    if count < 0:
        raise ValueError(f"invalid {name} {value!r}: must not be negative")
    return count


def positive_count(value: str, name: str) -> int:
    count = parse_capacity(value, name)
    if count < 1:
        raise ValueError(f"invalid {name} {value!r}: must be at least 1")
    return count


def choice(value: str, name: str, choices: tuple[str, ...]) -> Any:
    word = value.strip().lower()
    if word not in choices:
        raise ValueError(f"invalid {name} {value!r}: expected one of {', '.join(choices)}")
    return word


def positive_size(value: str, name: str) -> int:
    size = parse_size(value, name=name) or 0
    # The core's rule (a budget of no bytes would evict every entry as soon as it is
    # written); unset means unbounded.
    try:
        return _core.check_size(name, size)
    except ValueError:
        raise ValueError(
            f"invalid {name} {value!r}: must be positive (unset it for no limit)"
        ) from None


def duration(*, zero_ok: bool) -> Callable[[str, str], float]:
    bounds = "from 0 to" if zero_ok else "positive and at most"

    def parse(value: str, name: str) -> float:
        seconds = parse_duration(value, name=name)
        if seconds > MAX_DURATION_S or (seconds == 0 and not zero_ok):
            raise ValueError(
                f"invalid {name} {value!r}: must be {bounds} {MAX_DURATION_S:.0f} seconds"
            )
        return seconds

    return parse


def compile_time(value: str, name: str) -> float:
    # A compile-time threshold is naturally written in milliseconds; "5m" would be minutes.
    word = value.strip()
    scale = 1.0
    if word.lower().endswith("ms"):
        word, scale = word[:-2], 1e-3
    try:
        if not word or (word[-1:].isalpha() and scale != 1.0):
            raise ValueError(word)
        return duration(zero_ok=True)(word, name) * scale
    except ValueError:
        raise ValueError(
            f"invalid {name} {value!r}: expected seconds from 0, such as '0.5', '2s' or '500ms'"
        ) from None


def size(value: str, name: str) -> int:
    return parse_size(value, name=name) or 0


def path(value: str, name: str) -> str:
    return os.path.expanduser(value.strip())


def text(value: str, name: str) -> str:
    return value.strip()


def local_path(value: str, name: str) -> str:
    found = path(value, name)
    if is_url(found):
        # Not quoted: a URL may carry a credential.
        raise ValueError(f"invalid {name}: a local directory, not a URL")
    return found


def absolute(value: str, name: str) -> str | None:
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    value = value.strip()
    return value if os.path.isabs(value) else None
