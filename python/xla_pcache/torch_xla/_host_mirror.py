"""The host-local side of the torch_xla adapter: no torch import here.

torch_xla reads and writes one flat directory of files named by the decimal graph hash,
writing them in place. A ``HostMirror`` keeps such directories in step with a shared
``Store``, through its parts:

- ``_mirror_dirs``: the host's directories (``HostDirs``), each this user's own, and what
  lies beneath them (the pools, the manifest, the views);
- ``_mirror_pool``: store -> pool, the host's verified copies brought up to date
  (``PoolRefresh``);
- ``_mirror_view``: this process's view, the directory torch_xla reads and writes, linked
  to the pool (``View``; why a view per process is said there);
- ``_mirror_publish``: view -> store, what torch_xla wrote published (``Publisher``);
- ``_mirror_counters``: what the mirror did, and the failures it survived (``Counters``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from xla_pcache.builds import Build
from xla_pcache.store import Store
from xla_pcache.torch_xla._keys import is_torch_xla_name, name_of, store_key
from xla_pcache.torch_xla._mirror_counters import Counters
from xla_pcache.torch_xla._mirror_dirs import POOL, VIEWS, HostDirs, InHostDir
from xla_pcache.torch_xla._mirror_pool import PoolRefresh
from xla_pcache.torch_xla._mirror_publish import Publisher
from xla_pcache.torch_xla._mirror_view import View

# What callers of the mirror use: the mirror, its report, and the names of its files and keys.
__all__ = ["HostMirror", "describe", "is_torch_xla_name", "store_key"]


class HostMirror:
    """Keeps a host's pool and this process's view in step with ``store``.

    ``meta`` is called at publish time for the producer metadata; ``on_publish`` with the
    store key of each entry this process published (a graph it missed); ``compile_time``
    gives the compile time torch_xla measured for a view file just written (recorded with
    the entry, so that its hits count the compile time they saved). ``build`` is the runtime
    build whose entries this mirror serves and publishes: its keys end with it
    (``store_key``), and its host directory is its own, so no process of another build ever
    links a copy in. ``named_root``: see ``HostDirs``.

    Every public method turns failures into logged warnings and counters, except
    ``open_view`` which raises ``OSError`` (``CacheError`` for a refused directory) so the
    caller can fall back to no persistent cache at all.
    """

    def __init__(
        self,
        store: Store,
        local_root: str,
        meta: Callable[[], dict[str, str]] = dict,
        counters: Counters | None = None,
        on_publish: Callable[[str], None] | None = None,
        compile_time: Callable[[os.stat_result], float | None] | None = None,
        build: Build | None = None,
        named_root: bool = False,
    ) -> None:
        self._store = store
        self.local_root = local_root
        self.named_root = named_root
        self.build = build
        self.counters = Counters() if counters is None else counters
        self.dirs = HostDirs(
            store, local_root, build=build, named_root=named_root, counters=self.counters
        )
        self._refresh = PoolRefresh(store, self.dirs, self.counters, build)
        self._view = View(self.dirs, self.counters)
        self._publisher = Publisher(
            store,
            self._view,
            self.dirs,
            self.counters,
            build=build,
            meta=meta,
            compile_time=compile_time,
            on_publish=on_publish,
        )

    @property
    def store(self) -> Store:
        """The store served; one set here (a test gives a writer for a reader) is every
        part's."""
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = self.dirs.store = self._refresh.store = self._publisher.store = store

    # -- where it lives ------------------------------------------------------------------

    pool = InHostDir(POOL)
    views = InHostDir(VIEWS)

    @property
    def root(self) -> str:
        """The host's directory (one level deeper under a named root others can write,
        once ``check_dirs`` has opened it)."""
        return self.dirs.root

    @property
    def view(self) -> str | None:
        """This process's view, while it is open."""
        return self._view.path

    def key(self, name: str) -> str:
        """The store's key of torch_xla's file ``name`` for this mirror's build."""
        return store_key(name, self.build)

    def name_of(self, key: str) -> str:
        """torch_xla's file name of a key of this mirror's build; "" for any other key."""
        return name_of(key, self.build)

    def warn(self, what: str, exc: BaseException) -> None:
        """First failure of a kind at warning level, the rest at debug; always counted."""
        self.counters.warn(what, exc)

    # -- the host's own directories ----------------------------------------------------

    def check_dirs(self) -> None:
        """``HostDirs.check``: every directory this process will use opened and checked;
        ``CacheError`` naming the first that is refused."""
        self.dirs.check()

    def close_dirs(self) -> None:
        """Let go of the host's directory (the view, if any, keeps its own handles)."""
        self.dirs.close()

    def pools(self) -> list[str]:
        """The pool directories this process may link from (``HostDirs.pools``)."""
        return self.dirs.pools()

    # -- store -> pool -------------------------------------------------------------------

    def refresh_pool(self) -> None:
        """Bring the pool up to date with the store: copy in what is new, drop what the
        store evicted. Costs directory reads only when nothing changed."""
        self._refresh.refresh()

    # -- the view ------------------------------------------------------------------------

    def open_view(self) -> str:
        """Create this process's torch_xla directory, linked to every pool file; its path
        (``torch_path`` is the one to give torch_xla)."""
        return self._view.open()

    def torch_path(self) -> str | None:
        """The path to give torch_xla for the view (``View.torch_path``)."""
        return self._view.torch_path()

    def adopt_view(self, other: HostMirror) -> None:
        """Take over ``other``'s view (the directory torch_xla already reads) for this
        mirror's store: drop the links ``other`` made, link this pool in. Only before the
        first execution, when every file of the view is one of ``other``'s links."""
        self._view.adopt(other._view)

    def written_names(self) -> set[str]:
        """Names of the files torch_xla wrote into the view itself (graphs it compiled)."""
        return self._view.written_names()

    def opened_links(self) -> set[str]:
        """Names of linked (store) files opened since the last call."""
        return self._view.opened_links()

    def close_view(self) -> None:
        """Remove the view (after the last publish)."""
        self._view.close()

    # -- view -> store -------------------------------------------------------------------

    def publish(self, *, final: bool = False) -> None:
        """Publish every complete file torch_xla wrote into the view since the last call."""
        self._publisher.publish(final=final)


def describe(mirror: HostMirror | None) -> dict[str, Any]:
    if mirror is None:
        return {}
    return {"local_dir": mirror.root, "view": mirror.view, **mirror.counters.as_dict()}
