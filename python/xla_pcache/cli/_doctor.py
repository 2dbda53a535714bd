"""``xla-pcache doctor``: what this environment will do with the cache, checked for real.

For each framework installed (found without importing it), its version, and whether its
backend can serialize an executable AND load it back. That check compiles a small program
in a subprocess (frameworks are slow to import and may crash on a bad backend), once: the
answer is kept in the cache under a key made of the framework, its versions and the
backend asked for, so the next doctor on any host sharing the cache reads it instead.

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

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xla_pcache._text import raw_stream, shown
from xla_pcache.config import DISABLE_VAR, Settings

__all__ = ["FRAMEWORKS", "Framework", "main", "probe_key"]

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
        from xla_pcache.jax import _read_hook
        form = _read_hook.read_form(cc)
        out["prefetch"] = "ok" if isinstance(form, int) else form
    except Exception as exc:
        out["prefetch"] = f"{type(exc).__name__}: {exc}"
    try:
        from jax._src import compiler
        from xla_pcache.jax import _compile_hook
        form = _compile_hook.read_form(compiler)
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


def _read_settings() -> tuple[Settings | None, list[str]]:
    """The environment's settings, or None and the problem with a malformed variable."""
    try:
        return Settings.from_env(), []
    except (ValueError, TypeError) as exc:
        return None, [str(exc)]


def _settings(read: tuple[Settings | None, list[str]] | None = None) -> Settings:
    """The environment's settings; a malformed variable is reported by ``_configuration``,
    and the rest of the report goes on with the defaults."""
    settings, _problems = read if read is not None else _read_settings()
    return settings if settings is not None else Settings()


def _configuration(
    path: str | None, read: tuple[Settings | None, list[str]] | None = None
) -> tuple[dict[str, Any], list[str]]:
    settings, problems = read if read is not None else _read_settings()
    problems = list(problems)
    config: dict[str, Any] = {}
    env_path = settings.path if settings else None
    resolved = path or env_path or _settings(read).default_cache_path()
    url = _bucket_path(resolved)
    url_read_only = False
    if url is not None:
        # A bucket: served by a host-local store (xla_pcache.bucket), reported as the path.
        # A file: URL is its directory.
        from xla_pcache import bucket
        from xla_pcache._url import names_directory
        from xla_pcache.cache_path import route
        from xla_pcache.tiers import redact

        where = route(url)
        if where.kind == "local":
            config["path"] = where.path
            url_read_only = where.read_only
        elif where.kind == "bucket":
            config["bucket"] = redact(url)
            config["path"] = bucket.local_path(url, settings or Settings())
        else:
            if not names_directory(url):
                config["bucket"] = redact(url)
            config["path"] = redact(url)
            problems.append(f"{redact(url)} cannot be served: {where.reason}")
    else:
        config["path"] = os.path.abspath(os.path.expanduser(resolved))
    config["path_source"] = (
        "--path" if path else "XLA_PERSISTENT_CACHE_PATH" if env_path else "default"
    )
    if settings is not None:
        config["read_only"] = settings.read_only or url_read_only
        config["max_size"] = settings.max_size
        config["memory_capacity"] = settings.memory_capacity
        if settings.remote is not None:
            from xla_pcache.tiers import redact_chain

            config["remote"] = redact_chain(settings.remote)
        config["trust"] = _trust(settings)
    return config, problems


def _trust(settings: Settings) -> dict[str, Any]:
    """The trust set-up by key name: never the private key, nor its file's content."""
    import base64
    import hashlib

    signing = settings.signing_key
    trusted = settings.trusted_keys
    return {
        "signing_key": None if signing is None else {"name": signing.name, "file": signing.path},
        # A short fingerprint of each public key, to compare with what keygen printed.
        "trusted_keys": None
        if trusted is None
        else [
            {
                "name": name,
                "public_key": base64.b64encode(public).decode(),
                "fingerprint": hashlib.sha256(public).hexdigest()[:16],
            }
            for name, public in trusted
        ],
    }


