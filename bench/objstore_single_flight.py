"""Single flight without a shared directory: six JAX processes, three per "host" (each host
its own cache directory), sharing only an S3 bucket (SeaweedFS on loopback), start the same
program together. Prints how many compiled and the slowest process's wall time, against one
compile alone plus one remote hit alone, measured in the same run.

    PYTHONPATH=python python bench/objstore_single_flight.py [--layers 12]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.jax.helpers import finish_jax, runs, start_jax
from tests.tiers.servers import start_s3


def _steps(cache: Path, layers: int, ready: Path | None, go: Path | None) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"op": "install", "path": str(cache), "compile_wait": 300}]
    if ready is not None and go is not None:
        steps.append({"op": "wait", "ready": str(ready), "file": str(go)})
    return [*steps, *runs(5, layers=layers)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = start_s3(tmp / "weed")
        try:
            env = {"XLA_PCACHE_REMOTE": server.url(uuid.uuid4().hex), **server.env()}
            go = tmp / "go"
            ready = [tmp / f"ready-{i}" for i in range(6)]
            procs = [
                start_jax(_steps(tmp / ("a" if i < 3 else "b"), args.layers, ready[i], go), env)
                for i in range(6)
            ]
            while not all(r.exists() for r in ready):
                time.sleep(0.02)
            go.touch()
            fleet = [finish_jax(p, timeout=600)["runs"][0] for p in procs]
            # The baselines, alone: one compile on an empty bucket, one remote hit.
            env1 = {"XLA_PCACHE_REMOTE": server.url(uuid.uuid4().hex), **server.env()}
            alone = finish_jax(start_jax(_steps(tmp / "c", args.layers, None, None), env1))["runs"][
                0
            ]
            hit = finish_jax(start_jax(_steps(tmp / "d", args.layers, None, None), env1))["runs"][0]
        finally:
            server.stop()
    compiles = sum(1 for r in fleet if r["hit"] == 0)
    slowest = max(r["seconds"] for r in fleet)
    print(f"fleet of 6 (2 hosts x 3, bucket only): {compiles} compile(s), hits {6 - compiles}")
    print("hits per process: " + ", ".join(str(r["hit"]) for r in fleet))
    print(
        f"slowest process: {slowest:.2f} s (per process: "
        + ", ".join(f"{r['seconds']:.2f}" for r in fleet)
        + ")"
    )
    print(
        f"one compile alone {alone['seconds']:.2f} s (hit={alone['hit']}) + one remote hit "
        f"alone {hit['seconds']:.2f} s (hit={hit['hit']}) = "
        f"{alone['seconds'] + hit['seconds']:.2f} s"
    )


if __name__ == "__main__":
    main()
