"""Warm start of real programs: xla_pcache against JAX's own cache, zero code, fresh processes.

    python bench/real_programs_warm_start.py --json out.json   # run (in a JAX venv with
                                                               # xla_pcache, flax, optax,
                                                               # equinox installed)
    python bench/real_programs_warm_start.py --plot out.json docs/bench_real_programs.png

The programs are ``tests/jax/real_programs.py`` (flax linen, flax nnx, equinox, each with
optax; they know nothing of xla_pcache), each run alone in a fresh process configured by the
environment only:

- ``xla_pcache``: ``XLA_PERSISTENT_CACHE_PATH`` alone (the README's set-up);
- ``jax``: JAX's own cache, ``JAX_COMPILATION_CACHE_DIR`` with its default thresholds
  (``XLA_PCACHE_DISABLE=1``, so xla_pcache stays out);
- ``jax_0``: the same with ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``.

Per program and cache: one cold process (empty cache) then one warm one; compile time is the
sum of JAX's ``backend_compile_duration`` events of the process (on jax 0.12 the event also
times the loading of a hit), hits and lookups JAX's own events; a lookup that did not hit
compiled. Then four processes of one program started at once on an empty cache, per cache:
how many programs each compiled (xla_pcache's single flight makes the others wait for the
first compile of each program and hit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "jax" / "real_programs.py"
NAMES = ("linen", "nnx", "equinox")
CACHES = {
    "xla_pcache": "xla_pcache (path only)",
    "jax": "JAX's cache, default thresholds",
    "jax_0": "JAX's cache, min compile time 0",
}
CONCURRENT = 4


def _env(cache: str, path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    if cache == "xla_pcache":
        env["XLA_PERSISTENT_CACHE_PATH"] = str(path)
    else:
        env.update(XLA_PCACHE_DISABLE="1", JAX_COMPILATION_CACHE_DIR=str(path))
        if cache == "jax_0":
            env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def _start(name: str, cache: str, path: Path) -> tuple[subprocess.Popen[str], float]:
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(cache, path),
    )
    return proc, time.perf_counter()


def _finish(proc: subprocess.Popen[str], started: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=1200)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"program failed:\n{err[-3000:]}")
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    report["wall_s"] = wall
    return report


def run(scratch: Path, concurrent_program: str) -> dict[str, Any]:
    results: dict[str, Any] = {"runs": {}, "concurrent": {}}
    for name in NAMES:
        for cache in CACHES:
            path = scratch / f"{name}-{cache}"
            cold = _finish(*_start(name, cache, path))
            warm = _finish(*_start(name, cache, path))
            results["runs"][f"{name}/{cache}"] = {"cold": cold, "warm": warm}
            print(f"{name}/{cache}: {json.dumps({'cold': cold, 'warm': warm})}", file=sys.stderr)
    for cache in ("xla_pcache", "jax_0"):
        path = scratch / f"concurrent-{cache}"
        procs = [_start(concurrent_program, cache, path) for _ in range(CONCURRENT)]
        results["concurrent"][cache] = [_finish(p, t) for p, t in procs]
    results["concurrent_program"] = concurrent_program
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| program | cache | cold: programs, compile time | warm: hits / lookups "
        "| warm: compile time | warm / cold compile time |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in results["runs"].items():
        name, cache = key.split("/")
        cold, warm = r["cold"], r["warm"]
        ratio = warm["compile_seconds"] / cold["compile_seconds"]
        lines.append(
            f"| {name} | {CACHES[cache]} | {cold['lookups']}, {cold['compile_seconds']:.2f} s "
            f"| {warm['hits']} / {warm['lookups']} | {warm['compile_seconds']:.2f} s "
            f"| {ratio:.0%} |"
        )
    lines += [
        "",
        f"{CONCURRENT} processes of `{results['concurrent_program']}` started at once on an "
        "empty cache:",
        "",
        "| cache | programs compiled, per process | total compiled | hits per process |",
        "|---|---|---|---|",
    ]
    for cache, reports in results["concurrent"].items():
        compiles = [r["lookups"] - r["hits"] for r in reports]
        lines.append(
            f"| {CACHES[cache]} | {', '.join(map(str, compiles))} | {sum(compiles)} "
            f"| {', '.join(str(r['hits']) for r in reports)} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / (len(CACHES) + 1)
    for i, name in enumerate(NAMES):
        cold = min(results["runs"][f"{name}/{c}"]["cold"]["compile_seconds"] for c in CACHES)
        ax.bar(
            i,
            cold,
            width,
            color="0.7",
            label="cold (fastest of the three cold runs)" if i == 0 else None,
        )
        for j, cache in enumerate(CACHES, start=1):
            warm = results["runs"][f"{name}/{cache}"]["warm"]["compile_seconds"]
            ax.bar(
                i + j * width,
                warm,
                width,
                color=f"C{j - 1}",
                label=CACHES[cache] if i == 0 else None,
            )
    ax.set_xticks([i + width * len(CACHES) / 2 for i in range(len(NAMES))], NAMES)
    ax.set_ylabel("compile time in the process (s)")
    ax.set_title("Second run of real programs: compile time left (JAX's backend_compile_duration)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument("--dir", default=None, help="where the scratch caches go")
    parser.add_argument("--concurrent-program", default="equinox", choices=NAMES)
    parser.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="plot saved results")
    a = parser.parse_args()
    if a.plot:
        results = json.loads(Path(a.plot[0]).read_text())
        plot(results, Path(a.plot[1]))
        print(table(results))
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="xla-pcache-real-", dir=a.dir))
    try:
        results = run(scratch, a.concurrent_program)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    import jax

    results["jax"] = jax.__version__
    results["cpus"] = os.cpu_count()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    print(f"jax {results['jax']}, CPU, {results['cpus']} CPUs\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
