"""What one remote hit costs on top of the tier's own request: the Python<->Rust crossings
it makes and its time in microseconds, for many small entries, each a local miss answered
by the tier (fetched, verified, published into the local directory, returned).

    TMPDIR=/dev/shm PYTHONPATH=python python bench/remote_hit.py [--tier memory|redis]
        [--hits 2000] [--size 4096] [--reps 5] [--trusting]

The stores are made in the temporary directory: on a disk whose write rate is throttled (a
VM's virtual disk) every hit's local publish soon waits on it, so put ``TMPDIR`` on tmpfs to
time the store and the chain rather than the disk.

``--tier memory`` (the default) is a tier in this process (a dict behind the same
bookkeeping every tier keeps, ``tiers.base.TierBase``, and the same header check before a
value is taken), so that what is timed is the store's and the chain's part of a hit, not a
network round trip; ``--tier redis`` starts a loopback ``redis-server``. ``--trusting``
signs the entries and reads them with a store that trusts the key (the signed path).

Crossings are counted in a separate pass over 200 hits (counting slows a call):

- Python into Rust: every call of a built-in function or method of the extension
  (``sys.setprofile``'s ``c_call`` events whose function is ``_core``'s or bound to one of
  its objects), every read of an attribute of its types (their getters, wrapped for the
  pass in counting properties) and every call of one of its callable objects (``__call__``,
  wrapped likewise);
- Rust into Python: every Python frame entered while the innermost running call is one
  of the extension's (a hook the binding calls).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xla_pcache import Store, _core
from xla_pcache.tiers import base as tier_base
from xla_pcache.tiers import chain as tier_chain

# The in-process tier's values, by entry name (shared by every store of this process).
MEMORY: dict[str, bytes] = {}


class MemoryTier(tier_base.TierBase):
    """A tier whose server is a dict: the checks and counting of a real tier, no network."""

    def __init__(self) -> None:
        self.url = "mem://bench"
        self.max_value_bytes = 1 << 30
        super().__init__(retry_after=5.0, thread_name="bench-memory-tier")

    def get(self, name: str, *, max_bytes: int | None = None, spool: Any = None) -> Any:
        checks = self._checked(name, max_bytes)
        if checks is None:
            return None
        checked, limit = checks
        value = MEMORY.get(checked)
        if value is None:
            self.count("remote_misses")
            return None
        if len(value) > limit:
            self.reject("too_large", "over the limit")
            return None
        # As the Redis and object-store tiers: the header first, before the rest is taken.
        refused, verdict = self.judge_head(
            checked, value[: tier_base.HEAD_BYTES], len(value), whole=True
        )
        return verdict if refused else value

    def _write(self, name: Any, data: Any, *_: Any) -> None:
        MEMORY[str(name)] = bytes(data)
        self.count("remote_puts")
        self.count("remote_written_bytes", len(data))


def _install_memory_tier() -> str:
    opened = tier_chain._open_one

    def open_one(url: Any, *args: Any, **kwargs: Any) -> Any:
        # The chain hands over each URL parsed (a TierURL).
        if str(getattr(url, "text", url)).startswith("mem://"):
            return MemoryTier()
        return opened(url, *args, **kwargs)

    tier_chain._open_one = open_one  # type: ignore[assignment]
    tier_chain.TIER_KINDS["mem"] = "mem"
    return "mem://bench"


def _core_types() -> list[type]:
    return [
        v for v in vars(_core).values() if isinstance(v, type) and v.__module__ == _core.__name__
    ]


@contextmanager
def crossings() -> Iterator[Counter[str]]:
    """Counts the crossings made inside the block (see the module's docstring), by name."""
    counts: Counter[str] = Counter()
    types = tuple(_core_types())
    patched: list[tuple[type, str, Any]] = []
    for t in types:
        for name, attr in list(vars(t).items()):
            if type(attr).__name__ == "getset_descriptor":

                def get(obj: Any, _a: Any = attr, _n: str = f"{t.__name__}.{name}") -> Any:
                    counts["py->rust " + _n] += 1
                    return _a.__get__(obj, type(obj))

                patched.append((t, name, attr))
                setattr(t, name, property(get))
            elif name == "__call__":

                def call(obj: Any, *a: Any, _c: Any = attr, _n: str = t.__name__, **k: Any) -> Any:
                    counts[f"py->rust {_n}()"] += 1
                    return _c(obj, *a, **k)

                patched.append((t, name, attr))
                setattr(t, name, call)
    # Frames and calls being run: "rust" for an extension's call, else the Python frame.
    stack: list[Any] = []

    def ours(fn: Any) -> bool:
        owner = getattr(fn, "__self__", None)
        return getattr(fn, "__module__", None) == _core.__name__ or isinstance(owner, types)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and ours(arg):
            counts[f"py->rust {arg.__qualname__}"] += 1
            stack.append("rust")
        elif event in ("c_return", "c_exception") and ours(arg):
            if stack and stack[-1] == "rust":
                stack.pop()
        elif event == "call":
            if stack and stack[-1] == "rust":
                counts[f"rust->py {frame.f_code.co_qualname}"] += 1
            stack.append(frame)
        elif event == "return" and stack and stack[-1] is frame:
            stack.pop()

    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(None)
        for t, name, attr in patched:
            setattr(t, name, attr)


def _keys(n: int) -> list[str]:
    return [f"bench-remote-hit-{i}" for i in range(n)]


def _seed(root: str, url: str, keys: list[str], size: int, keyargs: dict[str, Any]) -> None:
    with Store(root, remote=url, **keyargs) as w:
        for k in keys:
            assert w.put(k, os.urandom(size))
        assert w.remote is not None
        w.remote.flush()


def _reader(root: str, url: str, keyargs: dict[str, Any]) -> Store:
    s = Store(root, remote=url, hit_interval=0, **keyargs)
    assert s.remote is not None  # the tier's client made before anything is timed
    return s


def _hits(store: Store, keys: list[str]) -> list[float]:
    times = []
    for k in keys:
        t = time.perf_counter_ns()
        blob = store.get(k)
        times.append(time.perf_counter_ns() - t)
        assert blob is not None, k
    return times


def _redis() -> tuple[Any, str]:
    from bench.remote import _redis as start

    return start()


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tier", choices=("memory", "redis"), default="memory")
    ap.add_argument("--hits", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--trusting", action="store_true")
    args = ap.parse_args()
    keyargs: dict[str, Any] = {}
    if args.trusting:
        private = _core.generate_signing_key()
        keyargs = {
            "signing_key": ("ci-1", private),
            "trusted_keys": [("ci-1", _core.signing_public_key(private))],
        }
    server = None
    if args.tier == "redis":
        server, url = _redis()
    else:
        url = _install_memory_tier()
    d = tempfile.mkdtemp(prefix="xla-pcache-remote-hit-")
    try:
        keys = _keys(args.hits)
        _seed(os.path.join(d, "writer"), url, keys, args.size, keyargs)
        # The crossings: one reader, 200 hits under the profiler.
        counted = keys[:200]
        reader = _reader(os.path.join(d, "counted"), url, keyargs)
        with crossings() as counts:
            _hits(reader, counted)
        hits = reader.stats().get("remote_hits")
        reader.close()
        assert hits == len(counted), (hits, len(counted))
        with (
            Store(os.path.join(d, "put-counted"), remote=url, **keyargs) as w,
            crossings() as put_counts,
        ):
            for k in counted:
                w.put(k + "-put", b"p" * args.size)
        per_hit = sum(counts.values()) / len(counted)
        per_put = sum(put_counts.values()) / len(counted)
        # The time: a fresh reader per repetition, every key a remote hit.
        means, medians = [], []
        for rep in range(args.reps):
            reader = _reader(os.path.join(d, f"r{rep}"), url, keyargs)
            times = _hits(reader, keys)
            reader.close()
            means.append(statistics.fmean(times) / 1e3)
            medians.append(statistics.median(times) / 1e3)
        print(f"CPU: {_cpu()} ({os.cpu_count()} CPUs); Python {platform.python_version()}")
        print(
            f"tier {args.tier}, {args.hits} entries of {args.size} bytes"
            + (", signed, trusting reader" if args.trusting else "")
        )
        print(f"crossings per remote hit: {per_hit:g}")
        for name, n in sorted(counts.items()):
            print(f"    {n / len(counted):g}  {name}")
        print(f"crossings per put with a tier: {per_put:g}")
        for name, n in sorted(put_counts.items()):
            print(f"    {n / len(counted):g}  {name}")
        print(
            "µs per remote hit, median of the per-hit times in each run: "
            + " ".join(f"{m:.1f}" for m in medians)
            + "; mean per run: "
            + " ".join(f"{m:.1f}" for m in means)
        )
        print(
            f"median over the runs: {statistics.median(medians):.1f} µs (per-hit medians), "
            f"{statistics.median(means):.1f} µs (means)"
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
