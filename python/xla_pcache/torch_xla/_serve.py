"""The store and host mirror a torch_xla process is served from: the cache path resolved,
the runtime build named, the store opened (on a bucket path, the bucket's entries of this
build pulled; in a directory, torch_xla's own files written in place warned about), the host
mirror's directories checked, its pool filled and its view opened; and, before the first
execution, the mirror of another store put under the view torch_xla already reads."""

from __future__ import annotations

import functools
import os

from xla_pcache import build_key, builds, cache_path, explain
from xla_pcache._core import CacheError
from xla_pcache._text import package_logger
from xla_pcache.bucket import BucketStore
from xla_pcache.cache_path import shown_path
from xla_pcache.config import LOCAL_DIR_VAR, PATH_VAR, READ_ONLY_VAR, Settings
from xla_pcache.store import Store, StoreOptions
from xla_pcache.torch_xla import _bucket_start
from xla_pcache.torch_xla import _build as _txbuild
from xla_pcache.torch_xla import _keyparts as _txkeys
from xla_pcache.torch_xla._cache import TorchXlaCache
from xla_pcache.torch_xla._environment import source
from xla_pcache.torch_xla._host_mirror import HostMirror
from xla_pcache.torch_xla._keys import KEY_PREFIX, is_torch_xla_name, store_key
from xla_pcache.torch_xla._runtime import compile_times, producer_meta

logger = package_logger("xla_pcache.torch_xla")

NO_CACHE = "torch_xla runs with no persistent cache in this process"


def resolve(path: str | os.PathLike[str] | None, settings: Settings) -> tuple[str, bool]:
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


def identity(store: Store) -> str:
    """What ``resolve`` gives for the path ``store`` was opened for."""
    return store.bucket_url if isinstance(store, BucketStore) else store.path


def serve(resolved: str, options: StoreOptions, root: str, named: bool) -> HostMirror | None:
    """The host mirror of the store at ``resolved`` beneath the local root ``root``
    (``named`` by the user or not), its view open; None, with one warning, when the build,
    the store or the local directory cannot be used (everything opened is closed again)."""
    build = _runtime_build()
    store = None if build is None else _open_store(resolved, options, build=build)
    if store is None or build is None:
        return None
    builds.count_rehash(build, store)
    mirror = _mirror(store, root, named, build, options.read_only, NO_CACHE)
    if mirror is None:
        return None
    try:
        mirror.open_view()
    except Exception as exc:
        mirror.warn(f"creating a host-local cache directory under {root}", exc)
        mirror.close_view()
        store.close()
        return None
    return mirror


def serve_instead(inst: TorchXlaCache, resolved: str, ro: bool) -> bool:
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
    instead = f"torch_xla.runtime.initialize_cache keeps the cache at {inst.store.path}"
    store = _open_store(resolved, inst.options.replace(read_only=ro), instead, build)
    if store is None:
        return False
    mirror = _mirror(store, inst.mirror.local_root, inst.mirror.named_root, build, ro, instead)
    if mirror is None:
        return False
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
    instead: str = NO_CACHE,
    build: builds.Build | None = None,
) -> Store | None:
    """The store at ``resolved`` (``xla_pcache.open_store``), or None (one warning, ending
    with ``instead``) when it cannot be used."""
    where = cache_path.route(resolved)
    if where.kind == "unserved":
        cache_path.warn_unserved(where, source(resolved), instead)
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


def _foreign_files(path: str) -> int:
    """How many of torch_xla's own cache files (decimal names, written in place by a
    torch_xla running without xla_pcache) sit at the top of ``path``."""
    try:
        with os.scandir(path) as it:
            return sum(1 for e in it if is_torch_xla_name(e.name) and e.is_file())
    except OSError:
        return 0


def _pull_from_bucket(store: Store, build: builds.Build | None) -> None:
    """A bucket path: torch_xla looks only in its own directory, so the bucket's torch_xla
    entries of this build that this host lacks are fetched before it starts
    (``_bucket_start.pull``: a marker of another build names another entry)."""
    if not isinstance(store, BucketStore):
        return
    fetched = _bucket_start.pull(store, functools.partial(store_key, build=build))
    if fetched:
        logger.info("xla_pcache: fetched %d torch_xla entries from the bucket", fetched)


def _mirror(
    store: Store, root: str, named: bool, build: builds.Build | None, ro: bool, instead: str
) -> HostMirror | None:
    """The host mirror of ``store`` beneath ``root``, its directories checked and its pool
    brought up to date; None, ``store`` closed, when a directory is refused (``_own_dirs``).
    A read-only one publishes nothing, so records no miss."""
    mirror = HostMirror(
        store,
        root,
        meta=producer_meta,
        on_publish=None
        if ro or build is None
        else functools.partial(_on_publish, store, builds.OtherBuilds(build)),
        compile_time=compile_times,
        build=build,
        named_root=named,
    )
    if not _own_dirs(mirror, instead):
        store.close()
        return None
    mirror.refresh_pool()
    return mirror


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


def _on_publish(store: Store, others: builds.OtherBuilds, key: str) -> None:
    """After this process published torch_xla's file under ``key``: the graph missed here
    (torch_xla compiled and wrote it), so the miss is recorded, and counted when another
    build has an entry of it; for a bucket path, the marker that lets other hosts find the
    entry."""
    bare = build_key.strip(key)
    others.count(store, bare)
    try:
        parts = _txkeys.components()
    except Exception as exc:
        logger.debug("xla_pcache: recording the torch_xla miss of %r failed: %s", key, exc)
    else:
        explain.record_miss(store, key, parts, "torch_xla")
    if isinstance(store, BucketStore):
        store.mark(key, bare[len(KEY_PREFIX) :])
