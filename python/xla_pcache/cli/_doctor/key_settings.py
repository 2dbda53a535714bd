"""What this host puts into every JAX key besides the program: the compression JAX chose (zstd
where the zstandard package imports, zlib where it does not) and the flags it hashes
(``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``, with what JAX's own set-up adds on a TPU VM), asked of
JAX itself in a fresh process (never remembered: what is installed on a host and its
variables are not what a probe's key names); and the store's JAX entries written under other
settings, which this host never reads. Hosts of one fleet that differ there, or a cache
filled ahead of time on a host that does, share no entry; this says so at once.
"""

from __future__ import annotations

import collections
import importlib.metadata
import textwrap
from typing import Any

from xla_pcache.cli._doctor.frameworks import _run_probe

# JAX's own choices, read from its functions: ``compilation_cache.get_cache_key`` hands
# ``cache_key.get`` the compression it names in the key (replaced here, in the probe's own
# process, by one that keeps it), and ``cache_key._hash_xla_flags`` feeds the key each flag
# it hashes. Importing jax runs its TPU set-up (``cloud_tpu_init``), which adds its flag on a
# TPU VM; nothing here starts a backend.
_PROBE = textwrap.dedent(
    """
    import json
    out = {}
    from jax._src import cache_key, compilation_cache
    try:
        kept = {}
        def get(module, devices, options, backend, compression_algorithm=None, *rest, **kw):
            kept["compression"] = compression_algorithm
            return ""
        original, cache_key.get = cache_key.get, get
        try:
            compilation_cache.get_cache_key(None, None, None, None)
        finally:
            cache_key.get = original
        out["compression"] = str(kept["compression"])
    except Exception as exc:
        out["compression_error"] = f"{type(exc).__name__}: {exc}"
    try:
        class Flags:
            def __init__(self):
                self.fed = []
            def update(self, data):
                self.fed.append(bytes(data).decode("utf-8", "replace"))
        flags = Flags()
        cache_key._hash_xla_flags(flags, cache_key.get_flag_prefixes())
        out["flags"] = flags.fed
    except Exception as exc:
        out["flags_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
    """
)

# The components compared, with how the report names them.
_COMPARED = (
    ("compression", "compression"),
    ("XLA flags", "flags"),
    ("jax_lib version", "jaxlib"),
    ("runtime build", "runtime build"),
)
_MAX_VALUE_CHARS = 400
# The other settings shown, the most used first.
_MAX_SHOWN = 10


def host_settings() -> dict[str, Any]:
    """The compression and flags this host's JAX puts into its keys (``error``: why they
    could not be had)."""
    try:
        found = _run_probe(_PROBE)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if "error" in found:
        return found
    out: dict[str, Any] = {}
    compression = found.get("compression")
    if isinstance(compression, str):
        out["compression"] = compression
    flags = found.get("flags")
    if isinstance(flags, list) and all(isinstance(f, str) for f in flags):
        out["flags"] = flags
    for name in ("compression_error", "flags_error"):
        if isinstance(found.get(name), str):
            out[name] = found[name]
    return out


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "\u2026"


def compare(store: Any, here: dict[str, Any], build: str | None) -> dict[str, Any]:
    """The store's JAX entries that recorded their key's components, and of them those whose
    compression, flags, jaxlib or runtime build is not this host's: counted by part and
    value. An entry's components are whatever its writer put there, so values are shown
    clipped, and a malformed one counts as not recorded."""
    from xla_pcache import build_key
    from xla_pcache.explain import entry_components

    mine: dict[str, Any] = {}
    if isinstance(here.get("compression"), str):
        mine["compression"] = here["compression"]
    if isinstance(here.get("flags"), list):
        # As the entries record it: the flags fed to the key, space separated.
        mine["XLA flags"] = " ".join(f.strip() for f in here["flags"])
    jaxlib = _version("jaxlib")
    if jaxlib is not None:
        mine["jax_lib version"] = jaxlib
    recorded = 0
    other: dict[tuple[str, str], int] = collections.Counter()
    for entry in store.entries():
        meta = entry.get("meta")
        if not isinstance(meta, dict) or meta.get("framework") != "jax":
            continue
        parts = entry_components(meta)
        if parts is None:
            continue
        recorded += 1
        values = {
            str(p["name"]): p.get("value") for p in parts["components"] if isinstance(p, dict)
        }
        for name, shown in _COMPARED:
            if name == "runtime build":
                digest = build_key.split(str(entry.get("key")))[1]
                if build is not None and digest is not None and digest != build:
                    other[(shown, digest)] += 1
                continue
            value = values.get(name)
            if name in mine and isinstance(value, str) and value != mine[name]:
                other[(shown, _clip(value))] += 1
    ranked = sorted(other.items(), key=lambda kv: (-kv[1], kv[0]))
    return {
        "recorded": recorded,
        "other": [
            {"part": part, "value": value, "entries": n} for (part, value), n in ranked[:_MAX_SHOWN]
        ],
        # Entries of further values (a writer can make as many as it writes entries).
        "other_left_out": sum(n for _, n in ranked[_MAX_SHOWN:]),
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def report(store: Any, jax_report: dict[str, Any] | None) -> dict[str, Any] | None:
    """This host's key settings and, with a store, its entries compared with them; None where
    JAX is not installed."""
    if jax_report is None:
        return None
    here = host_settings()
    out: dict[str, Any] = {"host": here}
    if store is not None and "error" not in here:
        build = (jax_report.get("build") or {}).get("digest")
        try:
            out["entries"] = compare(store, here, build if isinstance(build, str) else None)
        except Exception as exc:
            out["entries_error"] = f"{type(exc).__name__}: {exc}"
    return out
