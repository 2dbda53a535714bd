"""A host mirror's directories on this host, each this user's own:

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
(``HostDirs.check``) and torch_xla runs without a persistent cache, with one warning naming
it. One of this user's that others can write (an earlier release made it under ``umask
002``) is repaired: made 0700, and everything in it discarded, since others could have put
anything there (the copies are made again from the store). A local root the user named
(``named_root``) is never changed: when others can write it, this user's own directory
``xla_pcache-<uid>`` beneath it holds the host's directory instead. Each directory is
checked on the handle it is used through: the host's directory is opened once and kept, and
everything beneath it is reached through it (``dir_fd=``), so a directory renamed into the
local root's place later, by whoever can write its parent, is never used; torch_xla is given
its view as ``/proc/self/fd/<n>`` (``View.torch_path``), a path no rename redirects. A pool
file is linked only when it is a regular file of this user's.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol

from xla_pcache._core import hash_key
from xla_pcache._owndir import OwnDir, Rule, open_own
from xla_pcache.builds import Build
from xla_pcache.store import Store
from xla_pcache.torch_xla._mirror_counters import Counters

POOL = "pool"
# Under the host's directory: one pool per trusted key (see the module's docstring).
TRUSTED_POOLS = "trusted"
VIEWS = "views"
MANIFEST = "manifest.json"
# A directory beneath a handle, opened without following a link.
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Said when a directory an earlier release left open to the group is emptied.
_REFETCHED = "torch_xla's host copies are made again from the store"


def key_pool_name(name: str, public: bytes) -> str:
    """The directory of the copies verified against the key ``name`` with public key
    ``public``: its name and a fingerprint of the key, so a key re-issued under the same
    name is another directory."""
    return f"{name}.{hash_key(public)[:16]}"


class _Rooted(Protocol):
    @property
    def root(self) -> str: ...


class InHostDir:
    """The path of ``name`` in the host's directory, read from its owner's ``root`` at each
    use: the root moves once, when ``HostDirs.check`` opens it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, rooted: _Rooted, owner: type | None = None) -> str:
        return os.path.join(rooted.root, self.name)


class HostDirs:
    """The host's directory for ``store`` and ``build`` beneath ``local_root``, and the pools
    and views' directory beneath it, each opened beneath the last and checked.

    ``named_root``: ``local_root`` was named by the user (``XLA_PCACHE_TORCH_XLA_LOCAL_DIR``,
    ``install(local_dir=)``): never changed, and when others can write it, this user's own
    directory beneath it is used (see the module's docstring).
    """

    pool = InHostDir(POOL)
    views = InHostDir(VIEWS)

    def __init__(
        self,
        store: Store,
        local_root: str,
        *,
        build: Build | None,
        named_root: bool,
        counters: Counters,
    ) -> None:
        self.store = store
        self.local_root = local_root
        self.named_root = named_root
        self.counters = counters
        real = os.path.realpath(store.path)
        # The host name keeps hosts apart when the local root is itself on a shared home
        # directory; the hash keeps two stores, and two builds of one store, apart.
        host = socket.gethostname().split(".")[0] or "host"
        ident = real if build is None else f"{real}\0{build.digest}"
        self.host_name = f"{host}-{hash_key(ident)[:16]}"
        # Where the host's directory is; under a named root others can write, one level
        # deeper, once ``check`` has opened it.
        self.root = os.path.join(local_root, self.host_name)
        self._host: OwnDir | None = None

    def check(self) -> None:
        """Open (each absent one made 0700) and check every directory this process will use:
        the local root, the host's directory, the pools it may link from and the views'
        directory, each this user's own and writable by nobody else (one an earlier release
        left open to the group is repaired: made 0700 and emptied). ``CacheError`` naming
        the first that is refused (the caller then runs torch_xla without this mirror)."""
        for rel in (VIEWS, *self.pool_rels()):
            self.sub(rel).close()

    def host(self) -> OwnDir:
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

    def sub(self, rel: str) -> OwnDir:
        """The directory ``rel`` (``pool``, ``views``, ``trusted/<key pool>``) beneath the
        host's, each component opened beneath the last and checked; the caller closes it."""
        d = self.host()
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

    def close(self) -> None:
        """Let go of the host's directory (the view, if any, keeps its own handles)."""
        if self._host is not None:
            self._host.close()
            self._host = None

    def pool_rels(self) -> list[str]:
        """The pools this process may link from, beneath the host's directory (``pools``)."""
        keys = self.store.trusted_keys
        if keys is None:
            return [POOL]
        return [f"{TRUSTED_POOLS}/{key_pool_name(n, pub)}" for n, pub in keys]

    def pools(self) -> list[str]:
        """The pool directories this process may link from, asked of the store at every
        call: with trusted keys, the directory of each key it trusts now, in the set's order
        (a copy verified against a key the set no longer holds is never linked); without,
        the pool of unverified copies."""
        return [os.path.join(self.root, rel) for rel in self.pool_rels()]

    def pool_for(self, signer: str | None) -> str | None:
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
