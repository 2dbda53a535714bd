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

from .common import MIB, Scratch, rotate, settle, summarize
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


def _reference(value: bytes) -> dict[str, float]:
    """Seconds to copy value into a resident buffer (numpy copyto) and to xxh3-hash it
    (``xla_pcache.hash_key``): this machine's memory bandwidth, for reference."""
    import numpy as np
    from xla_pcache import hash_key

    src = np.frombuffer(value, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the destination in: time the copy, not the page faults
    t0 = time.perf_counter()
    np.copyto(dst, src)
    t1 = time.perf_counter()
    hash_key(value)
    t2 = time.perf_counter()
    return {"memcpy": t1 - t0, "xxh3": t2 - t1}


def run(
    scratch: Scratch,
    peers: list[type[Peer]],
    sizes: dict[str, tuple[int, int, int]],
    log: Any = print,
) -> dict:
    """sizes: label -> (value bytes, repeats, ops per repeat)."""
    out: dict[str, Any] = {"sizes": {}}
    ref: dict[str, list[float]] = {"memcpy": [], "xxh3": []}
    big = max(b for b, _, _ in sizes.values())
    for label, (size, reps, n) in sizes.items():
        value = os.urandom(size)
        samples: dict[str, dict[str, list[float]]] = {p.name: {op: [] for op in OPS} for p in peers}
        for r in range(reps):
            for cls in rotate(peers, r):
                # Small values make many files: set those directories aside (deleting
                # them here slowed the file creations of the next stage's first peers).
                with scratch.dir(f"rt-{label}-{cls.name}", set_aside=size < MIB) as d:
                    peer = cls(d)
                    keys = [f"k{r:03d}x{i:06d}" for i in range(n)]
                    miss = [f"m{r:03d}x{i:06d}" for i in range(n)]
                    settle()
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
            if size == big:  # reference rates, measured between the peers' turns
                for k, t in _reference(value).items():
                    ref[k].append(t)
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
    out["bandwidth"] = {
        "bytes": big,
        "memcpy": big / summarize(ref["memcpy"]).median,
        "xxh3": big / summarize(ref["xxh3"]).median,
    }
    return out