def _bucket_path(path: str) -> str | None:
    """``path`` if it is written as a URL (a bucket path, or a ``file:`` URL, which
    ``open_store`` routes), else None."""
    from xla_pcache._url import is_url

    return path.strip() if is_url(path) else None


def _open_store(
    config: dict[str, Any], settings: Settings | None = None, url: str | None = None
) -> tuple[Any, dict[str, Any], list[str]]:
    """The store ``config`` names (for a bucket path ``url``, its host-local store with
    the bucket behind it), what it reports, and the problems found."""
    from xla_pcache.cache_path import open_store

    info: dict[str, Any] = {}
    try:
        # The budget and read-only mode the report shows are the settings' own.
        if url is not None:
            store = open_store(url, settings or _settings())
        else:
            store = open_store(config["path"], settings)
    except Exception as exc:
        return None, info, [f"cannot open the cache at {config['path']}: {exc}"]
    info["filesystem"] = store.filesystem
    info["mmap_reads"] = store.mmap_reads
    try:
        stats = store.stats()
        info.update(
            entries=stats.get("entries"), bytes=stats.get("bytes"), max_size=stats.get("max_size")
        )
        # The cache's stored budget (`xla-pcache config`; the JSON key keeps its older name);
        # max_size above is the stricter of the stored budget and this environment's.
        info["stored_settings"] = dict(store.cache_settings())
        info["max_age_s"] = stats.get("max_age_s")
        # Loading ahead, summed over every process (docs/jax.md, "Loading ahead").
        info["prefetch"] = {
            k.removeprefix("prefetch_"): v for k, v in stats.items() if k.startswith("prefetch_")
        }
    except Exception as exc:
        info["stats_error"] = f"{type(exc).__name__}: {exc}"
    problems: list[str] = []
    chain = getattr(store, "remote", None)
    if chain is not None:
        # The chain as XLA_PCACHE_REMOTE set it, redacted (no user, password or option
        # value but the read-only and trust flags); the tiers that could not be used are problems.
        # A read-only store writes no tier, whatever each URL says.
        info["remote"] = [
            dict(t, read_only=t["read_only"] or store.read_only) for t in chain.describe()
        ]
        problems += [f"remote tier {url} is not used (see the warning)" for url in chain.dropped]
    return store, info, problems


def _activation(settings: Settings | None = None) -> dict[str, str]:
    """Whether zero-code activation is on in processes started with this environment, and
    by which path (nothing here imports a framework)."""
    settings = settings or _settings()
    registered = any(
        ep.value == "_xla_pcache_autoload"
        for ep in importlib.metadata.entry_points(group="jax_plugins")
    )
    # JAX_COMPILATION_CACHE_DIR is JAX's own variable, read by JAX (and by the start-up hook).
    wanted = settings.path is not None or os.environ.get("JAX_COMPILATION_CACHE_DIR", "").strip()
    if settings.disabled:
        state = f"off ({DISABLE_VAR}=1)"
    elif not _importable("jax"):
        # The entry point is JAX's to call: without jax nothing activates.
        state = "off (jax is not installed in this environment)"
    elif not registered:
        state = "off (package not installed with its entry point; pip install it)"
    elif not wanted:
        state = "off (XLA_PERSISTENT_CACHE_PATH and JAX_COMPILATION_CACHE_DIR unset)"
    else:
        state = "on (jax_plugins entry point, at JAX backend start-up)"
    return {"jax": state, "torch_xla": _torch_xla_activation(settings)}


def _jax_caching(settings: Settings | None = None) -> dict[str, dict[str, Any]]:
    """What JAX caches in processes started with this environment: each threshold's value
    and where it comes from (a ``jax.config.update`` in the program before activation would
    also win; the running process's own answer is ``xla_pcache.jax.thresholds()``). Nothing
    where JAX is not installed: there is no JAX to store anything."""
    if not _importable("jax"):
        return {}
    from xla_pcache.jax import _thresholds as _jax_thresholds

    settings = settings or _settings()
    out: dict[str, dict[str, Any]] = {}
    if settings.disabled:
        for t in _jax_thresholds.THRESHOLDS:
            raw = os.environ.get(t.jax_var, "").strip()
            source = f"JAX's variable {t.jax_var}" if raw else f"JAX's default ({DISABLE_VAR}=1)"
            out[t.option] = {"value": raw or t.jax_default, "source": source}
        return out
    for d in _jax_thresholds.decide(settings, os.environ):
        out[d.option] = {"value": d.value, "source": d.source}
    return out


