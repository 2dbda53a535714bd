"""One worker process of the reliability scenarios (a "process on a host").

Usage: ``python worker.py CONFIG.json``. The config names a ``role`` and the store to open;
the worker runs for a bounded time and writes its result as JSON to ``config["out"]``.
Every failure inside an operation is recorded, never raised, so the caller can show it.

Values self-identify: ``magic | seed | body length | key length | key | body`` where the
body is derived from the seed alone, so a reader can tell whether the bytes it got are
exactly a value some writer stored under that key (anything else is torn or wrong).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import struct
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from xla_pcache import Store

MAGIC = b"XPCT"
_HEAD = struct.Struct("<4sQIH")  # magic, seed, body length, key length


def make_value(key: str, seed: int, body_len: int) -> bytes:
    """The value a writer stores under ``key``: a header naming key and seed, then a body
    that only the seed determines."""
    k = key.encode()
    body = random.Random(seed).randbytes(body_len)
    return _HEAD.pack(MAGIC, seed, body_len, len(k)) + k + body


def check_value(key: str, data: bytes) -> str | None:
    """None if ``data`` is exactly a value written under ``key``; else what is wrong:
    ``"wrong: ..."`` (another key's value, or not ours at all) or ``"torn: ..."``."""
    if len(data) < _HEAD.size:
        return f"torn: {len(data)} bytes, shorter than the header"
    magic, seed, body_len, key_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        return f"wrong: bad magic {magic!r}"
    found = data[_HEAD.size : _HEAD.size + key_len]
    if found != key.encode():
        return f"wrong: value of key {found!r}"
    body = data[_HEAD.size + key_len :]
    if len(body) != body_len:
        return f"torn: body of {len(body)} bytes, header says {body_len}"
    if body != random.Random(seed).randbytes(body_len):
        return f"torn: body differs from seed {seed}"
    return None


def warning_kind(message: str) -> str:
    """A warning without its particulars: the words before the first path or number."""
    text = message.removeprefix("xla_pcache: ")
    return re.split(r"[/0-9(:]", text, maxsplit=1)[0].strip()


class LogCounter(logging.Handler):
    """Counts (and keeps the first few of) the warnings the store logs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: list[str] = []
        self.kinds: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        message = record.getMessage()
        self.kinds[warning_kind(message)] += 1
        if len(self.first) < 20:
            self.first.append(message)

    def __enter__(self) -> LogCounter:
        logging.getLogger("xla_pcache").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("xla_pcache").removeHandler(self)


def open_store(cfg: dict[str, Any]) -> Store:
    return Store(
        cfg["root"],
        max_size=cfg.get("max_size"),
        lock_mode=cfg.get("lock_mode", "auto"),
        lock_timeout=cfg.get("lock_timeout", 0.0),
        lease_time=cfg.get("lease_time", 30.0),
        hit_interval=cfg.get("hit_interval", 1.0),
        # Keep evicted and deleted entries in trash/ for the whole run: the test reads
        # trash/ afterwards to tell "chosen by an eviction or a delete" from "lost".
        trash_grace=3600.0,
    )


class Recorder:
    """What one worker saw, in a JSON-ready form."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.bad_reads: list[dict[str, Any]] = []
        self.exceptions: list[str] = []
        self.published: list[tuple[str, int]] = []
        self.deleted: list[str] = []
        self.evictions: list[dict[str, Any]] = []

    def exception(self, op: str) -> None:
        self.ops["exceptions"] += 1
        if len(self.exceptions) < 20:
            self.exceptions.append(f"{op}: {traceback.format_exc()}")

    def read(self, key: str, blob: Any) -> None:
        self.ops["gets"] += 1
        if blob is None:
            self.ops["misses"] += 1
            return
        self.ops["hits"] += 1
        problem = check_value(key, bytes(blob))
        if problem is not None:
            self.ops["torn" if problem.startswith("torn") else "wrong"] += 1
            if len(self.bad_reads) < 20:
                self.bad_reads.append({"key": key, "problem": problem})

    def timed_evict(self, store: Store, **kwargs: Any) -> None:
        t0 = time.monotonic()
        try:
            report = store.evict(**kwargs)
        except Exception:
            self.exception("evict")
            return
        t1 = time.monotonic()
        self.ops["evict_calls"] += 1
        if report.get("skipped"):
            self.ops["evict_skipped"] += 1
            return
        names = report.get("names")
        self.evictions.append(
            {
                "t0": t0,
                "t1": t1,
                "removed": report.get("removed"),
                "bytes": report.get("bytes"),
                "names": names if isinstance(names, list) else [],
            }
        )

    def result(self, store: Store | None, logs: LogCounter, **extra: Any) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        if store is not None:
            try:
                store.flush()
                stats = dict(store.stats())
            except Exception:
                self.exception("stats")
        return {
            "pid": os.getpid(),
            "ops": dict(self.ops),
            "bad_reads": self.bad_reads,
            "exceptions": self.exceptions,
            "published": self.published,
            "deleted": self.deleted,
            "evictions": self.evictions,
            "warnings": logs.count,
            "warning_kinds": dict(logs.kinds),
            "first_warnings": logs.first,
            "stats": stats,
            **extra,
        }


def run_mixed(cfg: dict[str, Any], rec: Recorder, store: Store) -> None:
    """Random puts, gets and deletes over a key space shared with the other workers."""
    rng = random.Random(cfg["seed"])
    deadline = time.monotonic() + cfg["duration"]
    keys = [f"k{i:04d}" for i in range(cfg["key_space"])]
    lo, hi = cfg["value_sizes"]
    n = 0
    while time.monotonic() < deadline:
        key = rng.choice(keys)
        r = rng.random()
        if r < cfg.get("get_share", 0.55):
            try:
                blob = store.get(key)
            except Exception:
                rec.exception("get")
                continue
            rec.read(key, blob)
        elif r < 1.0 - cfg.get("delete_share", 0.1):
            n += 1
            seed = (cfg["seed"] << 32) | n
            value = make_value(key, seed, rng.randint(lo, hi))
            try:
                stored = store.put(key, value)
            except Exception:
                rec.exception("put")
                continue
            rec.ops["puts"] += 1
            if stored:
                rec.ops["published"] += 1
                rec.published.append((key, seed))
            else:
                rec.ops["put_false"] += 1
        else:
            try:
                gone = store.delete(key)
            except Exception:
                rec.exception("delete")
                continue
            rec.ops["deletes"] += 1
            if gone:
                rec.deleted.append(key)


def run_evictor(cfg: dict[str, Any], rec: Recorder, store: Store) -> None:
    """Calls ``evict()`` (down to the budget's low watermark) again and again."""
    deadline = time.monotonic() + cfg["duration"]
    while time.monotonic() < deadline:
        rec.timed_evict(store)
        time.sleep(cfg.get("pause", 0.05))


def run_batch_evictor(cfg: dict[str, Any], rec: Recorder, store: Store) -> None:
    """Puts a batch of fresh entries, then evicts down to ``target`` bytes, in a loop: every
    evict() has work to do, so evictors on both hosts contend for the lock."""
    deadline = time.monotonic() + cfg["duration"]
    rng = random.Random(cfg["seed"])
    n = 0
    while time.monotonic() < deadline:
        for _ in range(cfg["batch"]):
            n += 1
            key = f"w{cfg['seed']}-{n}"
            try:
                if store.put(key, make_value(key, n, rng.randint(*cfg["value_sizes"]))):
                    rec.published.append((key, n))
            except Exception:
                rec.exception("put")
        rec.timed_evict(store, max_size=cfg["target"])


def run_evict_once(cfg: dict[str, Any], rec: Recorder, store: Store) -> None:
    """One eviction (down to ``target``); the test may kill the process while it runs."""
    print("evicting", flush=True)
    rec.timed_evict(store, max_size=cfg["target"])


ROLES = {
    "mixed": run_mixed,
    "evictor": run_evictor,
    "batch_evictor": run_batch_evictor,
    "evict_once": run_evict_once,
}


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    for name, value in cfg.get("env", {}).items():
        os.environ[name] = value
    rec = Recorder()
    store: Store | None = None
    with LogCounter() as logs:
        try:
            store = open_store(cfg)
            ROLES[cfg["role"]](cfg, rec, store)
        except Exception:
            rec.exception("worker")
        result = rec.result(store, logs, role=cfg["role"], host=cfg.get("host"))
    Path(cfg["out"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
