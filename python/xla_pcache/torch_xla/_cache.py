"""What ``install()`` set up in a process (``TorchXlaCache``): the store, the host mirror
torch_xla's directory is kept in step with, the background publish, and what torch_xla's
own counters say (hits the pool served, misses, whether this backend loads its entries).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from xla_pcache import explain, metrics
from xla_pcache import on_miss as _on_miss
from xla_pcache._text import package_logger
from xla_pcache.store import Store, StoreOptions
from xla_pcache.torch_xla import _keyparts as _txkeys
from xla_pcache.torch_xla._host_mirror import HostMirror, describe
from xla_pcache.torch_xla._runtime import device_type, torch_xla_counters, torch_xla_version

logger = package_logger("xla_pcache.torch_xla")

# The upstream report of torch_xla failing to load its own serialized executables back.
CANNOT_LOAD_ISSUE = "https://github.com/pytorch/xla/issues/9094"


@dataclass
class TorchXlaCache:
    """What ``install()`` set up in this process; ``sync()`` and ``stats()`` act on it."""

    store: Store
    mirror: HostMirror
    read_only: bool
    sync_interval: float | None
    # What its store was opened with (``store.settle``), for one opened in its place.
    options: StoreOptions
    pid: int = field(default_factory=os.getpid)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _capability: str = "unknown"
    _told: bool = False
    via: str = "install()"
    _closed: bool = False
    # Pool hits: names of store files torch_xla opened and not yet counted, and how many
    # of torch_xla's PersistentCacheHit have been counted in the store.
    _opened: set[str] = field(default_factory=set)
    _hits_counted: int = 0
    # How many of torch_xla's PersistentCacheMiss have been counted in the store (its
    # lookups are in the view, which the store never sees), and reported by on_miss.
    _misses_counted: int = 0
    _misses_reported: int = 0
    _reported_names: set[str] = field(default_factory=set)
    on_miss: str = "compile"
    max_size: int | None = None
    # The read-only setting torch_xla's cache was created with (fixed for the process).
    _torch_read_only: bool = False

    def _start_thread(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="xla_pcache-torch_xla-sync", daemon=True
        )
        self._thread.start()

    @property
    def local_dir(self) -> str | None:
        """The directory torch_xla reads and writes in this process."""
        return self.mirror.view

    def sync(self, *, final: bool = False) -> dict[str, Any]:
        """Publish every complete file torch_xla wrote, check what the backend can load."""
        if os.getpid() != self.pid:
            return {}  # a forked child: its parent owns the view and the store handle
        with self._lock:
            if self._closed:
                return self.stats()
            self.mirror.publish(final=final)
            counts = self._check_capability()
            if counts is not None:
                self._count_pool_hits(counts["PersistentCacheHit"])
                self._count_misses(counts["PersistentCacheMiss"])
            return self.stats()

    def _count_misses(self, misses: int) -> None:
        """Count in the store the misses torch_xla had in the view, so that ``xla-pcache
        stats`` shows them beside the hits (the store never saw those lookups)."""
        if misses <= self._misses_counted:
            return
        try:
            self.store.count_misses(misses - self._misses_counted)
        except Exception as exc:
            self.mirror.warn("counting torch_xla's misses", exc)
        self._misses_counted = misses

    def after_step(self) -> None:
        """``XLA_PCACHE_ON_MISS`` at the end of a step: the graphs it missed (compiled, and
        already written to the view by torch_xla) are warned about, or fail the step."""
        if os.getpid() != self.pid or self.on_miss == "compile" or self._closed:
            return
        try:
            misses = torch_xla_counters()["PersistentCacheMiss"]
        except Exception as exc:
            self.mirror.warn("reading torch_xla's counters", exc)
            return
        new = misses - self._misses_reported
        if new <= 0:
            return
        self._misses_reported = misses
        names = sorted(self.mirror.written_names() - self._reported_names)[:new]
        self._reported_names.update(names)
        programs = names + ["(not yet written)"] * (new - len(names))
        for name in programs:
            _on_miss.handle(
                self.on_miss,
                self.store,
                self.mirror.key(name),
                program=f"graph {name}",
                framework="torch_xla",
                parts=_txkeys.components(),
            )

    def refresh(self) -> None:
        """Bring the host's copy up to date with the store (for later processes)."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            if not self._closed:
                self.mirror.refresh_pool()

    def stats(self) -> dict[str, Any]:
        return {
            "store": self.store.path,
            "read_only": self.read_only,
            "capability": self._capability,
            **describe(self.mirror),
        }

    def close(self) -> None:
        """Final publish, then remove this process's view. Runs at exit on its own."""
        if os.getpid() != self.pid:
            return
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self.sync(final=True)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.mirror.close_view()
            _summarize(self)
            try:
                self.store.close()
            except Exception as exc:
                self.mirror.warn("closing the store", exc)

    def _count_pool_hits(self, hits: int) -> None:
        """Record in the store the hits the host-local pool served (torch_xla loaded them
        from the view, the store never saw a read), so that ``xla-pcache stats`` counts them
        and eviction sees those entries as used. Each is one ``get`` of the entry, at most
        as many as torch_xla counted hits."""
        self._opened |= self.mirror.opened_links()
        if self.store.read_only:
            return  # a read-only store records nothing
        while self._opened and self._hits_counted < hits:
            name = self._opened.pop()
            self._hits_counted += 1
            try:
                self.store.get(self.mirror.key(name))
            except Exception as exc:
                self.mirror.warn("counting a hit served from the host-local copy", exc)

    def _check_capability(self) -> dict[str, int] | None:
        try:
            counts = torch_xla_counters()
        except Exception as exc:
            self.mirror.warn("reading torch_xla's counters", exc)
            return None
        if counts["PersistentCacheHit"]:
            self._capability = "loads"
        elif counts["PersistentCacheDeserializeFailure"] and self._capability != "loads":
            self._capability = "cannot-load"
            if not self._told:
                self._told = True
                logger.warning(
                    "xla_pcache: torch_xla on this backend (%s) writes compiled programs but "
                    "cannot load them back (PersistentCacheDeserializeFailure=%d): this "
                    "process, and every later one on this backend, recompiles every graph. "
                    "The cache still keeps the entries, for backends that can load them "
                    "(torch_xla %s; upstream report: %s).",
                    device_type(),
                    counts["PersistentCacheDeserializeFailure"],
                    torch_xla_version(),
                    CANNOT_LOAD_ISSUE,
                )
        return counts

    def _run(self) -> None:
        assert self.sync_interval is not None
        rounds = 0
        while not self._stop.wait(self.sync_interval):
            rounds += 1
            try:
                self.sync()
                # Entries other hosts publish meanwhile reach this host's copy for the next
                # process (never this one's view: see the docs on late additions).
                if rounds % 10 == 0:
                    self.refresh()
            except Exception as exc:  # never let the thread die loudly
                self.mirror.warn("the background sync", exc)


def _summarize(inst: TorchXlaCache) -> None:
    """At close: the process's INFO summary; a read-only one also says why it missed."""
    try:
        counts = torch_xla_counters()
    except Exception:
        return
    misses = counts["PersistentCacheMiss"]
    explaining = logging.getLogger("xla_pcache.explain").isEnabledFor(logging.INFO)
    if inst.read_only and misses > 0 and explaining:
        # A read-only process cannot log its misses: it says once, at exit, how its
        # environment differs from the nearest torch_xla entry's (INFO).
        try:
            key = f"{_txkeys.MODULE}/process-{os.getpid()}"
            explain.record_miss(inst.store, key, _txkeys.components(), "torch_xla")
        except Exception as exc:
            logger.debug("xla_pcache: explaining torch_xla's misses failed: %s", exc)
    try:
        metrics.log_summary(inst.store, hits=counts["PersistentCacheHit"], misses=misses)
    except Exception as exc:
        logger.debug("xla_pcache: no exit summary: %s", exc)
