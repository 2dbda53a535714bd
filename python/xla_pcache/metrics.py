"""What the cache is worth, for people and for monitoring systems.

``prometheus_text()`` renders ``xla-pcache stats`` in the Prometheus text exposition format
through ``prometheus_client`` (the ``metrics`` extra), for node_exporter's textfile
collector (see docs/observability.md): counters aggregated across every process that used
the cache, named ``xla_pcache_*_total``, with a ``tier`` label (``local``, the directory; each
remote tier the store counted, by its name, ``redis``, ``s3``, ...: only tiers that exist;
``remote``, what remote tiers counted that no tier name accounts for, as journals written
before the counters per tier name hold) and a ``cache`` label (the directory), so several
caches on one host do not collide: summed over ``tier``, a counter is the whole cache's.

``log_exit_summary()`` is what the adapters register to run at exit: one INFO line with what
this process did with the store (hits, misses, puts, bytes, compile time saved).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from xla_pcache._reports import tier_counters
from xla_pcache._text import package_logger

logger = package_logger("xla_pcache")

# stats() name -> help. The metric is named as the stat (without xla_pcache_ and _total)
# unless _RENAMED names it otherwise.
_COUNTER_HELP: tuple[tuple[str, str], ...] = (
    ("hits", "Lookups served from the cache."),
    ("misses", "Lookups the cache could not serve."),
    ("other_build", "Misses of a key another build of the framework's runtime has an entry for."),
    ("puts", "Entries published."),
    ("put_exists", "Puts of a key already present (first writer won)."),
    ("adopted", "Hits served from JAX's own cache files and taken over."),
    ("bytes_read", "Payload bytes served by hits."),
    ("bytes_written", "Payload bytes published."),
    ("compile_saved_ms", "Compile time the hits saved."),
    ("evictions", "Entries evicted."),
    ("evicted_bytes", "Disk bytes freed by eviction."),
    ("corrupt", "Entries found corrupt (each also a miss)."),
    ("newer_format", "Lookups that met a later release's entry (each also a miss, left alone)."),
    ("errors", "I/O failures treated as misses or skipped writes."),
    ("too_large", "Values over the budget, not stored."),
    ("puts_refused", "Puts refused: over budget, no room made in time."),
    ("claims", "Compile claims taken (single flight)."),
    ("claim_takeovers", "Claims taken over from a silent holder."),
    ("claims_abandoned", "Claims given up without a publish."),
    ("claim_waits", "Waits for another process's compile."),
    ("claim_wait_ms", "Time spent waiting for others' compiles."),
    ("claim_wait_timeouts", "Waits that ran out."),
    ("unsafe_paths", "Paths skipped: not a real directory in the cache."),
    ("unreadable", "Index files skipped: could not be read."),
    ("prefetch_planned", "Executables a plan named to load ahead (JAX)."),
    ("prefetch_loaded", "Executables loaded ahead of their read."),
    ("prefetch_used", "Reads served by an executable loaded ahead."),
    ("prefetch_wasted", "Executables loaded ahead and never read."),
    ("prefetch_errors", "Loads ahead that failed (each then read as before)."),
    ("prefetch_saved_ms", "Time the reads served from loading ahead saved."),
    ("prefetch_plans_written", "Prefetch plans written."),
    ("prefetch_plans_refused", "Prefetch plans refused as malformed."),
    ("prefetch_compiled", "Programs compiled ahead from their module records (JAX)."),
    (
        "prefetch_compiled_used",
        "Programs compiled ahead and handed to JAX's compile of the same module.",
    ),
    ("prefetch_modules_refused", "Module records refused as malformed or over their bounds."),
    (
        "build_rehashes",
        "Process starts that hashed the runtime's binaries with no record to keep them in.",
    ),
)
_RENAMED: Mapping[str, str] = {
    "other_build": "other_build_misses",
    "put_exists": "puts_existing",
    "bytes_read": "read_bytes",
    "bytes_written": "written_bytes",
    "compile_saved_ms": "compile_time_saved_seconds",
    "claim_wait_ms": "claim_wait_seconds",
    "unreadable": "unreadable_files",
    "prefetch_saved_ms": "prefetch_saved_seconds",
}
# Units per base unit; dividing, not multiplying by 1e-3, keeps 286 ms as 0.286 and not
# 0.28600000000000003.
_PER_UNIT: Mapping[str, int] = {
    "compile_saved_ms": 1000,
    "claim_wait_ms": 1000,
    "prefetch_saved_ms": 1000,
}
# stats() name -> (metric name, help, units per base unit).
_COUNTERS: tuple[tuple[str, str, str, int], ...] = tuple(
    (stat, _RENAMED.get(stat, stat), help_text, _PER_UNIT.get(stat, 1))
    for stat, help_text in _COUNTER_HELP
)

# The remote tiers' counters (xla_pcache.tiers.chain) under the local names where they match.
_REMOTE_COUNTERS: Mapping[str, str] = {
    "remote_hits": "hits",
    "remote_misses": "misses",
    "remote_puts": "puts",
    "remote_put_exists": "puts_existing",
    "remote_rejected": "corrupt",
    "remote_errors": "errors",
    "remote_read_bytes": "read_bytes",
    "remote_written_bytes": "written_bytes",
    "remote_too_large": "too_large",
}

_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("entries", "entries", "Entries in the cache."),
    ("bytes", "disk_bytes", "Bytes the entries take on disk."),
    ("max_size", "max_size_bytes", "The cache's byte budget (absent when unbounded)."),
    ("max_age_s", "max_age_seconds", "Entries unused this long are evicted (absent if unset)."),
    ("processes", "processes", "Processes whose counters are included."),
    ("view_age_s", "view_age_seconds", "Age of the oldest journal data in these figures."),
)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class _StatsCollector:
    def __init__(self, report: Mapping[str, Any]) -> None:
        self._report = report

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        report = self._report
        cache = str(report.get("path", ""))
        families: dict[str, Any] = {}
        for stat, name, help_text, scale in _COUNTERS:
            value = _number(report.get(stat))
            if value is None:
                continue
            fam = families.setdefault(
                name, CounterMetricFamily(f"xla_pcache_{name}", help_text, labels=["cache", "tier"])
            )
            fam.add_metric([cache, "local"], value / scale)
        tiers = tier_counters(report)
        for stat, name in _REMOTE_COUNTERS.items():
            value = _number(report.get(stat))
            if value is None:
                continue
            help_text = next((h for _, n, h, _ in _COUNTERS if n == name), name)
            fam = families.setdefault(
                name, CounterMetricFamily(f"xla_pcache_{name}", help_text, labels=["cache", "tier"])
            )
            # Each tier the store counted, by name; what they do not account for stays
            # "remote" (journals from before the counters per tier name).
            rest = value
            counter = stat.removeprefix("remote_")
            for tier, counts in sorted(tiers.items()):
                part = float(counts.get(counter, 0))
                fam.add_metric([cache, tier], part)
                rest -= part
            if rest > 0 or not tiers:
                fam.add_metric([cache, "remote"], rest)
        yield from families.values()
        for stat, name, help_text in _GAUGES:
            value = _number(report.get(stat))
            if value is None:
                continue
            gauge = GaugeMetricFamily(f"xla_pcache_{name}", help_text, labels=["cache"])
            gauge.add_metric([cache], value)
            yield gauge


def prometheus_text(report: Mapping[str, Any]) -> str:
    """``report`` (what ``xla-pcache stats --format json`` prints) in the Prometheus text
    format. Raises ImportError naming the extra when prometheus_client is missing."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
    except ImportError as exc:
        raise ImportError(
            'prometheus output needs prometheus_client: pip install "xla-pcache[metrics]"'
        ) from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatsCollector(report))
    return generate_latest(registry).decode()


