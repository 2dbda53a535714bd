"""One JAX process of the single-flight scenarios (``single_flight.py``).

Prepares everything before the start line (imports jax, installs the cache, makes the
input), says so by creating ``<ready>``, waits for ``<go>`` to appear, then compiles and
runs one program that takes a few seconds to compile, and writes a JSON result: the value,
the wall time from the start line to the value, and JAX's persistent-cache events.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HITS = "/jax/compilation_cache/cache_hits"
# JAX records this event when it writes an entry after compiling (compilation_cache.py).
WRITES = "/jax/compilation_cache/cache_misses"


def program(size: int) -> Any:
    import jax.numpy as jnp
    from jax import lax

    def body(i: Any, x: Any) -> Any:
        return jnp.sin(x) * 1.0001 + jnp.cos(x * (i % 7 + 1)) * 0.5

    def f(x: Any) -> Any:
        # Many small loops: XLA's CPU compile time grows with them (about 1 s per 90).
        for j in range(size):
            x = lax.fori_loop(0, 3, body, x) + j
        return x.sum()

    return f


def _time_waits() -> list[tuple[float, float]]:
    """Records the monotonic start and end of every miss's claim-or-wait (for the figures;
    the tests assert on JAX's events, not on these)."""
    from xla_pcache.jax import _single_flight

    spans: list[tuple[float, float]] = []
    original = _single_flight.SingleFlight.after_miss

    def after_miss(self: Any, key: str) -> Any:
        begin = time.monotonic()
        try:
            return original(self, key)
        finally:
            spans.append((begin, time.monotonic()))

    _single_flight.SingleFlight.after_miss = after_miss  # type: ignore[method-assign]
    return spans


def _time_puts() -> list[float]:
    """Records the monotonic time at which each put of the cache returned (published)."""
    import xla_pcache.jax as xj

    times: list[float] = []
    original = xj._StoreCacheImpl.put

    def put(self: Any, key: str, value: bytes) -> None:
        try:
            original(self, key, value)
        finally:
            times.append(time.monotonic())

    xj._StoreCacheImpl.put = put  # type: ignore[method-assign]
    return times


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    import jax
    import numpy as np
    import xla_pcache.jax as xj

    events: Counter[str] = Counter()

    def listener(event: str, **_: Any) -> None:
        events[event] += 1

    jax.monitoring.register_event_listener(listener)
    waits = _time_waits()
    puts = _time_puts()
    store = xj.install(cfg["path"])
    assert store is not None, "the cache did not open"
    f = jax.jit(program(int(cfg["size"])))
    # From numpy: jnp.arange would compile a program of its own (and claim it).
    x = jax.device_put(np.arange(1000.0, dtype=np.float32))
    x.block_until_ready()

    Path(cfg["ready"]).touch()
    go = Path(cfg["go"])
    while not go.exists():
        time.sleep(0.002)
    start = time.monotonic()
    value = float(f(x))
    wall = time.monotonic() - start
    store.flush()
    result = {
        "pid": os.getpid(),
        "value": value,
        "wall": wall,
        "hits": events[HITS],
        "writes": events[WRITES],
        # When (seconds after the start line) each miss began and ended its claim or wait.
        "misses": [(round(a - start, 3), round(b - start, 3)) for a, b in waits],
        "puts": [round(t - start, 3) for t in puts],
        # CLOCK_MONOTONIC is one clock for every process of the machine: lets the
        # scenario line up one process's publish with the others' end of wait.
        "go_mono": start,
    }
    Path(cfg["out"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
