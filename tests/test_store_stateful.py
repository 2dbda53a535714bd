"""`Store` against a model, under Hypothesis: random sequences of put, get, contains, delete,
evict, clear and reopen, each made by this process or by a second one working on the same
directory (a long-lived worker speaking JSON lines), checked against what the model allows.

The model keeps, for each key, the set of values a get may return (None: a miss). Without a
budget it is exact: first writer wins, a put of a present key returns False and changes
nothing, a put or delete by either process is seen at once by the other. With a budget, any
put or explicit evict may remove any entry (the put's own key too, before it publishes), so
a miss becomes possible for every key; a hit must still return exactly the bytes put. Never
wrong bytes, in either process.

CI runs a small number of examples; XLA_PCACHE_STATEFUL_EXAMPLES and
XLA_PCACHE_STATEFUL_STEPS make a bigger run (past pytest's 600 s timeout: pass --timeout), e.g.

    XLA_PCACHE_STATEFUL_EXAMPLES=2500 XLA_PCACHE_STATEFUL_STEPS=50 \
        python -m pytest -s --timeout=2400 tests/test_store_stateful.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from xla_pcache import Store

WORKERS = str(Path(__file__).with_name("workers.py"))
EXAMPLES = int(os.environ.get("XLA_PCACHE_STATEFUL_EXAMPLES", "40"))
STEPS = int(os.environ.get("XLA_PCACHE_STATEFUL_STEPS", "30"))

Key = str | bytes
KEYS: list[Key] = ["a", "b", "jit_f-0123", "é ü", "x" * 300, b"\x00bin", b"\xff\xfe raw"]
# Three of the largest values go over this budget (each takes 5 blocks of 4 KiB on disk).
BUDGET = 48 << 10
SIZES = [0, 1, 100, 3000, 9000, 20000]

values = st.builds(
    lambda head, n: head + bytes([len(head)]) * n, st.binary(max_size=12), st.sampled_from(SIZES)
)
who = st.sampled_from(["here", "other"])
keys = st.sampled_from(KEYS)


def _wire(key: Key) -> dict[str, str]:
    return {"s": key} if isinstance(key, str) else {"b": key.hex()}


class Worker:
    """The second process: `workers.py serve`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, WORKERS, "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, op: str, **args: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"worker exited (status {self.proc.poll()})"
        reply = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply["r"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class StoreMachine(RuleBasedStateMachine):
    worker: ClassVar[Worker]
    cleaner: ClassVar[ThreadPoolExecutor]
    base: ClassVar[Path]
    seen: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(dir=self.base)
        self.path = os.path.join(self.dir, "cache")
        self.budget: int | None = None
        self.store: Store | None = None
        # key -> the values a get may return now (None: a miss).
        self.possible: dict[Key, set[bytes | None]] = {k: {None} for k in KEYS}
        # key -> which process published the value present, to count cross-process hits.
        self.writer: dict[Key, str] = {}

    def _open(self) -> Store:
        return Store(self.path, max_size=self.budget, lock_timeout=0.05)

    @initialize(
        budget=st.sampled_from([None, BUDGET]),
        first=st.lists(st.tuples(who, keys, values), max_size=4),
    )
    def open_both(self, budget: int | None, first: list[tuple[str, Key, bytes]]) -> None:
        self.budget = budget
        self.store = self._open()
        self.worker.call("open", path=self.path, max_size=budget)
        self.seen["bounded" if budget else "unbounded"] += 1
        # A few entries to start from: the rules are drawn in a skewed mix (swarm testing),
        # and a store that is never filled tests little.
        for by, key, value in first:
            self.put(by, key, value)
            # Seen by the other process at once (checked against the model like any get).
            self.get("other" if by == "here" else "here", key)

    def _filled(self) -> bool:
        return any(v != {None} for v in self.possible.values())

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        self.worker.call("close")
        # Removing a store's 260-odd directories can take most of a second on a busy disk:
        # done on the side, waited for at the end of the test.
        self.cleaner.submit(shutil.rmtree, self.dir, ignore_errors=True)

    @property
    def here(self) -> Store:
        assert self.store is not None
        return self.store

    def _maybe_evicted(self) -> None:
        for values_now in self.possible.values():
            values_now.add(None)

    @rule(by=who, key=keys, value=values)
    def put(self, by: str, key: Key, value: bytes) -> None:
        self.seen["put calls"] += 1
        if by == "here":
            stored = self.here.put(key, value)
        else:
            stored = self.worker.call("put", key=_wire(key), value=value.hex())
        before = self.possible[key]
        if self.budget is not None:
            # Admission may evict anything, this key included, before publishing.
            self._maybe_evicted()
        elif stored:
            assert None in before, f"put of a present key {key!r} returned True"
        else:
            # First writer wins: False says the key is there (unbounded, nothing refuses).
            assert before != {None}, f"put of an absent key {key!r} (unbounded) returned False"
            before.discard(None)
        if stored:
            self.possible[key] = {value}
            self.writer[key] = by
            self.seen["puts stored"] += 1

    @rule(by=who, key=keys)
    def get(self, by: str, key: Key) -> None:
        self.seen["get calls"] += 1
        if by == "here":
            blob = self.here.get(key)
            got = None if blob is None else bytes(blob)
        else:
            reply = self.worker.call("get", key=_wire(key))
            got = None if reply is None else bytes.fromhex(reply)
        allowed = self.possible[key]
        assert got in allowed, (
            f"get {key!r} by {by}: {None if got is None else len(got)} bytes, "
            f"allowed {[None if v is None else len(v) for v in allowed]}"
        )
        self.possible[key] = {got}
        if got is None:
            self.seen["misses"] += 1
        else:
            self.seen["hits, same process" if self.writer.get(key) == by else "hits, other"] += 1

    @rule(by=who, key=keys)
    def contains(self, by: str, key: Key) -> None:
        self.seen["contains calls"] += 1
        present = key in self.here if by == "here" else self.worker.call("contains", key=_wire(key))
        if present:
            assert self.possible[key] != {None}, f"{key!r} in store, but deleted or never put"
            self.possible[key].discard(None)
        else:
            assert None in self.possible[key], f"{key!r} missing, but nothing could remove it"
            self.possible[key] = {None}

    @rule(by=who, key=keys)
    def delete(self, by: str, key: Key) -> None:
        self.seen["delete calls"] += 1
        if by == "here":
            removed = self.here.delete(key)
        else:
            removed = self.worker.call("delete", key=_wire(key))
        if removed:
            assert self.possible[key] != {None}, f"delete {key!r} removed something absent"
        else:
            assert None in self.possible[key], f"delete {key!r} found nothing, but it is present"
        self.possible[key] = {None}

    @precondition(lambda self: self._filled())
    @rule(size=st.sampled_from([0, 4 << 10, 16 << 10, "32K", None]))
    def evict(self, size: int | str | None) -> None:
        target = size
        if target is None and self.budget is None:
            target = 0  # an unbounded store has no default target
        result = self.here.evict(max_size=target)
        # Skipped only if another process held the evictor's lock (the worker is idle here).
        assert not result["skipped"], result
        if target == 0:
            for key in KEYS:
                self.possible[key] = {None}
        else:
            self._maybe_evicted()
        self.seen["evicts"] += 1

    @precondition(lambda self: self._filled())
    @rule()
    def clear(self) -> None:
        removed = self.here.clear()
        certain = sum(None not in v for v in self.possible.values())
        maybe = sum(v != {None} for v in self.possible.values())
        assert certain <= removed <= maybe, (certain, removed, maybe)
        for key in KEYS:
            self.possible[key] = {None}
        self.seen["clears"] += 1

    @rule(by=who)
    def reopen(self, by: str) -> None:
        if by == "here":
            self.here.close()
            self.store = self._open()
        else:
            self.worker.call("open", path=self.path, max_size=self.budget)
        self.seen["reopens"] += 1


def test_store_against_a_model(tmp_path: Path) -> None:
    worker = Worker()
    StoreMachine.worker = worker
    StoreMachine.cleaner = ThreadPoolExecutor(max_workers=1)
    StoreMachine.base = tmp_path
    StoreMachine.seen.clear()
    try:
        run_state_machine_as_test(
            StoreMachine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        worker.close()
        StoreMachine.cleaner.shutdown(wait=True)
    seen = dict(StoreMachine.seen)
    print(f"stateful: {EXAMPLES} examples x up to {STEPS} steps: {seen}")
    # The run covered what it is for: both budgets, and hits on the other process's puts.
    assert seen.get("bounded") and seen.get("unbounded"), seen
    assert seen.get("hits, other"), seen