def human_duration(seconds: float) -> str:
    """``11520`` -> ``"3 h 12 min"``; ``42.5`` -> ``"42.5 s"``."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60)} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


# --- one summary per process at exit ----------------------------------------------------------

_exit_lock = threading.Lock()
_exit_stores: weakref.WeakSet[Any] = weakref.WeakSet()
_exit_registered = False


def summary(store: Any, hits: int | None = None, misses: int | None = None) -> str | None:
    """One line about what this process did with ``store``, or None when it did nothing.
    ``hits`` and ``misses`` replace the store's where the framework reads the cache itself
    (torch_xla)."""
    c = dict(store.process_stats())
    if hits is not None:
        c["hits"] = hits
    if misses is not None:
        c["misses"] = misses
    if not any(c.get(k) for k in ("hits", "misses", "puts")):
        return None
    from xla_pcache.sizes import format_size

    return (
        f"xla_pcache: this process: {c.get('hits', 0)} hits, {c.get('misses', 0)} misses, "
        f"{c.get('puts', 0)} puts, {format_size(c.get('bytes_read', 0))} read, "
        f"{format_size(c.get('bytes_written', 0))} written, compile time saved "
        f"{human_duration(c.get('compile_saved_ms', 0) / 1000)} ({store.path})"
    )


def log_summary(store: Any, hits: int | None = None, misses: int | None = None) -> None:
    """Log ``summary()`` now, at INFO (when there is anything to say)."""
    line = summary(store, hits, misses)
    if line is not None:
        logger.info("%s", line)


def _log_at_exit() -> None:
    with _exit_lock:
        stores = list(_exit_stores)
    for store in stores:
        try:
            line = summary(store)
        except Exception:  # a closed store, or one whose directory is gone
            continue
        if line is not None:
            logger.info("%s", line)


def log_exit_summary(store: Any) -> None:
    """Log ``summary(store)`` at INFO when the process exits (once per store)."""
    global _exit_registered
    with _exit_lock:
        _exit_stores.add(store)
        if not _exit_registered:
            atexit.register(_log_at_exit)
            _exit_registered = True
