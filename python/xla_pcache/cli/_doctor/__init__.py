"""``xla-pcache doctor``: what this environment will do with the cache, checked for real.

For each framework installed (found without importing it), its version, and whether its
backend can serialize an executable AND load it back. That check compiles a small program
in a subprocess (frameworks are slow to import and may crash on a bad backend), once: the
answer is kept in the cache under a key made of the framework, its versions and the
backend asked for, so the next doctor on any host sharing the cache reads it instead.

The report's parts are modules of this package, one subject each: ``frameworks`` (each
framework's probe, and what is remembered of it), ``environment`` (the settings, the cache
and its store, activation, what JAX stores, loading ahead), ``key_settings`` (the compression
and flags in this host's JAX keys, and the store's entries made under others),
``bucket_check`` (a bucket path's requests, each made once) and ``render`` (the report for
people); here they are put together (``collect``) and printed (``main``).
"""

from __future__ import annotations

import json
import platform
from typing import Any

from xla_pcache.cli._doctor import bucket_check, key_settings

# Named here as well (``x as x``) are the parts tests and the fuzzer reach through
# ``xla_pcache.cli._doctor``.
from xla_pcache.cli._doctor.environment import _activation as _activation
from xla_pcache.cli._doctor.environment import (
    _bucket_path,
    _configuration,
    _open_store,
    _prefetch_settings,
    _read_settings,
    _settings,
)
from xla_pcache.cli._doctor.environment import _jax_caching as _jax_caching
from xla_pcache.cli._doctor.frameworks import FRAMEWORKS, Framework, _check_framework, probe_key
from xla_pcache.cli._doctor.frameworks import _dist_version as _dist_version
from xla_pcache.cli._doctor.render import _console, _render
from xla_pcache.cli._doctor.render import _render_prefetch as _render_prefetch

__all__ = ["FRAMEWORKS", "Framework", "main", "probe_key"]


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
        url = _bucket_path(raw)
        store, cache, store_problems = _open_store(config, settings, url)
        if url is not None and config.get("bucket"):
            # Each request a host makes of the bucket, once: which one fails, and why.
            steps, bucket_problems = bucket_check.check(
                url,
                read_only=bool(config.get("read_only")),
                timeout=max(settings.remote_timeout, 10.0),
            )
            cache["bucket_checks"] = steps
            store_problems += bucket_problems
    problems += store_problems
    frameworks: dict[str, Any] = {}
    try:
        for name, fw in FRAMEWORKS.items():
            report = _check_framework(fw, store)
            if report is not None:
                frameworks[name] = report
        # What enters this host's JAX keys, and the store's entries made under other settings.
        jax_keys = key_settings.report(store, frameworks.get("jax"))
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
        "jax_keys": jax_keys,
        "prefetch": _prefetch_settings(settings),
        "problems": problems,
    }


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
