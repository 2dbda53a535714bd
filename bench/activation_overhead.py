"""Import-time and first-compile cost of zero-code activation (medians of fresh processes).

    python bench/activation_overhead.py [N]

Needs the package installed (the jax_plugins entry point and xla_pcache_autoload.pth) in
this interpreter's venv. ``python -c pass`` runs 4*N times (it is fast and noisy); the
torch_xla rows run when torch_xla is installed (PJRT_DEVICE=CPU).
"""

from __future__ import annotations

import importlib.util
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
    on = {**base, "XLA_PERSISTENT_CACHE_PATH": cache}
    try:
        for label, code, runs in (
            ("python -c pass", "pass", 4 * n),
            ("import jax", "import jax", n),
        ):
            off_s, on_s = median_s(code, base, runs), median_s(code, on, runs)
            sys.stdout.write(f"{label:<28} unset {off_s:.3f} s   set {on_s:.3f} s\n")
        off_s = median_s(FIRST, base, n)
        on_s = median_s(FIRST, on, n)
        disabled = median_s(FIRST, {**on, "XLA_PCACHE_DISABLE": "1"}, n)
        sys.stdout.write(
            f"{'import jax + first jit':<28} unset {off_s:.3f} s   set (warm) {on_s:.3f} s   "
            f"XLA_PCACHE_DISABLE=1 {disabled:.3f} s\n"
        )
        if importlib.util.find_spec("torch_xla") is not None:
            torch_xla_rows(base, cache, n)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


TORCH_XLA_FIRST = (
    "import torch, torch_xla; "
    "y = torch.arange(8.0).to(torch_xla.device()) * 2; torch_xla.sync(); y.cpu()"
)


def torch_xla_rows(base: dict[str, str], cache: str, n: int) -> None:
    local = tempfile.mkdtemp(prefix="xla-pcache-activation-local-")
    off = {**base, "PJRT_DEVICE": "CPU", "TF_CPP_MIN_LOG_LEVEL": "2"}
    on = {**off, "XLA_PERSISTENT_CACHE_PATH": cache, "XLA_PCACHE_TORCH_XLA_LOCAL_DIR": local}
    try:
        for label, code in (
            ("import torch_xla", "import torch_xla"),
            ("torch_xla first graph", TORCH_XLA_FIRST),
        ):
            off_s = median_s(code, off, n)
            on_s = median_s(code, on, n)
            disabled = median_s(code, {**on, "XLA_PCACHE_DISABLE": "1"}, n)
            sys.stdout.write(
                f"{label:<28} unset {off_s:.3f} s   set {on_s:.3f} s   "
                f"XLA_PCACHE_DISABLE=1 {disabled:.3f} s\n"
            )
    finally:
        shutil.rmtree(local, ignore_errors=True)


if __name__ == "__main__":
    main()
