"""Remote tiers chained behind the local directory, tried in order, as sccache chains them.

``XLA_PCACHE_REMOTE`` (or ``Store(..., remote=...)``) is a comma-separated list of URLs:
``redis://`` / ``rediss://`` (a Redis server), ``s3://bucket/prefix``, ``gs://bucket/prefix``,
``az://container/prefix`` (object stores). ``?ro=1`` (or ``?read_only=1``) after a URL makes
that tier read-only: read, never written, never backfilled. ``?trust=required`` makes it
serve only entries signed by a key the store trusts (``XLA_PCACHE_TRUSTED_KEYS``): a store
without trusted keys drops such a tier with one warning, and only signed entries are written
to it.

- **get**: each tier in order, and in each tier the key's plain object, then each trusted
  signer's own object for the key (the names the core gives, ``Store.entry_names``, in
  its one order); the first value the store
  verifies answers. A value it refuses (damaged, unsigned or untrusted; it says
  ``count("remote_rejected")``) stops nothing: the next object, then the next tier, is
  tried. Once the store has verified one (``count("remote_hits")``), it is backfilled in the
  background into every writable tier before the one that answered.
- **put**: written through to every writable tier, each in its own background thread: to
  the plain object and, for a signed entry, to its signer's own object too, which only that
  signer writes (an object squatting the plain name, or planted after the trusted writer's,
  hides nothing from a trusting reader).
- A URL that cannot be used (unknown scheme, missing client package, bad option) drops that
  tier with one warning; the others and the local directory go on.

Counters are kept per tier (``tier<N>_<counter>``, ``tier<N>`` naming the tier, 1 being the
first remote tier; this process's own) and summed over the tiers under the ``remote_*``
names. The store also keeps them per tier name in its journal (``Store.add_tier_counter``,
reported as ``remote_redis_hits``, ``remote_s3_get_ms``, ...), so that both are summed across
processes. A tier's name is its kind (``redis``, ``s3``, ``gs``, ``az``): chains differ from one
process to the next, but a kind means the same in every one; two tiers of one kind in a chain
add into the same counters. The core knows the names only as data.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xla_pcache._text import package_logger
from xla_pcache.config import DEFAULT_REMOTE_MAX_BYTES, Settings
from xla_pcache.tiers import objstore, redis
from xla_pcache.tiers.base import (
    TRUST_OPTION,
    TRUST_REQUIRED,
    Spooled,
    Tier,
    hide_url_secrets,
    split_mode,
)
from xla_pcache.tiers.base import redact as redact
from xla_pcache.tiers.readonly import ReadOnly

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = package_logger("xla_pcache")

# Tier counters -> the store's counters that keep them across processes.
_PERSISTED = {
    "remote_hits": "remote_hits",
    "remote_misses": "remote_misses",
    "remote_rejected": "remote_rejected",
    "remote_get_errors": "remote_errors",
    "remote_put_errors": "remote_errors",
    "remote_claim_errors": "remote_errors",
    "remote_puts": "remote_puts",
    "remote_put_exists": "remote_put_exists",
    "remote_read_bytes": "remote_read_bytes",
    "remote_written_bytes": "remote_written_bytes",
    "remote_get_ms": "remote_get_ms",
    "remote_backfills": "remote_backfills",
}
# The kind of tier each scheme is: the name under which the store keeps each total of
# _PERSISTED per tier too (``remote_<kind>_hits``, ...).
TIER_KINDS = {s: "redis" for s in redis.SCHEMES} | {s: s for s in objstore.SCHEMES}
# Counters a tier keeps that are failures of any kind.
_ERROR_COUNTERS = ("remote_get_errors", "remote_put_errors", "remote_claim_errors")


def _size(data: Buffer | list[Buffer] | Spooled) -> int:
    if isinstance(data, Spooled):
        return os.fstat(data.fd).st_size
    if isinstance(data, list):
        return sum(len(memoryview(p)) for p in data)
    return len(memoryview(data))


def split_urls(raw: str) -> list[str]:
    return [u.strip() for u in raw.split(",") if u.strip()]


def redact_chain(raw: str) -> str:
    """A comma-separated chain, each URL redacted (a password holding a comma cuts its URL
    in two, and each half is redacted as a URL: neither shows any of it)."""
    return ",".join(redact(u) for u in split_urls(raw))


def hide_chain_secrets(text: str, raw: str) -> str:
    """``text`` without any part of the chain's URLs that redaction would not show
    (``hide_url_secrets`` of each)."""
    for url in split_urls(raw):
        text = hide_url_secrets(text, url)
    return text


def check_chain(raw: object, name: str) -> None:
    """What is wrong with a chain before any tier is opened: not a string, or no URL in it
    (``TypeError`` / ``ValueError`` naming ``name``). A URL no tier can use is not an error
    here: that tier is dropped with a warning when the chain is opened, the rest goes on."""
    if not isinstance(raw, str):
        raise TypeError(f"{name} must be a string of comma-separated URLs")
    if not split_urls(raw):
        raise ValueError(f"invalid {name} {raw!r}: no URL in it")


class _Slot:
    """One tier of the chain and the counters the chain keeps for it."""

    def __init__(self, tier: Tier, read_only: bool, trust_required: bool = False) -> None:
        self.tier = tier
        self.read_only = read_only
        # Serves and takes only signed entries (what it serves, the store verifies under its
        # trusted keys: a chain holds such a tier only for a store that has some).
        self.trust_required = trust_required
        self.lock = threading.Lock()
        self.hits = 0
        self.rejected = 0
        # The tier's own counters already handed to the store.
        self.synced: dict[str, int] = {}
        self.read_bytes = 0
        self.get_ms = 0.0
        self.backfills = 0
        self.kind = TIER_KINDS.get(tier.url.split(":", 1)[0].lower(), "")


def _mode(slot: _Slot) -> str:
    """The query that shows a slot's mode in the chain's URL."""
    opts = [("ro", "1")] if slot.read_only else []
    if slot.trust_required:
        opts.append((TRUST_OPTION, TRUST_REQUIRED))
    return "?" + urllib.parse.urlencode(opts) if opts else ""


def _takes(slot: _Slot, own: str | None) -> bool:
    """Whether ``slot`` is written an entry: writable, and signed if it requires trust."""
    return not slot.read_only and (own is not None or not slot.trust_required)


def _write(slot: _Slot, name: str, data: Buffer, own: str | None) -> None:
    slot.tier.put_async(name, data)
    if own is not None:
        # The signer's own object: what a trusting reader finds there even when the plain
        # one holds an entry it would not trust (planted before or after this one).
        slot.tier.put_async(own, data, own=True)


class Chain:
    """The remote tiers in order, behind the interface the store uses for one tier:
    ``get``, ``put_async``, ``count``, ``stats``, ``close`` (and ``flush``)."""

    def __init__(
        self, slots: list[_Slot], *, read_only: bool = False, dropped: list[str] | None = None
    ) -> None:
        self._slots = slots
        self.read_only = read_only
        self.dropped = dropped or []
        self._last = threading.local()
        self.url = ",".join(s.tier.url + _mode(s) for s in slots)
        self._sink: Callable[[], Any] | None = None
        self._sync_lock = threading.Lock()

    def persist_counters(self, store: Any) -> None:
        """Also count into ``store`` (``Store.add_counter``: its ``remote_*`` counters,
        written to its journal and summed across processes by ``stats``). Held weakly."""
        self._sink = weakref.ref(store)

    def _store(self) -> Any:
        return self._sink() if self._sink is not None else None

    def _writes(self) -> bool:
        """Whether this chain may write (backfill): not for a read-only store."""
        store = self._store()
        return not (self.read_only or bool(getattr(store, "read_only", False)))

    def sync_counters(self) -> None:
        """Hands the store what the tiers counted since the last call (their own counters
        are cumulative: the difference is added)."""
        if self._store() is None:
            return
        with self._sync_lock:
            for slot in self._slots:
                raw = slot.tier.stats()
                for name, value in raw.items():
                    if name not in _PERSISTED or not isinstance(value, int):
                        continue
                    delta = value - slot.synced.get(name, 0)
                    if delta > 0:
                        slot.synced[name] = value
                        self._persist(name, delta, slot)

    def _persist(self, counter: str, n: int, slot: _Slot) -> None:
        """Adds ``n`` to the store's counter for ``slot``'s tier (by its name) and to the
        ``remote_*`` total, which the store adds itself."""
        name = _PERSISTED.get(counter)
        store = self._sink() if self._sink is not None else None
        if name is None or store is None or n <= 0:
            return
        try:
            if slot.kind:
                store.add_tier_counter(slot.kind, name.removeprefix("remote_"), n)
            else:
                store.add_counter(name, n)
        except Exception as e:  # a closed store: the counts of this process stop there
            log.debug("xla_pcache: remote counter %s not kept: %s", name, e)

    def __len__(self) -> int:
        return len(self._slots)

    def __bool__(self) -> bool:
        # A chain whose tiers were all dropped is still the store's tier (``if store.remote``
        # must not read it as no tier).
        return True

    @property
    def tiers(self) -> list[Tier]:
        return [s.tier for s in self._slots]

    def describe(self) -> list[dict[str, Any]]:
        """Each tier, redacted, for doctor and stats."""
        return [
            {
                "tier": i + 1,
                "url": s.tier.url,
                "read_only": s.read_only or self.read_only,
                "trust_required": s.trust_required,
            }
            for i, s in enumerate(self._slots)
        ]

    def get(
        self,
        name: str,
        *,
        max_bytes: int | None = None,
        spool: Callable[[], Spooled] | None = None,
    ) -> Any:
        """The first tier's value for ``name`` (``values([name])``'s first), or None."""
        return next(self.values([name], max_bytes=max_bytes, spool=spool), None)

    def values(
        self,
        names: Sequence[str],
        *,
        max_bytes: int | None = None,
        spool: Callable[[], Spooled] | None = None,
    ) -> Iterator[Any]:
        """Each value stored under one of ``names`` (``Store.entry_names``: the core's
        candidate names, in its order), tier by tier, in order: a buffer, a list of
        buffers to be taken in order (an object store's ranged pieces), or a ``Spooled``
        file. Not yet verified: the store verifies each and, before taking the next, says
        ``count("remote_hits")`` (and stops) or ``count("remote_rejected")``, so that a
        refused value stops neither the next name nor the next tier. Bounded as
        ``Tier.get`` says."""
        for i, slot in enumerate(self._slots):
            for name in names:
                self._last.hit = None
                t = time.perf_counter()
                data = slot.tier.get(name, max_bytes=max_bytes, spool=spool)
                ms = (time.perf_counter() - t) * 1000
                with slot.lock:
                    slot.get_ms += ms
                self._persist("remote_get_ms", round(ms), slot)
                self.sync_counters()
                if data is not None:
                    size = _size(data)
                    with slot.lock:
                        slot.read_bytes += size
                    self._persist("remote_read_bytes", size, slot)
                    self._last.hit = (i, names[0], data)
                    yield data
        self._last.hit = None

    def count(self, counter: str, n: int = 1, *, own: str | None = None) -> None:
        """Adds ``n`` to ``counter``. ``remote_hits`` / ``remote_rejected`` are said of the
        value ``values`` handed out last; a hit is backfilled, under the key's plain name
        and, for a signed entry, under ``own``, its signer's own name for the key."""
        last = getattr(self._last, "hit", None)
        self._last.hit = None
        if counter in ("remote_hits", "remote_rejected") and last is not None:
            i, name, data = last
            slot = self._slots[i]
            with slot.lock:
                if counter == "remote_hits":
                    slot.hits += n
                else:
                    slot.rejected += n
            self._persist(counter, n, slot)
            if counter == "remote_hits" and self._writes():
                self._backfill(i, name, data, own)
            return
        if self._slots:
            self._slots[0].tier.count(counter, n)

    def _backfill(self, k: int, name: str, data: Buffer | list[Buffer], own: str | None) -> None:
        # The faster tiers before the one that answered get the verified entry, with its
        # signature (the bytes are the entry file, as verified).
        targets = [slot for slot in self._slots[:k] if _takes(slot, own)]
        if not targets or isinstance(data, Spooled):
            # A spooled value is over SPOOL_BYTES: not read into memory again to be copied
            # to the faster tiers (they get it from the next put of this entry).
            return
        whole = b"".join(data) if isinstance(data, list) else data  # tiers write one buffer
        for slot in targets:
            _write(slot, name, whole, own)
            with slot.lock:
                slot.backfills += 1
            self._persist("remote_backfills", 1, slot)

    def put_async(self, name: str, data: Buffer, *, own: str | None = None) -> None:
        """Writes the entry file ``data`` to every writable tier under the key's plain
        ``name`` and, for a signed entry, under ``own``, its signer's own name for the key.
        A tier with ``?trust=required`` takes only a signed entry."""
        if not self._writes():
            return
        for slot in self._slots:
            if _takes(slot, own):
                _write(slot, name, data, own)

    def flush(self) -> None:
        for slot in self._slots:
            slot.tier.flush()
        self.sync_counters()

    def close(self) -> None:
        for slot in self._slots:
            try:
                slot.tier.close()
            except Exception as e:  # closing at exit must not raise into the program
                log.debug("xla_pcache: closing remote tier %s: %s", slot.tier.url, e)
        self.sync_counters()

    def claims(self) -> objstore.ObjectClaims | None:
        """The compile claims of the first writable object-store tier, if any."""
        for slot in self._slots:
            tier = slot.tier
            if isinstance(tier, objstore.ObjectTier) and not slot.read_only:
                return tier.claims
        return None

    def tier_stats(self) -> list[dict[str, int | float | str]]:
        out: list[dict[str, int | float | str]] = []
        for i, slot in enumerate(self._slots):
            raw = slot.tier.stats()
            with slot.lock:
                row: dict[str, int | float | str] = {
                    "tier": i + 1,
                    "url": str(raw.get("remote", slot.tier.url)),
                    "hits": slot.hits,
                    "misses": int(raw.get("remote_misses", 0)),
                    "rejected": slot.rejected,
                    "errors": sum(int(raw.get(c, 0)) for c in _ERROR_COUNTERS),
                    "skipped": int(raw.get("remote_skipped", 0))
                    + int(raw.get("remote_put_skipped", 0)),
                    "puts": int(raw.get("remote_puts", 0)),
                    "put_exists": int(raw.get("remote_put_exists", 0)),
                    "backfills": slot.backfills,
                    "read_bytes": slot.read_bytes,
                    "written_bytes": int(raw.get("remote_written_bytes", 0)),
                    "get_ms": round(slot.get_ms, 1),
                }
            for k, v in raw.items():
                if k.startswith("remote_claim") and isinstance(v, int):
                    row[k.removeprefix("remote_")] = v
            out.append(row)
        return out

    def stats(self) -> dict[str, int | float | str]:
        """Per tier (``tier<N>``, ``tier<N>_<counter>``) and summed over the tiers: each
        tier's own ``remote_*`` counters, and the chain's (hits, rejected, backfills,
        bytes and time read)."""
        self.sync_counters()
        out: dict[str, int | float | str] = {}
        totals: dict[str, int | float] = {}
        for slot in self._slots:
            raw: dict[str, int | str] = slot.tier.stats()
            for name, value in raw.items():
                if isinstance(value, int) and name.startswith("remote_"):
                    totals[name] = totals.get(name, 0) + value
        for row in self.tier_stats():
            i = row["tier"]
            out[f"tier{i}"] = row["url"]
            for k, v in row.items():
                if k in ("tier", "url") or isinstance(v, str):
                    continue
                out[f"tier{i}_{k}"] = v
                if k in ("hits", "rejected", "backfills", "read_bytes", "get_ms"):
                    totals[f"remote_{k}"] = totals.get(f"remote_{k}", 0) + v
        for name, total in totals.items():
            out[name] = round(total, 1) if isinstance(total, float) else total
        out["remote"] = self.url
        if self.dropped:
            out["remote_dropped"] = ",".join(self.dropped)
        return out


def open_chain(
    raw: str,
    settings: Settings | None = None,
    *,
    read_only: bool | None = None,
    environ: Mapping[str, str] = os.environ,
    trusting: bool = False,
) -> Chain:
    """The chain for a comma-separated URL list. A URL that cannot be used is dropped with
    one warning naming it (redacted) and why; a malformed timeout or size is a ValueError
    naming its variable, as for every other setting. ``trusting``: the store has trusted
    keys; without them a ``?trust=required`` tier is dropped (it could serve nothing)."""
    cfg = Settings.from_env(environ) if settings is None else settings
    if read_only is None:
        read_only = cfg.read_only
    slots: list[_Slot] = []
    dropped: list[str] = []
    for url in split_urls(raw):
        shown = redact(url)
        try:
            bare, ro, required = split_mode(url)
            if required and not trusting:
                from xla_pcache.config import TRUSTED_KEYS_VAR

                dropped.append(shown)
                log.warning(
                    "xla_pcache: remote cache %s is not used: it requires trust=required "
                    "and this process trusts no key (set %s); the other tiers and the local "
                    "cache go on",
                    shown,
                    TRUSTED_KEYS_VAR,
                )
                continue
            tier = _open_one(url, bare, shown, cfg, environ)
            slots.append(_Slot(ReadOnly(tier) if ro else tier, ro, required))
        except Exception as e:
            dropped.append(shown)
            log.warning(
                "xla_pcache: remote cache %s is not used (%s: %s); the other tiers and the "
                "local cache go on",
                shown,
                type(e).__name__,
                hide_url_secrets(objstore.scrub(str(e), environ), url),
            )
    return Chain(slots, read_only=read_only, dropped=dropped)


def _open_one(url: str, bare: str, shown: str, cfg: Settings, environ: Mapping[str, str]) -> Tier:
    """The tier of the kind ``url``'s scheme names (``bare``: without its mode options)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    cap = cfg.remote_max_bytes
    if scheme in redis.SCHEMES:
        tier = redis.RedisTier(
            bare, timeout=cfg.remote_timeout, max_value_bytes=cap or DEFAULT_REMOTE_MAX_BYTES
        )
        tier.url = shown.split("?")[0]
        return tier
    if scheme not in objstore.SCHEMES:
        known = ", ".join(f"{s}://" for s in (*redis.SCHEMES[:2], *objstore.SCHEMES))
        raise ValueError(f"unknown scheme {scheme + '://' if scheme else '(none)'}: use {known}")
    location, _ = objstore.parse_object_url(url)
    return objstore.ObjectTier(
        location,
        display_url=location,
        timeout=cfg.remote_timeout,
        max_value_bytes=cap or objstore.DEFAULT_MAX_VALUE,
        environ=environ,
    )


# The store reaches the tiers through these two (checked at construction, opened at first
# use), which ``xla_pcache.tiers`` exports; no tier module imports the chain.
def check_url(url: str, name: str) -> None:
    """Refuse, without connecting, a value that names no URL at all (``ValueError`` naming
    ``name``). A URL no tier can use is not refused here: the chain drops that tier with one
    warning when it opens, and the local directory and the other tiers go on."""
    check_chain(url, name)


def open_tier(
    url: str,
    settings: Settings,
    *,
    read_only: bool = False,
    trusting: bool = False,
    counters: Any = None,
) -> Chain:
    """The tiers ``url`` names (a comma-separated chain), configured from ``settings``
    (timeout, largest value), behind the one-tier interface; ``trusting``: the store has
    trusted keys; ``counters``: the store that also keeps their counters (``Store.add_counter``,
    ``Store.add_tier_counter``, summed across processes), held weakly."""
    chain = open_chain(url, settings, read_only=read_only, trusting=trusting)
    if counters is not None:
        chain.persist_counters(counters)
    return chain
