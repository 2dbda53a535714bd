"""What a torch_xla cache key depends on, as far as Python can see it.

torch_xla names a persistent-cache file by a hash computed in C++: the traced graph (its IR,
shapes, dtypes, sharding), the device, and ``HashXlaEnvVars`` (runtime/env_hash.cc: the
``--xla*`` flags of ``XLA_FLAGS`` and ``LIBTPU_INIT_ARGS``, sorted, less the dump options,
and ``TPU_MEGACORE`` as it is). The graph part never reaches Python, so it cannot be
explained: only the parts recorded here can. Each entry torch_xla publishes carries them in
its metadata, and the adapter records each publish (a graph this process missed, compiled
and wrote) as a miss with them (``explain.record_miss``), under the program name
``torch_xla``: ``xla-pcache explain`` then compares the environment the miss was compiled in
with the nearest other torch_xla entry's. When nothing recorded differs, the graph itself
did.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.torch_xla import _build

logger = package_logger(__name__)

MODULE = "torch_xla"

# Mirrors torch_xla's runtime/env_hash.cc (which mirrors JAX's list).
_EXCLUDED_FLAGS = frozenset(
    {
        "--xla_dump_compress_protos",
        "--xla_dump_module_metadata",
        "--xla_dump_max_hlo_modules",
        "--xla_dump_include_timestamp",
        "--xla_dump_hlo_pass_re",
        "--xla_dump_hlo_module_re",
        "--xla_dump_hlo_snapshots",
        "--xla_dump_fusion_visualization",
        "--xla_dump_hlo_as_url",
        "--xla_dump_hlo_as_proto",
        "--xla_dump_hlo_as_text",
        "--xla_dump_hlo_as_long_text",
        "--xla_dump_hlo_as_html",
        "--xla_dump_hlo_as_dot",
        "--xla_dump_to",
        "--xla_force_host_platform_device_count",
        "--xla_dump_disable_metadata",
        "--xla_dump_hlo_pipeline_re",
        "--xla_tpu_sdc_checker_streamz_metric",
        "--xla_tpu_sdc_checker_enable_sdc_event_callbacks",
    }
)

# Variables of ours or torch_xla's cache that say where things go, not what is compiled.
_NOT_COMPILE_INPUTS = ("XLA_PERSISTENT_CACHE_", "XLA_PCACHE_")


def _flags(value: str) -> str:
    """The ``--xla*`` flags torch_xla hashes, as it orders them."""
    kept = [
        flag
        for flag in value.split(" ")
        if flag.startswith("--xla") and flag.split("=", 1)[0] not in _EXCLUDED_FLAGS
    ]
    return " ".join(sorted(kept))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device() -> dict[str, Any] | None:
    try:
        import torch_xla.runtime as xr

        tx: Any = xr
        return {
            "type": str(tx.device_type()),
            "count": int(tx.global_runtime_device_count()),
        }
    except Exception:
        return None


def _component(name: str, value: Any) -> dict[str, Any]:
    text = value if isinstance(value, str) else repr(value)
    return {
        "name": name,
        "digest": hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest(),
        "value": value,
    }


_cached: dict[str, Any] | None = None


def components(environ: os._Environ[str] | dict[str, str] = os.environ) -> dict[str, Any]:
    """This process's recorded components (computed once: torch_xla hashes its environment
    once per process too)."""
    global _cached
    if _cached is not None and environ is os.environ:
        return _cached
    libtpu = _version("libtpu") or _version("libtpu-nightly")
    other_env = {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith("XLA_") and k != "XLA_FLAGS" and not k.startswith(_NOT_COMPILE_INPUTS)
    }
    parts = [
        _component("XLA_FLAGS", _flags(environ.get("XLA_FLAGS", ""))),
        _component("LIBTPU_INIT_ARGS", _flags(environ.get("LIBTPU_INIT_ARGS", ""))),
        _component("TPU_MEGACORE", environ.get("TPU_MEGACORE", "")),
        _component("torch version", _version("torch")),
        _component("torch_xla version", _version("torch_xla") or _version("torch-xla")),
        _component("libtpu version", libtpu),
        _component("device", _device()),
        _component("XLA_* environment", other_env),
        # The binaries themselves (torch_xla/_build.py): what keys of other builds differ in.
        _build.build().component(),
    ]
    # Not "verified": the key is torch_xla's C++ hash, which this cannot recompute.
    out = {"module": MODULE, "components": parts, "unexplained": "graph"}
    if environ is os.environ:
        _cached = out
    return out
