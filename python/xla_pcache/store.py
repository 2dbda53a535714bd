"""``Store``: the Rust store, with budgets accepted as size strings."""

from __future__ import annotations

import os
from typing import Literal

from xla_pcache import _core
from xla_pcache.config import claim_lease_from_env, compile_wait_from_env
from xla_pcache.sizes import parse_size


class Store(_core.Store):
    """A persistent key -> blob store rooted at ``path`` (see ``xla_pcache._core.Store``).

    ``max_size`` may be a byte count or a string such as ``"500M"``, ``"50G"``, ``"1.5T"``.
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
        lock_timeout: float = 0.5,
        lease_time: float = 30.0,
        hit_interval: float = 60.0,
        trash_grace: float = 300.0,
        tmp_grace: float = 3600.0,
        claim_lease: float | None = None,
    ) -> Store:
        return super().__new__(
            cls,
            path,
            max_size=parse_size(max_size, name="max_size"),
            read_only=read_only,
            durable=durable,
            lock_mode=lock_mode,
            lock_timeout=lock_timeout,
            lease_time=lease_time,
            hit_interval=hit_interval,
            trash_grace=trash_grace,
            tmp_grace=tmp_grace,
            claim_lease=claim_lease_from_env() if claim_lease is None else claim_lease,
        )

    def claim(self, key: _core.Key, wait: float | None = None) -> _core.Claim:
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
        return super().claim(key, compile_wait_from_env() if wait is None else wait)
