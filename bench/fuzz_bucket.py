"""The bucket-state fuzzer's long run: `python bench/fuzz_bucket.py --steps N --seed S`.

Runs `tests/bucketstate_fuzz.py`'s harness (hosts' real operations on a cache whose path is
a bucket of a real SeaweedFS server behind the tests' relay, hostile objects planted between
them) for N steps per seed, then its final phase, and prints the figures: steps, operations,
processes, plants, the failures by kind, and per operation its largest peak RSS and most
requests with their bounds; with `--floods N`, the flood table: each kind of flood
(`tests/floods.py`) planted alone, N keys, and every operation run with it, its exit
status, requests (bound), time and peak RSS (bound). Exit status 1 if any step failed.
`--seeds K` runs seeds S..S+K-1 one after another (each with its own server);
`--failures FILE` writes every failure as a JSON line (seed, step, kind, operation,
detail) for reproduction with the same
seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import bucketstate_fuzz as bz


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    ap.add_argument(
        "--op-timeout", type=float, default=120.0, help="an op without a request this long hangs"
    )
    ap.add_argument("--op-limit", type=float, default=900.0, help="an op past this long hangs")
    ap.add_argument("--rlimit-as", type=int, default=4 << 30, help="address-space limit of each op")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies planted counts and sizes")
    ap.add_argument(
        "--no-read-only", action="store_true", help="leave out the read-only hosts' operations"
    )
    ap.add_argument(
        "--floods",
        type=int,
        default=0,
        metavar="N",
        help="after the steps, plant each kind of flood alone (N keys) and run every "
        "operation with it: the flood table",
    )
    ap.add_argument("--failures", type=Path, help="write failures here as JSON lines")
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (weed.log)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    total = bz.Figures()
    failures: list[bz.Failure] = []
    start = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - start:6.0f} s] {message[:400]}", flush=True)

    for seed in range(a.seed, a.seed + a.seeds):
        base = Path(tempfile.mkdtemp(prefix=f"fuzz-bucket-{seed}-"))
        try:
            h = bz.run(
                a.steps,
                seed,
                base,
                op_timeout=a.op_timeout,
                op_limit=a.op_limit,
                rlimit_as=a.rlimit_as,
                scale=a.scale,
                floods=a.floods,
                read_only_hosts=not a.no_read_only,
                log=(lambda m: None) if a.quiet else log,
            )
        finally:
            if a.keep:
                print(f"kept {base}", flush=True)
            else:
                bz.cleanup(base)
        print(bz.summary(h.figures, seed, h.failures), flush=True)
        failures += h.failures
        if a.failures:
            with a.failures.open("a") as f:
                for fl in h.failures:
                    f.write(json.dumps({"seed": seed, **dataclasses.asdict(fl)}) + "\n")
        total.merge(h.figures)
    if a.seeds > 1:
        print(f"\nall {a.seeds} seeds from {a.seed}:")
        print(bz.summary(total, f"{a.seed} to {a.seed + a.seeds - 1}", failures))
    print(f"wall time {time.monotonic() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
