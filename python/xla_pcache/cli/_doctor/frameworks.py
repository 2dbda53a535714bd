"""Each framework the doctor checks, for real: its versions, the backend this process would
get, and whether that backend can serialize an executable AND load it back. The check
compiles a small program in a subprocess (frameworks are slow to import and may crash on a
bad backend), once: the answer is kept in the cache under a key made of the framework, its
versions, the backend asked for, the machine and the runtime build, so the next doctor on
any host sharing the cache reads it instead. What is read back is an entry any writer of the
cache could have written: one that is not a probe result of the expected shape is probed
again.

Frameworks register a ``Framework`` in ``FRAMEWORKS``; nothing here imports them.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from typing import Any

PROBE_KEY_PREFIX = "xla_pcache.doctor/probe/v1"
_PROBE_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Framework:
    """How the doctor checks one framework.

    ``module``: the import name (found with ``importlib.util.find_spec``, not imported).
    ``versions``: distributions whose versions go into the report and the probe key.
    ``backend_hint``: the backend this process would get, guessed cheaply (environment,
    installed plugins); part of the probe key. ``probe``: runs the real check in
    subprocesses and returns a dict with at least ``serialize`` and ``load`` (bools) and
    ``backend`` (what was really used); it raises or returns ``error`` when it could not
    tell, and then nothing is remembered. ``build``: the runtime's build here
    (``xla_pcache.builds``), the one the adapter keys entries with; part of the probe key.
    """

    name: str
    module: str
    versions: tuple[str, ...]
    backend_hint: Callable[[], str]
    probe: Callable[[], dict[str, Any]]
    build: Callable[[], Any]


def _jax_build() -> Any:
    from xla_pcache.jax import _build

    return _build.build()


def _torch_xla_build() -> Any:
    from xla_pcache.torch_xla import _build

    return _build.build()


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed(*dists: str) -> bool:
    return any(_dist_version(d) is not None for d in dists)


def _run_probe(code: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; its last stdout line is the JSON result."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=_PROBE_TIMEOUT_S,
        # The probe checks the framework itself; activation would route it into the cache.
        env={**os.environ, "XLA_PCACHE_DISABLE": "1", **(env or {})},
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"probe exited with {proc.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# jax -------------------------------------------------------------------------------------

_JAX_PROBE = textwrap.dedent(
    """
    import json
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.experimental import serialize_executable as se

    out = {"backend": jax.default_backend(), "serialize": False, "load": False}
    try:
        from xla_pcache.jax import _hooks
        _hooks.find()
        out["adapter"] = "ok"
    except Exception as exc:
        out["adapter"] = f"{type(exc).__name__}: {exc}"
    try:
        from jax._src import compilation_cache as cc
        from xla_pcache.jax.ahead import _read_hook
        form = _read_hook.read_form(cc)
        out["prefetch"] = "ok" if isinstance(form, int) else form
    except Exception as exc:
        out["prefetch"] = f"{type(exc).__name__}: {exc}"
    try:
        from jax._src import compiler
        from xla_pcache.jax.ahead import _compiler
        form = _compiler.read_form(compiler)
        out["compile_ahead"] = "ok" if isinstance(form, tuple) else form
    except Exception as exc:
        out["compile_ahead"] = f"{type(exc).__name__}: {exc}"
    x = np.arange(16, dtype=np.float32)
    compiled = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * 2.0)).lower(x).compile()
    expected = np.asarray(compiled(x))
    try:
        payload, in_tree, out_tree = se.serialize(compiled)
        out["serialize"] = True
        out["bytes"] = len(payload)
    except Exception as exc:
        out["detail"] = f"serialize: {type(exc).__name__}: {exc}"
    else:
        try:
            loaded = se.deserialize_and_load(payload, in_tree, out_tree)
            out["load"] = bool(np.array_equal(np.asarray(loaded(x)), expected))
            if not out["load"]:
                out["detail"] = "the loaded executable computed a different result"
        except Exception as exc:
            out["detail"] = f"load: {type(exc).__name__}: {exc}"
    print(json.dumps(out))
    """
)


def _jax_backend_hint() -> str:
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0]
    if _installed("libtpu", "libtpu-nightly"):
        return "tpu?"
    if _installed("jax-cuda12-plugin", "jax-cuda13-plugin"):
        return "cuda?"
    if _installed("jax-rocm60-plugin", "jax-rocm7-plugin"):
        return "rocm?"
    return "cpu"


def _probe_jax() -> dict[str, Any]:
    return _run_probe(_JAX_PROBE)


# torch_xla -------------------------------------------------------------------------------

# torch_xla has no Python call that serializes an executable: the check goes through its
# own persistent cache, writing an entry in one process and loading it in another.
_TORCH_XLA_PROBE = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    import torch_xla.debug.metrics as met

    xr.initialize_cache(sys.argv[1], readonly=False)
    device = torch_xla.device()
    x = torch.arange(16, dtype=torch.float32, device=device)
    y = torch.cumsum(torch.sin(x) * 2.0, 0)
    torch_xla.sync()
    y.cpu()
    counters = {
        name: met.counter_value(name) or 0
        for name in ("PersistentCacheMiss", "PersistentCacheHit",
                     "PersistentCacheDeserializeFailure")
    }
    print(json.dumps({
        "backend": str(xr.device_type()),
        "version": str(torch_xla.__version__),
        "files": len(os.listdir(sys.argv[1])),
        **counters,
    }))
    """
)


def _torch_xla_backend_hint() -> str:
    device = os.environ.get("PJRT_DEVICE", "").strip()
    if device:
        return device.lower()
    return "tpu?" if _installed("libtpu", "libtpu-nightly") else "cpu"


