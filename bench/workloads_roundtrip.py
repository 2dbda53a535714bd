"""put / get-hit / get-miss for 100 KB and 64 MB values, every peer, interleaved.

Each repeat gives every peer a fresh directory and times a batch of puts of new keys, then
gets of those keys (hits: the call plus ``memoryview`` of what it returns; every peer has
read and, where it checks anything, checked all bytes by then), then gets of absent keys.
A repeat's figure is the mean time per operation over its batch; the report gives the median
over repeats with the IQR and min-max. Peers run in a rotated order in each repeat.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from .common import MIB, Scratch, rotate, summarize
from .peers import Peer

OPS = ("put", "get_hit", "get_miss", "round_trip")


def _time_batch(peer: Peer, keys: list[str], miss_keys: list[str], value: bytes) -> dict:
    n = len(keys)
    size = len(value)
    pc = time.perf_counter
    t0 = pc()
    for k in keys:
        peer.put(k, value)
    t1 = pc()
    for k in keys:
        v = peer.get(k)
        mv = memoryview(v)
        if mv.nbytes != size:
            raise RuntimeError(f"{peer.name}: got {mv.nbytes} bytes, expected {size}")
        mv.release()
        del v
    t2 = pc()
    for k in miss_keys:
        if peer.get(k) is not None:
            raise RuntimeError(f"{peer.name}: hit on an absent key")
    t3 = pc()
    put, hit = (t1 - t0) / n, (t2 - t1) / n
    return {"put": put, "get_hit": hit, "get_miss": (t3 - t2) / n, "round_trip": put + hit}


def _check_once(peer: Peer, key: str, value: bytes) -> None:
    v = peer.get(key)
    if v is None or bytes(memoryview(v)) != value:
        raise RuntimeError(f"{peer.name}: value read back differs")


def memory_bandwidth(size: int = 64 * MIB, reps: int = 5) -> dict[str, float]:
    """Reference rates on this machine: memcpy (numpy copyto) and xxh3 hashing, in bytes/s."""
    import numpy as np
    from xla_pcache import hash_key

    src = np.frombuffer(os.urandom(size), dtype=np.uint8)
    dst = np.empty_like(src)
    cp, hs = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        cp.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hash_key(src)
        hs.append(time.perf_counter() - t0)
    return {
        "memcpy": size / summarize(cp).median,
        "xxh3": size / summarize(hs).median,
    }


def run(
    scratch: Scratch,
    peers: list[type[Peer]],
    sizes: dict[str, tuple[int, int, int]],
    log: Any = print,
) -> dict:
    """sizes: label -> (value bytes, repeats, ops per repeat)."""
    out: dict[str, Any] = {"sizes": {}, "bandwidth": memory_bandwidth()}
    for label, (size, reps, n) in sizes.items():
        value = os.urandom(size)
        samples: dict[str, dict[str, list[float]]] = {p.name: {op: [] for op in OPS} for p in peers}
        for r in range(reps):
            for cls in rotate(peers, r):
                with scratch.dir(f"rt-{label}-{cls.name}") as d:
                    peer = cls(d)
                    keys = [f"k{r:03d}x{i:06d}" for i in range(n)]
                    miss = [f"m{r:03d}x{i:06d}" for i in range(n)]
                    gc.collect()
                    gc.disable()
                    try:
                        res = _time_batch(peer, keys, miss, value)
                    finally:
                        gc.enable()
                    if r == 0:
                        _check_once(peer, keys[0], value)
                    peer.close()
                    del peer  # drop it before its directory goes
                for op, t in res.items():
                    samples[cls.name][op].append(t)
            log(f"  roundtrip {label}: repeat {r + 1}/{reps} done")
        out["sizes"][label] = {
            "bytes": size,
            "repeats": reps,
            "ops_per_repeat": n,
            "peers": {
                name: {op: summarize(xs).as_dict() for op, xs in ops.items()}
                for name, ops in samples.items()
            },
        }
    return out
