"""Single flight on the two-host sshfs bed: compiles and wall times with and without it.

    sudo python bench/single_flight.py [--size 360] [--json out.json]

Runs the scenarios of ``tests/reliability/single_flight.py`` (the code the tests run):
one process alone on an empty cache (a cold compile) and then alone on the other mount (a
hit); six processes, three per mount, starting the same program at the same instant on
an empty cache, with single flight and without (``XLA_PCACHE_COMPILE_WAIT=0``); and a
claim holder SIGKILLed while compiling. Prints a markdown table for docs/benchmarks.md.
Needs root, /dev/fuse, sshfs and sshd (``tests/reliability/setup_testbed.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "reliability"))

import single_flight  # noqa: E402
import testbed  # noqa: E402


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.2f} / {max(values):.2f}"


def _fleet_rows(label: str, run: dict[str, Any], yardstick: float) -> list[str]:
    slowest = run["slowest_s"]
    walls = sorted(run["walls_s"].values())
    stats = run["stats"]
    return [
        f"| {label} | {run['compiles']} | {run['hits']} | {len(run['values'])} | "
        f"{walls[0]:.2f} / {walls[len(walls) // 2]:.2f} / {slowest:.2f} | "
        f"{slowest / yardstick:.2f} | {stats['claim_waits']} | {stats['claim_takeovers']} | "
        f"{_span(run['notice_s'])} |"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=single_flight.PROGRAM_SIZE)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out: dict[str, Any] = {"cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="xla-pcache-sf-") as tmp:
        base = Path(tmp)
        with testbed.two_hosts(base / "bed") as bed:
            out["alone"] = single_flight.alone(bed, base / "alone", size=args.size)
            out["single_flight"] = single_flight.fleet(bed, base / "sf", size=args.size)
            out["no_single_flight"] = single_flight.fleet(
                bed, base / "nosf", size=args.size, compile_wait=0
            )
            out["killed_holder"] = single_flight.killed_holder(bed, base / "kill", size=args.size)
    alone = out["alone"]
    yardstick = alone["cold"] + alone["hit"]
    lines = [
        f"One process alone: cold compile {alone['cold']:.2f} s, then a hit on the other "
        f"mount {alone['hit']:.2f} s (yardstick: their sum, {yardstick:.2f} s).",
        "",
        "| six processes, 3 per mount | compiles | persistent-cache hits | distinct results "
        "| wall min / median / max (s) | max / yardstick | waits | takeovers "
        "| publish to end of wait, min / max (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *_fleet_rows("single flight", out["single_flight"], yardstick),
        *_fleet_rows("without (`XLA_PCACHE_COMPILE_WAIT=0`)", out["no_single_flight"], yardstick),
        *_fleet_rows(
            f"holder SIGKILLed at +{out['killed_holder']['killed_at_s']:.1f} s "
            f"(5 waiters, lease {out['killed_holder']['claim_lease_s']:.0f} s)",
            out["killed_holder"],
            yardstick,
        ),
    ]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
