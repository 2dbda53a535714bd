"""What the runtime's build (``xla_pcache.builds``) costs: once per process start, and per
get.

    PYTHONPATH=python python bench/build_identity.py [--framework jax|torch_xla] [--starts 20]
        [--unwritable-home [--processes 10]]

In a process that has imported the framework and (for JAX) compiled once, as the adapter
does at its first compile: ``builds.identify`` with an empty record (the first process
after an install: every file without a build-id hashed), then ``--starts`` times with the
record it wrote (every later process: a ``stat`` per file, the record and the memory map
read), and the time of finding the files alone. Per get: the one thing a get does with the
build, its key joined with it (``Build.store_key``: a call and a concatenation), beside a
store hit of a 100 kB entry (``timeit``, best of 7). The record is written in a temporary
directory, never the user's.

With ``--unwritable-home`` the record is the default one, as a process finds it, in an
environment whose home cannot be written (``HOME`` a regular file, ``XDG_CACHE_HOME`` and
``XDG_RUNTIME_DIR`` unset, ``TMPDIR`` a fresh temporary directory): where the record is kept
then, and what every later start costs; ``--processes N`` also starts N fresh processes in
that environment, one after the other, each timing its own build after its first compile
(what a process start pays, caches and all).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _framework(name: str) -> Callable[[], list[Any]]:
    if name == "jax":
        import jax
        import jax.numpy as jnp

        jax.jit(lambda x: jnp.sin(x).sum())(jnp.arange(8.0)).block_until_ready()
        from xla_pcache.jax import _build
    else:
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        import torch_xla  # noqa: F401  (its extension mapped, as in a real process)
        from xla_pcache.torch_xla import _build
    return _build.wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=["jax", "torch_xla"], default="jax")
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument(
        "--unwritable-home",
        action="store_true",
        help="the default record, with a home that cannot be written",
    )
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.framework)
        return
    wanted = _framework(args.framework)

    from xla_pcache import Store, builds

    scratch = tempfile.mkdtemp(prefix="xla-pcache-bench-builds-")
    record: str | None = scratch
    if args.unwritable_home:
        # Read by the core at each call: a home that is a file, a fresh temp dir.
        home = os.path.join(scratch, "home-is-a-file")
        with open(home, "w"):
            pass
        os.environ["HOME"] = home
        os.environ["TMPDIR"] = os.path.join(scratch, "tmp")
        os.mkdir(os.environ["TMPDIR"])
        for var in ("XDG_CACHE_HOME", "XDG_RUNTIME_DIR"):
            os.environ.pop(var, None)
        record = None

    def start() -> tuple[float, builds.Build]:
        t = time.perf_counter()
        build = builds.identify(args.framework, wanted(), record)
        return time.perf_counter() - t, build

    try:
        first, build = start()
        starts = [start() for _ in range(args.starts)]
        later = sorted(t for t, _ in starts)
        rehashed = sum(1 for _, b in starts if b.hashed)
        fresh = [_fresh(args.framework) for _ in range(args.processes)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    finding = min(timeit.repeat(wanted, number=1, repeat=args.starts))
    kinds = statistics.multimode(f.kind for f in build.files)
    print(f"CPU: {_cpu()}, load average {os.getloadavg()[0]:.1f}")
    print(
        f"{args.framework}: {len(build.files)} files ({', '.join(kinds)} mostly), "
        f"{build.hashed} read whole or for their build-id by the first start"
    )
    if args.unwritable_home:
        print(
            f"home unwritable: record kept in {getattr(build, 'record_dir', None)}; "
            f"{rehashed} of {args.starts} later starts hashed again"
        )
    if fresh:
        ms = sorted(f["ms"] for f in fresh)
        print(
            f"{len(fresh)} fresh processes (after the ones above): their build "
            f"{ms[0]:.2f} ms best, {ms[len(ms) // 2]:.2f} ms median, {ms[-1]:.2f} ms worst; "
            f"{sum(1 for f in fresh if f['hashed'])} hashed again"
        )
    print(f"first start after an install: {first * 1e3:.1f} ms")
    print(
        f"every later start: {later[0] * 1e3:.2f} ms best, "
        f"{later[len(later) // 2] * 1e3:.2f} ms median, of which finding the files "
        f"{finding * 1e3:.2f} ms"
    )
    key = "jit_step-" + "ab" * 32
    n = 1_000_000
    join = min(timeit.repeat(lambda: build.store_key(key), number=n, repeat=7)) / n
    with tempfile.TemporaryDirectory() as d, Store(d) as store:
        stored = build.store_key(key)
        store.put(stored, b"x" * 100_000)
        m = 20_000
        get = min(timeit.repeat(lambda: store.get(stored), number=m, repeat=7)) / m
    print(
        f"per get: {join * 1e9:.0f} ns, the key's join timed in a lambda "
        f"(a store hit of 100 kB: {get * 1e6:.1f} us)"
    )


def _fresh(framework: str) -> dict[str, Any]:
    """One fresh process in this environment: its build's time and files hashed."""
    proc = subprocess.run(
        [sys.executable, __file__, "--framework", framework, "--child"],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _child(framework: str) -> None:
    wanted = _framework(framework)
    from xla_pcache import builds

    t = time.perf_counter()
    build = builds.identify(framework, wanted())
    ms = (time.perf_counter() - t) * 1e3
    print(json.dumps({"ms": ms, "hashed": build.hashed}))


if __name__ == "__main__":
    main()
