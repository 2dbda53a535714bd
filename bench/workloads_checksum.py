"""Checksum throughput: ``xla_pcache.hash_key`` (the xxh3 the store verifies and writes with,
vector path chosen at run time) against the C xxHash library (python-xxhash ``xxh3_128``,
which dispatches to AVX2/AVX-512 itself) and against a copy of the same bytes into a resident
buffer (``numpy.copyto``: memory bandwidth), interleaved in one run.

The 550 KB buffer (a typical JAX executable) stays in the CPU cache between repeats, so it
measures the hash loop; 64 MB does not, so it measures memory."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .common import rotate, summarize

SIZES = {"550 KB": 550_000, "64 MB": 64 << 20}


def _rate(fn: Callable[[], Any], nbytes: int, inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return nbytes * inner / (time.perf_counter() - t0)


def run(reps: int, log: Any = print) -> dict:
    import numpy as np
    import xxhash
    from xla_pcache import _core, hash_key

    out: dict[str, Any] = {"impl": _core.hash_impl(), "xxhash": xxhash.XXHASH_VERSION, "sizes": {}}
    for label, n in SIZES.items():
        value = os.urandom(n)
        src = np.frombuffer(value, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # fault the destination in: time the copy, not the page faults
        fns: dict[str, Callable[[], Any]] = {
            "xla_pcache": lambda v=value: hash_key(v),
            "python-xxhash": lambda v=value: xxhash.xxh3_128_intdigest(v),
            "memcpy": lambda d=dst, s=src: np.copyto(d, s),
        }
        inner = max(1, (256 << 20) // n)
        for f in fns.values():
            f()  # warm up
        rates: dict[str, list[float]] = {k: [] for k in fns}
        for r in range(reps):
            for name in rotate(list(fns), r):
                rates[name].append(_rate(fns[name], n, inner))
        med = {k: summarize(v).median for k, v in rates.items()}
        out["sizes"][label] = {"bytes": n, "repeats": reps, "inner": inner, "rate": med}
        log(
            f"  checksum {label}: xla_pcache {med['xla_pcache'] / 1e9:.1f} GB/s, python-xxhash "
            f"{med['python-xxhash'] / 1e9:.1f} GB/s, memcpy {med['memcpy'] / 1e9:.1f} GB/s"
        )
    return out
