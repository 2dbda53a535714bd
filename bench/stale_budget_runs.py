"""The stale-budget scenario run many times, each on a new two-host bed (an empty
cache, as the test starts): one line per run with the peak on disk, puts published and
refused, and how explicit evict() ended. A test runs it once; this shows the spread.

    sudo python bench/stale_budget_runs.py [--runs 5] [--modes lease,fcntl] [--cache-timeout S]

``--cache-timeout`` omitted mounts with sshfs's default (20 s). Needs what the netfs tests
need: root, /dev/fuse, sshfs and sshd (``tests/reliability/setup_testbed.sh``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "reliability"))

import scenarios  # noqa: E402
import testbed  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default="lease,fcntl", help="lock modes, comma list")
    parser.add_argument("--cache-timeout", type=int, default=None)
    args = parser.parse_args()
    peaks: list[float] = []
    for run in range(args.runs):
        with (
            tempfile.TemporaryDirectory() as base,
            testbed.two_hosts(Path(base), cache_timeout=args.cache_timeout) as bed,
        ):
            for mode in args.modes.split(","):
                with tempfile.TemporaryDirectory() as work:
                    r = scenarios.stale_budget(
                        bed, Path(work), cache_timeout=args.cache_timeout, lock_mode=mode
                    )
                peaks.append(r["peak_ratio"])
                line = {
                    "run": run,
                    "lock_mode": mode,
                    "peak_x_budget": r["peak_ratio"],
                    "published": r["published"],
                    "refused": r["puts_refused"],
                    "evict_s": r["evict_s"],
                    "over_budget_after_evict": r["over_budget_after_evict"],
                    "stats_error_after": round(r["stats_error_after"], 4),
                    "lost": r["lost_count"],
                    "first_seconds_x_budget": r["timeline"][:12],
                }
                print(json.dumps(line), flush=True)
    print(f"peaks: min {min(peaks):.3f}, max {max(peaks):.3f} over {len(peaks)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
