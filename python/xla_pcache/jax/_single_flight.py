"""Single flight for JAX: one process of a fleet compiles a program, the others wait for it.

On a miss, the cache's ``get`` claims the key in the store (``Store.claim``) or, when
another process holds the claim, waits for its entry and returns it as a hit. The claim is
released by the ``put`` of the key. JAX decides after compiling whether to put at all (not
below ``jax_persistent_cache_min_compile_time_secs`` or ``..._min_entry_size_bytes``, not
on a process other than 0, not when the compile raised), and tells the cache nothing when
it does not; so the claim is tied to the call that compiles: it is kept in the call's
``_compile_context.CompileContext``, and when ``compile_or_get_cached`` returns or raises,
every claim taken inside it that the put did not release is released at once (retired:
waiters stop waiting and compile themselves). A waiter therefore never waits for a program
that will not be put for longer than its compile takes. A ``get`` outside that call (or on
another thread than the one compiling) never claims nor waits.

When the store's remote chain has a writable object-store tier, a fleet whose hosts share
only the bucket gets single flight across hosts too: the process holding the local claim
(one per host) then claims the key on the bucket (``xla_pcache.tiers.objstore.ObjectClaims``), or
waits there for another host's compile and fetches its entry, which the local waiters then
find published.

This module imports nothing from JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from xla_pcache._core import Blob, Claim, entry_name
from xla_pcache._text import package_logger
from xla_pcache.jax import _compile_context
from xla_pcache.store import Store

logger = package_logger(__name__)


class _Releasable(Protocol):
    def release(self) -> None: ...


class _Both:
    """A local claim and the bucket's claim on the same key, released together (the
    bucket's after the entry's upload, which was queued first)."""

    def __init__(self, local: Claim, remote: _Releasable) -> None:
        self.local = local
        self.remote = remote

    def release(self) -> None:
        try:
            self.local.release()
        finally:
            self.remote.release()


def _bucket_claims(store: Store) -> Any:
    """The object-store claims of the store's remote chain, or None."""
    chain = getattr(store, "remote", None)
    claims = getattr(chain, "claims", None)
    return claims() if callable(claims) else None


class SingleFlight:
    """What the cache's ``get`` does on a miss: claim, or wait for the claim's holder.

    ``may_claim()`` says whether this process would put what it compiles (JAX writes from
    process 0 only); a process that would not only waits. Any store failure is a miss.
    """

    def __init__(self, store: Store, wait: float, may_claim: Callable[[], bool]) -> None:
        self._store = store
        self._wait = wait
        self._may_claim = may_claim

    @property
    def wait(self) -> float:
        return self._wait

    def after_miss(self, key: str) -> Blob | None:
        """The entry once another process published it, else None (compile it)."""
        scope = _compile_context.current()
        if scope is None or key in scope.claims:
            # Not a compile JAX is about to run, or our own claim (the verification wrapper
            # reads the key again in its put).
            return None
        store = self._store
        try:
            claimant = not store.read_only and self._may_claim()
            claim = store.claim(key, self._wait) if claimant else store.wait_for(key, self._wait)
        except Exception as exc:
            logger.warning(
                "xla_pcache: compile claim on %r failed, compiling without it: %s: %s",
                key,
                type(exc).__name__,
                exc,
            )
            return None
        state = claim.state
        bucket = _bucket_claims(store) if state in ("claimed", "unclaimed") else None
        if bucket is not None:
            fetched: Blob | None = self._across_hosts(bucket, store, key, claim, scope)
            return fetched
        if state == "claimed":
            scope.claims[key] = claim
            return None
        if state == "published":
            logger.debug("xla_pcache: %r was compiled by another process meanwhile", key)
            return store.get(key)
        if state == "timed_out":
            logger.warning(
                "xla_pcache: waited %.0f s for another process compiling %r; compiling it "
                "here (XLA_PCACHE_COMPILE_WAIT sets the wait)",
                claim.waited,
                key,
            )
        return None

    def _across_hosts(
        self,
        bucket: Any,
        store: Store,
        key: str,
        claim: Claim,
        scope: _compile_context.CompileContext,
    ) -> Any:
        """This host's turn: claim ``key`` on the bucket, or wait for the host compiling it."""
        held = claim.state == "claimed"
        if held:
            scope.claims[key] = claim  # released with the scope whatever happens below
        try:
            remote = bucket.claim(
                entry_name(key), self._wait, store.settings.claim_lease, may_claim=held
            )
        except Exception as exc:
            logger.warning("xla_pcache: compile claim on the bucket failed: %s", exc)
            return None
        if remote.state == "claimed":
            scope.claims[key] = _Both(claim, remote)
            return None
        if remote.state == "published":
            logger.debug("xla_pcache: %r was compiled by another host meanwhile", key)
            blob: Blob | None = store.get(key)
            return blob
        return None
