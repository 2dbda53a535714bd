"""Settings from environment variables, named as torch_xla names them plus our own.

Every malformed value is a ``ValueError`` that names the variable and quotes the value:
a cache that silently falls back to a default could fill a shared disk or write to a
directory that was meant to be read-only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from xla_pcache.sizes import parse_duration, parse_size

PATH_VAR = "XLA_PERSISTENT_CACHE_PATH"
READ_ONLY_VAR = "XLA_PERSISTENT_CACHE_READ_ONLY"
MEMORY_CAPACITY_VAR = "XLA_COMPILATION_CACHE_SIZE"
MAX_SIZE_VAR = "XLA_PERSISTENT_CACHE_MAX_SIZE"
COMPILE_WAIT_VAR = "XLA_PCACHE_COMPILE_WAIT"
CLAIM_LEASE_VAR = "XLA_PCACHE_CLAIM_LEASE"

# Single flight: how long a process that misses waits for another one compiling the same
# program, at most (longer than most compiles, short enough that a stuck holder costs a
# few minutes, not a job); and how long a claim may go without a heartbeat.
DEFAULT_COMPILE_WAIT_S = 300.0
DEFAULT_CLAIM_LEASE_S = 30.0
# The longest duration the store accepts (about 31 years; the Rust core refuses more).
MAX_DURATION_S = 1e9

# torch_xla's in-memory cache holds 2048 computations by default; keep the same number so
# switching between the C++ and Python caches does not change memory use.
DEFAULT_MEMORY_CAPACITY = 2048

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class Settings:
    """What the environment asks of the cache.

    ``path`` is None when no persistent cache is wanted. ``max_size`` is a byte budget or
    None for unbounded. ``memory_capacity`` is the number of live objects kept in memory.
    """

    path: str | None = None
    read_only: bool = False
    max_size: int | None = None
    memory_capacity: int = DEFAULT_MEMORY_CAPACITY


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


def _get(environ: Mapping[str, str], name: str) -> str | None:
    # An empty variable counts as unset, as in torch_xla and in shells that export VAR=.
    value = environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value


def memory_capacity_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """``XLA_COMPILATION_CACHE_SIZE``, or the default of 2048."""
    raw = _get(environ, MEMORY_CAPACITY_VAR)
    return DEFAULT_MEMORY_CAPACITY if raw is None else parse_capacity(raw, MEMORY_CAPACITY_VAR)


def read_only_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """``XLA_PERSISTENT_CACHE_READ_ONLY``, or False."""
    raw = _get(environ, READ_ONLY_VAR)
    return False if raw is None else parse_bool(raw, READ_ONLY_VAR)


def max_size_from_env(environ: Mapping[str, str] = os.environ) -> int | None:
    """``XLA_PERSISTENT_CACHE_MAX_SIZE`` in bytes, or None (unbounded)."""
    raw = _get(environ, MAX_SIZE_VAR)
    size = parse_size(raw, name=MAX_SIZE_VAR)
    # A zero budget would evict every entry as soon as it is written; unset means unbounded.
    if size == 0:
        raise ValueError(
            f"invalid {MAX_SIZE_VAR} {raw!r}: must be positive (unset it for no limit)"
        )
    return size


def path_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """``XLA_PERSISTENT_CACHE_PATH`` with ``~`` expanded, or None."""
    raw = _get(environ, PATH_VAR)
    return None if raw is None else os.path.expanduser(raw)


def compile_wait_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """``XLA_PCACHE_COMPILE_WAIT`` in seconds (``"90"``, ``"90s"``, ``"5m"``), or 300.
    ``0`` turns single flight off: every process that misses compiles."""
    raw = _get(environ, COMPILE_WAIT_VAR)
    if raw is None:
        return DEFAULT_COMPILE_WAIT_S
    wait = parse_duration(raw, name=COMPILE_WAIT_VAR)
    if not 0 <= wait <= MAX_DURATION_S:
        raise ValueError(
            f"invalid {COMPILE_WAIT_VAR} {raw!r}: must be from 0 to {MAX_DURATION_S:.0f} seconds"
        )
    return wait


def claim_lease_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """``XLA_PCACHE_CLAIM_LEASE`` in seconds, or 30: a compile claim whose heartbeat a
    waiter has not seen change for this long is taken over."""
    raw = _get(environ, CLAIM_LEASE_VAR)
    if raw is None:
        return DEFAULT_CLAIM_LEASE_S
    lease = parse_duration(raw, name=CLAIM_LEASE_VAR)
    if not 0 < lease <= MAX_DURATION_S:
        raise ValueError(
            f"invalid {CLAIM_LEASE_VAR} {raw!r}: must be positive and at most "
            f"{MAX_DURATION_S:.0f} seconds"
        )
    return lease


def settings_from_env(environ: Mapping[str, str] = os.environ) -> Settings:
    """Read every variable; raise ``ValueError`` on the first malformed one."""
    return Settings(
        path=path_from_env(environ),
        read_only=read_only_from_env(environ),
        max_size=max_size_from_env(environ),
        memory_capacity=memory_capacity_from_env(environ),
    )


def default_cache_path(environ: Mapping[str, str] = os.environ) -> str:
    """``$XDG_CACHE_HOME/xla_pcache``, or ``~/.cache/xla_pcache`` per the XDG base-dir spec."""
    base = _get(environ, "XDG_CACHE_HOME")
    # The spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    if base is None or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xla_pcache")
