"""Remote tiers chained behind the local directory, tried in order, as sccache chains them.

``XLA_PCACHE_REMOTE`` (or ``Store(..., remote=...)``) is a comma-separated list of URLs:
``redis://`` / ``rediss://`` (a Redis server), ``s3://bucket/prefix``, ``gs://bucket/prefix``,
``az://container/prefix`` (object stores). ``?ro=1`` (or ``?read_only=1``) after a URL makes
that tier read-only: read, never written, never backfilled. ``?trust=required`` makes it
serve only entries signed by a key the store trusts (``XLA_PCACHE_TRUSTED_KEYS``): a store
without trusted keys drops such a tier with one warning, and only signed entries are written
to it.

- **fetch** (``Chain.fetch(names, accept)``, as ccache's remote storage hands each value to
  an entry receiver): each tier in order, and in each tier each of the names the core gives
  (the key's plain object, then each trusted signer's own object for the key, in its one
  order); each value found goes to ``accept`` (the core's one gate: ``_core.Accept``), and
  the first it takes answers. A value refused, by its first bytes in the tier or whole by
  ``accept`` (damaged, unsigned or untrusted: counted ``remote_rejected``; a later release's
  entry: ``newer_format``), stops nothing: the next object, then the next tier, is tried;
  the core's verdict on each goes back to whoever fetched, in the ``Fetch`` returned. The
  value taken (counted ``remote_hits``) is backfilled in the background into every writable
  tier before the one that answered, under the names ``accept`` returned.
- **put** (``Chain.put_async(names, data)``): the entry file a put just wrote, written
  through to every writable tier, each in its own background thread: to the plain object
  and, for a signed entry, to its signer's own object too, which only that signer writes (an
  object squatting the plain name, or planted after the trusted writer's, hides nothing from
  a trusting reader).
- **Read-only**: a tier marked ``?ro=1`` is opened as a ``ReadOnlyTier`` (``read_only.py``),
  which has no write; the chain lists the tiers it writes once, when it is made, and never
  asks a tier's mode on a write. A read-only store writes no tier because it publishes
  nothing and its ``accept`` names nothing to backfill.
- A URL that cannot be used (unknown scheme, missing client package, bad option) drops that
  tier with one warning; the others and the local directory go on.

Counters are kept per tier (``tier<N>_<counter>``, ``tier<N>`` naming the tier, 1 being the
first remote tier; this process's own) and summed over the tiers under the ``remote_*``
names. The store also keeps them per tier name in its journal (``Store.add_tier_counters``,
one call per fetch,
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xla_pcache import _core
from xla_pcache._text import package_logger
from xla_pcache._url import BUCKET_SCHEMES, REDIS_SCHEMES
from xla_pcache.config import DEFAULT_REMOTE_MAX_BYTES, Settings
from xla_pcache.tiers import objstore, redis
from xla_pcache.tiers.base import (
    TRUST_OPTION,
    TRUST_REQUIRED,
    Spool,
    Spooled,
    Tier,
    TierURL,
    hide_url_secrets,
    parse_tier_url,
    split_chain,
)
from xla_pcache.tiers.base import redact as redact
from xla_pcache.tiers.read_only import ReadOnlyTier

if TYPE_CHECKING:
    from typing_extensions import Buffer

    # What a fetch hands each value to (``_core.Accept``): the names the tiers before the
    # one that answered are backfilled under when it takes the value, else the core's
    # verdict on it (None: not read, which proves nothing).
    Accept = Callable[[Buffer | list[Buffer] | Spooled], tuple[str, ...] | _core.Refusal | None]

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
TIER_KINDS = {s: "redis" for s in REDIS_SCHEMES} | {s: s for s in BUCKET_SCHEMES}
# Counters a tier keeps that are failures of any kind.
_ERROR_COUNTERS = ("remote_get_errors", "remote_put_errors", "remote_claim_errors")


@dataclass(frozen=True)
class Refused:
    """A value a tier holds under entry ``name`` that the core refused, by its first bytes
    in the tier or whole, with the core's verdict (``verdict.garbage``: no entry of that
    name for any reader; ``newer_format``: a later release's, left alone)."""

    tier: Tier | ReadOnlyTier
    name: str
    verdict: _core.Refusal


