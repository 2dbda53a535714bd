"""Serve torch_xla's persistent compilation cache from a shared, bounded xla_pcache store.

torch_xla's own ``PersistentCache`` writes one file per graph, in place, with no lock and no
eviction, so pointing many processes at one directory risks torn files and a full disk.
``install()`` keeps torch_xla's variables and behaviour but moves its directory to a private
per-process view of a host-local copy of the store (see ``_host_mirror``), and publishes
what torch_xla writes there into the store, atomically and first writer wins.

Call ``install()`` before the first XLA execution: torch_xla reads its cache settings once,
when it first needs its computation cache. This module imports torch_xla only inside its
functions, so ``import xla_pcache`` never imports torch.

Here are the three ways in (``install()``, activation from the environment, torch_xla's own
``initialize_cache`` routed here), how they meet (the first wins; a later one agrees or is
refused), and the one record of what they set up in this process; one module, since each
calls the others (install() routes initialize_cache here, which installs). What they do is in
modules named for it: ``_runtime`` (torch_xla itself), ``_environment`` (the variables
torch_xla and child processes read), ``_serve`` (the store and host mirror a process is
served from) and ``_cache`` (``TorchXlaCache``, what install() set up).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from xla_pcache import cache_path
from xla_pcache._core import CacheError
from xla_pcache._text import package_logger
from xla_pcache._url import is_url
from xla_pcache.cache_path import shown_path
from xla_pcache.config import PATH_VAR, Settings
from xla_pcache.store import settle
from xla_pcache.tiers import redact
from xla_pcache.torch_xla import _environment as _env
from xla_pcache.torch_xla import _runtime, _serve
from xla_pcache.torch_xla._cache import CANNOT_LOAD_ISSUE as CANNOT_LOAD_ISSUE
from xla_pcache.torch_xla._cache import TorchXlaCache
from xla_pcache.torch_xla._runtime import SUPPORTED_TORCH_XLA as SUPPORTED_TORCH_XLA
from xla_pcache.torch_xla._runtime import torch_xla_counters as torch_xla_counters

__all__ = [
    "SUPPORTED_TORCH_XLA",
    "TorchXlaCache",
    "capability",
    "initialize_cache",
    "install",
    "installed",
    "sync",
]

logger = package_logger("xla_pcache.torch_xla")

DEFAULT_SYNC_INTERVAL_S = 30.0

_state_lock = threading.Lock()
_installed: TorchXlaCache | None = None
# Set while an explicit install() imports torch_xla, so that the import hook leaves the
# set-up to it and its arguments win.
_explicit_depth = 0
# Set when torch_xla's cache was created with no persistent cache because the store could
# not be used: a later initialize_cache cannot change that, and must not raise for it.
_started_without_cache = False
# torch_xla's own initialize_cache, for the calls left to it (kept here by the patch, or by
# the import hook's shim).
_original_initialize_cache: Any = None


def installed() -> TorchXlaCache | None:
    """The cache ``install()`` set up in this process, or None."""
    return _installed


def sync() -> dict[str, Any]:
    """Publish torch_xla's new files now (also done in the background and at exit).

    Returns counters: published, already_stored, pending, errors, ... and ``capability``
    (``loads``, ``cannot-load`` or ``unknown`` until torch_xla has tried to load an entry).
    """
    inst = _installed
    if inst is None:
        raise CacheError("xla_pcache.torch_xla.install() has not been called in this process")
    return inst.sync()


def capability() -> str:
    """``loads``, ``cannot-load`` or ``unknown``, from torch_xla's counters so far."""
    inst = _installed
    if inst is None:
        return "unknown"
    inst.sync()
    return inst._capability


def activation() -> str | None:
    """How the adapter was installed in this process (``install()`` or the activation
    path), or None."""
    inst = _installed
    return None if inst is None else inst.via


