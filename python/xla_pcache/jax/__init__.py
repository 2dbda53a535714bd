"""Route JAX's persistent compilation cache through an xla_pcache ``Store``.

``install()`` replaces the factory JAX calls to build its file cache
(``jax._src.compilation_cache.get_file_cache``), so everything that goes through that
factory keeps working: ``jax_compilation_cache_dir``, ``set_cache_dir``, ``reset_cache``,
the ``jax_compilation_cache_check_contents`` verification wrapper and JAX's own
thresholds. ``uninstall()`` puts JAX's factory back.

This module imports jax only when one of its functions runs, so that ``import xla_pcache``
stays cheap and works without jax installed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from xla_pcache import _memory, builds, cache_path, metrics
from xla_pcache._text import package_logger
from xla_pcache.bucket import BucketStore
from xla_pcache.config import Settings
from xla_pcache.jax import _adopt, _build, _compile_context, _hooks, _installation, _single_flight
from xla_pcache.jax._hooks import (
    CACHE_DIR_OPTION,
    RAISE_ERRORS_OPTION,
    SUPPORTED_JAX,
    XLA_CACHES_OPTION,
    Hooks,
)
from xla_pcache.jax._installation import Installation
from xla_pcache.jax._store_cache import _StoreCacheImpl
from xla_pcache.jax.ahead import _backend_wait, _prefetch, _read_hook
from xla_pcache.jax.ahead._compiling import CompileAhead
from xla_pcache.sizes import parse_duration
from xla_pcache.store import Store, StoreOptions

# ``StoreCache`` is also public; see __getattr__ below.
__all__ = [
    "SUPPORTED_JAX",
    "activation",
    "install",
    "installed_store",
    "prefetch_report",
    "thresholds",
    "uninstall",
]

logger = package_logger(__name__)

_class_lock = threading.Lock()
_store_cache_class: type[_StoreCacheImpl] | None = None


def _cache_class(hooks: Hooks) -> type[_StoreCacheImpl]:
    """``StoreCache``: built on first use because its base class lives inside jax."""
    global _store_cache_class
    with _class_lock:
        if _store_cache_class is None:
            _store_cache_class = type(
                "StoreCache",
                (_StoreCacheImpl, hooks.cache_interface),
                {"__module__": __name__, "__doc__": _StoreCacheImpl.__doc__},
            )
        return _store_cache_class


def __getattr__(name: str) -> Any:
    # ``xla_pcache.jax.StoreCache`` imports jax on first access, not at module import.
    if name == "StoreCache":
        return _cache_class(_hooks.find())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_state_lock = threading.RLock()
_installed: Installation | None = None


def _open_store(where: cache_path.Route, options: StoreOptions) -> Store | None:
    """The store of the directory or bucket ``where`` names (``xla_pcache.open_store``);
    None, with one warning, when it cannot be opened."""
    try:
        return cache_path.open_store(where, options)
    except Exception as exc:
        logger.warning(
            "xla_pcache: cannot open the cache at %s (%s: %s); JAX will compile without a "
            "persistent cache",
            cache_path.shown_path(where.path),
            type(exc).__name__,
            exc,
        )
        return None


def _factory(path: str) -> tuple[Any, str] | None:
    """Stands in for ``compilation_cache.get_file_cache``; JAX calls it, lazily, with the
    value of ``jax_compilation_cache_dir`` when it first needs its cache."""
    with _state_lock:
        inst = _installed
    if inst is None:  # pragma: no cover - uninstall() restores the original first
        return None
    path = str(path)
    where = cache_path.route(path)
    if where.kind == "unserved":
        # A gs://, s3:// or az:// path without obstore is JAX's own business, as before; any
        # other URL is uncached (JAX's own cache would make a directory of it).
        if where.path not in inst.warned:
            inst.warned.add(where.path)
            cache_path.warn_unserved(
                where,
                CACHE_DIR_OPTION,
                "JAX uses its own cache there"
                if where.own_cache
                else "JAX compiles without a persistent cache",
            )
        if not where.own_cache:
            return None
        result: tuple[Any, str] | None = inst.original_factory(path)
        return result
    loc = where.location if where.kind == "bucket" else None
    with _state_lock:
        same_dir = (
            loc == inst.bucket
            if loc is not None and inst.bucket is not None
            else loc is None and where.path == inst.path
        )
        adopter = inst.adopter
        if same_dir:
            # install() already tried this directory (and warned if it failed).
            store = inst.store
        else:
            store = _open_store(where, inst.options)
            if store is not None:
                inst.others.append(store)
                if loc is None:
                    sources = _adopt.sources(store, os.path.abspath(path), None)
                    adopter = _adopt.Adopter(sources, inst.hooks.cc) if sources else None
                else:
                    adopter = None
    if store is None:
        return None
    build = _runtime_build()
    if build is None:
        return None
    builds.count_rehash(build, store)
    # A bucket's entries live in its host-local store: what JAX is told (XLA's side
    # caches go there, never into a directory named after the URL).
    path = store.path
    meta = dict(inst.meta)
    platform = _hooks.backend_platform(inst.hooks)
    if platform is not None:
        meta["backend"] = platform
    hooks = inst.hooks
    verify = bool(
        hooks.verification_cache is not None
        and hooks.jax.config.values.get("jax_compilation_cache_check_contents", False)
    )
    flight = None
    # In "error" mode a miss raises: no claim is taken that nobody would publish.
    if inst.compile_wait > 0 and hooks.compiler is not None and inst.on_miss != "error":
        flight = _single_flight.SingleFlight(store, inst.compile_wait, _hooks.writes_cache)
    cache: Any = _cache_class(hooks)(
        store,
        meta,
        verified=verify,
        single_flight=flight,
        adopter=adopter,
        on_miss=inst.on_miss,
        build=build,
    )
    # The verification wrapper forces a compile at the first read of every key: nothing
    # loaded ahead would be used, so there is no session under it.
    session = None
    if inst.prefetch_form is not None and not verify:
        with _state_lock:
            begun = inst.session
        if begun is not None and not begun.attached and begun.store is store:
            # The session installation began for this store, loading since the backend's
            # start: JAX's cache is its own now.
            session = begun
        else:
            session = _session(inst, store, build)
        session.attached = True
    cache.prefetch = session
    # Recording for compiling ahead, the session's; what it compiles and JAX takes is put
    # here.
    ahead = None if session is None else session.ahead
    cache.recorder = None if ahead is None else ahead.recorder
    if session is not None:
        session.put_ahead, session.served_ahead = cache.put_ahead, cache.served_ahead
    with _state_lock:
        # JAX builds a new cache after reset_cache or a new directory: the last one's
        # session ends (its plan written, what it loaded released).
        previous, inst.session = inst.session, session
    if previous is not None and previous is not session:
        previous.close()
    if verify:
        cache = hooks.verification_cache(cache)
    return cache, path


def _session(
    inst: Installation, store: Store, build: builds.Build | Callable[[], builds.Build | None]
) -> _prefetch.Prefetch:
    assert inst.prefetch_form is not None
    settings = inst.settings
    # The job's memory (the host's, or a cgroup's limit below it), read once for both bounds.
    job_memory = _memory.total()
    session = _prefetch.Prefetch(
        store,
        inst.hooks.cc,
        threads=settings.prefetch_thread_count(),
        memory=settings.prefetch_memory_bound(job_memory),
        loads=settings.prefetch_load_count,
        name=settings.prefetch_name,
        jax_version=str(inst.hooks.jax.__version__),
        form=inst.prefetch_form,
        build=build,
        # A read-only process, and a bucket path's host that writes nothing to the
        # bucket, load from the plan the writers keep and write none.
        write_plans=not (store.read_only or (isinstance(store, BucketStore) and store.bucket_ro)),
    )
    if inst.compile_form is not None:
        # Compiling ahead what the plan names and the store lacks, in a compiler process
        # started as soon as the plan is read; a read-only process compiles into its memory
        # only.
        session.ahead = CompileAhead(
            store,
            session,
            threads=settings.compile_ahead_thread_count(),
            reserve=settings.compile_ahead_reserve(job_memory),
            writes=not store.read_only,
            meta=inst.meta,
        )
    return session


def _begin_loading(inst: Installation) -> None:
    """Loading ahead from the backend's start: a session for the store just opened, whose
    thread reads the plan and fetches what it can now, and deserializes once JAX's default
    backend is up (``_backend_wait``). Activation runs inside JAX's backend start, before
    the backend exists; an ``install()`` after it finds the backend up. JAX's cache, built
    at the first compilation (``_factory``), takes this session; under JAX's verification
    wrapper, or after the cache moved elsewhere, it is closed there instead."""
    store = inst.store
    if inst.prefetch_form is None or store is None or inst.uncached:
        return
    verify = bool(
        inst.hooks.verification_cache is not None
        and inst.hooks.jax.config.values.get("jax_compilation_cache_check_contents", False)
    )
    if verify:
        return
    session = _session(inst, store, _runtime_build)
    inst.session = session
    session.begin(wait_backend=_backend_wait.wait)


_warned_build = False


def _runtime_build() -> builds.Build | None:
    """This process's runtime build (``jax/_build.py``), or None, with one warning, when it
    cannot be named: a binary this process loaded was replaced on disk since (an install
    over a running program), or the files could not be read. JAX then compiles without a
    persistent cache: an entry filed under the wrong build is the one thing not to write."""
    global _warned_build
    build, why = builds.usable(_build.build)
    if build is not None:
        return build
    if not _warned_build:
        _warned_build = True
        logger.warning("xla_pcache: %s; JAX compiles without a persistent cache", why)
    return None


def install(
    path: str | os.PathLike[str] | None = None,
    *,
    max_size: int | str | None = None,
    read_only: bool | None = None,
    compile_wait: float | None = None,
    min_compile_time: float | str | None = None,
    min_entry_size: int | str | None = None,
    prefetch: bool | None = None,
) -> Store | None:
    """Make every JAX compilation in this process read and write an xla_pcache store.

    Defaults: ``path`` from ``XLA_PERSISTENT_CACHE_PATH``, else JAX's own
    ``jax_compilation_cache_dir`` when set, else ``Settings.default_cache_path()``
    (``$XDG_CACHE_HOME/xla_pcache``);
    ``max_size`` (bytes or a string such as ``"50G"``) from ``XLA_PERSISTENT_CACHE_MAX_SIZE``,
    else JAX's ``jax_compilation_cache_max_size`` when positive, else unbounded;
    ``read_only`` from ``XLA_PERSISTENT_CACHE_READ_ONLY``; ``compile_wait`` (seconds) from
    ``XLA_PCACHE_COMPILE_WAIT``, else 300: on a miss, how long to wait for another process
    compiling the same program (single flight, see docs/jax.md; 0 turns it off);
    ``min_compile_time`` (seconds) and ``min_entry_size`` (bytes) from
    ``XLA_PCACHE_MIN_COMPILE_TIME`` / ``XLA_PCACHE_MIN_ENTRY_SIZE``, else 0: what is worth
    caching; ``prefetch`` from ``XLA_PCACHE_PREFETCH``, else on: load the executables this
    program's earlier runs read ahead, on a thread pool, from the backend's start (from now,
    if it is up) on (docs/jax.md, "Loading ahead").

    Sets ``jax_compilation_cache_dir`` to the path (JAX only consults a cache when it is
    set) and ``jax_persistent_cache_enable_xla_caches`` to ``"none"``, which makes keys
    independent of the path on jax 0.10. Sets JAX's thresholds
    (``jax_persistent_cache_min_compile_time_secs``, ``..._min_entry_size_bytes``) to
    ``min_compile_time`` and ``min_entry_size``, unless the program set JAX's own (its
    variable, or ``jax.config.update`` to a value other than JAX's default) and these
    arguments are not given; ``thresholds()`` says which is in force. Calling it again
    reinstalls with the new settings.

    A directory JAX's own cache filled (the store's own, or the ``jax_compilation_cache_dir``
    set before this call) is served on a miss and its entries moved into the store as they
    are asked for (docs/jax.md, "Adopting JAX's own cache").

    A bucket (``gs://``, ``s3://``, ``az://``) as the path is served by a host-local store with
    the bucket behind it (``xla_pcache.open_store``; JAX's option then names that local store);
    a URL that cannot be served is one warning, and JAX runs on its own cache (a bucket URL
    without obstore) or uncached (any other URL), never in a directory named after it.

    Returns the opened ``Store``, or None when the directory cannot be opened (logged; JAX
    then compiles as if there were no persistent cache). Raises ``CacheError`` when the
    installed jax lacks the hooks this adapter needs, ``ValueError`` on malformed settings.
    """
    global _installed
    hooks = _hooks.find()
    jax_config = hooks.jax.config
    settings, options = _installation.settled(hooks, max_size, read_only)
    resolved_wait = (
        settings.compile_wait
        if compile_wait is None
        else parse_duration(compile_wait, name="compile_wait")
    )
    explicit = _installation.explicit_thresholds(min_compile_time, min_entry_size)

    with _state_lock:
        if _installed is not None:
            uninstall()
        previous_dir = jax_config.values.get(CACHE_DIR_OPTION)
        resolved_path, source = _installation.chosen_path(path, settings, previous_dir)
        where = cache_path.route(os.path.expanduser(str(resolved_path)))
        if where.read_only and not options.read_only:
            # A file: URL's ?ro=1: read-only as the variable would make it.
            options = options.replace(read_only=True)
        loc = where.location if where.kind == "bucket" else None
        if where.kind == "unserved":
            if where.own_cache:
                # gs://, s3://, az:// without obstore: JAX's own cache, as without xla_pcache
                # (which reads such a URL through etils and gcsfs or s3fs).
                cache_path.warn_unserved(where, source, "JAX uses its own cache there")
                jax_config.update(CACHE_DIR_OPTION, where.path)
                return None
            cache_path.warn_unserved(where, source, "JAX compiles without a persistent cache")
        store = None
        if where.kind != "unserved":
            store = _open_store(where, options)
        # What JAX's option names: the directory, or a bucket's host-local store.
        resolved_path = store.path if loc is not None and store is not None else where.path
        if store is not None:
            metrics.log_exit_summary(store)
        workaround, previous_xla_caches = _installation.keys_free_of_path(hooks)

        inst = Installation(
            hooks=hooks,
            path=resolved_path,
            options=options,
            original_factory=hooks.cc.get_file_cache,
            previous_cache_dir=previous_dir,
            previous_xla_caches=previous_xla_caches,
            store=store,
            meta=_hooks.producer_meta(hooks),
            compile_wait=resolved_wait,
            on_miss=settings.on_miss,
            bucket=loc,
            uncached=where.kind == "unserved",
            settings=settings,
        )
        _installed = inst
        _installation.apply_thresholds(inst, settings, explicit)
        _installation.raise_on_miss(inst)
        _installation.hook_jax(inst, prefetch)
        _installation.adopt_own_cache(inst, where, previous_dir, workaround)
        _hand_to_jax(inst)
        return store


def _hand_to_jax(inst: Installation) -> None:
    """install()'s last step: JAX's cache factory is ours (``_factory``), its directory the
    store's, the cache it may have built dropped, and loading ahead begun."""
    hooks = inst.hooks
    hooks.cc.get_file_cache = _factory
    # An unserved URL: no directory at all for JAX (nor for XLA's side caches, which
    # would make one of the URL); JAX compiles without a persistent cache.
    hooks.jax.config.update(CACHE_DIR_OPTION, None if inst.uncached else inst.path)
    # Drop a cache JAX may already have built, so the next compilation calls _factory.
    hooks.cc.reset_cache()
    _begin_loading(inst)
    logger.debug(
        "xla_pcache: JAX compilation cache at %s (max_size=%s, read_only=%s)",
        inst.path,
        inst.options.max_size,
        inst.options.read_only,
    )


def uninstall() -> None:
    """Restore JAX's own cache factory and the options ``install()`` changed."""
    global _installed
    with _state_lock:
        inst = _installed
        if inst is None:
            return
        _installed = None
        cc = inst.hooks.cc
        if cc.get_file_cache is _factory:
            cc.get_file_cache = inst.original_factory
        if inst.original_get_cache_key is not None and isinstance(
            getattr(cc, "get_cache_key", None), _adopt.KeyAliases
        ):
            cc.get_cache_key = inst.original_get_cache_key
        if inst.hooks.compiler is not None:
            _compile_context.uninstall_hook(inst.hooks.compiler)
        _read_hook.uninstall_hook(cc)
        if inst.session is not None:
            inst.session.close()
            inst.session = None
        config = inst.hooks.jax.config
        config.update(CACHE_DIR_OPTION, inst.previous_cache_dir)
        for decision in inst.thresholds:
            # A value the program set since installation is the program's: left as it is.
            if (
                decision.option in inst.replaced_thresholds
                and config.values.get(decision.option) == decision.value
            ):
                config.update(decision.option, inst.replaced_thresholds[decision.option])
        if inst.hooks.has_xla_caches_option and inst.hooks.needs_path_workaround:
            config.update(XLA_CACHES_OPTION, inst.previous_xla_caches)
        if inst.previous_raise_errors is not None:
            config.update(RAISE_ERRORS_OPTION, inst.previous_raise_errors)
        cc.reset_cache()
        for store in [inst.store, *inst.others]:
            if store is None:
                continue
            try:
                store.close()
            except Exception as exc:
                logger.debug("xla_pcache: closing the store at %s failed: %s", store.path, exc)


def thresholds() -> dict[str, dict[str, Any]]:
    """JAX's caching thresholds as installation left them: for each option, ``value`` and
    ``source`` (the store's default or variable, JAX's variable, the program's
    ``jax.config.update``, or ``install()``'s arguments). Empty when not installed. A
    ``jax.config.update`` after installation is not reflected here; JAX uses it."""
    with _state_lock:
        if _installed is None:
            return {}
        return {d.option: {"value": d.value, "source": d.source} for d in _installed.thresholds}


def _auto_install(via: str) -> None:
    """Activation from the environment: an explicit ``install()`` that came first wins, and
    a store that cannot be opened leaves JAX's own cache in place."""
    with _state_lock:
        if _installed is not None:
            return
        settings = Settings.from_env()
        # XLA_PERSISTENT_CACHE_PATH is install()'s own default, named as the source of any
        # warning about it; a path a torch_xla parent left for its children is passed on.
        store = install(None if settings.path else settings.inherited_path)
        if store is None:
            # An unserved URL stays installed, uncached: JAX's own cache would make a
            # directory of it.
            if _installed is not None and not _installed.uncached:
                uninstall()
            return
        assert _installed is not None
        _installed.via = via


def activation() -> str | None:
    """How the adapter was installed in this process (``install()`` or the activation
    path), or None."""
    with _state_lock:
        return None if _installed is None else _installed.via


def installed_store() -> Store | None:
    """The store ``install()`` opened, or None when not installed (or it failed to open)."""
    with _state_lock:
        return None if _installed is None else _installed.store


def prefetch_report(loads: bool = False) -> dict[str, Any] | None:
    """What loading ahead did in this process so far: the workload its plan is named for,
    the plan's key, how many executables the plan named and what became of each (``taken``
    by a read, ``loaded`` and not yet asked for, ``skipped``, ``missing`` from the store,
    ``failed``, ``released`` unused), and this process's ``prefetch_*`` counters; with
    compiling ahead on, ``compile_ahead``: what it compiled and what became of it; with
    ``loads``, each read served and what its load took. None when loading ahead is off (or
    JAX has not built its cache yet)."""
    with _state_lock:
        session = None if _installed is None else _installed.session
        store = None if _installed is None else _installed.store
    if session is None:
        return None
    report = session.report(loads=loads)
    if session.ahead is not None:
        report["compile_ahead"] = {**session.ahead.report(), "states": session.compiled_states()}
    if store is not None:
        counters = store.process_stats()
        report["counters"] = {k: v for k, v in counters.items() if k.startswith("prefetch_")}
    return report
