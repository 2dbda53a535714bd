"""JAX: loading ahead, the session's loading pool: the queue of planned executables and its
order (``_schedule``), and the threads that fetch and deserialize them (``_loads``).

The loading threads hold the GIL as little as they can (the main thread traces and lowers
meanwhile, holding it): a thread is woken only when there is work for it (``_jobs``), the
options' digest is worked out once per option set (``_loads.Normalizer``), and the store's
read, the decompression and XLA's deserialize release it.
"""

from __future__ import annotations

import bisect
import threading
import time

from xla_pcache import build_key
from xla_pcache._text import package_logger
from xla_pcache.jax.ahead import _loads, _schedule
from xla_pcache.jax.ahead._handover import Handover
from xla_pcache.jax.ahead._loads import EntryUnusable, Slot, State
from xla_pcache.jax.ahead._session_state import loading_order

logger = package_logger("xla_pcache.jax")

# What a deserialize is taken to cost per stored byte before this process finished one (a
# TPU's take about a tenth of this, a CPU's about as much): only the first threads' first
# loads follow it; the order is worked out again as deserializes finish (after the 1st,
# 2nd, 4th, 8th, ...).
_PRIOR_S_PER_BYTE = 1e-6


class Pool(Handover):
    """The slots' queues and the threads that work on them (all under the session's lock
    but the fetch and the deserialize)."""

    def _enqueue(self) -> set[str]:
        """Queue what the candidates all hold and is not queued yet, and order the queue as
        the reference's list; the keys newly queued."""
        if self._recog is None or self._ended or self._closed:
            return set()
        new: set[str] = set()
        for entry in self._recog.wanted():
            if entry.key in self._slots or entry.key in self._passed:
                continue
            slot = Slot(entry)
            self._slots[entry.key] = slot
            self._queue.append(slot)
            new.add(entry.key)
        if new:
            self._order = self._recog.order()
            self._reschedule()
            self._count([("planned", len(new))])
            alive = sum(1 for w in self._workers if w.is_alive())
            for _ in range(min(self._threads, len(self._slots)) - alive):
                worker = threading.Thread(
                    target=self._work,
                    name=f"xla_pcache-prefetch-{len(self._workers)}",
                    daemon=True,
                )
                self._workers.append(worker)
                worker.start()
            self._jobs.notify(len(new))
        return new

    def _reschedule(self) -> None:
        """Order what is still to load (``_schedule``): each slot's need is when the
        recorded run read it, less the clock now; its cost what deserializes of its size
        take here (before any finished, ``_PRIOR_S_PER_BYTE``); the threads still
        deserializing are busy for what is left of theirs."""
        pending = [s for s in (*self._queue, *self._fetched) if not s.urgent]
        self._ordered_at = self._costs.samples
        if not pending:
            return
        now_s = self._clock.time(time.perf_counter())
        position = self._order

        def cost(size: int | None) -> float | None:
            if self._costs.samples:
                return self._costs.predict(size)
            return None if size is None else size * _PRIOR_S_PER_BYTE

        ordered = sorted(pending, key=lambda s: position.get(s.entry.key, len(position)))
        needs = [None if s.entry.at_us is None else s.entry.at_us / 1e6 - now_s for s in ordered]
        busy = []
        now = time.perf_counter()
        for s in self._slots.values():
            if s.state is State.LOADING and s.started_at:
                left = (cost(s.size) or 0.0) - (now - s.started_at)
                busy.append(max(0.0, left))
        ranks = _schedule.order(needs, [cost(s.size) for s in ordered], self._loads, busy)
        for rank, i in enumerate(ranks):
            ordered[i].rank = rank
        self._queue.sort(key=loading_order)
        self._fetched.sort(key=loading_order)

    def _drop(self, slots: list[Slot]) -> None:
        """Let go of those of ``slots`` not started or only fetched (not counted wasted:
        never loaded); one being fetched is let go when it is."""
        for slot in slots:
            slot.dropped = True
            if slot.state is State.QUEUED:
                self._queue.remove(slot)
                slot.state = State.SKIPPED
            elif slot.state is State.COMPILING and self.ahead is not None:
                if self.ahead.cancel(slot.entry.key) != "compiling":
                    slot.state = State.SKIPPED
            elif slot.state is State.FETCHED:
                self._fetched.remove(slot)
                self._release(slot, State.SKIPPED)

    def _job(self, pop: bool) -> tuple[Slot, bool] | None:
        """The next slot to work on and whether to fetch it (else deserialize it): the first
        in the order of those fetched (once the backend is up) and of those to fetch (while
        the memory bound allows, or asked for)."""
        ready = self._applied and self._backend is not None
        load = self._fetched[0] if ready and self._fetched else None
        if load is not None and not (load.urgent or self._deserializing < self._loads):
            load = None
        fetch = self._queue[0] if self._queue else None
        if fetch is not None and not (fetch.urgent or self._in_flight < self._memory):
            fetch = None
        if load is not None and (fetch is None or loading_order(load) <= loading_order(fetch)):
            return (self._fetched.pop(0) if pop else load), False
        if fetch is not None:
            return (self._queue.pop(0) if pop else fetch), True
        return None

    def _release(self, slot: Slot, state: State = State.RELEASED) -> None:
        """Drop what ``slot`` holds."""
        freed = slot.nbytes
        self._in_flight -= freed
        slot.nbytes = 0
        slot.executable = slot.blob = slot.time = slot.serialized = None
        slot.state = state
        self._cond.notify_all()
        if freed and self._queue:
            self._jobs.notify()

    def _end_queue(self) -> None:
        """Load nothing more."""
        self._ended = True
        self._drop([s for s in self._slots.values() if s.state is State.FETCHED])
        for slot in self._queue:
            slot.state = State.SKIPPED
        self._queue.clear()
        self._cond.notify_all()
        self._jobs.notify_all()

    def _work(self) -> None:
        self._meter.loader()
        while True:
            with self._jobs:
                self._jobs.wait_for(lambda: self._closed or self._job(False) is not None)
                if self._closed:
                    return
                job = self._job(True)
                assert job is not None
                slot, fetch = job
                slot.state = State.FETCHING if fetch else State.LOADING
                self._deserializing += not fetch
                self._busy += 1
                if self._job(False) is not None:
                    self._jobs.notify()  # more work than this thread: the next one
            loading = not fetch
            try:
                if fetch and not self._fetch(slot):
                    continue
                loading = True
                self._deserialize(slot)
            except EntryUnusable as exc:
                # The entry's own bytes: JAX's read of the key meets them and says so itself.
                logger.debug("xla_pcache: %r is not loaded ahead: %s", slot.entry.key, exc)
                self._failed(slot)
            except Exception as exc:
                self._warn("loading", slot.entry.key, exc)
                self._failed(slot)
            finally:
                with self._cond:
                    self._busy -= 1
                    if loading:
                        self._deserializing -= 1
                        if self._fetched:
                            self._jobs.notify()
                    if self._busy == 0:
                        self._cond.notify_all()

    def _failed(self, slot: Slot) -> None:
        with self._cond:
            self._release(slot, State.FAILED)
        self._count([("errors", 1)])

    def _fetch(self, slot: Slot) -> bool:
        """Read and decompress ``slot``'s entry (no backend needed; off the lock): whether
        this thread deserializes it now (the backend is up, and nothing fetched comes
        before it), else it waits among the fetched, or is let go."""
        with self._meter.fetching(slot.steps):
            key = build_key.join(slot.entry.key, self._own_build)
            got = _loads.fetch(slot.entry, self.store, key, self._cc, self._normal)
        if got is None:
            # Compiled ahead from its record when it has one; its read waits for that, or
            # goes JAX's way.
            with self._cond:
                slot.state = State.COMPILING if self.ahead is not None else State.MISSING
                self._cond.notify_all()
            if not self._entry_absent(slot):
                with self._cond:
                    if slot.state is State.COMPILING:
                        slot.state = State.MISSING
                    self._cond.notify_all()
            self._idle_check()
            return False
        with self._cond:
            if self._closed:
                slot.state = State.RELEASED
                self._cond.notify_all()
                return False
            slot.serialized, slot.time, slot.blob = got.serialized, got.compile_time, got.blob
            slot.options = got.options
            slot.nbytes = len(got.serialized)
            slot.size = len(got.blob)
            self._in_flight += slot.nbytes
            if self._ended or slot.dropped:
                self._release(slot, State.SKIPPED)
                return False
            ready = self._applied and self._backend is not None
            if (
                ready
                and (slot.urgent or self._deserializing < self._loads)
                and not (self._fetched and loading_order(self._fetched[0]) < loading_order(slot))
            ):
                slot.state = State.LOADING
                self._deserializing += 1
                return True
            slot.state = State.FETCHED
            bisect.insort(self._fetched, slot, key=loading_order)
            if ready:
                self._jobs.notify()
        return False

    def _deserialize(self, slot: Slot) -> None:
        """Deserialize ``slot``'s fetched executable with the backend (off the lock)."""
        slot.started_at = time.perf_counter()
        with self._meter.deserializing(slot.steps):
            executable = _loads.deserialize(slot, self._backend, self._form)
        with self._cond:
            if not (slot.compiled and self._puts_ahead()):
                slot.serialized = None  # one compiled ahead is put once taken
            if self._closed:
                self._release(slot)
                return
            slot.executable = executable
            slot.loaded_at = time.perf_counter()
            slot.state = State.LOADED
            self._costs.add(slot.size, slot.steps.load_wall)
            if self._costs.samples >= 2 * self._ordered_at or self._costs.samples == 1:
                self._reschedule()
            self._cond.notify_all()
        if not slot.compiled:
            self._count([("loaded", 1)])