@dataclass
class Fetch:
    """What one fetch found: whether a value was taken, and each value refused on the way,
    with the core's verdict (what its caller learns from the check itself, never by asking
    again)."""

    taken: bool = False
    refused: list[Refused] = field(default_factory=list)


def _size(data: Buffer | list[Buffer] | Spooled) -> int:
    if isinstance(data, Spooled):
        return os.fstat(data.fd).st_size
    if isinstance(data, list):
        return sum(len(memoryview(p)) for p in data)
    return len(memoryview(data))


def redact_chain(raw: str) -> str:
    """A comma-separated chain, each URL redacted (a password holding a comma cuts its URL
    in two, and each half is redacted as a URL: neither shows any of it)."""
    return ",".join(redact(u) for u in split_chain(raw))


def hide_chain_secrets(text: str, raw: str) -> str:
    """``text`` without any part of the chain's URLs that redaction would not show
    (``hide_url_secrets`` of each)."""
    for url in split_chain(raw):
        text = hide_url_secrets(text, url)
    return text


def check_chain(raw: object, name: str) -> tuple[TierURL, ...]:
    """A chain's URLs, each parsed once (``parse_tier_url``), before any tier is opened;
    ``TypeError`` / ``ValueError`` naming ``name`` for what is not a string or holds no URL.
    A URL no tier can use is not an error here: that tier is dropped with a warning when
    the chain is opened, and the local directory and the other tiers go on."""
    if not isinstance(raw, str):
        raise TypeError(f"{name} must be a string of comma-separated URLs")
    urls = tuple(parse_tier_url(u) for u in split_chain(raw))
    if not urls:
        raise ValueError(f"invalid {name} {raw!r}: no URL in it")
    return urls


class _Slot:
    """One tier of the chain and the counters the chain keeps for it."""

    def __init__(self, tier: Tier | ReadOnlyTier, trust_required: bool = False) -> None:
        self.tier = tier
        # Opened read-only (``?ro=1``): for what reports the chain; what is written is
        # decided by the tier's type (``Chain._writers``).
        self.read_only = isinstance(tier, ReadOnlyTier)
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


class _Writer:
    """A tier the chain writes (one that is not read-only), with its place in the chain."""

    def __init__(self, place: int, slot: _Slot, tier: Tier) -> None:
        self.place, self.slot, self.tier = place, slot, tier

    def takes(self, names: Sequence[str]) -> bool:
        """Whether it is written an entry filed under ``names``: signed (a signer's own name
        after the plain one) if it requires trust."""
        return len(names) > 1 or not self.slot.trust_required

    def write(self, names: Sequence[str], data: Buffer, replace: bool = False) -> None:
        plain, *own = names
        self.tier.put_async(plain, data, replace=replace)
        for name in own:
            # The signer's own object: what a trusting reader finds there even when the
            # plain one holds an entry it would not trust (planted before or after this one).
            self.tier.put_async(name, data, replace=True, own=True)


def _writers(slots: list[_Slot]) -> list[_Writer]:
    """The tiers of ``slots`` that can be written, in order: all but the read-only ones."""
    return [
        _Writer(i, slot, slot.tier)
        for i, slot in enumerate(slots)
        if not isinstance(slot.tier, ReadOnlyTier)
    ]


