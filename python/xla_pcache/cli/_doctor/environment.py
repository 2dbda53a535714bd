"""What this environment asks of the cache, read without importing a framework: the
settings (a malformed variable is a problem, the rest of the report goes on with the
defaults), the cache path and where it came from, the trust set-up, the store it opens and
what that reports, whether zero-code activation is on for each framework, what JAX stores
and how loading ahead runs.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any

from xla_pcache import _memory
from xla_pcache.config import DISABLE_VAR, Settings


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


def _prefetch_settings(settings: Settings) -> dict[str, Any]:
    """How JAX processes started with this environment load and compile ahead, and the job's
    memory their bounds follow."""
    from xla_pcache.config import COMPILE_AHEAD_MEMORY_VAR, COMPILE_AHEAD_VAR, PREFETCH_VAR

    memory = _memory.read()
    job = memory.total()
    reserve_from = (
        COMPILE_AHEAD_MEMORY_VAR
        if settings.compile_ahead_memory is not None
        else "a quarter of the job's memory"
        if job is not None
        else "the job's memory is unknown"
    )
    return {
        "state": "on" if settings.prefetch else f"off ({PREFETCH_VAR}=0)",
        "threads": settings.prefetch_thread_count(),
        "memory": settings.prefetch_memory_bound(job),
        "name": settings.prefetch_name,
        "compile_ahead": {
            "state": "on" if settings.compile_ahead else f"off ({COMPILE_AHEAD_VAR}=0)",
            "threads": settings.compile_ahead_thread_count(),
            "memory_kept_free": settings.compile_ahead_reserve(job),
            "memory_kept_free_from": reserve_from,
        },
        "job_memory": _job_memory(memory),
    }


def _job_memory(memory: _memory.Memory) -> dict[str, Any]:
    """The job's memory as ``_memory`` reads it: the host's, every cgroup limit found (its
    version, path, the file it is from, limit, use and room) and the one of least room."""
    tightest = memory.tightest()
    return {
        "total": memory.total(),
        "available": memory.available(),
        "host_total": memory.host_total,
        "host_available": memory.host_available,
        "limits": [
            {
                "version": lim.version,
                "cgroup": lim.cgroup,
                "directory": lim.directory,
                "source": lim.source,
                "limit": lim.limit,
                "use": lim.use,
                "room": lim.room,
            }
            for lim in memory.limits
        ],
        "tightest": None if tightest is None else memory.limits.index(tightest),
    }