def _importable(module: str) -> bool:
    """Whether ``module`` is installed here (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _torch_xla_activation(settings: Settings | None = None) -> str:
    import site

    settings = settings or _settings()
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    hook = next(
        (d for d in dirs if os.path.isfile(os.path.join(d, "xla_pcache_autoload.pth"))), None
    )
    if settings.disabled:
        return f"off ({DISABLE_VAR}=1)"
    if not _importable("torch_xla"):
        return "off (torch_xla is not installed in this environment)"
    if hook is None:
        return "off (package not installed with its xla_pcache_autoload.pth; pip install it)"
    if settings.inherited_path is None:
        return "off (XLA_PERSISTENT_CACHE_PATH unset)"
    return (
        "on (xla_pcache_autoload.pth import hook, right after `import torch_xla`; "
        f"{os.path.join(hook, 'xla_pcache_autoload.pth')})"
    )


def collect(path: str | None) -> dict[str, Any]:
    """Everything the doctor reports, as a dict (the ``--json`` output)."""
    from xla_pcache import FORMAT_VERSION, __version__

    # Parsed once; each part of the report reads the same settings.
    read = _read_settings()
    settings = _settings(read)
    config, problems = _configuration(path, read)
    store: Any = None
    cache: dict[str, Any] = {}
    store_problems: list[str] = []
    if not problems:
        raw = path or settings.path or ""
        store, cache, store_problems = _open_store(config, settings, _bucket_path(raw))
    problems += store_problems
    frameworks: dict[str, Any] = {}
    try:
        for name, fw in FRAMEWORKS.items():
            report = _check_framework(fw, store)
            if report is not None:
                frameworks[name] = report
    finally:
        if store is not None:
            store.close()
    return {
        "xla_pcache": __version__,
        "format_version": FORMAT_VERSION,
        "python": platform.python_version(),
        "config": config,
        "cache": cache,
        "frameworks": frameworks,
        "activation": _activation(settings),
        "jax_caching": _jax_caching(settings),
        "prefetch": _prefetch_settings(settings),
        "problems": problems,
    }


def _prefetch_settings(settings: Settings) -> dict[str, Any]:
    """How JAX processes started with this environment load ahead."""
    from xla_pcache.config import COMPILE_AHEAD_VAR, PREFETCH_VAR

    return {
        "state": "on" if settings.prefetch else f"off ({PREFETCH_VAR}=0)",
        "threads": settings.prefetch_thread_count(),
        "memory": settings.prefetch_memory,
        "name": settings.prefetch_name,
        "compile_ahead": {
            "state": "on" if settings.compile_ahead else f"off ({COMPILE_AHEAD_VAR}=0)",
            "threads": settings.compile_ahead_thread_count(),
            "memory_kept_free": settings.compile_ahead_reserve(),
        },
    }


def _e(value: object) -> str:
    # Paths, versions and error texts (some quote files a cache writer chose) are printed as
    # they are, never read as rich markup.
    # Control sequences in them are made visible (shown), never sent to the terminal.
    return escape(shown(value))


def _render(console: Console, report: dict[str, Any]) -> None:
    from xla_pcache.sizes import format_size

    cfg = report["config"]
    console.print(
        f"xla_pcache {report['xla_pcache']} (format {report['format_version']}), "
        f"Python {report['python']}"
    )
    console.print(f"Cache: [bold]{_e(cfg['path'])}[/] (from {_e(cfg['path_source'])})")
    if "bucket" in cfg:
        console.print(
            f"  a bucket: {_e(cfg['bucket'])}, served by this host-local store in front of it"
        )
    if "read_only" in cfg:
        console.print(
            f"  read-only: {cfg['read_only']}, max size: {format_size(cfg['max_size'])}, "
            f"in-memory capacity: {cfg['memory_capacity']}"
        )
    trust = cfg.get("trust")
    if trust is not None:
        signing, trusted = trust["signing_key"], trust["trusted_keys"]
        console.print(
            "  signing: "
            + (
                f"every put signed by {_e(signing['name'])} (key file {_e(signing['file'])})"
                if signing
                else "puts are unsigned"
            )
        )
        console.print(
            "  trusted keys: "
            + (
                ", ".join(_e(k["name"]) for k in trusted) + ": only entries they signed are loaded"
                if trusted
                else "none set, every verified entry is loaded (any writer's)"
            )
        )
    cache = report["cache"]
    if cache:
        size = cache.get("bytes")
        console.print(
            f"  filesystem: {_e(cache['filesystem'])} "
            f"({'mmap' if cache['mmap_reads'] else 'pread'} reads), "
            f"{cache.get('entries')} entries, "
            f"{format_size(size) if isinstance(size, int) else _e(size)}"
        )
    stored = cache.get("stored_settings")
    if stored is not None:
        from xla_pcache.metrics import human_duration

        age, kept = cache.get("max_age_s"), cache.get("max_size")
        console.print(
            f"  budget kept: {format_size(kept) if kept else 'unbounded'} (stored in the "
            f"cache: {format_size(stored['max_size']) if stored['max_size'] else 'none'}), "
            f"max age: {human_duration(age) if age else 'none'}"
        )
    for tier in cache.get("remote", []):
        console.print(
            f"  remote tier {tier['tier']}: {_e(tier['url'])}"
            + (" (read-only)" if tier["read_only"] else "")
            + (" (trusted entries only)" if tier.get("trust_required") else "")
        )
    for name, state in report.get("activation", {}).items():
        console.print(f"Zero-code activation for {_e(name)}: {_e(state)}")
    caching = report.get("jax_caching", {})
    if caching:
        console.print(
            "What JAX stores (a jax.config.update in the program before activation wins):"
        )
    for option, setting in caching.items():
        console.print(f"  {_e(option)} = {_e(setting['value'])} (from {_e(setting['source'])})")
    _render_prefetch(console, report)
    table = Table(title="Frameworks")
    for column in ("framework", "versions", "backend", "serialize", "load", "note"):
        table.add_column(column)
    for name, fw in report["frameworks"].items():
        versions = ", ".join(f"{d} {v}" for d, v in fw["versions"].items())
        if "error" in fw:
            table.add_row(
                _e(name),
                _e(versions),
                _e(fw["backend_hint"]),
                "?",
                "?",
                f"[red]{_e(fw['error'])}[/]",
            )
            continue
        note = fw.get("detail", "")
        if fw.get("adapter") not in (None, "ok"):
            note = f"{note} adapter: {fw['adapter']}".strip()
        if fw.get("remembered"):
            note = f"{note} (remembered)".strip()
        if fw.get("cache_error"):
            note = f"{note} ({fw['cache_error']})".strip()
        table.add_row(
            _e(name),
            _e(versions),
            _e(fw.get("backend")),
            "[green]yes[/]" if fw.get("serialize") else "[red]no[/]",
            "[green]yes[/]" if fw.get("load") else "[red]no[/]",
            _e(note),
        )
    if report["frameworks"]:
        console.print(table)
        _render_builds(console, report["frameworks"])
    else:
        console.print("No framework found: install jax or torch_xla.")
    for problem in report["problems"]:
        console.print(f"[red]problem:[/] {_e(problem)}")


def _render_builds(console: Console, frameworks: dict[str, Any]) -> None:
    """The runtime builds in force: each entry's key ends with its build, and a process
    loads only its own build's entries (docs/jax.md, docs/torch_xla.md)."""
    console.print("Runtime builds (a process loads only entries its own build made):")
    for name, fw in frameworks.items():
        build = fw.get("build") or {}
        if "error" in build:
            console.print(f"  {_e(name)}: [red]unknown[/] ({_e(build['error'])})")
            continue
        console.print(f"  {_e(name)}: build {_e(build.get('digest'))}")
        for role, r in (build.get("roles") or {}).items():
            if role == "unreadable":
                console.print(f"    [red]unreadable[/]: {_e('; '.join(r.get('messages', [])))}")
                continue
            console.print(
                f"    {_e(role)}: {_e(r.get('file'))} {_e(r.get('id'))}"
                + (
                    f" (+{r['files'] - 1} more files, digest {_e(r.get('digest'))})"
                    if r.get("files", 1) > 1
                    else ""
                )
            )
        if build.get("record_problems"):
            console.print(
                "    [red]the record of identities was refused[/] (see the warning): every "
                "process hashes the binaries"
            )
        _render_record(console, build.get("record"))


