"""One JAX process for tests/jax/test_jax.py: runs a script of steps, prints a report.

Usage: ``python jax_worker.py '<json>'`` where the JSON is ``{"steps": [...]}``. Each step
is a dict with an ``op``; the report (one JSON object on the last line of stdout) holds a
record per ``run`` step (program, hit, result), JAX's warnings, the warnings xla_pcache
logged, and whatever the ``inspect`` and ``contract`` steps found. Failures inside a step
are reported, not raised, so the test can show them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
import warnings
from typing import Any

import numpy as np

HIT = "/jax/compilation_cache/cache_hits"
MISS = "/jax/compilation_cache/cache_misses"
COMPILE = "/jax/core/compile/backend_compile_duration"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(
            {"level": record.levelname, "name": record.name, "msg": record.getMessage()}
        )


def program(
    jax: Any, k: int, layers: int, compiler_options: dict[str, Any] | None = None
) -> tuple[Any, tuple[Any, ...]]:
    """A jitted function distinct for each ``k`` (k is baked into the program) and its
    inputs. ``layers`` scales compile time: a deeper MLP with its gradient.
    ``compiler_options`` goes to ``jax.jit`` as it is."""
    jnp = jax.numpy
    rng = np.random.default_rng(k)
    width = 64
    ws = tuple(rng.standard_normal((width, width)).astype(np.float32) * 0.1 for _ in range(layers))
    x = rng.standard_normal((8, width)).astype(np.float32)

    def loss(params: tuple[Any, ...], x: Any) -> Any:
        h = x
        for i, w in enumerate(params):
            h = jnp.tanh(h @ w + (k + 1) * 0.01 * (i + 1))
        return jnp.mean(h**2)

    def step(params: tuple[Any, ...], x: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, x)
        return value, sum(jnp.sum(g) for g in grads)

    if compiler_options:
        return jax.jit(step, compiler_options=compiler_options), (ws, x)
    return jax.jit(step), (ws, x)


def main() -> int:
    spec = json.loads(sys.argv[1])
    capture = _Capture()
    pcache_logger = logging.getLogger("xla_pcache")
    pcache_logger.addHandler(capture)
    pcache_logger.setLevel(logging.INFO)

    if os.environ.get("TEST_JAX_NO_ZSTD") == "1":
        # As in a Python without a zstd module: JAX then compresses its values with zlib.
        sys.modules["zstandard"] = None  # type: ignore[assignment]
        sys.modules["compression.zstd"] = None  # type: ignore[assignment]
    for hidden in filter(None, os.environ.get("TEST_HIDE_MODULES", "").split(",")):
        # As in an environment without that package (an extra not installed).
        sys.modules[hidden] = None  # type: ignore[assignment]
    import jax as jax_module
    from jax._src import compilation_cache as cc

    # Typed as Any: jax's config and private modules are untyped.
    jax: Any = jax_module

    events: list[str] = []
    jax.monitoring.register_event_listener(lambda event, **kw: events.append(event))
    # The compile times JAX measures (seconds), one per backend compile.
    compiles: list[float] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(duration) if event == COMPILE else None
    )

    report: dict[str, Any] = {"runs": [], "inspect": [], "errors": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in spec["steps"]:
            op = step["op"]
            try:
                if op == "install":
                    import xla_pcache.jax as xj

                    kwargs = {k: v for k, v in step.items() if k != "op"}
                    store = xj.install(**kwargs)
                    report["installed"] = store is not None
                elif op == "uninstall":
                    import xla_pcache.jax as xj

                    xj.uninstall()
                elif op == "config":
                    if step.get("optional") and step["name"] not in jax.config.values:
                        # An option this JAX lacks: recorded, the test adapts.
                        report.setdefault("missing_options", []).append(step["name"])
                    else:
                        jax.config.update(step["name"], step["value"])
                elif op == "set_cache_dir":
                    cc.set_cache_dir(step["path"])
                    cc.reset_cache()
                elif op == "clear_caches":
                    jax.clear_caches()
                elif op == "wait":
                    if "ready" in step:
                        open(step["ready"], "w").close()
                    deadline = time.monotonic() + 120
                    while not os.path.exists(step["file"]) and time.monotonic() < deadline:
                        time.sleep(0.005)
                elif op == "run":
                    hits, misses = events.count(HIT), events.count(MISS)
                    compiled = len(compiles)
                    fn, args = program(
                        jax, step["program"], step.get("layers", 2), step.get("compiler_options")
                    )
                    start = time.monotonic()
                    value, gsum = fn(*args)
                    result = [float(value), float(gsum)]
                    report["runs"].append(
                        {
                            "program": step["program"],
                            "hit": events.count(HIT) - hits,
                            "miss": events.count(MISS) - misses,
                            "result": result,
                            "seconds": time.monotonic() - start,
                            "compile_seconds": sum(compiles[compiled:]),
                        }
                    )
                elif op == "loaded_ahead":
                    # Before any compilation: the backend up, then what loading ahead did by
                    # the time it loaded everything it planned (or after 120 s).
                    import xla_pcache.jax as xj

                    jax.devices()
                    deadline = time.monotonic() + 120
                    pending = ("queued", "fetching", "fetched", "loading")
                    while time.monotonic() < deadline:
                        ahead = xj.prefetch_report()
                        states = (ahead or {}).get("states", {})
                        if ahead and ahead["planned"] and not any(k in states for k in pending):
                            break
                        time.sleep(0.01)
                    report["loaded_ahead"] = ahead
                elif op == "inspect":
                    cache: Any = cc._cache
                    base = getattr(cache, "_base_cache", cache)
                    report["inspect"].append(
                        {
                            "cache_type": type(cache).__name__,
                            "base_type": type(base).__name__,
                            "base_module": type(base).__module__,
                            "is_cache_interface": isinstance(
                                base,
                                __import__(
                                    "jax._src.compilation_cache_interface", fromlist=["x"]
                                ).CacheInterface,
                            ),
                            "path": None if cache is None else str(cache._path),
                            "len": len(base) if hasattr(base, "__len__") else None,
                            "factory_module": cc.get_file_cache.__module__,
                            "cache_dir": jax.config.values["jax_compilation_cache_dir"],
                            "xla_caches": jax.config.values[
                                "jax_persistent_cache_enable_xla_caches"
                            ],
                            "min_compile_time": jax.config.values[
                                "jax_persistent_cache_min_compile_time_secs"
                            ],
                        }
                    )
                elif op == "break":
                    # Replace the cache directory with a plain file under the running store.
                    import shutil

                    shutil.rmtree(step["path"])
                    with open(step["path"], "w") as f:
                        f.write("not a directory")
                elif op == "unsupported":
                    # The real jax, with one hook taken away as an older jax would lack it.
                    import xla_pcache.jax as xj

                    saved = cc.get_file_cache
                    del cc.get_file_cache
                    try:
                        xj.install(step["path"])
                        report["unsupported"] = "installed"
                    except Exception as exc:
                        report["unsupported"] = f"{type(exc).__name__}: {exc}"
                    finally:
                        cc.get_file_cache = saved
                elif op == "claims":
                    # The compile claims on disk now, and whether single flight wraps JAX.
                    from jax._src import compiler

                    claims_dir = os.path.join(step["path"], "locks", "claims")
                    files = {}
                    if os.path.isdir(claims_dir):
                        for name in sorted(os.listdir(claims_dir)):
                            with open(os.path.join(claims_dir, name)) as f:
                                files[name] = f.read()
                    report.setdefault("claims", []).append(
                        {
                            "dir_exists": os.path.isdir(claims_dir),
                            "files": files,
                            "wrapped": hasattr(
                                compiler.compile_or_get_cached, "__xla_pcache_wrapped__"
                            ),
                        }
                    )
                elif op == "thresholds":
                    import xla_pcache.jax as xj

                    report.setdefault("thresholds", []).append(
                        {
                            "in_force": xj.thresholds(),
                            "config": {
                                name: jax.config.values[name]
                                for name in (
                                    "jax_persistent_cache_min_compile_time_secs",
                                    "jax_persistent_cache_min_entry_size_bytes",
                                )
                            },
                        }
                    )
                elif op == "contract":
                    report["contract"] = contract(step["path"])
                else:
                    raise ValueError(f"unknown op {op!r}")
            except Exception:
                report["errors"].append({"op": op, "traceback": traceback.format_exc()})
    report["warnings"] = [str(w.message) for w in caught]
    report["log"] = capture.records
    print(json.dumps(report))
    return 0


def contract(path: str) -> dict[str, Any]:
    """JAX's cache contract, checked on a StoreCache over a fresh store."""
    import xla_pcache.jax as xj
    from jax._src.compilation_cache_interface import CacheInterface
    from xla_pcache import Store

    out: dict[str, Any] = {}
    cache = xj.StoreCache(Store(path))
    out["is_cache_interface"] = isinstance(cache, CacheInterface)
    out["missing"] = cache.get("jit_f-0123")
    for method, args in (("get", ("",)), ("put", ("", b"x"))):
        try:
            getattr(cache, method)(*args)
            out[f"empty_{method}"] = "no error"
        except ValueError as exc:
            out[f"empty_{method}"] = f"ValueError: {exc}"
    cache.put("jit_f-0123", b"first")
    cache.put("jit_f-0123", b"second")
    out["after_two_puts"] = bytes(cache.get("jit_f-0123")).decode()
    value = cache.get("jit_f-0123")
    out["get_type"] = type(value).__name__
    out["get_readonly"] = value.readonly
    cache.put("jit_g-4567", b"other")
    out["len"] = len(cache)
    cache.clear()
    out["len_after_clear"] = len(cache)
    out["get_after_clear"] = cache.get("jit_g-4567")
    return out


if __name__ == "__main__":
    sys.exit(main())
