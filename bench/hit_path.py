"""The JAX adapter's hit path alone: ``StoreCache.get`` of one 187 KiB entry, in-process.

    python bench/hit_path.py DIR     # DIR: a scratch directory (the entry is made once)

Prints the median, in microseconds, of 30 rounds of 200 gets. Run it alternately with two
trees on ``PYTHONPATH`` to compare them (docs/observability.md, "The hit path").
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import xla_pcache.jax as xj
from xla_pcache import Store


def main(root: str) -> None:
    cache_class = xj._cache_class(xj._hooks())
    store = Store(root)
    key = "jit_train_step-" + "ab" * 32
    if store.get(key) is None:
        # About what the demo model's entry holds, with recorded components and time.
        meta = {"framework": "jax", "compile_time_s": "3.2", "key_components": "x" * 1500}
        store.put(key, os.urandom(187 * 1024), meta=meta)
    cache = cache_class(store, {})
    rounds = []
    for _ in range(30):
        start = time.perf_counter()
        for _ in range(200):
            cache.get(key)
        rounds.append((time.perf_counter() - start) / 200)
    print(f"{statistics.median(rounds) * 1e6:.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
