"""torch_xla as the adapter uses it, imported only inside functions (``import xla_pcache``
never imports torch): the bindings it needs, whether it has executed anything, its
persistent-cache counters and compile-time metric, what an entry records of it, and its step
functions wrapped so that a miss can be reported where the step that compiled it returns."""

from __future__ import annotations

import functools
import importlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from xla_pcache import misslog
from xla_pcache._core import CacheError
from xla_pcache.torch_xla import _keyparts as _txkeys

# What CI proves: the oldest and the newest torch_xla the adapter tests run against.
SUPPORTED_TORCH_XLA = "torch_xla >= 2.7, <= 2.9 (CI tests 2.7.0 and 2.9.0)"

_COUNTERS = (
    "PersistentCacheMiss",
    "PersistentCacheHit",
    "PersistentCacheDeserializeFailure",
    "UncachedCompile",
    "CachedCompile",
)


def xla_bindings() -> Any:
    """torch_xla's ``_XLAC``, imported; ``CacheError`` when torch_xla is missing or lacks
    what the adapter needs to create its cache before the first execution."""
    try:
        import torch_xla
    except ImportError as exc:
        raise CacheError(
            f"xla_pcache.torch_xla needs torch_xla; importing it failed: {exc}. "
            'Install it with `pip install "xla-pcache[torch-xla]"`.'
        ) from exc
    xlac = getattr(torch_xla, "_XLAC", None)
    for name in ("_xla_computation_cache_is_initialized", "_xla_get_num_cached_compilation_graph"):
        if not callable(getattr(xlac, name, None)):
            raise CacheError(
                f"xla_pcache.torch_xla supports {SUPPORTED_TORCH_XLA}; torch_xla "
                f"{getattr(torch_xla, '__version__', '?')} lacks _XLAC.{name}, which it needs "
                "to create torch_xla's cache before the first execution"
            )
    return xlac


def executed() -> bool:
    """Whether torch_xla has looked anything up in its cache yet (its first execution)."""
    try:
        counts = torch_xla_counters()
    except Exception:
        return True
    if any(counts.values()):
        return True
    try:
        xlac: Any = xla_bindings()
        return int(xlac._xla_get_num_cached_compilation_graph()) > 0
    except Exception:
        return True


def torch_xla_counters() -> dict[str, int]:
    """torch_xla's persistent-cache counters (0 where never counted)."""
    met: Any = importlib.import_module("torch_xla.debug.metrics")
    return {name: int(met.counter_value(name) or 0) for name in _COUNTERS}


def torch_xla_version() -> str:
    try:
        import torch_xla

        return str(getattr(torch_xla, "__version__", "?"))
    except Exception:
        return "?"


def device_type() -> str:
    try:
        import torch_xla.runtime as xr

        return str(xr.device_type() or "unknown")
    except Exception:
        return "unknown"


class CompileTimes:
    """Finds the compile time of each file torch_xla writes into the view, from its
    ``CompileTime`` metric: torch_xla records a sample (when the compile returned, how long
    it took) and writes the graph's file right after, compiles running one at a time, so a
    file's compile is the latest sample that ended before the file was written and was not
    given to another file."""

    # Filesystem timestamps come from a clock that ticks every few milliseconds, and can
    # read a little earlier than the sample's.
    SLACK_S = 0.02

    def __init__(self) -> None:
        self._used: set[float] = set()
        self._lock = threading.Lock()

    def __call__(self, st: os.stat_result) -> float | None:
        try:
            met: Any = importlib.import_module("torch_xla.debug.metrics")
            data = met.metric_data("CompileTime")
        except Exception:
            return None
        if not data or len(data) < 3:
            return None
        written = st.st_mtime_ns / 1e9 + self.SLACK_S
        with self._lock:
            best: tuple[float, float] | None = None
            for ts, value in data[2]:
                ts, value = float(ts), float(value)
                if ts <= written and ts not in self._used and (best is None or ts > best[0]):
                    best = (ts, value)
            if best is None:
                return None
            self._used.add(best[0])
            return best[1] / 1e9  # the metric is in nanoseconds


# One for the process: a sample given to a file is never given to another.
compile_times = CompileTimes()


def producer_meta() -> dict[str, str]:
    """What an entry this process publishes records of torch_xla."""
    import torch
    import torch_xla

    tx: Any = torch_xla
    return {
        "framework": "torch_xla",
        "framework_version": str(tx.__version__),
        "torch_version": str(torch.__version__),
        "device": device_type(),
        "time": f"{time.time():.3f}",
        # What explain compares (see torch_xla/_keyparts.py; the graph hash is not visible).
        misslog.META_COMPONENTS: misslog.encode(_txkeys.components()),
    }


def watch_steps(after_step: Callable[[], None]) -> None:
    """Run ``after_step`` when a step returns: torch_xla's cache lives in C++ and offers no
    hook before a compile, so the closest point at which a miss can be reported, or fail the
    program, is the end of the step that compiled it (``torch_xla.sync()``,
    ``xm.mark_step()``)."""
    for module_name, attr in (("torch_xla", "sync"), ("torch_xla.core.xla_model", "mark_step")):
        try:
            module: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, attr, None)
        if original is None or getattr(original, "_xla_pcache", False):
            continue

        @functools.wraps(original)
        def step(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(*args, **kwargs)
            after_step()
            return result

        step._xla_pcache = True  # type: ignore[attr-defined]
        setattr(module, attr, step)
