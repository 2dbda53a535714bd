"""Serve torch_xla's persistent compilation cache from a shared, bounded xla_pcache store.

torch_xla's own ``PersistentCache`` writes one file per graph, in place, with no lock and no
eviction, so pointing many processes at one directory risks torn files and a full disk.
``install()`` keeps torch_xla's variables and behaviour but moves its directory to a private
per-process view of a host-local copy of the store (see ``_host_mirror``), and publishes
what torch_xla writes there into the store, atomically and first writer wins.

Call ``install()`` before the first XLA execution: torch_xla reads its cache settings once,
when it first needs its computation cache. This module imports torch_xla only inside its
functions, so ``import xla_pcache`` never imports torch.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
from typing import Any

from xla_pcache import builds, cache_path, explain, misslog
from xla_pcache._core import CacheError
from xla_pcache._text import package_logger
from xla_pcache._url import is_url
from xla_pcache.cache_path import shown_path
from xla_pcache.config import LOCAL_DIR_VAR, PATH_VAR, READ_ONLY_VAR, SHARED_PATH_VAR, Settings
from xla_pcache.store import Store, StoreOptions, settle
from xla_pcache.tiers import redact
from xla_pcache.torch_xla import _build as _txbuild
from xla_pcache.torch_xla import _keyparts as _txkeys
from xla_pcache.torch_xla._cache import CANNOT_LOAD_ISSUE as CANNOT_LOAD_ISSUE
from xla_pcache.torch_xla._cache import TorchXlaCache, device_type, torch_xla_counters
from xla_pcache.torch_xla._host_mirror import HostMirror
from xla_pcache.torch_xla._keys import KEY_PREFIX, is_torch_xla_name, store_key

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
# What CI proves: the oldest and the newest torch_xla the adapter tests run against.
SUPPORTED_TORCH_XLA = "torch_xla >= 2.7, <= 2.9 (CI tests 2.7.0 and 2.9.0)"


class _CompileTimes:
    """Finds the compile time of each file torch_xla writes into the view, from its
    ``CompileTime`` metric: torch_xla records a sample (when the compile returned, how long
    it took) and writes the graph's file right after, compiles running one at a time, so a
    file's compile is the latest sample that ended before the file was written and was not
    given to another file."""

    # Filesystem timestamps come from a clock that ticks every few milliseconds, and can
    # read a little earlier than the sample's.
    SLACK_S = 0.02

    def __init__(self) -> None:
        self._used: set[float] = set()
        self._lock = threading.Lock()

    def __call__(self, st: os.stat_result) -> float | None:
        try:
            import importlib

            met: Any = importlib.import_module("torch_xla.debug.metrics")
            data = met.metric_data("CompileTime")
        except Exception:
            return None
        if not data or len(data) < 3:
            return None
        written = st.st_mtime_ns / 1e9 + self.SLACK_S
        with self._lock:
            best: tuple[float, float] | None = None
            for ts, value in data[2]:
                ts, value = float(ts), float(value)
                if ts <= written and ts not in self._used and (best is None or ts > best[0]):
                    best = (ts, value)
            if best is None:
                return None
            self._used.add(best[0])
            return best[1] / 1e9  # the metric is in nanoseconds


_compile_times = _CompileTimes()


def _watch_steps() -> None:
    """Run ``TorchXlaCache.after_step`` when a step returns: torch_xla's cache lives in
    C++ and offers no hook before a compile, so the closest point at which a miss can be
    reported, or fail the program, is the end of the step that compiled it
    (``torch_xla.sync()``, ``xm.mark_step()``)."""
    import importlib

    for module_name, attr in (("torch_xla", "sync"), ("torch_xla.core.xla_model", "mark_step")):
        try:
            module: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, attr, None)
        if original is None or getattr(original, "_xla_pcache", False):
            continue

        @functools.wraps(original)
        def step(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(*args, **kwargs)
            inst = _installed
            if inst is not None:
                inst.after_step()
            return result

        step._xla_pcache = True  # type: ignore[attr-defined]
        setattr(module, attr, step)


_state_lock = threading.Lock()
_installed: TorchXlaCache | None = None
# Set while an explicit install() imports torch_xla, so that the import hook leaves the
# set-up to it and its arguments win.
_explicit_depth = 0


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


def _producer_meta() -> dict[str, str]:
    import torch
    import torch_xla

    tx: Any = torch_xla
    return {
        "framework": "torch_xla",
        "framework_version": str(tx.__version__),
        "torch_version": str(torch.__version__),
        "device": device_type(),
        "time": f"{time.time():.3f}",
        # What explain compares (see torch_xla/_keyparts.py; the graph hash is not visible).
        misslog.META_COMPONENTS: misslog.encode(_txkeys.components()),
    }


def _torch_xla() -> Any:
    try:
        import torch_xla
    except ImportError as exc:
        raise CacheError(
            f"xla_pcache.torch_xla needs torch_xla; importing it failed: {exc}. "
            'Install it with `pip install "xla-pcache[torch-xla]"`.'
        ) from exc
    xlac = getattr(torch_xla, "_XLAC", None)
    for name in ("_xla_computation_cache_is_initialized", "_xla_get_num_cached_compilation_graph"):
        if not callable(getattr(xlac, name, None)):
            raise CacheError(
                f"xla_pcache.torch_xla supports {SUPPORTED_TORCH_XLA}; torch_xla "
                f"{getattr(torch_xla, '__version__', '?')} lacks _XLAC.{name}, which it needs "
                "to create torch_xla's cache before the first execution"
            )
    return xlac


def _start_cache(xlac: Any, directory: str | None, read_only: bool) -> None:
    """Make torch_xla create its computation cache now, reading ``directory``.

    torch_xla reads XLA_PERSISTENT_CACHE_PATH/_READ_ONLY once, when it first needs its
    cache. Creating it here, under install()'s control, rather than at the first
    execution, means the variables can be put back at once and no later change to them can
    send torch_xla's in-place writes into the shared directory.
    """
    saved = {name: os.environ.get(name) for name in (PATH_VAR, READ_ONLY_VAR)}
    try:
        if directory is None:
            os.environ.pop(PATH_VAR, None)
        else:
            os.environ[PATH_VAR] = directory
        os.environ[READ_ONLY_VAR] = "1" if read_only else "0"
        xlac._xla_get_num_cached_compilation_graph()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if not xlac._xla_computation_cache_is_initialized():
        raise CacheError("torch_xla did not create its computation cache when asked")


def _hide_from_children(path: str) -> None:
    """Child processes inherit the environment. One that runs torch_xla without calling
    install() would write in place into the shared directory; moving the path to our own
    variable gives it no persistent cache instead, and install() in it still finds it."""
    os.environ[SHARED_PATH_VAR] = path
    os.environ.pop(PATH_VAR, None)


def _foreign_files(path: str) -> int:
    """How many of torch_xla's own cache files (decimal names, written in place by a
    torch_xla running without xla_pcache) sit at the top of ``path``."""
    try:
        with os.scandir(path) as it:
            return sum(1 for e in it if is_torch_xla_name(e.name) and e.is_file())
    except OSError:
        return 0


def _runtime_build() -> builds.Build | None:
    """This process's torch_xla runtime build (``torch_xla/_build.py``), or None, with one
    warning, when it cannot be named (a binary loaded here was replaced on disk since, or
    the files could not be read): torch_xla then runs with no persistent cache."""
    build, why = builds.usable(_txbuild.build)
    if build is not None:
        return build
    logger.warning("xla_pcache: %s; torch_xla runs with no persistent cache", why)
    return None


def _open_store(
    resolved: str,
    options: StoreOptions,
    instead: str = "torch_xla runs with no persistent cache in this process",
    build: builds.Build | None = None,
) -> Store | None:
    """The store at ``resolved`` (``xla_pcache.open_store``), or None (one warning, ending
    with ``instead``) when it cannot be used."""
    where = cache_path.route(resolved)
    if where.kind == "unserved":
        cache_path.warn_unserved(where, _source(resolved), instead)
        return None
    try:
        # A bucket: its host-local store, the bucket behind it; torch_xla's own directory
        # stays the host-local view below, as for any store.
        store = cache_path.open_store(where, options)
    except Exception as exc:
        logger.warning(
            "xla_pcache: cannot open the cache at %s (%s: %s); %s",
            shown_path(resolved),
            type(exc).__name__,
            exc,
            instead,
        )
        return None
    if where.kind == "bucket":
        _pull_from_bucket(store, build)
        return store
    found = _foreign_files(resolved)
    if found:
        # They were written in place, with no lock: any of them may be torn, and a store
        # entry is forever (first writer wins), so they are not adopted. Nor deleted.
        logger.warning(
            "xla_pcache: %s holds %d file(s) of torch_xla's own persistent cache, written "
            "in place before xla_pcache served this directory; they are left untouched and "
            "not used (torch_xla compiles those graphs once more, into the store). Delete "
            "them when no torch_xla without xla_pcache uses this directory any more.",
            resolved,
            found,
        )
    return store


def _resolve(path: str | os.PathLike[str] | None, settings: Settings) -> tuple[str, bool]:
    """The cache's identity: an absolute directory (a ``file:`` URL's, decoded), or a URL as
    given (a bucket's, served by a host-local store; never a directory named after it); and
    whether the path asks for read-only (a ``file:`` URL's ``?ro=1``)."""
    if path is None:
        path = settings.inherited_path
        if path is None:
            raise CacheError(
                f"xla_pcache.torch_xla.install(): no cache path; pass one or set {PATH_VAR}"
            )
    where = cache_path.route(os.fspath(path))
    return where.path, where.read_only


def _identity(store: Store) -> str:
    """What ``_resolve`` gives for the path ``store`` was opened for."""
    url = getattr(store, "bucket_url", "")
    return url or store.path


def _source(resolved: str) -> str:
    """Which setting named ``resolved``, for a warning."""
    settings_path = (
        os.environ.get(PATH_VAR, "").strip() or os.environ.get(SHARED_PATH_VAR, "").strip()
    )
    if settings_path and cache_path.route(settings_path).path == resolved:
        return PATH_VAR
    return "torch_xla's cache path"


def _pull_from_bucket(store: Store, build: builds.Build | None) -> None:
    """A bucket path: torch_xla looks only in its own directory, so the bucket's torch_xla
    entries of this build that this host lacks are fetched before it starts
    (``BucketStore.pull_torch_xla``: a marker of another build names another entry)."""
    pull = getattr(store, "pull_torch_xla", None)
    if pull is None:
        return
    fetched = pull(functools.partial(store_key, build=build))
    if fetched:
        logger.info("xla_pcache: fetched %d torch_xla entries from the bucket", fetched)


def _on_publish(store: Store, others: builds.OtherBuilds, key: str) -> None:
    """After this process published torch_xla's file under ``key``: the graph missed here
    (torch_xla compiled and wrote it), so the miss is recorded, and counted when another
    build has an entry of it; for a bucket path, the marker that lets other hosts find the
    entry."""
    bare = builds.split_key(key)[0]
    others.count(store, bare)
    try:
        parts = _txkeys.components()
    except Exception as exc:
        logger.debug("xla_pcache: recording the torch_xla miss of %r failed: %s", key, exc)
    else:
        explain.record_miss(store, key, parts, "torch_xla")
    mark = getattr(store, "mark_torch_xla", None)
    if mark is not None:
        mark(key, bare[len(KEY_PREFIX) :])


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
        xlac = _torch_xla()
    finally:
        _explicit_depth -= 1
    _patch_initialize_cache()
    settings = Settings.from_env()
    resolved, url_read_only = _resolve(path, settings)
    options = settle(
        settings, max_size=max_size, read_only=None if read_only is None else bool(read_only)
    )
    if url_read_only and not options.read_only:
        options = options.replace(read_only=True)
    ro = options.read_only
    with _state_lock:
        if _installed is not None and _installed.pid == os.getpid():
            same = (_identity(_installed.store), _installed.read_only) == (resolved, ro)
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
                f"other settings ({shown_path(_identity(_installed.store))}){how}; "
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
        # A root the user named is never changed (see _host_mirror).
        named = local_dir is not None or settings.torch_xla_local_dir is not None
        build = _runtime_build()
        store = None if build is None else _open_store(resolved, options, build=build)
        if store is None or build is None:
            _start_without_cache(xlac, resolved, ro)
            return None
        builds.count_rehash(build, store)
        mirror = HostMirror(
            store,
            root,
            meta=_producer_meta,
            on_publish=None
            if ro
            else functools.partial(_on_publish, store, builds.OtherBuilds(build)),
            compile_time=_compile_times,
            build=build,
            named_root=named,
        )
        if not _own_dirs(mirror, "torch_xla runs with no persistent cache in this process"):
            store.close()
            _start_without_cache(xlac, resolved, ro)
            return None
        mirror.refresh_pool()
        try:
            mirror.open_view()
        except Exception as exc:
            mirror.warn(f"creating a host-local cache directory under {root}", exc)
            mirror.close_view()
            store.close()
            _start_without_cache(xlac, resolved, ro)
            return None
        _start_cache(xlac, mirror.torch_path(), ro)
        _hide_from_children(resolved)
        inst = TorchXlaCache(store, mirror, ro, sync_interval, options=options)
        inst.max_size = options.max_size
        inst._torch_read_only = ro
        inst.on_miss = settings.on_miss
        if settings.on_miss != "compile":
            _watch_steps()
        if sync_interval is not None and sync_interval > 0 and not ro:
            inst._start_thread()
        atexit.register(inst.close)
        _installed = inst
        return inst


def _own_dirs(mirror: HostMirror, instead: str) -> bool:
    """Whether the host-local directories ``mirror`` uses are this user's own (made 0700 if
    absent); if one is not (another user made it, or others can write it, so they would
    choose what torch_xla loads), one warning naming it, ending with ``instead``."""
    try:
        mirror.check_dirs()
    except (CacheError, OSError) as exc:
        mirror.close_dirs()
        logger.warning(
            "xla_pcache: torch_xla's host-local directory is refused: %s; %s (make it this "
            "user's own and writable by no one else, or set %s to a directory of your own)",
            exc,
            instead,
            LOCAL_DIR_VAR,
        )
        return False
    return True


# Set when torch_xla's cache was created with no persistent cache because the store could
# not be used: a later initialize_cache cannot change that, and must not raise for it.
_started_without_cache = False


def _start_without_cache(xlac: Any, resolved: str, ro: bool) -> None:
    global _started_without_cache
    _start_cache(xlac, None, ro)
    _hide_from_children(resolved)
    _started_without_cache = True


def _executed(inst: TorchXlaCache) -> bool:
    """Whether torch_xla has looked anything up in its cache yet (its first execution)."""
    try:
        counts = torch_xla_counters()
    except Exception:
        return True
    if any(counts.values()):
        return True
    try:
        xlac: Any = _torch_xla()
        return int(xlac._xla_get_num_cached_compilation_graph()) > 0
    except Exception:
        return True


def _retarget(inst: TorchXlaCache, resolved: str, ro: bool) -> bool:
    """Serve the view torch_xla already reads from the store at ``resolved`` instead:
    before the first execution torch_xla has read nothing from it, so swapping the links
    under it is the same as having created the cache there."""
    if ro != inst._torch_read_only and not ro:
        logger.warning(
            "xla_pcache: torch_xla.runtime.initialize_cache(readonly=False) after activation "
            "started torch_xla's cache read-only (%s=1): torch_xla fixes that once, so %s is "
            "served read-only in this process",
            READ_ONLY_VAR,
            shown_path(resolved),
        )
        ro = True
    build = inst.mirror.build
    store = _open_store(
        resolved,
        inst.options.replace(read_only=ro),
        instead=f"torch_xla.runtime.initialize_cache keeps the cache at {inst.store.path}",
        build=build,
    )
    if store is None:
        return False
    mirror = HostMirror(
        store,
        inst.mirror.local_root,
        meta=_producer_meta,
        on_publish=None
        if ro or build is None
        else functools.partial(_on_publish, store, builds.OtherBuilds(build)),
        compile_time=_compile_times,
        build=build,
        named_root=inst.mirror.named_root,
    )
    if not _own_dirs(
        mirror, f"torch_xla.runtime.initialize_cache keeps the cache at {inst.store.path}"
    ):
        store.close()
        return False
    mirror.refresh_pool()
    with inst._lock:
        old = inst.store
        try:
            mirror.adopt_view(inst.mirror)
        except Exception as exc:
            mirror.warn("linking the new cache's entries into torch_xla's directory", exc)
        inst.store, inst.mirror, inst.read_only = store, mirror, ro
        inst._opened.clear()
    try:
        old.close()
    except Exception as exc:
        mirror.warn("closing the store", exc)
    if not ro and inst._thread is None and inst.sync_interval:
        inst._start_thread()
    return True


_original_initialize_cache: Any = None


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
        if (_identity(inst.store), inst.read_only) == (resolved, ro):
            _leave_for_children(resolved, ro)
            return
        if _executed(inst):
            raise AssertionError(
                "Computation cache has already been initialized (xla_pcache serves "
                f"{inst.store.path}; torch_xla fixes its cache at the first execution, so "
                f"initialize_cache({shown_path(path)!r}) must come before it)"
            )
        before = _identity(inst.store)
        if _retarget(inst, resolved, ro):
            _leave_for_children(resolved, inst.read_only)
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
        xlac: Any = _torch_xla()
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
        _leave_for_children(resolved, ro)


def _leave_for_children(resolved: str, ro: bool) -> None:
    """torch_xla's own call leaves its settings in the environment for child processes;
    so does this one, with the path in the variable only xla_pcache reads (see
    _hide_from_children), which activation in a child serves from the store."""
    os.environ[READ_ONLY_VAR] = "1" if ro else "0"
    _hide_from_children(resolved)


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
        _leave_without_cache()
        raise
    if inst is not None:
        inst.via = via


def _leave_without_cache() -> None:
    """After a failed activation: torch_xla must not find the store's path, or it would
    write its own files in place into the store. Children keep the path in the variable
    only xla_pcache reads, so they try again."""
    raw = os.environ.pop(PATH_VAR, "").strip()
    if raw:
        os.environ[SHARED_PATH_VAR] = cache_path.route(raw).path


def activation() -> str | None:
    """How the adapter was installed in this process (``install()`` or the activation
    path), or None."""
    inst = _installed
    return None if inst is None else inst.via
