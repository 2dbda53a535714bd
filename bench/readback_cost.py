"""What a hit costs against what the compile it saves cost: the measurement behind the default
``XLA_PCACHE_MIN_COMPILE_TIME`` / ``XLA_PCACHE_MIN_ENTRY_SIZE`` (0: store everything).

    python bench/readback_cost.py            # 3 warm processes
    python bench/readback_cost.py --quick    # 1

Programs of entry sizes from a few KB to tens of MB (small and larger MLPs with their
gradients, and functions closing over a constant of 1, 16 and 64 MB, which the executable
carries) are compiled in one fresh process through the JAX adapter (thresholds 0), then run
in fresh warm processes. Per program: the compile JAX measured cold (its
``backend_compile_duration`` event), the store's ``get`` in the warm process (the adapter's
``StoreCache.get``, first call, then the median of repeated calls), and JAX's whole
retrieval (``cache_retrieval_time_sec``: get, decompression, deserialization). A program is
worth storing when the whole retrieval costs less than the compile.
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
from pathlib import Path
from typing import Any

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
RETRIEVAL_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"
HIT_EVENT = "/jax/compilation_cache/cache_hits"
REPEATED_GETS = 20
PROGRAMS = ("scalar", "mlp_small", "mlp_large", "const_1M", "const_16M", "const_64M")


def build(jax: Any, name: str) -> tuple[Any, tuple[Any, ...]]:
    import numpy as np

    jnp = jax.numpy
    rng = np.random.default_rng(PROGRAMS.index(name))
    if name == "scalar":
        return jax.jit(lambda x: jnp.sin(x).sum() * 3.0), (jnp.arange(8.0),)
    if name.startswith("mlp"):
        width, depth = (64, 2) if name == "mlp_small" else (512, 12)
        ws = [
            jnp.asarray(rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width))
            for _ in range(depth)
        ]
        x = jnp.ones((32, width), jnp.float32)

        def loss(ws: list[Any], x: Any) -> Any:
            for w in ws:
                x = jnp.tanh(x @ w)
            return (x**2).mean()

        return jax.jit(jax.value_and_grad(loss)), (ws, x)
    mib = int(name.split("_")[1].rstrip("M"))
    const = rng.standard_normal(mib * (1 << 20) // 4, dtype=np.float32)
    return jax.jit(lambda x: (x + const) * 2.0), (jnp.ones_like(const),)


def worker(path: str) -> dict[str, Any]:
    import jax
    import xla_pcache.jax as xj

    xj.install(path, min_compile_time=0, min_entry_size=0)
    compiles: list[float] = []
    retrievals: list[float] = []
    hits: list[str] = []
    gets: list[tuple[str, float, int]] = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == HIT_EVENT else None
    )

    def on_duration(event: str, duration_secs: float, **_: Any) -> None:
        if event == COMPILE_EVENT:
            compiles.append(duration_secs)
        elif event == RETRIEVAL_EVENT:
            retrievals.append(duration_secs)

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    original_get = xj._StoreCacheImpl.get

    def get(self: Any, key: str) -> Any:
        start = time.perf_counter()
        value = original_get(self, key)
        gets.append((key, time.perf_counter() - start, 0 if value is None else len(value)))
        return value

    xj._StoreCacheImpl.get = get  # type: ignore[method-assign]
    out: dict[str, Any] = {}
    for name in PROGRAMS:
        fn, args = build(jax, name)
        c0, r0, h0, g0 = len(compiles), len(retrievals), len(hits), len(gets)
        jax.block_until_ready(fn(*args))
        row: dict[str, Any] = {
            "compile_s": sum(compiles[c0:]),
            "hit": len(hits) > h0,
            "retrieval_s": sum(retrievals[r0:]),
        }
        mine = gets[g0:]
        if row["hit"] and mine:
            key, first, size = mine[-1]
            cache = __import__("jax._src.compilation_cache", fromlist=["_cache"])._cache
            base = getattr(cache, "_base_cache", cache)
            repeated = []
            for _ in range(REPEATED_GETS):
                start = time.perf_counter()
                original_get(base, key)
                repeated.append(time.perf_counter() - start)
            row.update(get_s=first, repeated_get_s=statistics.median(repeated), entry_bytes=size)
        out[name] = row
    return out


def run_worker(path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_P"))}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def fmt(sec: float) -> str:
    if sec < 1e-3:
        return f"{sec * 1e6:.0f} µs"
    if sec < 1:
        return f"{sec * 1e3:.1f} ms"
    return f"{sec:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 warm process")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--dir", default=None, help="where the scratch cache goes")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker)))
        return 0
    import jax

    repeats = a.repeats or (1 if a.quick else 3)
    scratch = Path(tempfile.mkdtemp(prefix="xla-pcache-readback-", dir=a.dir))
    try:
        cold = run_worker(scratch / "cache")
        warm = [run_worker(scratch / "cache") for _ in range(repeats)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [
        f"jax {jax.__version__}, CPU backend, {os.cpu_count()} CPUs; cold: one process, warm: "
        f"median of {repeats} fresh processes.",
        "",
        "| program | entry (compressed) | compile, cold | store get, first "
        "| store get, repeated | whole retrieval (get + decompress + deserialize) "
        "| retrieval / compile |",
        "|---|---|---|---|---|---|---|",
    ]
    failures = []
    for name in PROGRAMS:
        rows = [w[name] for w in warm]
        if not all(r["hit"] and "get_s" in r for r in rows):
            failures.append(f"{name}: a warm process missed")
            continue
        compile_s = cold[name]["compile_s"]
        retrieval = statistics.median(r["retrieval_s"] for r in rows)
        size = rows[0]["entry_bytes"]
        shown = f"{size / 1024:.0f} KiB" if size < 1 << 20 else f"{size / (1 << 20):.1f} MiB"
        lines.append(
            f"| {name} | {shown} | {fmt(compile_s)} "
            f"| {fmt(statistics.median(r['get_s'] for r in rows))} "
            f"| {fmt(statistics.median(r['repeated_get_s'] for r in rows))} "
            f"| {fmt(retrieval)} | {retrieval / compile_s:.2f} |"
        )
    lines += [f"- FAILED: {f}" for f in failures]
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
