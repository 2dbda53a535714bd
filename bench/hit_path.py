"""The JAX adapter's hit path alone: ``StoreCache.get`` of one 187 KiB entry.

    python bench/hit_path.py DIR            # in-process: median of 30 rounds of 200 gets
    python bench/hit_path.py DIR --first    # this process's first get only
    python bench/hit_path.py DIR --fill [--bare]   # write the entry (--bare: no components)

Prints microseconds. Run it alternately with two trees on ``PYTHONPATH``, over entries each
tree wrote, to compare them (docs/observability.md, "The hit path"). The entry is written
with metadata like what the JAX adapter records (compile time, 1.5 KB of key components)
unless ``--bare``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import xla_pcache.jax as xj
from xla_pcache import Store

KEY = "jit_train_step-" + "ab" * 32


def main(root: str, args: list[str]) -> None:
    store = Store(root)
    if "--fill" in args:
        meta = {"framework": "jax"}
        if "--bare" not in args:
            meta.update({"compile_time_s": "3.2", "key_components": "x" * 1500})
        store.put(KEY, os.urandom(187 * 1024), meta=meta)
        return
    cache = xj._cache_class(xj._hooks())(store, {})
    if "--first" in args:
        start = time.perf_counter()
        cache.get(KEY)
        print(f"{(time.perf_counter() - start) * 1e6:.0f}")
        return
    rounds = []
    for _ in range(30):
        start = time.perf_counter()
        for _ in range(200):
            cache.get(KEY)
        rounds.append((time.perf_counter() - start) / 200)
    print(f"{statistics.median(rounds) * 1e6:.1f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
