"""What a put and an explicit evict() cost on the two-host sshfs bed (sshfs's default cache).

    sudo python bench/netfs_costs.py [--builds DIR[,DIR...]] [--rounds 2]

For each build (a directory holding an ``xla_pcache`` package with its ``_core``; default:
this checkout's ``python/``), in turns so that machine noise falls on all of them alike:
- put: one process on host A makes 300 puts of 64 KiB, unbounded and with a 1 MiB budget
  (every put then evicts), while host B has a journal of its own; median and p90 in ms;
- evict: 125 entries of 8 KiB, then three times 125 more and ``evict(max_size=64 KiB)``
  (lock mode lease): seconds per evict().
Compare two builds (e.g. one of an older commit) side by side with ``--builds a,b``.
Needs root, /dev/fuse, sshfs and sshd (``tests/reliability/setup_testbed.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "reliability"))

import testbed  # noqa: E402

PUTS = r"""
import json, os, statistics, sys, time
from xla_pcache._core import Store
root, max_size = sys.argv[1], None if sys.argv[2] == "none" else int(sys.argv[2])
store = Store(root, max_size=max_size)
value = os.urandom(64 * 1024)
times = []
for i in range(300):
    t = time.perf_counter()
    store.put(f"k{i}", value)
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"median_ms": statistics.median(times) * 1e3, "p90_ms": times[270] * 1e3}))
"""

EVICTS = r"""
import json, os, sys, time
from xla_pcache._core import Store
store = Store(sys.argv[1], lock_mode="lease")
for i in range(125):
    store.put(f"k{i}", os.urandom(8192))
times = []
for r in range(3):
    for i in range(125):
        store.put(f"r{r}k{i}", os.urandom(8192))
    t = time.perf_counter()
    store.evict(max_size=64 * 1024)
    times.append(time.perf_counter() - t)
print(json.dumps({"evict_s": times}))
"""


def run(code: str, build: Path, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(build)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{build}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--builds", default=str(REPO / "python"), help="comma list of dirs")
    parser.add_argument("--rounds", type=int, default=2, help="turns per build")
    args = parser.parse_args()
    builds = [Path(b).resolve() for b in args.builds.split(",")]
    with (
        tempfile.TemporaryDirectory() as base,
        testbed.two_hosts(Path(base), cache_timeout=None) as bed,
    ):
        n = 0
        for turn in range(args.rounds):
            for build in builds:
                for max_size in ("none", str(1024 * 1024)):
                    n += 1
                    name = f"puts{n}"
                    # Another host's journal, so the view follows two writers.
                    run(
                        "import sys; from xla_pcache._core import Store;"
                        "Store(sys.argv[1]).put('x', b'1'); print('{}')",
                        build,
                        str(bed.host_b / name),
                    )
                    r = run(PUTS, build, str(bed.host_a / name), max_size)
                    budget = "unbounded" if max_size == "none" else "1 MiB budget"
                    print(
                        f"turn {turn} {build}: put 64 KiB, {budget}: median "
                        f"{r['median_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms",
                        flush=True,
                    )
                n += 1
                r = run(EVICTS, build, str(bed.host_a / f"evict{n}"))
                times = ", ".join(f"{t:.3f}" for t in r["evict_s"])  # type: ignore[union-attr]
                print(f"turn {turn} {build}: evict() of 125 entries: {times} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
