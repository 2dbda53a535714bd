"""The host-local side of the torch_xla adapter: no torch import here.

torch_xla reads and writes one flat directory of files named by the decimal graph hash,
writing them in place. This module keeps such directories in step with a shared ``Store``:

``<local root>/<host>-<store id>/``
    ``pool/<name>``      complete, verified copies of the store's torch_xla entries, written
                         by us only (temp file + rename), shared by the host's processes that
                         trust no key.
    ``trusted/<key>/<name>``  the same for processes with trusted keys, one directory per key
                         (``<key name>.<fingerprint of its public key>``): a copy there was
                         verified against that key. A process links only from the directories
                         of the keys it trusts now, so a key dropped from its set (revoked)
                         is never linked into its view, whatever other processes of the host
                         copied earlier; the graph is a miss there, compiled and counted.
    ``manifest.json``    which store entry file (hex name) holds which torch_xla name, so a
                         warm host reads no entry header; only a hint, the files are the truth.
    ``views/<id>/``      one process's torch_xla directory: hard links to the pool, made
                         before torch_xla starts, plus the files torch_xla writes itself.
    ``views/<id>.lock``  fcntl-locked for the life of the process, so others can tell a view
                         whose owner died and remove it.

Every directory here is this user's own (``_owndir``, the verification record's rule):
made mode 0700 whatever the umask, and used only when it is owned by this user and writable
by nobody else. torch_xla loads what its view holds, so whoever else could write a pool (a
group member under ``umask 002``, the user who made a scratch disk's directory first) would
choose what this process runs. One another user owns, or a link, is refused
(``check_dirs``) and torch_xla runs without a persistent cache, with one warning naming
it. One of this user's that others can write (an earlier release made it under ``umask
002``) is repaired: made 0700, and everything in it discarded, since others could have put
anything there (the copies are made again from the store). A local root the user named
(``named_root``) is never changed: when others can write it, this user's own directory
``xla_pcache-<uid>`` beneath it holds the host's directory instead. Each directory is
checked on the handle it is used through: the host's directory is opened once and kept, and
everything beneath it is reached through it (``dir_fd=``), so a directory renamed into the
local root's place later, by whoever can write its parent, is never used; torch_xla is given
its view as ``/proc/self/fd/<n>`` (``torch_path``), a path no rename redirects. A pool file
is linked only when it is a regular file of this user's.

Why a view per process rather than pointing torch_xla at the pool: torch_xla checks that a
file is absent and then opens it with truncation, with no lock between the two. In a
directory several processes share, two of them compiling the same graph interleave their
writes, and a reader can load a half-written file. In a private view only this process's
torch_xla creates files, so a new inode there is written by exactly one writer, ours to
inspect, and never one the pool or another process uses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from xla_pcache._core import FORMAT_VERSION, CacheError, hash_key
from xla_pcache._owndir import OwnDir, Rule, open_own, pinned_path
from xla_pcache._text import package_logger
from xla_pcache.builds import Build
from xla_pcache.misslog import META_COMPILE_TIME
from xla_pcache.store import Store
from xla_pcache.torch_xla._opens import open_inodes, opened_names, watch_opens

logger = package_logger("xla_pcache.torch_xla")

KEY_PREFIX = "torch_xla/"
# Under the host's directory: one pool per trusted key (see the module's docstring).
TRUSTED_POOLS = "trusted"
MANIFEST_VERSION = 1
# A view whose lock file is younger than this is left alone by sweepers even if its lock
# is free: its owner may be between creating the file and locking it.
VIEW_GRACE_S = 60.0
_TMP_PREFIX = ".tmp-"
POOL = "pool"
VIEWS = "views"
MANIFEST = "manifest.json"
# Said when a directory an earlier release left open to the group is emptied.
_REFETCHED = "torch_xla's host copies are made again from the store"
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def is_torch_xla_name(name: str) -> bool:
    """torch_xla names its files by the 128-bit graph hash printed in decimal."""
    return 0 < len(name) <= 40 and name.isascii() and name.isdigit()


def store_key(name: str, build: Build | None = None) -> str:
    """The store's key of torch_xla's file ``name`` compiled by ``build`` (its runtime's
    build, ``xla_pcache.builds``; None only where no build is wanted: tests of the mirror
    alone)."""
    return KEY_PREFIX + name + (build.suffix if build is not None else "")


def key_pool_name(name: str, public: bytes) -> str:
    """The directory of the copies verified against the key ``name`` with public key
    ``public``: its name and a fingerprint of the key, so a key re-issued under the same
    name is another directory."""
    return f"{name}.{hash_key(public)[:16]}"


@dataclass
class Counters:
    """What the mirror did; ``errors`` counts failures that were logged and survived."""

    published: int = 0
    already_stored: int = 0
    pending: int = 0
    materialized: int = 0
    removed_from_pool: int = 0
    linked: int = 0
    header_scans: int = 0
    errors: int = 0
    # Host directories an earlier release left open to the group, made 0700 and emptied.
    repaired: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Seen:
    """A new file of the view as last observed, for the no-/proc fallback."""

    size: int
    mtime_ns: int
    ino: int


@dataclass
class HostMirror:
    """Keeps a host's pool and this process's view in step with ``store``.

    ``meta`` is called at publish time for the producer metadata. Every public method
    turns failures into logged warnings and counters, except ``open_view`` which raises
    ``OSError`` (``CacheError`` for a refused directory) so the caller can fall back to no
    persistent cache at all.
    """

    store: Store
    local_root: str
    meta: Callable[[], dict[str, str]] = dict
    counters: Counters = field(default_factory=Counters)
    # Called with the store key of each entry this process published (a graph it missed).
    on_publish: Callable[[str], None] | None = None
    # The compile time (seconds) torch_xla measured for the view file just written, or
    # None: recorded with the entry so that its hits count the compile time they saved.
    compile_time: Callable[[os.stat_result], float | None] | None = None
    # The runtime build whose entries this mirror serves and publishes: its keys end with it
    # (``store_key``), and its host directory is its own, so no process of another build
    # ever links a copy in.
    build: Build | None = None
    # ``local_root`` was named by the user (``XLA_PCACHE_TORCH_XLA_LOCAL_DIR``,
    # ``install(local_dir=)``): never changed, and when others can write it, this user's own
    # directory beneath it is used (see the module's docstring).
    named_root: bool = False

    def __post_init__(self) -> None:
        real = os.path.realpath(self.store.path)
        # The host name keeps hosts apart when the local root is itself on a shared home
        # directory; the hash keeps two stores, and two builds of one store, apart.
        host = socket.gethostname().split(".")[0] or "host"
        ident = real if self.build is None else f"{real}\0{self.build.digest}"
        self.host_name = f"{host}-{hash_key(ident)[:16]}"
        # Where the host's directory is; under a named root others can write, one level
        # deeper, once ``check_dirs`` has opened it.
        self.root = os.path.join(self.local_root, self.host_name)
        self.view: str | None = None
        self._host: OwnDir | None = None
        # The views' directory and this process's view, open while the view lives.
        self._views: OwnDir | None = None
        self._view_fd: int | None = None
        self._handed_out = False
        self._lock_fd: int | None = None
        self._watch_fd: int | None = None
        # name -> (dev, ino) of the pool file linked into the view at open: not torch_xla's.
        self._linked: dict[str, tuple[int, int]] = {}
        # inodes of view files already handled (published, or found already stored).
        self._handled: set[tuple[int, int]] = set()
        self._seen: dict[str, _Seen] = {}
        self._warned: set[str] = set()

    def key(self, name: str) -> str:
        """The store's key of torch_xla's file ``name`` for this mirror's build."""
        return store_key(name, self.build)

    def name_of(self, key: str) -> str:
        """torch_xla's file name of a key of this mirror's build; "" for any other key."""
        suffix = self.build.suffix if self.build is not None else ""
        if not key.startswith(KEY_PREFIX) or not key.endswith(suffix):
            return ""
        name = key[len(KEY_PREFIX) : len(key) - len(suffix)]
        return name if is_torch_xla_name(name) else ""

    @property
    def pool(self) -> str:
        return os.path.join(self.root, POOL)

    @property
    def trusted_pools(self) -> str:
        return os.path.join(self.root, TRUSTED_POOLS)

    @property
    def views(self) -> str:
        return os.path.join(self.root, VIEWS)

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.root, MANIFEST)

    # -- failures ----------------------------------------------------------------------

    def warn(self, what: str, exc: BaseException) -> None:
        """First failure of a kind at warning level, the rest at debug; always counted."""
        self.counters.errors += 1
        kind = f"{what}:{type(exc).__name__}"
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(
            level,
            "xla_pcache.torch_xla: %s failed (%s: %s); the program goes on without it",
            what,
            type(exc).__name__,
            exc,
        )

    # -- the host's own directories ----------------------------------------------------

    def check_dirs(self) -> None:
        """Open (each absent one made 0700) and check every directory this process will use:
        the local root, the host's directory, the pools it may link from and the views'
        directory, each this user's own and writable by nobody else (one an earlier release
        left open to the group is repaired: made 0700 and emptied). ``CacheError`` naming
        the first that is refused (the caller then runs torch_xla without this mirror)."""
        for rel in (VIEWS, *self._pool_rels()):
            self._sub(rel).close()

    def _host_dir(self) -> OwnDir:
        """The host's directory, opened (and the local root checked) at the first call and
        kept: everything beneath it is reached through this handle."""
        if self._host is None:
            rule: Rule = "named" if self.named_root else "repair"
            with open_own(self.local_root, rule=rule, refetched=_REFETCHED) as local:
                self._note(local)
                host = open_own(self.host_name, rule="repair", parent=local, refetched=_REFETCHED)
            self._note(host)
            self.root = host.path
            self._host = host
        return self._host

    def _sub(self, rel: str) -> OwnDir:
        """The directory ``rel`` (``pool``, ``views``, ``trusted/<key pool>``) beneath the
        host's, each component opened beneath the last and checked; the caller closes it."""
        d = self._host_dir()
        opened: list[OwnDir] = []
        try:
            for part in rel.split("/"):
                d = open_own(part, rule="repair", parent=d, refetched=_REFETCHED)
                opened.append(d)
                self._note(d)
        except BaseException:
            for o in opened:
                o.close()
            raise
        for o in opened[:-1]:
            o.close()
        return d

    def _note(self, d: OwnDir) -> None:
        if d.repaired:
            self.counters.repaired += 1

    def close_dirs(self) -> None:
        """Let go of the host's directory (the view, if any, keeps its own handles)."""
        if self._host is not None:
            self._host.close()
            self._host = None

    def _pool_rels(self) -> list[str]:
        """The pools this process may link from, beneath the host's directory (``pools``)."""
        keys = self.store.trusted_keys
        if keys is None:
            return [POOL]
        return [f"{TRUSTED_POOLS}/{key_pool_name(n, pub)}" for n, pub in keys]

    # -- store -> pool -------------------------------------------------------------------

    def _store_listing(self) -> set[str] | None:
        """Hex names of the store's entry files, by reading directories only.

        Relies on the store's format-1 layout (``entries/<2 hex>/<32 hex>``); on any other
        format returns None and the caller reads entry headers instead. Read beneath the
        directory the store itself works in (``Store.root_fd``).
        """
        if FORMAT_VERSION != 1:
            return None
        names: set[str] = set()
        try:
            root = self.store.root_fd()
        except (OSError, CacheError):
            return None  # its directory is gone: the entries' headers say what is left
        try:
            try:
                top = os.open("entries", _O_DIR, dir_fd=root)
            except FileNotFoundError:
                return names
            except OSError:
                return None  # not a real directory: the store's own walk says what is there
        finally:
            os.close(root)
        try:
            with os.scandir(top) as it:
                shards = [e.name for e in it if len(e.name) == 2]
            for shard in shards:
                try:
                    fd = os.open(shard, _O_DIR, dir_fd=top)
                except OSError:
                    continue  # gone, or not a real directory (a link): holds no entry
                try:
                    with os.scandir(fd) as it:
                        names.update(e.name for e in it if len(e.name) == 32)
                finally:
                    os.close(fd)
        finally:
            os.close(top)
        return names

    def _load_manifest(self) -> dict[str, str]:
        try:
            host = self._host_dir().fd
            fd = os.open(MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=host)
            with open(fd, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self.warn("reading the host manifest", exc)
            return {}
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            return {}
        names = data.get("names")
        if not isinstance(names, dict):
            return {}
        return {str(k): str(v) for k, v in names.items()}

    def _save_manifest(self, names: dict[str, str]) -> None:
        host = self._host_dir().fd
        tmp = f"{MANIFEST}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=host
            )
            with open(fd, "w", encoding="utf-8") as f:
                json.dump(
                    {"version": MANIFEST_VERSION, "store": self.store.path, "names": names}, f
                )
            os.replace(tmp, MANIFEST, src_dir_fd=host, dst_dir_fd=host)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=host)
            self.warn("writing the host manifest", exc)

    def _scan_headers(self) -> tuple[dict[str, str], list[tuple[float, str, int]]]:
        """Every entry's hex name -> torch_xla name ('' when not ours), plus our entries as
        (last use, name, size) for ordering. Reads every header: only when the listing
        shows names the manifest does not know."""
        self.counters.header_scans += 1
        names: dict[str, str] = {}
        ours: list[tuple[float, str, int]] = []
        for e in self.store.entries():
            key = e.get("key")
            hexname = str(e.get("name"))
            tx = self.name_of(key) if isinstance(key, str) else ""
            names[hexname] = tx
            if tx:
                used = e.get("last_use") or e.get("created") or 0.0
                size = e.get("size")
                ours.append(
                    (
                        float(used) if isinstance(used, int | float) else 0.0,
                        tx,
                        int(size) if isinstance(size, int) else 0,
                    )
                )
        return names, ours

    def refresh_pool(self) -> None:
        """Bring the pool up to date with the store: copy in what is new, drop what the
        store evicted. Costs directory reads only when nothing changed."""
        try:
            self._refresh_pool()
        except Exception as exc:
            self.warn("updating the host-local copy of the cache", exc)

    def pools(self) -> list[str]:
        """The pool directories this process may link from, asked of the store at every
        call: with trusted keys, the directory of each key it trusts now, in the set's order
        (a copy verified against a key the set no longer holds is never linked); without,
        the pool of unverified copies."""
        return [os.path.join(self.root, rel) for rel in self._pool_rels()]

    def _pool_for(self, signer: str | None) -> str | None:
        """Where a copy the store verified goes (beneath the host's directory): the pool of
        the trusted key that signed it (None if the store trusts no such key), or the
        unverified pool."""
        keys = self.store.trusted_keys
        if keys is None:
            return POOL
        for n, pub in keys:
            if n == signer:
                return f"{TRUSTED_POOLS}/{key_pool_name(n, pub)}"
        return None

    def _refresh_pool(self) -> None:
        rels = self._pool_rels()
        self.check_dirs()
        pools: dict[str, OwnDir] = {}
        try:
            for rel in rels:
                pools[rel] = self._sub(rel)
            self._refresh_pools(pools)
        finally:
            for d in pools.values():
                d.close()

    def _refresh_pools(self, pools: dict[str, OwnDir]) -> None:
        started_ns = time.time_ns()
        listing = self._store_listing()
        manifest = self._load_manifest()
        order: list[tuple[float, str, int]] = []
        if listing is None or not listing.issubset(manifest.keys()):
            names, order = self._scan_headers()
        else:
            names = {h: manifest[h] for h in listing}
        wanted = {tx for tx in names.values() if tx}
        held: dict[str, int] = {}
        for pool in pools.values():
            found = self._pool_files(pool)
            for tx in found.keys() - wanted:
                # Only files older than this scan: one another process just published may
                # not have been in the listing yet.
                if found[tx].st_ctime_ns < started_ns:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tx, dir_fd=pool.fd)
                        self.counters.removed_from_pool += 1
                del found[tx]
            for tx, st in found.items():
                held.setdefault(tx, st.st_size)
        missing = wanted - held.keys()
        if missing:
            budget = self.store.max_size
            used = sum(held.values())
            if not order:
                order = [(0.0, tx, 0) for tx in missing]
            # Most recently used first, so a budget smaller than the store keeps the hot set.
            for _, tx, _size in sorted(order, reverse=True):
                if tx not in missing:
                    continue
                added = self._materialize(tx, budget, used, pools)
                if added is None:
                    break
                used += added
        if names != manifest:
            self._save_manifest(names)

    def _pool_files(self, pool: OwnDir) -> dict[str, os.stat_result]:
        out: dict[str, os.stat_result] = {}
        with os.scandir(pool.fd) as it:
            for e in it:
                if is_torch_xla_name(e.name):
                    with contextlib.suppress(FileNotFoundError):
                        out[e.name] = e.stat(follow_symlinks=False)
                elif e.name.startswith(_TMP_PREFIX):
                    self._sweep_tmp(e, pool)
        return out

    def _sweep_tmp(self, e: os.DirEntry[str], pool: OwnDir) -> None:
        with contextlib.suppress(OSError):
            if time.time() - e.stat(follow_symlinks=False).st_mtime > 3600:
                os.unlink(e.name, dir_fd=pool.fd)

    def _materialize(
        self, tx: str, budget: int | None, used: int, pools: dict[str, OwnDir]
    ) -> int | None:
        """Copy one verified entry into the pool; its size, 0 if gone, None if over budget.

        Read without counting a use: filling the host's copy is no hit; torch_xla's load of
        it is, counted once when it opens the file (``opened_links``)."""
        key = self.key(tx)
        data = self.store.get_entry_file(key)
        blob = None if data is None else self.store.verify_entry_file(key, data)
        if blob is None:
            return 0
        # Filed by the key it was verified against: only processes trusting that key link it.
        rel = self._pool_for(blob.signer)
        pool = None if rel is None else pools.get(rel)
        if pool is None:
            return 0
        size = len(blob)
        if budget is not None and used + size > budget:
            return None
        tmp = f"{_TMP_PREFIX}{tx}.{os.getpid()}.{secrets.token_hex(4)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o444, dir_fd=pool.fd)
            try:
                with memoryview(blob) as view:
                    written = 0
                    while written < size:
                        written += os.write(fd, view[written:])
            finally:
                os.close(fd)
            # Whole file or nothing under the final name; another host process doing the
            # same replaces an equal copy.
            os.replace(tmp, tx, src_dir_fd=pool.fd, dst_dir_fd=pool.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pool.fd)
            raise
        self.counters.materialized += 1
        return size

    # -- views -----------------------------------------------------------------------

    def open_view(self) -> str:
        """Create this process's torch_xla directory, linked to every pool file; its path
        (``torch_path`` is the one to give torch_xla)."""
        self.check_dirs()
        views = self._sub(VIEWS)
        try:
            self._sweep_views(views)
            ident = f"{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(
                f"{ident}.lock",
                os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=views.fd,
            )
            # Where locks fail the view is still ours; sweepers just cannot tell it is alive.
            with contextlib.suppress(OSError):
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock_fd = fd
            os.mkdir(ident, 0o700, dir_fd=views.fd)
            self._view_fd = os.open(ident, _O_DIR, dir_fd=views.fd)
        except BaseException:
            views.close()
            raise
        self._views = views
        self.view = os.path.join(views.path, ident)
        self._link_pool()
        self._watch_view()
        return self.view

    def torch_path(self) -> str | None:
        """The path to give torch_xla for the view: ``/proc/self/fd/<n>`` of the handle it
        was made through, so that no directory renamed into the local root's place later
        is ever read or written (the path itself where there is no ``/proc``). The handle
        then stays open for the life of the process (``close_view`` removes the view but
        keeps it): torch_xla keeps the path, and a number closed could come back for
        another directory."""
        if self._view_fd is None or self.view is None:
            return None
        self._handed_out = True
        return pinned_path(self._view_fd, self.view)

    def _link_pool(self) -> None:
        """Links every copy of the pools this process may use now (``pools()``: the keys
        it trusts at this moment) into its view; the first pool holding a name wins."""
        assert self._view_fd is not None
        for rel in self._pool_rels():
            with self._sub(rel) as pool, os.scandir(pool.fd) as it:
                for e in it:
                    if not is_torch_xla_name(e.name) or e.name in self._linked:
                        continue
                    self._link_one(e, pool)

    def _link_one(self, e: os.DirEntry[str], pool: OwnDir) -> None:
        view = self._view_fd
        assert view is not None
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                # Not a copy this user made (the pool is its own): never torch_xla's to load.
                self.counters.errors += 1
                logger.debug(
                    "xla_pcache.torch_xla: %s is not this user's copy",
                    os.path.join(pool.path, e.name),
                )
                return
            os.link(e.name, e.name, src_dir_fd=pool.fd, dst_dir_fd=view, follow_symlinks=False)
        except FileNotFoundError:
            return  # dropped from the pool meanwhile
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            self._copy_into_view(e.name, pool)  # no hard links here: a private copy
        st = os.stat(e.name, dir_fd=view, follow_symlinks=False)
        self._linked[e.name] = (st.st_dev, st.st_ino)
        self.counters.linked += 1

    def _copy_into_view(self, name: str, pool: OwnDir) -> None:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pool.fd)
        try:
            dst = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=self._view_fd,
            )
            with open(src, "rb", closefd=False) as fin, open(dst, "wb") as fout:
                shutil.copyfileobj(fin, fout)
        finally:
            os.close(src)

    def adopt_view(self, other: HostMirror) -> None:
        """Take over ``other``'s view (the directory torch_xla already reads) for this
        mirror's store: drop the links ``other`` made, link this pool in. Only before the
        first execution, when every file of the view is one of ``other``'s links."""
        assert other.view is not None and self.view is None
        other._unwatch()
        self.view, self._lock_fd = other.view, other._lock_fd
        self._views, self._view_fd = other._views, other._view_fd
        self._handed_out = other._handed_out
        other.view, other._lock_fd, other._views, other._view_fd = None, None, None, None
        other.close_dirs()
        assert self._view_fd is not None
        for name, ident in other._linked.items():
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=self._view_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == ident:
                    os.unlink(name, dir_fd=self._view_fd)
        other._linked.clear()
        self._link_pool()
        self._watch_view()

    # -- which pool files torch_xla opened: hits the store did not serve ---------------

    def _watch_view(self) -> None:
        """Watch the view for opens: torch_xla opens a linked file only to load it, so the
        names it opens are the store's entries it used, to be counted as hits (the pool
        served them, the store never saw a read). Linux only; elsewhere nothing is counted."""
        if self.view is not None and self._view_fd is not None:
            self._watch_fd = watch_opens(pinned_path(self._view_fd, self.view))

    def _unwatch(self) -> None:
        if self._watch_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._watch_fd)
            self._watch_fd = None

    def written_names(self) -> set[str]:
        """Names of the files torch_xla wrote into the view itself (graphs it compiled)."""
        if self._view_fd is None:
            return set()
        out: set[str] = set()
        with contextlib.suppress(OSError), os.scandir(self._view_fd) as it:
            for e in it:
                if not is_torch_xla_name(e.name):
                    continue
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    if self._linked.get(e.name) != (st.st_dev, st.st_ino):
                        out.add(e.name)
        return out

    def opened_links(self) -> set[str]:
        """Names of linked (store) files opened since the last call."""
        if self._watch_fd is None:
            return set()
        return {name for name in opened_names(self._watch_fd) if name in self._linked}

    def _sweep_views(self, views: OwnDir) -> None:
        """Remove views whose owner died (its lock is free). Their new files are dropped,
        not published: a process killed mid-write leaves a file nobody can vouch for."""
        try:
            names = os.listdir(views.fd)
        except OSError:
            return
        now = time.time()
        for name in names:
            if not name.endswith(".lock"):
                continue
            try:
                st = os.stat(name, dir_fd=views.fd, follow_symlinks=False)
                if now - st.st_mtime < VIEW_GRACE_S:
                    continue
                fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=views.fd)
            except OSError:
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # alive, or locks do not work here
            try:
                shutil.rmtree(name[: -len(".lock")], ignore_errors=True, dir_fd=views.fd)
                os.unlink(name, dir_fd=views.fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def close_view(self) -> None:
        """Remove the view (after the last publish)."""
        if self.view is not None and self._views is not None:
            name = os.path.basename(self.view)
            shutil.rmtree(name, ignore_errors=True, dir_fd=self._views.fd)
            with contextlib.suppress(OSError):
                os.unlink(f"{name}.lock", dir_fd=self._views.fd)
        self.view = None
        if self._views is not None:
            self._views.close()
            self._views = None
        if self._view_fd is not None and not self._handed_out:
            # One torch_xla was given stays open (``torch_path``), on a removed directory.
            with contextlib.suppress(OSError):
                os.close(self._view_fd)
        self._view_fd = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        self._unwatch()
        self.close_dirs()

    # -- view -> store ------------------------------------------------------------------

    def publish(self, *, final: bool = False) -> None:
        """Publish every complete file torch_xla wrote into the view since the last call."""
        if self._view_fd is None or self.store.read_only:
            return
        try:
            self._publish(final)
        except Exception as exc:
            self.warn("publishing torch_xla's new cache files", exc)

    def _candidates(self) -> Iterable[tuple[str, os.stat_result]]:
        assert self._view_fd is not None
        with os.scandir(self._view_fd) as it:
            for e in it:
                if not is_torch_xla_name(e.name):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                ident = (st.st_dev, st.st_ino)
                if not stat.S_ISREG(st.st_mode) or ident in self._handled:
                    continue
                if self._linked.get(e.name) == ident:
                    continue  # the store's own bytes, linked in at start
                yield e.name, st

    def _publish(self, final: bool) -> None:
        candidates = list(self._candidates())
        if not candidates:
            return
        busy = open_inodes()
        if busy is None and final:
            # Without /proc, completeness rests on the file not changing; at exit, look
            # twice a moment apart rather than waiting for the next poll.
            for name, st in candidates:
                self._settled(name, st)
            time.sleep(0.5)
            candidates = list(self._candidates())
        meta: dict[str, str] | None = None
        for name, st in candidates:
            ident = (st.st_dev, st.st_ino)
            if st.st_size == 0 or (busy is not None and ident in busy):
                self.counters.pending += 1
                continue  # torch_xla still holds it open: the next pass takes it
            if busy is None and not self._settled(name, st):
                self.counters.pending += 1
                continue
            key = self.key(name)
            if key in self.store:
                # First writer wins; on backends that cannot load, torch_xla rewrites every
                # entry it was given, and those rewrites land here.
                self._handled.add(ident)
                self.counters.already_stored += 1
                continue
            data = self._read_whole(name, st)
            if data is None:
                continue
            if meta is None:
                meta = self.meta()
            self._handled.add(ident)
            entry_meta = dict(meta, torch_xla_name=name)
            secs = self.compile_time(st) if self.compile_time is not None else None
            if secs is not None:
                entry_meta[META_COMPILE_TIME] = f"{secs:.6f}"
            if self.store.put(key, data, meta=entry_meta):
                self.counters.published += 1
                self._share_with_host(name)
                if self.on_publish is not None:
                    self.on_publish(key)
            elif key in self.store:
                self.counters.already_stored += 1
            else:
                self.counters.errors += 1
                logger.debug("xla_pcache.torch_xla: the store did not take %s", name)

    def _settled(self, name: str, st: os.stat_result) -> bool:
        now = _Seen(st.st_size, st.st_mtime_ns, st.st_ino)
        before = self._seen.get(name)
        self._seen[name] = now
        return before == now

    def _read_whole(self, name: str, st: os.stat_result) -> bytes | None:
        """The view file's bytes if it is the inode we judged complete and did not change
        while we read it; None otherwise (looked at again on the next pass)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._view_fd)
        except FileNotFoundError:
            return None
        try:
            before = os.fstat(fd)
            if (before.st_dev, before.st_ino) != (st.st_dev, st.st_ino):
                return None  # torch_xla replaced it since the listing
            chunks = []
            while chunk := os.read(fd, 1 << 24):
                chunks.append(chunk)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if (
            len(data) != before.st_size
            or after.st_size != before.st_size
            or after.st_mtime_ns != before.st_mtime_ns
        ):
            self.counters.pending += 1
            return None
        return data

    def _share_with_host(self, name: str) -> None:
        """Link a file just published into the pool, so later processes of this host get
        it without reading the store. The inode is final: torch_xla never writes an
        existing file again, it only creates new ones. Only into the unverified pool: a
        process with trusted keys leaves its pools to copies the store verified (the next
        refresh makes one)."""
        assert self._view_fd is not None
        if self.store.trusted_keys is not None:
            return
        with self._sub(POOL) as pool, contextlib.suppress(FileExistsError, FileNotFoundError):
            try:
                os.link(name, name, src_dir_fd=self._view_fd, dst_dir_fd=pool.fd)
            except OSError as exc:
                if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    return  # the next refresh copies it from the store
                raise


def describe(mirror: HostMirror | None) -> dict[str, Any]:
    if mirror is None:
        return {}
    return {"local_dir": mirror.root, "view": mirror.view, **mirror.counters.as_dict()}
