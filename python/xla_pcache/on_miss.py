"""What a miss of the persistent cache does (``XLA_PCACHE_ON_MISS``): compile, warn, error.

Serving fleets would rather learn at deploy time that a warm-up missed a program than pay a
compile at request time. ``error`` makes a miss fail the framework's compile with
``CacheMissError``; ``warn`` compiles and logs one warning per miss, with the one-line
reason ``xla-pcache explain`` would give. A program found in the cache runs in every mode:
only a miss reaches this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.config import ON_MISS_VAR

__all__ = ["CacheMissError", "handle"]

logger = package_logger("xla_pcache")


class CacheMissError(RuntimeError):
    """A program was not in the persistent cache and ``XLA_PCACHE_ON_MISS=error``."""

    def __init__(self, program: str, key: str, framework: str, reason: str) -> None:
        self.program = program
        self.key = key
        self.framework = framework
        self.reason = reason
        super().__init__(
            f"{ON_MISS_VAR}=error: {framework} program {program!r} is not in the persistent "
            f"compilation cache (key {key}); {reason}. Warm the cache with this program "
            f"first, or unset {ON_MISS_VAR} to compile it"
        )


def reason(
    store: Any,
    key: str,
    parts: dict[str, Any] | None,
    framework: str,
    module_diff: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> str:
    """Why ``key`` missed, in one line (``xla-pcache explain``'s answer, with the module's
    diff against the nearest record's where the computation changed and ``module_diff``
    gives one); never raises."""
    try:
        from xla_pcache import explain, misslog

        record = misslog.miss_record(key, parts, framework)
        entries = explain._recent_entries(store)
        result = explain.explain_records([record], entries, module_diff)[0]
        return explain.one_line(result)
    except Exception as exc:
        logger.debug("xla_pcache: cannot explain the miss of %r: %s", key, exc)
        return f"{key}: no entry"


def handle(
    mode: str,
    store: Any,
    key: str,
    *,
    program: str,
    framework: str,
    parts: dict[str, Any] | None = None,
    module_diff: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Apply ``mode`` to a miss of ``key``: nothing for ``compile``, one warning for
    ``warn``, ``CacheMissError`` for ``error``."""
    if mode == "compile":
        return
    why = reason(store, key, parts, framework, module_diff)
    if mode == "error":
        raise CacheMissError(program, key, framework, why)
    logger.warning("xla_pcache: %s cache miss for program %r: %s", framework, program, why)
