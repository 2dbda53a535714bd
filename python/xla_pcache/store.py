"""``Store``: the Rust store, with budgets accepted as size strings."""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Literal

from xla_pcache import _core
from xla_pcache.config import claim_lease_from_env, compile_wait_from_env
from xla_pcache.sizes import parse_duration, parse_size

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from xla_pcache.bundle import ImportReport
    from xla_pcache.chain import Chain


class Store(_core.Store):
    """A persistent key -> blob store rooted at ``path`` (see ``xla_pcache._core.Store``).

    ``max_size`` may be a byte count or a string such as ``"500M"``, ``"50G"``, ``"1.5T"``;
    durations are seconds or strings such as ``"30s"``, ``"7d"``. A size or duration that is
    negative, NaN, infinite, empty or out of range is a ``ValueError`` naming the argument.
    ``claim_lease`` (seconds; default ``XLA_PCACHE_CLAIM_LEASE``, else 30) is how long a
    compile claim may go without a heartbeat before waiters take it over.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        max_size: int | str | None = None,
        read_only: bool = False,
        durable: bool = False,
        lock_mode: Literal["auto", "fcntl", "lease"] | None = None,
        lock_timeout: float | str = 0.5,
        lease_time: float | str = 30.0,
        hit_interval: float | str = 60.0,
        trash_grace: float | str = 300.0,
        tmp_grace: float | str = 3600.0,
        remote: str | None = None,
        claim_lease: float | str | None = None,
    ) -> Store:
        from xla_pcache.remote import remote_from_env

        url = remote if remote is not None else remote_from_env()
        if url and cls is Store:
            # The remote tier's get/put live in a subclass so that a store without one serves
            # hits straight from the Rust methods, with no Python frame in between.
            cls = RemoteStore
        self = super().__new__(
            cls,
            path,
            max_size=parse_size(max_size, name="max_size"),
            read_only=read_only,
            durable=durable,
            lock_mode=lock_mode,
            lock_timeout=parse_duration(lock_timeout, name="lock_timeout"),
            lease_time=parse_duration(lease_time, name="lease_time"),
            hit_interval=parse_duration(hit_interval, name="hit_interval"),
            trash_grace=parse_duration(trash_grace, name="trash_grace"),
            tmp_grace=parse_duration(tmp_grace, name="tmp_grace"),
            claim_lease=claim_lease_from_env()
            if claim_lease is None
            else parse_duration(claim_lease, name="claim_lease"),
        )
        self._remote = (
            _open_remote(url, self.read_only) if url and isinstance(self, RemoteStore) else None
        )
        if self._remote is not None:
            self._remote.persist_counters(self)
        _track_for_fork(self)
        return self

    _remote: Chain | None

    @property
    def remote(self) -> Chain | None:
        return self._remote

    # --- bundles (issue 15): see xla_pcache.bundle -----------------------------------------
    def export_bundle(
        self,
        out: str | os.PathLike[str],
        *,
        framework: str | None = None,
        newer_than: float | str | None = None,
        min_hits: int = 0,
    ) -> int:
        """Write verified entries to a bundle file (tar.gz); returns how many. ``min_hits``
        keeps entries with at least that many hits recorded (at most one per process per
        hit interval: a lower bound on uses)."""
        from xla_pcache.bundle import export_bundle

        age = None if newer_than is None else parse_duration(newer_than, name="newer_than")
        return export_bundle(self, out, framework=framework, newer_than=age, min_hits=min_hits)

    def import_bundle(self, bundle: str | os.PathLike[str]) -> ImportReport:
        """Publish each verifying entry of a bundle; returns imported/present/rejected."""
        from xla_pcache.bundle import import_bundle

        return import_bundle(self, bundle)

    def claim(self, key: _core.Key, wait: float | str | None = None) -> _core.Claim:
        """Single flight: claim ``key`` for compiling, or wait for the process compiling it.

        The first process to miss a key claims it (``state == "claimed"``): it compiles and
        puts the key, and the put releases the claim (so does ``release()``, leaving the
        ``with`` block, or closing the store). Others that miss the same key meanwhile wait
        up to ``wait`` seconds (default ``XLA_PCACHE_COMPILE_WAIT``, else 300) and get
        ``"published"`` once the entry is there (then ``get`` it), ``"abandoned"`` when the
        holder gave up without publishing, or ``"timed_out"``; in both of the last cases
        they compile themselves. A holder that stops heartbeating for ``claim_lease``
        seconds (killed, host lost) is taken over by a waiter (``took_over``). A read-only
        store waits but never claims (``"unclaimed"`` when nobody holds a claim).
        """
        if wait is None:
            return super().claim(key, compile_wait_from_env())
        return super().claim(key, parse_duration(wait, name="wait"))

    def wait_for(self, key: _core.Key, timeout: float | str) -> _core.Claim:
        return super().wait_for(key, parse_duration(timeout, name="timeout"))

    def evict(
        self, max_size: int | str | None = None, older_than: float | str | None = None
    ) -> dict[str, object]:
        """As ``_core.Store.evict``; ``max_size`` may also be a string such as ``"50G"`` and
        ``older_than`` one such as ``"7d"``, as ``Store()`` accepts them."""
        return super().evict(
            parse_size(max_size, name="max_size"),
            None if older_than is None else parse_duration(older_than, name="older_than"),
        )


class RemoteStore(Store):
    """A store with a Redis tier behind it: local first, then the remote (docs/remote.md)."""

    def get(self, key: _core.Key) -> _core.Blob | None:
        blob = super().get(key)
        if blob is not None or self._remote is None:
            return blob
        name = _core.entry_name(key)
        data = self._remote.get(name)
        if data is None:
            return None
        if self.read_only:
            # Nothing may be written locally, so the value is verified in memory and served
            # from there; the next read-only process asks the remote again.
            verified = self.verify_entry_file(key, data)
            self._remote.count("remote_hits" if verified is not None else "remote_rejected")
            return verified
        published = self.put_entry_file(key, data)
        if published is None:
            self._remote.count("remote_rejected")
            return None
        self._remote.count("remote_hits")
        return super().get(key)

    def put(self, key: _core.Key, value: Buffer, *, meta: dict[str, str] | None = None) -> bool:
        stored = super().put(key, value, meta=meta)
        if stored and self._remote is not None and not self.read_only:
            data = self.get_entry_file(key)
            if data is not None:
                self._remote.put_async(_core.entry_name(key), data)
        return stored

    def stats(self) -> dict[str, int | float | str | bool | None]:
        out = super().stats()
        if self._remote is not None:
            # The totals the store keeps across processes win over this process's own.
            for k, v in self._remote.stats().items():
                out.setdefault(k, v)
        return out


def _open_remote(url: str, read_only: bool) -> Chain:
    from xla_pcache.remote import open_tier

    return open_tier(url, None, read_only=read_only)


# Fork safety. A child forked while another thread was inside a store (PyTorch's DataLoader
# forks its workers) would inherit its mutexes locked, its journal (two writers on one
# journal), its held claims and a heartbeat thread that does not exist there. Right after the
# fork, while the child is still single-threaded, every live store forgets all of that: the
# child opens its own journal on its first write. A plain dict of weak references (its
# operations are single steps under the GIL, so a fork never sees it half-updated).
_live_stores: dict[int, weakref.ref[_core.Store]] = {}


def _track_for_fork(store: _core.Store) -> None:
    key = id(store)

    def forget(_ref: weakref.ref[_core.Store]) -> None:
        _live_stores.pop(key, None)

    _live_stores[key] = weakref.ref(store, forget)


def _after_fork_in_child() -> None:
    for ref in list(_live_stores.values()):
        store = ref()
        if store is not None:
            store._after_fork_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
