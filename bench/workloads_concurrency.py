"""1, 2, 4 and 8 processes on one cache directory: throughput and torn/failed reads.

Every process runs the compile-cache pattern: pick a key, ``get`` it, and on a miss build a
value and ``put`` it. Keys come in generations: every ``GEN_PERIOD`` seconds a new set of
``KEYS_PER_GEN`` keys becomes current for all processes at once (as when a fleet starts
compiling a new program together), so processes race to write, and read, the same new keys.

Values identify themselves (blake2b over key + body in a 24-byte header, see
``common.make_value``): a hit whose bytes do not check is a *torn read*. A ``get`` that
raises is a *failed read*; a ``put`` that raises is a *failed write*. Peers with a budget
get ``BUDGET`` bytes, so the bounded ones also evict while the load runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import time
from pathlib import Path
from typing import Any

from .common import MIB, Scratch, check_value, make_value, rotate, settle

GEN_PERIOD = 0.25
KEYS_PER_GEN = 16
VALUE_MIN, VALUE_MAX = 64 * 1024, 512 * 1024
BUDGET = 64 * MIB


def _init() -> None:
    # Import every peer up front so that start-up is not timed.
    import diskcache  # noqa: F401
    import jax._src.lru_cache  # noqa: F401
    import xla_pcache  # noqa: F401


def _warm(_: int) -> int:
    time.sleep(0.2)
    return 0


def worker(
    peer_name: str, path: str, barrier: str, n: int, duration: float, seed: int
) -> dict[str, int]:
    from .peers import BY_NAME

    cls = BY_NAME[peer_name]
    peer = cls(Path(path), BUDGET if cls.bounded else None)
    rng = random.Random(seed)
    c = dict(ops=0, hits=0, misses=0, puts=0, torn=0, failed_reads=0, failed_writes=0)
    # File barrier: start together once all n processes have opened the peer.
    Path(barrier, str(seed)).touch()
    t_wait = time.time()
    while len(os.listdir(barrier)) < n:
        if time.time() - t_wait > 120:
            raise RuntimeError("barrier timed out")
        time.sleep(0.001)
    t_start = time.time()
    c["wait_ms"] = int((t_start - t_wait) * 1000)
    t_end = t_start + duration
    while True:
        now = time.time()
        if now >= t_end:
            break
        gen = int((now - t_start) / GEN_PERIOD)
        key = f"g{gen:05d}k{rng.randrange(KEYS_PER_GEN):03d}"
        c["ops"] += 1
        try:
            v = peer.get(key)
        except Exception:
            c["failed_reads"] += 1
            continue
        if v is not None:
            c["hits"] += 1
            if not check_value(key, v):
                c["torn"] += 1
            del v
            continue
        c["misses"] += 1
        value = make_value(key, rng.randint(VALUE_MIN, VALUE_MAX))
        try:
            peer.put(key, value)
            c["puts"] += 1
        except Exception:
            c["failed_writes"] += 1
    with contextlib.suppress(Exception):
        peer.close()
    return c


def run(
    scratch: Scratch,
    peers: list[str],
    procs: list[int],
    duration: float,
    reps: int,
    log: Any = print,
) -> dict:
    ctx = mp.get_context("spawn")
    res: dict[str, Any] = {
        "duration_s": duration,
        "repeats": reps,
        "gen_period_s": GEN_PERIOD,
        "keys_per_gen": KEYS_PER_GEN,
        "value_range": [VALUE_MIN, VALUE_MAX],
        "budget": BUDGET,
        "runs": {p: {str(n): [] for n in procs} for p in peers},
    }
    with ctx.Pool(max(procs), initializer=_init) as pool:
        # Wait until every worker has started and imported the peers.
        pool.map(_warm, range(4 * max(procs)), chunksize=1)
        i = 0
        for r in range(reps):
            for n in procs:
                for name in rotate(peers, i):
                    i += 1
                    settle()
                    with (
                        scratch.dir(f"cc-{name}-{n}", set_aside=True) as d,
                        scratch.dir("barrier") as b,
                    ):
                        jobs = [
                            pool.apply_async(
                                worker, (name, str(d), str(b), n, duration, 1000 * i + w)
                            )
                            for w in range(n)
                        ]
                        counts = [j.get(timeout=duration + 300) for j in jobs]
                    tot = {k: sum(c[k] for c in counts) for k in counts[0]}
                    tot["wait_ms"] = max(c["wait_ms"] for c in counts)
                    tot["throughput"] = tot["ops"] / duration
                    res["runs"][name][str(n)].append(tot)
                    log(
                        f"  concurrency rep {r + 1} procs={n} {name:<18} "
                        f"{tot['throughput']:8.0f} ops/s  torn={tot['torn']} "
                        f"failed={tot['failed_reads']}/{tot['failed_writes']}"
                    )
    return res
