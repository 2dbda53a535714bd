"""Single flight on the two-host sshfs bed: compiles and wall times with and without it.

    sudo python bench/single_flight.py [--size 360] [--json out.json] [--docs docs/benchmarks.md]

Runs the scenarios of ``tests/reliability/single_flight.py`` (the code the tests run):
one process alone on an empty cache (a cold compile) and then alone on the other mount (a
hit); six processes, three per mount, starting the same program at the same instant on
an empty cache, with single flight and without (``XLA_PCACHE_COMPILE_WAIT=0``); and a
claim holder SIGKILLed while compiling. Prints a markdown section; ``--docs`` puts it in
docs/benchmarks.md between its markers (``bench/run.py`` keeps it when it regenerates).
Needs root, /dev/fuse, sshfs and sshd (``tests/reliability/setup_testbed.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
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


def _section(out: dict[str, Any]) -> list[str]:
    alone = out["alone"]
    yardstick = alone["cold"] + alone["hit"]
    sf, kill = out["single_flight"], out["killed_holder"]
    compiler = min(sf["walls_s"].values())
    notice = sf["notice_s"]
    return [
        "## Single flight: one compile per program for the fleet",
        "",
        "```",
        f"{out['command']}   # {out['date']}, git {out['git']}",
        "```",
        "",
        f"Two sshfs mounts of one export on this machine ({out['cpus']} CPUs, load average "
        f"{out['load'][0]} at start, {out['load'][1]} at end), jax {out['jax']} on CPU. The "
        f"program (`tests/reliability/jax_compile_worker.py`, {out['size']} small loops) "
        "compiles for several seconds; every process prepares (imports, input on the "
        "device), then all start together on an empty cache. Wall time is from the start "
        "line to the result, lowering included.",
        "",
        f"One process alone: cold compile {alone['cold']:.2f} s, then a hit on the other "
        f"mount {alone['hit']:.2f} s (yardstick: their sum, {yardstick:.2f} s).",
        "",
        "| six processes, 3 per mount | compiles | persistent-cache hits | distinct results "
        "| wall min / median / max (s) | max / yardstick | waits | takeovers "
        "| publish to end of wait, min / max (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *_fleet_rows("single flight", sf, yardstick),
        *_fleet_rows("without (`XLA_PCACHE_COMPILE_WAIT=0`)", out["no_single_flight"], yardstick),
        *_fleet_rows(
            f"holder SIGKILLed at +{kill['killed_at_s']:.1f} s "
            f"(5 waiters, lease {kill['claim_lease_s']:.0f} s)",
            kill,
            yardstick,
        ),
        "",
        "Compiles are JAX's own count (its `/jax/compilation_cache/cache_misses` event, "
        "recorded when it writes an entry), hits its `/jax/compilation_cache/cache_hits`; "
        "waits and takeovers are the store's counters. Reading the single-flight row: the "
        f"one compiling process finished in {compiler:.2f} s (alone: {alone['cold']:.2f} s; "
        "six processes lowering at once share the cores); the waiters saw the entry "
        f"{_span(notice)} s after it was published (a waiter re-reads the claim every half "
        "second at most); the rest of their wall time is five deserializations sharing the "
        f"machine's {out['cpus']} cores, which a fleet with a host per process does not "
        "share. Without single flight every process compiles, all six at once on the same "
        "cores, and five of the six puts find the entry already there. With the holder "
        "killed, the waiters judge its claim stale, on their own clocks, "
        f"once they have seen it unchanged for {kill['claim_lease_s']:.0f} s (their first "
        "look may come after the kill); one takes it over and compiles, the others wait "
        "for that one and hit.",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=single_flight.PROGRAM_SIZE)
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    parser.add_argument(
        "--from-json", type=Path, default=None, help="report saved results instead of running"
    )
    parser.add_argument(
        "--docs", type=Path, default=None, help="replace the section in this benchmarks.md"
    )
    args = parser.parse_args()
    out = json.loads(args.from_json.read_text()) if args.from_json else run(args.size)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    lines = _section(out)
    print("\n".join(lines))
    if args.docs:
        block = f"<!-- kept:{SECTION} -->\n" + "\n".join(lines) + f"\n<!-- /kept:{SECTION} -->"
        text = args.docs.read_text() if args.docs.exists() else ""
        pattern = re.compile(rf"<!-- kept:{SECTION} -->.*?<!-- /kept:{SECTION} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: block, text)
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        args.docs.write_text(text)
    return 0


SECTION = "single-flight"


def run(size: int) -> dict[str, Any]:
    import jax

    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "size": size,
        "jax": jax.__version__,
        "command": "sudo python bench/single_flight.py --docs docs/benchmarks.md",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
    }
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="xla-pcache-sf-") as tmp:
        base = Path(tmp)
        with testbed.two_hosts(base / "bed") as bed:
            out["alone"] = single_flight.alone(bed, base / "alone", size=size)
            out["single_flight"] = single_flight.fleet(bed, base / "sf", size=size)
            out["no_single_flight"] = single_flight.fleet(
                bed, base / "nosf", size=size, compile_wait=0
            )
            out["killed_holder"] = single_flight.killed_holder(bed, base / "kill", size=size)
    out["load"] = [load_start, " ".join(f"{x:.2f}" for x in os.getloadavg())]
    return out


if __name__ == "__main__":
    sys.exit(main())
