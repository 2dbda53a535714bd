"""Time that xla_pcache.torch_xla.install() adds to process start.

A store of N entries of SIZE bytes under torch_xla keys; each sample is a fresh process that
imports torch_xla (not timed, it costs the same with or without the cache), then times
install(). Cold host: an empty local directory each time (every entry is copied into the
host pool). Warm host: a local directory already in step (directory reads and hard links).

    python bench/torch_xla_install.py --entries 1000 --size 1M --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from xla_pcache import Store
from xla_pcache.sizes import parse_size

CHILD = """
import json, sys, time
import torch_xla  # imported before the clock starts
from xla_pcache import torch_xla as xt
t0 = time.perf_counter()
inst = xt.install(sys.argv[1], local_dir=sys.argv[2], sync_interval=None)
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, **inst.stats()}))
"""


def sample(store: str, local: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PERSISTENT_CACHE")}
    env.setdefault("PJRT_DEVICE", "CPU")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, store, local],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--size", default="1M")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to build the store (default: a temp dir)")
    args = ap.parse_args()
    size = parse_size(args.size) or 0
    base = tempfile.mkdtemp(prefix="xla-pcache-bench-", dir=args.dir)
    try:
        store_dir = os.path.join(base, "store")
        t0 = time.perf_counter()
        with Store(store_dir) as store:
            payload = bytearray(os.urandom(size))
            for i in range(args.entries):
                payload[:8] = i.to_bytes(8, "little")
                # Names like torch_xla's: a 128-bit hash in decimal.
                name = str(10**37 + i * 7919)
                store.put(f"torch_xla/{name}", payload, meta={"framework": "torch_xla"})
        print(
            f"store: {args.entries} entries of {args.size} built in "
            f"{time.perf_counter() - t0:.1f} s at {store_dir}"
        )
        cold: list[float] = []
        for i in range(args.repeat):
            r = sample(store_dir, os.path.join(base, f"cold{i}"))
            assert r["linked"] == args.entries, r
            cold.append(float(r["seconds"]))  # type: ignore[arg-type]
            shutil.rmtree(os.path.join(base, f"cold{i}"))
        warm_dir = os.path.join(base, "warm")
        sample(store_dir, warm_dir)
        warm: list[float] = []
        for _ in range(args.repeat):
            r = sample(store_dir, warm_dir)
            assert r["materialized"] == 0 and r["header_scans"] == 0, r
            warm.append(float(r["seconds"]))  # type: ignore[arg-type]
        for label, xs in (("cold host", cold), ("warm host", warm)):
            print(
                f"{label}: median {statistics.median(xs) * 1000:.1f} ms "
                f"(min {min(xs) * 1000:.1f}, max {max(xs) * 1000:.1f}, n={len(xs)})"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