class Chain:
    """The remote tiers in order: ``fetch`` (with backfill), ``put_async``, ``stats``,
    ``flush`` and ``close``, for the store."""

    def __init__(self, slots: list[_Slot], *, dropped: list[str] | None = None) -> None:
        self._slots = slots
        # The tiers written (puts, backfills): decided here, once, by each tier's type.
        self._writers = _writers(slots)
        self.dropped = dropped or []
        self.url = ",".join(s.tier.url + _mode(s) for s in slots)
        self._sink: Callable[[], Any] | None = None
        self._sync_lock = threading.Lock()
        # Counts for the store's journal, handed over in one call (``_hand_over``).
        self._pending: list[tuple[str, str, int]] = []
        self._pending_lock = threading.Lock()

    def persist_counters(self, store: Any) -> None:
        """Also count into ``store`` (``Store.add_tier_counters``: its ``remote_*``
        counters per tier name, written to its journal and summed across processes by
        ``stats``). Held weakly."""
        self._sink = weakref.ref(store)

    def _store(self) -> Any:
        return self._sink() if self._sink is not None else None

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
        self._hand_over()

    def _persist(self, counter: str, n: int, slot: _Slot) -> None:
        """Notes ``n`` for the store's counter of ``slot``'s tier (by its name; the store
        adds the ``remote_*`` total itself), handed over by the next ``_hand_over``."""
        name = _PERSISTED.get(counter)
        if name is None or n <= 0 or not slot.kind or self._sink is None:
            return
        with self._pending_lock:
            self._pending.append((slot.kind, name.removeprefix("remote_"), n))

    def _hand_over(self) -> None:
        """Adds the counts noted since the last call to the store, in one call."""
        with self._pending_lock:
            counts, self._pending = self._pending, []
        store = self._store()
        if not counts or store is None:
            return
        try:
            store.add_tier_counters(counts)
        except Exception as e:  # a closed store: the counts of this process stop there
            log.debug("xla_pcache: remote counters not kept: %s", e)

    def __len__(self) -> int:
        return len(self._slots)

    def __bool__(self) -> bool:
        # A chain whose tiers were all dropped is still the store's chain (``if store.remote``
        # must not read it as no chain).
        return True

    @property
    def tiers(self) -> list[Tier | ReadOnlyTier]:
        """Each tier as the chain holds it (a read-only one as a ``ReadOnlyTier``)."""
        return [s.tier for s in self._slots]

    def describe(self) -> list[dict[str, Any]]:
        """Each tier, redacted, for doctor and stats."""
        return [
            {
                "tier": i + 1,
                "url": s.tier.url,
                "read_only": s.read_only,
                "trust_required": s.trust_required,
            }
            for i, s in enumerate(self._slots)
        ]

    def fetch(
        self,
        names: Sequence[str],
        accept: Accept,
        *,
        max_bytes: int | None = None,
        spool: Spool | None = None,
    ) -> Fetch:
        """Asks each tier in order for each of ``names`` (the core's candidate names for a
        key, in its order) and hands each value found to ``accept`` (a buffer, a list of
        buffers to be taken in order, or a ``Spooled`` file, bounded as ``Tier.get`` says),
        until it takes one; the writable tiers before the one that answered are then
        backfilled in the background under the names it returned. A refused value stops
        neither the next name nor the next tier. What was taken and refused, with the
        core's verdicts; a later release's entry is also counted in the store's
        ``newer_format``."""
        out = Fetch()
        try:
            for i, slot in enumerate(self._slots):
                for name in names:
                    t = time.perf_counter()
                    data = slot.tier.get(name, max_bytes=max_bytes, spool=spool)
                    ms = (time.perf_counter() - t) * 1000
                    with slot.lock:
                        slot.get_ms += ms
                    self._persist("remote_get_ms", round(ms), slot)
                    if isinstance(data, _core.Refusal):
                        self._refused(out, slot, name, data, by_head=True)
                        continue
                    if data is None:
                        continue
                    size = _size(data)
                    with slot.lock:
                        slot.read_bytes += size
                    self._persist("remote_read_bytes", size, slot)
                    try:
                        backfill = accept(data)
                    finally:
                        if isinstance(data, Spooled):
                            data.close()
                    if not isinstance(backfill, tuple):
                        if backfill is not None:
                            self._refused(out, slot, name, backfill)
                        with slot.lock:
                            slot.rejected += 1
                        self._persist("remote_rejected", 1, slot)
                        continue
                    with slot.lock:
                        slot.hits += 1
                    self._persist("remote_hits", 1, slot)
                    if backfill:
                        self._backfill(i, backfill, data)
                    out.taken = True
                    return out
            return out
        finally:
            self.sync_counters()

    def _refused(
        self,
        out: Fetch,
        slot: _Slot,
        name: str,
        verdict: _core.Refusal,
        *,
        by_head: bool = False,
    ) -> None:
        """Notes the core's refusal of ``slot``'s value under ``name`` for the caller. A
        later release's entry the tier refused by its first bytes (``by_head``: the core
        never saw it whole, which counts it) is counted in the store as a local one is."""
        out.refused.append(Refused(slot.tier, name, verdict))
        store = self._store()
        if by_head and verdict.version is not None and store is not None:
            try:
                store.count_newer_format(verdict.version)
            except Exception as e:  # a closed store: the count of this process stops there
                log.debug("xla_pcache: a newer format's count not kept: %s", e)

    def _backfill(
        self, k: int, names: Sequence[str], data: Buffer | list[Buffer] | Spooled
    ) -> None:
        # The faster tiers before the one that answered get the verified entry, with its
        # signature (the bytes are the entry file, as verified).
        targets = [w for w in self._writers if w.place < k and w.takes(names)]
        if not targets or isinstance(data, Spooled):
            # A spooled value is over SPOOL_BYTES: not read into memory again to be copied
            # to the faster tiers (they get it from the next put of this entry).
            return
        whole = b"".join(data) if isinstance(data, list) else data  # tiers write one buffer
        for w in targets:
            w.write(names, whole)
            with w.slot.lock:
                w.slot.backfills += 1
            self._persist("remote_backfills", 1, w.slot)

    def put_async(self, names: Sequence[str], data: Buffer, *, replace: bool = False) -> None:
        """Writes the entry file ``data`` (as a put just wrote it) to every writable tier
        under ``names``: the key's plain name and, for a signed entry, its signer's own name
        for the key. A tier with ``?trust=required`` takes only a signed entry. With
        ``replace`` the plain name's object is overwritten too (``Store.replace``: a record
        that changes); otherwise the first writer wins there."""
        for w in self._writers:
            if w.takes(names):
                w.write(names, data, replace)

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
        """The compile claims of the first writable object-store tier, if any (a read-only
        one, a ``ReadOnlyTier``, has none)."""
        for w in self._writers:
            if isinstance(w.tier, objstore.ObjectTier):
                return w.tier.claims
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
    urls: str | Sequence[TierURL],
    settings: Settings | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    trusting: bool = False,
    counters: Any = None,
) -> Chain:
    """The chain of the tiers ``urls`` names (a comma-separated list, or its URLs as
    ``check_chain`` parsed them), configured from ``settings`` (timeout, largest value). A
    URL that cannot be used is dropped with one warning naming it (redacted) and why; a
    malformed timeout or size is a ValueError naming its variable, as for every other
    setting. ``trusting``: the store has trusted keys; without them a ``?trust=required``
    tier is dropped (it could serve nothing). ``counters``: the store that also keeps the
    tiers' counters (``Store.add_tier_counters``, summed across processes), held weakly."""
    cfg = Settings.from_env(environ) if settings is None else settings
    specs = [parse_tier_url(u) for u in split_chain(urls)] if isinstance(urls, str) else urls
    slots: list[_Slot] = []
    dropped: list[str] = []
    for spec in specs:
        shown = redact(spec.text)
        try:
            spec.checked()
            if spec.trust_required and not trusting:
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
            tier = _open_one(spec, shown, cfg, environ)
            # The one place a tier's mode is read: a read-only tier is one from here on.
            held = ReadOnlyTier(tier) if spec.read_only else tier
            slots.append(_Slot(held, spec.trust_required))
        except Exception as e:
            dropped.append(shown)
            log.warning(
                "xla_pcache: remote cache %s is not used (%s: %s); the other tiers and the "
                "local cache go on",
                shown,
                type(e).__name__,
                hide_url_secrets(objstore.scrub(str(e), environ), spec.text),
            )
    chain = Chain(slots, dropped=dropped)
    if counters is not None:
        chain.persist_counters(counters)
    return chain


def _open_one(spec: TierURL, shown: str, cfg: Settings, environ: Mapping[str, str]) -> Tier:
    """The tier of the kind ``spec``'s scheme names."""
    cap = cfg.remote_max_bytes
    if spec.scheme in REDIS_SCHEMES:
        tier = redis.RedisTier(
            spec.bare, timeout=cfg.remote_timeout, max_value_bytes=cap or DEFAULT_REMOTE_MAX_BYTES
        )
        tier.url = shown.split("?")[0]
        return tier
    if spec.scheme not in BUCKET_SCHEMES:
        known = ", ".join(f"{s}://" for s in (*REDIS_SCHEMES[:2], *BUCKET_SCHEMES))
        scheme = spec.scheme
        raise ValueError(f"unknown scheme {scheme + '://' if scheme else '(none)'}: use {known}")
    location, _ = objstore.parse_object_url(spec)
    return objstore.ObjectTier(
        location,
        display_url=location,
        timeout=cfg.remote_timeout,
        max_value_bytes=cap or objstore.DEFAULT_MAX_VALUE,
        environ=environ,
    )