def _render_record(console: Console, record: dict[str, Any] | None) -> None:
    """Where the identities of the runtime's binaries are remembered: a process start
    then pays a stat per file; where they cannot be, it hashes them all again."""
    from xla_pcache.sizes import format_size

    if not record:
        return
    if record.get("unkept"):
        console.print(
            "    [red]identities remembered nowhere[/] "
            f"({_e(record['unkept'])}): every process hashes these binaries again "
            f"({format_size(record.get('hashed_bytes') or 0)}) at its first compile"
        )
    elif record.get("dir"):
        skipped = record.get("skipped") or []
        console.print(
            f"    identities remembered in {_e(record['dir'])}"
            + (f" (not in {_e('; '.join(skipped))})" if skipped else "")
        )


def _render_prefetch(console: Console, report: dict[str, Any]) -> None:
    from xla_pcache.metrics import human_duration
    from xla_pcache.sizes import format_size

    pf = report.get("prefetch")
    jax = report["frameworks"].get("jax")
    if not pf or jax is None:
        return
    line = f"Loading ahead (JAX): {_e(pf['state'])}"
    if pf["state"] == "on":
        hook = jax.get("prefetch")
        line += (
            f", {pf['threads']} threads, up to {format_size(pf['memory'])} loaded and not yet "
            f"used; plans named by {_e(pf['name'] or 'the main module or script')}"
        )
        if hook is not None and hook != "ok":
            line += f"; [red]off in this JAX[/]: {_e(hook)}"
    console.print(line)
    ahead = pf.get("compile_ahead")
    if ahead and pf["state"] == "on":
        line = f"Compiling ahead what is missing (JAX): {_e(ahead['state'])}"
        if ahead["state"] == "on":
            line += (
                f", {ahead['threads']} threads, starting only while more than "
                f"{format_size(ahead['memory_kept_free'])} of memory is available"
            )
            hook = jax.get("compile_ahead")
            if hook is not None and hook != "ok":
                line += f"; [red]off in this JAX[/]: {_e(hook)}"
        console.print(line)
    counts = report["cache"].get("prefetch")
    if counts:
        console.print(
            f"  so far: {counts.get('planned', 0)} planned, {counts.get('loaded', 0)} loaded "
            f"ahead, {counts.get('used', 0)} used, {counts.get('wasted', 0)} wasted, "
            f"{counts.get('errors', 0)} failed, time saved "
            f"{human_duration(counts.get('saved_ms', 0) / 1000)}; plans written "
            f"{counts.get('plans_written', 0)}, refused {counts.get('plans_refused', 0)}; "
            f"compiled ahead {counts.get('compiled', 0)}, used "
            f"{counts.get('compiled_used', 0)}, module records refused "
            f"{counts.get('modules_refused', 0)}"
        )


def _console() -> Console:
    # Rich writes to the stream under the CLI's escaping one: what it is given is escaped.
    out = raw_stream(sys.stdout)
    console = Console(file=out)
    if not console.is_terminal:
        # Piped or redirected: whole lines, not wrapped at rich's default of 80 columns.
        console = Console(file=out, width=10_000)
    return console


def main(path: str | None = None, as_json: bool = False) -> int:
    """Print the report; 0 when the configuration is usable, 1 when it is not."""
    console = _console()
    if as_json:
        report = collect(path)
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        with console.status("checking frameworks (compiles a small program once per backend)"):
            report = collect(path)
        _render(console, report)
    return 1 if report["problems"] else 0