def install(
    path: str | os.PathLike[str] | None = None,
    *,
    max_size: int | str | None = None,
    read_only: bool | None = None,
    local_dir: str | os.PathLike[str] | None = None,
    sync_interval: float | None = DEFAULT_SYNC_INTERVAL_S,
) -> TorchXlaCache | None:
    """Serve torch_xla's persistent cache from the xla_pcache store at ``path``.

    Must run before the first XLA execution of the process (a later call raises
    ``CacheError``: torch_xla has already fixed its cache). Defaults: ``path`` from
    ``XLA_PERSISTENT_CACHE_PATH``; ``max_size`` (bytes or ``"50G"``) from
    ``XLA_PERSISTENT_CACHE_MAX_SIZE``; ``read_only`` from ``XLA_PERSISTENT_CACHE_READ_ONLY``.
    ``local_dir`` holds the host-local copy (default ``$XLA_PCACHE_TORCH_XLA_LOCAL_DIR``,
    else ``$XDG_CACHE_HOME/xla_pcache/torch_xla``). New files are published every
    ``sync_interval`` seconds (None: only on ``sync()`` and at exit).

    Returns the installed cache, or None when the store or the local directory cannot be
    used (logged; torch_xla then runs with no persistent cache, never the shared directory).
    Calling it again with the same settings returns the same object.
    """
    global _installed, _explicit_depth
    if local_dir is not None and is_url(os.fspath(local_dir)):
        # Never a directory named after a URL; not quoted: a URL may carry a credential.
        raise ValueError("invalid local_dir: a local directory, not a URL")
    _explicit_depth += 1
    try:
        xlac = _runtime.xla_bindings()
    finally:
        _explicit_depth -= 1
    _patch_initialize_cache()
    settings = Settings.from_env()
    resolved, url_read_only = _serve.resolve(path, settings)
    options = settle(
        settings, max_size=max_size, read_only=None if read_only is None else bool(read_only)
    )
    if url_read_only and not options.read_only:
        options = options.replace(read_only=True)
    ro = options.read_only
    with _state_lock:
        if _installed is not None and _installed.pid == os.getpid():
            same = (_serve.identity(_installed.store), _installed.read_only) == (resolved, ro)
            if same and not _installed._closed:
                return _installed
            how = (
                ""
                if _installed.via == "install()"
                else f" by zero-code activation ({_installed.via}; set XLA_PCACHE_DISABLE=1 "
                "or call install() before importing torch_xla to choose the settings)"
            )
            raise CacheError(
                "xla_pcache.torch_xla.install() was already called in this process with "
                f"other settings ({shown_path(_serve.identity(_installed.store))}){how}; "
                "torch_xla fixes its cache once"
            )
        if xlac._xla_computation_cache_is_initialized():
            raise CacheError(
                "xla_pcache.torch_xla.install() came too late: torch_xla has already "
                "created its computation cache (something ran on the XLA device, or "
                "torch_xla.runtime.initialize_cache was used). Call install() first thing, "
                "before any tensor is moved to or computed on the XLA device."
            )
        root = os.fspath(local_dir) if local_dir is not None else settings.torch_xla_local_root()
        # A root the user named is never changed (see _mirror_dirs).
        named = local_dir is not None or settings.torch_xla_local_dir is not None
        mirror = _serve.serve(resolved, options, root, named)
        if mirror is None:
            _start_without_cache(xlac, resolved, ro)
            return None
        _env.start_cache(xlac, mirror.torch_path(), ro)
        _env.hide_from_children(resolved)
        inst = TorchXlaCache(mirror.store, mirror, ro, sync_interval, options=options)
        inst.max_size = options.max_size
        inst._torch_read_only = ro
        inst.on_miss = settings.on_miss
        if settings.on_miss != "compile":
            _runtime.watch_steps(_after_step)
        if sync_interval is not None and sync_interval > 0 and not ro:
            inst._start_thread()
        atexit.register(inst.close)
        _installed = inst
        return inst


def _after_step() -> None:
    """``TorchXlaCache.after_step`` of the cache installed now, when a step returns."""
    inst = _installed
    if inst is not None:
        inst.after_step()


def _start_without_cache(xlac: Any, resolved: str, ro: bool) -> None:
    global _started_without_cache
    _env.start_cache(xlac, None, ro)
    _env.hide_from_children(resolved)
    _started_without_cache = True


