"""Import-time and first-compile cost of zero-code activation (medians of fresh processes).

    python bench/activation_overhead.py [N]

Needs the package installed (the jax_plugins entry point) in this interpreter's venv.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

FIRST = (
    "import jax, jax.numpy as jnp; "
    "jax.jit(lambda x: jnp.sin(x).sum())(jnp.arange(8.0)).block_until_ready()"
)


def median_s(code: str, env: dict[str, str], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    base["JAX_PLATFORMS"] = "cpu"
    cache = tempfile.mkdtemp(prefix="xla-pcache-activation-")
    on = {
        **base,
        "XLA_PERSISTENT_CACHE_PATH": cache,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    try:
        for label, code in (("python -c pass", "pass"), ("import jax", "import jax")):
            off_s, on_s = median_s(code, base, n), median_s(code, on, n)
            sys.stdout.write(f"{label:<28} unset {off_s:.3f} s   set {on_s:.3f} s\n")
        off_s = median_s(FIRST, base, n)
        on_s = median_s(FIRST, on, n)
        disabled = median_s(FIRST, {**on, "XLA_PCACHE_DISABLE": "1"}, n)
        sys.stdout.write(
            f"{'import jax + first jit':<28} unset {off_s:.3f} s   set (warm) {on_s:.3f} s   "
            f"XLA_PCACHE_DISABLE=1 {disabled:.3f} s\n"
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
