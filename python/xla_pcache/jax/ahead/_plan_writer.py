"""JAX: what a run read, and its plan written when that differs from what is stored.

The session (``_prefetch``) hands over each read (key, serialized compile options, device
ids) in order; the first ``_plan.MAX_ENTRIES`` keys are kept. Once the plan and the backend
are known (``bind``), the run is compared with the plan's variants of its platform and
device count: while one of them holds every key read so far, there is nothing to write, and
nothing is. Otherwise (a program the plan does not know, a changed one, or no plan yet) the
plan is written after ``QUIET_S`` without reads and at exit, with only the keys the store
holds (a miss JAX did not put, below its thresholds, is not worth loading ahead): the run's
variant joins the others (``_plan.merged``).

A run whose reads a variant holds can still keep a variant of its own, decided at its whole
end only (``close(whole=True)``: the process exits, and not by an exception, ``run_failed``):
when most of what the variants holding its reads all hold, which is what recognition loads
for it, was never asked for (``_plan.wants_own``: a program whose reads are a subset of
another's, or the victim of a planted variant). Its next run is then loaded only what both
hold. Never at a quiet spell, nor after a crash or Ctrl-C: a run stopped early reads a
prefix of its program, and a variant of that prefix would make every whole run of the
program load only the prefix before its reads tell it apart.

A run's variant is written whole, once: while a key it read is not stored yet (its program
is still compiling, which takes far longer than ``QUIET_S`` for a large one), a write after
quiet waits for it (``PENDING_S`` at most, for a miss JAX never puts: one below its
thresholds), so that a cold run writes its plan once after its last compile rather than
once per long compile. The write at exit takes what is stored then.

Before writing, the plan is read again: a variant another process wrote meanwhile that holds
this run's keys (the processes of one job read the same programs) leaves nothing to write.
A try that finds nothing new to write writes nothing; ``FRUITLESS_WRITES`` such tries in a
row leave it to the exit. A read-only process writes
none, nor does a bucket path's host that writes nothing to the bucket (``enabled``).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable

from xla_pcache import _testhook, build_key
from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax.ahead import _plan
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")

# Seconds without a read before a changed plan is written (and again at exit); tries in a
# row that find nothing new to write before only the exit's is left.
QUIET_S = 5.0
FRUITLESS_WRITES = 3
# How long a key read and not stored keeps a write after quiet waiting for its compile.
PENDING_S = 600.0


def run_failed() -> bool:
    """Whether the program ended by an exception Python saw: one that left the main module
    (a crash, Ctrl-C), or the last one a notebook's cell or a test raised (IPython and
    pytest keep it there too)."""
    return (
        getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None
    )


class PlanWriter:
    """What one session's run read, and the writing of its plan."""

    def __init__(
        self,
        store: Store,
        *,
        enabled: bool,
        warn: FirstWarning,
        count: Callable[[list[tuple[str, int]]], None],
    ) -> None:
        self._store = store
        self.enabled = enabled
        self._warn = warn
        self._count = count
        self._lock = threading.Lock()
        # Where the plan lives and what it is for (``bind``).
        self._key: str | None = None
        self._workload = ""
        # The runtime build the executables' keys carry (``build_key``), None for none.
        self._build: str | None = None
        self._platform = ""
        self._devices = 0
        # What this process read, in order (its variant).
        self._seen: dict[str, _plan.Entry] = {}
        # When each was first read (``time.monotonic``): a miss's compile is under way.
        self._read_at: dict[str, float] = {}
        # The stored variants of this platform, as key sets; None until bound. ``_holding``:
        # those that hold every key read so far.
        self._known: list[frozenset[str]] | None = None
        self._holding: list[frozenset[str]] = []
        self._dirty = False
        # Keys compiled ahead for nothing by this run: left out of the plan it writes.
        self._unread: frozenset[str] = frozenset()
        self._last_read = time.monotonic()
        self._last_write = 0.0
        self._postponed = 0.0
        self._fruitless = 0

    # -------------------------------------------------------------- what the run read

    def bind(
        self,
        key: str,
        workload: str,
        build: str | None,
        plan: _plan.Plan | None,
        platform: str,
        device_count: int,
    ) -> None:
        """The plan in use (or None), the runtime ``build`` (its digest) and the backend's
        platform: from now on a read that no stored variant holds makes the plan due."""
        with self._lock:
            self._key, self._workload, self._build = key, workload, build
            self._platform, self._devices = platform, device_count
            self._use(plan)

    def _use(self, plan: _plan.Plan | None) -> None:
        """Compare the run so far with ``plan`` (under the lock)."""
        variants = plan.on(self._platform, self._devices) if plan is not None else ()
        self._known = [v.keys() for v in variants]
        self._holding = [k for k in self._known if all(s in k for s in self._seen)]
        self._dirty = self.enabled and bool(self._seen) and not self._holding

    def read(self, entry: _plan.Entry) -> None:
        with self._lock:
            self._last_read = time.monotonic()
            if entry.key in self._seen or len(self._seen) >= _plan.MAX_ENTRIES:
                return
            self._seen[entry.key] = entry
            self._read_at[entry.key] = self._last_read
            self._fruitless = 0
            if self._known is not None:
                self._holding = [k for k in self._holding if entry.key in k]
                if not self._holding and self.enabled:
                    self._dirty = True

    def measured(self, key: str, *, size: int | None = None, read_us: int | None = None) -> None:
        """What this run measured of ``key`` after reading it (``_plan.Entry``'s ``size``,
        ``read_us``), kept with the read for the plan."""
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None:
                self._seen[key] = dataclasses.replace(
                    entry,
                    size=entry.size if size is None else size,
                    read_us=entry.read_us if read_us is None else read_us,
                )

    def due(self) -> float | None:
        """When (``time.monotonic``) the plan is next due to be written, or None."""
        with self._lock:
            if not self._dirty or self._key is None or self._fruitless >= FRUITLESS_WRITES:
                return None
            return max(self._last_read, self._last_write, self._postponed) + QUIET_S

    @property
    def dirty(self) -> bool:
        with self._lock:
            return self._dirty

    def report(self) -> dict[str, object]:
        with self._lock:
            return {"seen": len(self._seen), "plan_due": self._dirty}

    def unread(self, keys: frozenset[str]) -> None:
        """Keys of the plan this run compiled ahead and never read, though it read keys the
        plan names after them: the plan is due, without them."""
        with self._lock:
            if not self.enabled or self._known is None:
                return
            self._unread = keys
            if any(keys & known for known in self._known):
                self._dirty = True

    def keys_read(self) -> list[str]:
        """The keys this run read, in order (the first ``_plan.MAX_ENTRIES``)."""
        with self._lock:
            return list(self._seen)

    def close(self, *, whole: bool = False) -> None:
        """At the session's end: the plan written if it changed, or at the run's ``whole``
        end if the run keeps a variant of its own (``_plan.wants_own``); else, when this run
        read a key one of its variants holds, a use of it recorded (``Store.touch``): a plan
        that settled is never written again, and would otherwise be the first entry evicted,
        before the executables it names. A read-only store records no use."""
        with self._lock:
            own = (
                whole
                and self.enabled
                and not self._dirty
                and _plan.wants_own(self._holding, frozenset(self._seen))
            )
        if self.dirty or own:
            self.write(final=True, own=whole)
            return
        with self._lock:
            key = self._key
            used = self._known is not None and any(
                k in known for known in self._known for k in self._seen
            )
        if key is None or not used:
            return
        try:
            self._store.touch(key)
        except Exception as exc:
            logger.debug("xla_pcache: recording a use of the plan failed: %s", exc)

    # -------------------------------------------------------------- writing

    def _fetch(self) -> _plan.Plan | None:
        """The plan as stored now (None: none, or not a plan: it is written over)."""
        assert self._key is not None
        blob = self._store.get(self._key, count=False)
        if blob is None:
            return None
        try:
            return _plan.decode(memoryview(blob))
        except _plan.PlanError:
            return None

    def write(self, *, final: bool = False, own: bool = False) -> None:
        """Write what this process read as a variant of the plan, unless a stored variant
        holds it already (and, with ``own``, the run does not keep a variant of its own).
        Unless ``final`` (the exit's), a write waits while a program read recently is still
        compiling."""
        with self._lock:
            if not (self._dirty or own) or self._key is None:
                return
            now = time.monotonic()
            self._last_write = now
            seen = list(self._seen.values())
            read_at = dict(self._read_at)
            platform, devices = self._platform, self._devices
        _testhook.reached("plan-write")
        store = self._store
        try:
            # Only what the store holds: a miss JAX did not put (below its thresholds) is
            # not worth loading ahead.
            stored = {e.key for e in seen if build_key.join(e.key, self._build) in store}
            compiling = any(e.key not in stored and now - read_at[e.key] < PENDING_S for e in seen)
            if compiling and not final:
                with self._lock:
                    self._postponed = now
                return
            current = self._fetch()
            with self._lock:
                unread = self._unread
            trimmed = False
            if current is not None and unread:
                kept = _plan.without(current, unread, platform, devices)
                trimmed, current = kept != current, kept
            entries = _plan.carried(tuple(e for e in seen if e.key in stored), current)
            variant = _plan.bounded(_plan.Variant(time.time(), platform, devices, entries))
            wrote = False
            plan = current
            # A fleet that starts one job at once reads the same programs in every process:
            # the first to write says it for all, the others write nothing.
            held = _plan.holding(current, variant)
            if (
                variant.entries
                and self.enabled
                and _plan.valid_platform(platform, devices)
                and (trimmed or not held or (own and _plan.wants_own(held, variant.keys())))
            ):
                plan = _plan.merged(current, variant)
                data = _plan.encode(plan)
                meta = {"kind": _plan.META_KIND, "framework": "jax", "workload": self._workload}
                wrote = store.replace(self._key, data, meta=meta)
                if wrote:
                    self._count([("plans_written", 1)])
                else:
                    plan = current
            with self._lock:
                self._use(plan)
                # Reads not stored (yet, or ever) keep it due: a few more tries after quiet
                # spells, and the one at exit.
                self._fruitless = 0 if wrote else self._fruitless + 1
        except Exception as exc:
            self._warn("writing the plan", self._key, exc)