def initialize_cache(path: str, readonly: bool = False) -> None:
    """What ``torch_xla.runtime.initialize_cache`` becomes once torch_xla is imported with
    xla_pcache installed: the directory becomes an xla_pcache store, as
    ``install(path, read_only=readonly)`` would make it. It never raises because activation
    created torch_xla's cache first; after the first execution a different path is refused
    as torch_xla refuses it."""
    where = cache_path.route(os.fspath(path))
    resolved = where.path
    ro = bool(readonly) or where.read_only
    inst = _installed
    if inst is not None and inst.pid == os.getpid() and not inst._closed:
        if (_serve.identity(inst.store), inst.read_only) == (resolved, ro):
            _env.leave_for_children(resolved, ro)
            return
        if _runtime.executed():
            raise AssertionError(
                "Computation cache has already been initialized (xla_pcache serves "
                f"{inst.store.path}; torch_xla fixes its cache at the first execution, so "
                f"initialize_cache({shown_path(path)!r}) must come before it)"
            )
        before = _serve.identity(inst.store)
        if _serve.serve_instead(inst, resolved, ro):
            _env.leave_for_children(resolved, inst.read_only)
            logger.info(
                "xla_pcache: torch_xla.runtime.initialize_cache(%r, readonly=%s) replaces "
                "%s, set up by %s: before the first execution the call wins",
                shown_path(path),
                ro,
                shown_path(before),
                inst.via,
            )
            inst.via = "torch_xla.runtime.initialize_cache"
        return
    if _started_without_cache:
        logger.warning(
            "xla_pcache: torch_xla.runtime.initialize_cache(%r) ignored: torch_xla's cache "
            "was already created with no persistent cache after xla_pcache could not use "
            "its directory",
            shown_path(path),
        )
        return
    try:
        xlac: Any = _runtime.xla_bindings()
    except CacheError as exc:
        _initialize_unsupported(path, resolved, ro, exc)
        return
    if xlac._xla_computation_cache_is_initialized():
        _call_original(path, readonly)  # torch_xla's own refusal, as without xla_pcache
        return
    try:
        result = install(resolved, read_only=ro)
    except Exception as exc:
        logger.warning(
            "xla_pcache: torch_xla.runtime.initialize_cache(%r) could not go through "
            "xla_pcache (%s: %s); torch_xla runs with no persistent cache",
            shown_path(path),
            type(exc).__name__,
            exc,
        )
        if not xlac._xla_computation_cache_is_initialized():
            _start_without_cache(xlac, resolved, ro)
        return
    if result is not None:
        result.via = "torch_xla.runtime.initialize_cache"
        _env.leave_for_children(resolved, ro)


initialize_cache._xla_pcache = True  # type: ignore[attr-defined]


def _initialize_unsupported(path: str, resolved: str, ro: bool, exc: Exception) -> None:
    """initialize_cache on a torch_xla the adapter cannot serve: torch_xla's own in-place
    cache, except in a directory that is an xla_pcache store or a URL (torch_xla would make a
    directory named after it)."""
    if is_url(resolved):
        logger.warning(
            "xla_pcache: %s; torch_xla.runtime.initialize_cache(%r) names a URL, which "
            "torch_xla's own cache would take for a directory: torch_xla runs with no "
            "persistent cache instead",
            exc,
            redact(path),
        )
        os.environ.pop(PATH_VAR, None)
        return
    if os.path.exists(os.path.join(resolved, "FORMAT")):
        logger.warning(
            "xla_pcache: %s; torch_xla.runtime.initialize_cache(%r) names an xla_pcache "
            "store, which torch_xla would write in place into: torch_xla runs with no "
            "persistent cache instead",
            exc,
            path,
        )
        os.environ.pop(PATH_VAR, None)
        return
    logger.warning(
        "xla_pcache: %s; torch_xla.runtime.initialize_cache(%r) is left to torch_xla's own "
        "cache (written in place, unbounded)",
        exc,
        path,
    )
    _call_original(path, ro)


def _call_original(path: str, readonly: bool) -> None:
    original = _original_initialize_cache
    if original is None:
        raise CacheError("torch_xla.runtime.initialize_cache was not patched")
    original(path, readonly)


def _patch_initialize_cache() -> None:
    """Route ``torch_xla.runtime.initialize_cache`` through ``initialize_cache`` above."""
    global _original_initialize_cache
    import importlib

    runtime: Any = importlib.import_module("torch_xla.runtime")
    current = getattr(runtime, "initialize_cache", None)
    if current is None or getattr(current, "_xla_pcache", False):
        return  # absent, or already ours (here or the import hook's shim)
    _original_initialize_cache = current
    runtime.initialize_cache = initialize_cache


def _auto_install(via: str) -> None:
    """Activation from the environment, right after ``import torch_xla``: nothing to do when
    an explicit ``install()`` is doing the import or already ran; a later explicit call with
    the same settings returns this cache, with others it raises (torch_xla fixes its cache
    once)."""
    if _explicit_depth or _installed is not None:
        return
    try:
        # Inside the try: a malformed variable must also leave torch_xla without the path.
        if Settings.from_env().inherited_path is None:
            return  # only JAX's own variable is set: nothing asks for a torch_xla cache
        _patch_initialize_cache()
        inst = install()
    except Exception:
        _env.leave_without_cache()
        raise
    if inst is not None:
        inst.via = via
