"""Worker processes for the multi-process store tests: `python workers.py MODE ARGS...`.

Values are self-identifying: `value_for(key)` is a pure function of the key, so any reader
can tell a whole, right value from a torn or wrong one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
import traceback

from xla_pcache import Store


def value_for(key: str, min_size: int = 1024, max_size: int = 1 << 20) -> bytes:
    seed = hashlib.blake2b(key.encode(), digest_size=16).digest()
    size = min_size + int.from_bytes(seed[:4], "little") % (max_size - min_size + 1)
    block = hashlib.blake2b(seed, digest_size=64).digest()
    return (key.encode() + b"|" + block * (size // 64 + 1))[:size]


def stress(path: str, seconds: float, budget: int, seed: int, out: str) -> None:
    """Random puts, gets and deletes of 1 KB - 1 MB values against a budget."""
    rng = random.Random(seed)
    store = Store(path, max_size=budget)
    result = {"ops": 0, "puts": 0, "hits": 0, "misses": 0, "deletes": 0, "bad": 0, "errors": []}
    end = time.monotonic() + seconds
    keys = [f"key-{i}" for i in range(60)]
    while time.monotonic() < end:
        key = rng.choice(keys)
        op = rng.random()
        try:
            if op < 0.45:
                result["puts"] += store.put(key, value_for(key))
            elif op < 0.9:
                blob = store.get(key)
                if blob is None:
                    result["misses"] += 1
                elif bytes(blob) == value_for(key):
                    result["hits"] += 1
                else:
                    result["bad"] += 1
            else:
                result["deletes"] += store.delete(key)
        except Exception:
            result["errors"].append(traceback.format_exc())
        result["ops"] += 1
    store.close()
    with open(out, "w") as f:
        json.dump(result, f)


def crash_writer(path: str, log: str, prefix: str) -> None:
    """Puts fresh keys forever; logs each key after its put returned True (until killed)."""
    store = Store(path, max_size=64 << 20)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("ready", flush=True)
    i = 0
    while True:
        key = f"{prefix}-{i}"
        if store.put(key, value_for(key, 1024, 200_000)):
            os.write(fd, (key + "\n").encode())
        i += 1


def crash_evictor(path: str) -> None:
    """Evicts down to a small size forever (until killed)."""
    store = Store(path, max_size=64 << 20, lock_timeout=0.05)
    print("ready", flush=True)
    rng = random.Random(os.getpid())
    while True:
        store.evict(max_size=rng.choice([1 << 20, 4 << 20, 16 << 20]))


def lease_evictor(path: str, seconds: float, out: str) -> None:
    """Repeatedly evicts with the lease lock; the store's eviction trace records intervals."""
    store = Store(path, lock_mode="lease", lease_time=2.0, lock_timeout=0.05)
    end = time.monotonic() + seconds
    runs = skipped = 0
    while time.monotonic() < end:
        for i in range(5):
            store.put(f"{os.getpid()}-{time.monotonic_ns()}-{i}", b"x" * 2000)
        r = store.evict(max_size=20_000)
        if r["skipped"]:
            skipped += 1
        else:
            runs += 1
    with open(out, "w") as f:
        json.dump({"runs": runs, "skipped": skipped}, f)


def slow_lease_holder(path: str) -> None:
    """Fills the cache then evicts all of it with the lease held, to be killed mid-way."""
    store = Store(path, lock_mode="lease", lease_time=1.0)
    for i in range(20000):
        store.put(f"fill-{i}", b"y")
    print("ready", flush=True)
    while True:
        store.evict(max_size=1)
        for i in range(20000):
            store.put(f"refill-{time.monotonic_ns()}-{i}", b"y")


def _key(wire: dict[str, str]) -> str | bytes:
    return wire["s"] if "s" in wire else bytes.fromhex(wire["b"])


def serve() -> None:
    """The other process of the stateful test: one JSON request per stdin line, one JSON
    reply per stdout line ({"r": result} or {"error": traceback}), until "exit"."""
    store: Store | None = None
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "exit":
                break
            if op == "open":
                if store is not None:
                    store.close()
                store = Store(req["path"], max_size=req["max_size"], lock_timeout=0.05)
                result: object = None
            elif op == "close":
                if store is not None:
                    store.close()
                store = None
                result = None
            else:
                assert store is not None, "no store open"
                key = _key(req["key"])
                if op == "put":
                    result = store.put(key, bytes.fromhex(req["value"]))
                elif op == "get":
                    blob = store.get(key)
                    result = None if blob is None else bytes(blob).hex()
                elif op == "delete":
                    result = store.delete(key)
                elif op == "contains":
                    result = key in store
                else:
                    raise ValueError(f"unknown op {op}")
            reply: dict[str, object] = {"r": result}
        except Exception:
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
    if store is not None:
        store.close()


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "stress":
        stress(args[0], float(args[1]), int(args[2]), int(args[3]), args[4])
    elif mode == "crash_writer":
        crash_writer(*args)
    elif mode == "crash_evictor":
        crash_evictor(*args)
    elif mode == "lease_evictor":
        lease_evictor(args[0], float(args[1]), args[2])
    elif mode == "slow_lease_holder":
        slow_lease_holder(args[0])
    elif mode == "serve":
        serve()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
