"""The directory-state fuzzer's long run: `python bench/fuzz_dir.py --steps N --seed S`.

Runs `tests/dirstate_fuzz.py`'s harness (real operations on a cache directory, hostile state
planted between them, a SeaweedFS server for the tier steps) for N steps per seed and prints
the figures: steps, operations, processes, states planted, outside changes, hangs, aborts,
panics, tracebacks, raw escapes, and each operation's own peak RSS (the largest by kind of
operation, and the three largest with what was planted before them). Exit status 1 if any
step failed. `--seeds K` runs seeds S..S+K-1 one after another; `--failures FILE` writes
every failure as a JSON line (step, kind, operation, detail) for reproduction with the same
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

from tests import dirstate_fuzz as dz


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    ap.add_argument("--no-s3", action="store_true", help="skip the tier steps (no SeaweedFS)")
    ap.add_argument("--op-timeout", type=float, default=60.0, help="seconds before an op is a hang")
    ap.add_argument("--rlimit-as", type=int, default=2 << 30, help="address-space limit of each op")
    ap.add_argument("--rss-bound-mib", type=int, default=512, help="peak RSS over this fails")
    ap.add_argument("--scale", type=float, default=4.0, help="multiplies planted counts and sizes")
    ap.add_argument("--failures", type=Path, help="write failures here as JSON lines")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    total = dz.Figures()
    failures: list[dz.Failure] = []
    start = time.monotonic()
    for seed in range(a.seed, a.seed + a.seeds):
        base = Path(tempfile.mkdtemp(prefix=f"fuzz-dir-{seed}-"))
        try:
            h = dz.run(
                a.steps,
                seed,
                base,
                with_s3=not a.no_s3,
                op_timeout=a.op_timeout,
                rlimit_as=a.rlimit_as,
                rss_bound_kib=a.rss_bound_mib << 10,
                scale=a.scale,
                log=(lambda m: None) if a.quiet else (lambda m: print(m[:300], flush=True)),
            )
        finally:
            dz.cleanup(base)
        print(dz.summary(h.figures, seed, h.failures), flush=True)
        failures += h.failures
        if a.failures:
            with a.failures.open("a") as f:
                for fl in h.failures:
                    f.write(json.dumps({"seed": seed, **dataclasses.asdict(fl)}) + "\n")
        for field in dataclasses.fields(total):
            v = getattr(h.figures, field.name)
            if field.name == "peak_by_kind":
                for k, n in v.items():
                    total.peak_by_kind[k] = max(total.peak_by_kind.get(k, 0), n)
            elif field.name == "top_peaks":
                tagged = [(kib, f"{op} (seed {seed})", step, what) for kib, op, step, what in v]
                total.top_peaks = sorted(total.top_peaks + tagged, key=lambda t: -t[0])[:3]
            elif isinstance(v, int) and field.name != "peak_rss_kib":
                setattr(total, field.name, getattr(total, field.name) + v)
            elif isinstance(v, dict):
                acc = getattr(total, field.name)
                for k, n in v.items():
                    acc[k] = acc.get(k, 0) + n
        if h.figures.peak_rss_kib > total.peak_rss_kib:
            total.peak_rss_kib, total.peak_rss_op = h.figures.peak_rss_kib, h.figures.peak_rss_op
    if a.seeds > 1:
        print(f"\nall {a.seeds} seeds from {a.seed}:")
        print(dz.summary(total, a.seed, failures))
    print(f"wall time {time.monotonic() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