def _probe_torch_xla() -> dict[str, Any]:
    env = {} if os.environ.get("PJRT_DEVICE") else {"PJRT_DEVICE": "CPU"}
    with tempfile.TemporaryDirectory(prefix="xla-pcache-doctor-") as tmp:
        write = _run_probe(_TORCH_XLA_PROBE, tmp, env=env)
        if "error" in write:
            return write
        load = _run_probe(_TORCH_XLA_PROBE, tmp, env=env)
        if "error" in load:
            return load
    out: dict[str, Any] = {
        "backend": write.get("backend", "?").lower(),
        "serialize": write.get("files", 0) > 0,
        "load": load.get("PersistentCacheHit", 0) > 0,
    }
    if load.get("PersistentCacheDeserializeFailure", 0):
        from xla_pcache.torch_xla import CANNOT_LOAD_ISSUE

        out["detail"] = (
            f"entries are written but cannot be loaded back on this backend by torch_xla "
            f"{write.get('version', '?')} (PersistentCacheDeserializeFailure; upstream: "
            f"{CANNOT_LOAD_ISSUE}; torch_xla 2.7 loads them on CPU)"
        )
    elif out["load"]:
        out["detail"] = (
            f"torch_xla {write.get('version', '?')} loads its entries back on this backend "
            "(PersistentCacheHit)"
        )
    return out


FRAMEWORKS: dict[str, Framework] = {
    "jax": Framework("jax", "jax", ("jax", "jaxlib"), _jax_backend_hint, _probe_jax, _jax_build),
    "torch_xla": Framework(
        "torch_xla",
        "torch_xla",
        ("torch", "torch_xla"),
        _torch_xla_backend_hint,
        _probe_torch_xla,
        _torch_xla_build,
    ),
}


def probe_key(
    fw: Framework, versions: dict[str, str | None], hint: str, build: str | None = None
) -> str:
    """The key a probe result is remembered under; hosts that would get the same answer
    (the same versions, backend, machine and runtime build) share it."""
    parts = [f"{d}={versions.get(d)}" for d in fw.versions]
    return "/".join(
        [
            PROBE_KEY_PREFIX,
            fw.name,
            *parts,
            f"backend={hint}",
            f"arch={platform.machine()}",
            *([f"build={build}"] if build else []),
        ]
    )


def _build_report(fw: Framework) -> dict[str, Any]:
    """The runtime build in force (what its entries' keys end with), or why it is unknown."""
    try:
        build = fw.build()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "digest": build.digest,
        "roles": build.roles(),
        "hashed_now": build.hashed,
        "record_problems": build.record_problems,
        # Where the user's record of the binaries' identities is, and whether this process
        # could keep what it hashed (every process hashes again where it cannot).
        "record": {
            "dir": build.record_dir,
            "skipped": list(build.record_skipped),
            "unkept": build.record_unkept,
            "hashed_bytes": build.hashed_bytes,
        },
    }


# What a probe reports, by field, and the type each must have. A remembered result is an
# entry in the cache, which any writer of the directory can have written: one that is not a
# JSON object of these fields (strings of bounded length) is not ours, and the probe runs.
_PROBE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "backend": str,
    "serialize": bool,
    "load": bool,
    "adapter": str,
    "prefetch": str,
    "compile_ahead": str,
    "detail": str,
    "bytes": int,
}
_MAX_PROBE_TEXT = 2000
_MAX_PROBE_BYTES = 64 * 1024


def remembered_probe(raw: bytes) -> dict[str, Any] | None:
    """A remembered probe result read back from the cache, or None when it is not one
    doctor wrote (not JSON, not an object, unknown fields, wrong types, too long)."""
    if len(raw) > _MAX_PROBE_BYTES:
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not obj or not set(obj) <= set(_PROBE_FIELDS):
        return None
    for name, value in obj.items():
        want = _PROBE_FIELDS[name]
        if want is int and isinstance(value, bool):
            return None
        if not isinstance(value, want):
            return None
        if isinstance(value, str) and len(value) > _MAX_PROBE_TEXT:
            return None
        if isinstance(value, int) and not 0 <= value < 1 << 62:
            return None
    return obj


def _check_framework(fw: Framework, store: Any) -> dict[str, Any] | None:
    if importlib.util.find_spec(fw.module) is None:
        return None
    versions = {d: _dist_version(d) for d in fw.versions}
    hint = fw.backend_hint()
    build = _build_report(fw)
    key = probe_key(fw, versions, hint, build.get("digest"))
    report: dict[str, Any] = {"versions": versions, "backend_hint": hint, "build": build}
    cached = None
    if store is not None:
        try:
            blob = store.get(key)
            if blob is not None:
                cached = remembered_probe(bytes(blob))
                if cached is None:
                    report["cache_error"] = (
                        "the remembered probe result is not one doctor wrote; probed again"
                    )
                    if not store.read_only:
                        # Replaced by the new result below (entries are first-writer-wins).
                        store.delete(key)
        except Exception as exc:
            report["cache_error"] = f"{type(exc).__name__}: {exc}"
    if cached is not None:
        report.update(cached, remembered=True)
        return report
    try:
        result = fw.probe()
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    report.update(result, remembered=False)
    if "error" not in result and store is not None and not store.read_only:
        meta = {"framework": fw.name, "kind": "doctor-probe"}
        try:
            store.put(key, json.dumps(result).encode(), meta=meta)
        except Exception as exc:
            report["cache_error"] = f"{type(exc).__name__}: {exc}"
    return report
