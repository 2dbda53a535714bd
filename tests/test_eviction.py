"""Budgets, LRU eviction, locks and crash safety, with real processes."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from xla_pcache import Store, entry_name

from tests.helpers import read_only_copy, tree_state
from tests.workers import value_for

WORKERS = str(Path(__file__).with_name("workers.py"))


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in (root / "entries").glob("*/*") if p.is_file())


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, WORKERS, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "ready", (line, p.stderr.read() if p.stderr else "")


def kill(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    for stream in (p.stdout, p.stderr):
        if stream is not None:
            stream.close()


def journal_deletes(root: Path) -> set[str]:
    """Names (hex) of every entry a journal records as deleted."""
    names = set()
    for j in (root / "journal").glob("*.log"):
        data = j.read_bytes()
        at = 0
        while at + 4 <= len(data) and data[at] == 0xA5:
            kind, length = data[at + 1], struct.unpack_from("<H", data, at + 2)[0]
            if at + 4 + length + 8 > len(data):
                break
            if kind == 3:
                names.add(f"{int.from_bytes(data[at + 4 : at + 20], 'little'):032x}")
            at += 4 + length + 8
    return names


# ---------------------------------------------------------------- budget


def test_put_past_budget_evicts_oldest(cache_dir: Path) -> None:
    store = Store(cache_dir, max_size="1M")
    for i in range(40):
        assert store.put(f"k{i}", os.urandom(100_000))
    assert disk_bytes(cache_dir) <= 1 << 20
    assert store.get("k39") is not None, "the newest entry survives"
    assert store.get("k0") is None, "the oldest entry was evicted"
    s = store.stats()
    assert s["evictions"] > 0 and s["bytes"] <= s["max_size"]


def test_value_larger_than_budget_is_not_stored(cache_dir: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    store = Store(cache_dir, max_size=10_000)
    with caplog.at_level("WARNING", logger="xla_pcache"):
        assert store.put("huge", b"x" * 20_000) is False
    assert "larger than the cache budget" in caplog.text
    assert store.get("huge") is None
    assert store.stats()["too_large"] == 1


def test_explicit_evict_and_older_than(tmp_path: Path) -> None:
    # `older_than` is about time, but the test judges by order: the old entries' last use
    # came before `window` elapsed, the fresh one's after the cutoff. A run on a machine so
    # loaded that the evict did not start within `window` of the fresh put proves nothing
    # and is done again with a wider window, never judged.
    for attempt, window in enumerate((0.2, 1.0, 5.0)):
        cache_dir = tmp_path / f"cache-{attempt}"
        store = Store(cache_dir)
        for i in range(10):
            store.put(f"k{i}", b"v" * 10_000)
        r = store.evict(max_size=50_000)
        assert r["removed"] >= 5 and r["skipped"] is None
        assert disk_bytes(cache_dir) <= 50_000
        old_used = time.time()
        time.sleep(window * 1.5)
        fresh_put = time.time()
        assert fresh_put - old_used > window
        store.put("fresh", b"f")
        r = store.evict(older_than=window)
        evicted = time.time()
        if evicted - fresh_put >= window:
            store.close()
            continue
        assert store.get("fresh") is not None
        assert all(store.get(f"k{i}") is None for i in range(10)), r
        assert len(store) == 1
        return
    pytest.fail("no evict ran within its window of the fresh put, even of 5 s")


# ---------------------------------------------------------------- LRU order


def test_recently_read_entries_survive_across_processes_and_reopen(cache_dir: Path) -> None:
    def py(code: str) -> None:
        out = subprocess.run(
            [sys.executable, "-c", code, str(cache_dir)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr

    # Process 1 writes four entries, oldest first.
    py(
        "import sys, time\nfrom xla_pcache import Store\ns = Store(sys.argv[1])\n"
        "for k in 'ABCD':\n    s.put(k, bytes(300_000)); time.sleep(0.01)"
    )
    # Process 2 reads A: it becomes the most recently used.
    py(
        "import sys\nfrom xla_pcache import Store\n"
        "s = Store(sys.argv[1], hit_interval=0)\nassert s.get('A')"
    )
    # Process 3, with a budget, adds E: B and C (the least recently used) must go, A stays.
    py(
        "import sys\nfrom xla_pcache import Store\n"
        "s = Store(sys.argv[1], max_size=1_250_000)\ns.put('E', bytes(300_000))"
    )
    store = Store(cache_dir)
    present = {k for k in "ABCDE" if store.get(k) is not None}
    assert present == {"A", "D", "E"}
    assert disk_bytes(cache_dir) <= 1_250_000


def test_hits_are_rate_limited(cache_dir: Path) -> None:
    store = Store(cache_dir, hit_interval=3600)
    store.put("k", b"v")
    journal = next((cache_dir / "journal").glob("*.log"))
    size = journal.stat().st_size
    for _ in range(1000):
        store.get("k")
    # One hit record at most (plus possibly one counters record).
    assert journal.stat().st_size - size < 150


def test_eviction_cost_does_not_walk_entries(cache_dir: Path) -> None:
    """Eviction reads the index, not the directory: entries unknown to the index survive."""
    store = Store(cache_dir, max_size=2_000_000)
    for i in range(5):
        store.put(f"k{i}", bytes(300_000))
    # A file planted behind the index's back is invisible to eviction (verify finds it).
    planted = Store(cache_dir / "other")
    planted.put("ghost", bytes(300_000))
    src = next((cache_dir / "other" / "entries").glob("*/*"))
    dest = cache_dir / "entries" / src.parent.name / src.name
    os.link(src, dest)
    for i in range(5, 12):
        store.put(f"k{i}", bytes(300_000))
    assert dest.exists()
    report = store.verify()
    assert report["unindexed"] == 1 and report["problems"] == 1
    store.verify(repair=True)
    assert store.verify()["problems"] == 0


# ---------------------------------------------------------------- many processes


def test_eight_processes_random_ops_stay_whole_and_bounded(cache_dir: Path, tmp_path: Path) -> None:
    budget = 4 << 20
    Store(cache_dir, max_size=budget)
    outs = [tmp_path / f"w{i}.json" for i in range(8)]
    procs = [
        spawn("stress", str(cache_dir), "8", str(budget), str(i), str(out))
        for i, out in enumerate(outs)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    results = [json.loads(o.read_text()) for o in outs]
    assert all(r["errors"] == [] for r in results), [r["errors"] for r in results]
    assert sum(r["bad"] for r in results) == 0
    assert sum(r["hits"] for r in results) > 0
    assert sum(r["puts"] for r in results) > 0
    store = Store(cache_dir, max_size=budget)
    store.evict()
    assert disk_bytes(cache_dir) <= budget
    report = store.verify()
    assert report["problems"] == 0, report
    assert report["corrupt"] == []
    stats = store.stats()
    assert stats["puts"] == sum(r["puts"] for r in results)
    assert stats["evictions"] > 0


def test_sigkill_at_random_instants_never_corrupts(cache_dir: Path, tmp_path: Path) -> None:
    Store(cache_dir)
    log = tmp_path / "published.log"
    rng = random.Random(1234)
    kills = 0
    for i in range(120):
        procs = [spawn("crash_writer", str(cache_dir), str(log), f"it{i}")]
        if i % 2 == 0:
            procs.append(spawn("crash_evictor", str(cache_dir)))
        for p in procs:
            wait_ready(p)
        time.sleep(rng.uniform(0.0, 0.08))
        for p in procs:
            kill(p)
            kills += 1
    assert kills >= 180
    store = Store(cache_dir)
    report = store.verify()
    assert report["corrupt"] == [] and report["foreign"] == []
    # Every fully published key reads back whole, or was chosen by an eviction (recorded
    # in a journal, or its file is in the trash when the evictor died before recording).
    published = log.read_text().split()
    assert published
    deleted = journal_deletes(cache_dir)
    trashed = {p.name.split(".")[0] for p in (cache_dir / "trash").iterdir()}
    present = 0
    for key in published:
        blob = store.get(key)
        if blob is not None:
            assert bytes(blob) == value_for(key, 1024, 200_000)
            present += 1
        else:
            name = entry_name(key)
            assert name in deleted or name in trashed, f"{key} lost without an eviction"
    assert present > 0
    # The index reconciles: after a repair, nothing is left to repair.
    store.verify(repair=True)
    assert store.verify()["problems"] == 0


# ---------------------------------------------------------------- lease fallback


def test_lease_mode_evictors_never_overlap(cache_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    Store(cache_dir)
    outs = [tmp_path / f"l{i}.json" for i in range(3)]
    env = {**os.environ, "XLA_PCACHE_EVICT_TRACE": str(trace)}
    procs = [
        subprocess.Popen(
            [sys.executable, WORKERS, "lease_evictor", str(cache_dir), "6", str(o)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for o in outs
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    runs = sum(json.loads(o.read_text())["runs"] for o in outs)
    intervals = sorted(
        (int(s), int(e), int(pid))
        for pid, s, e in (line.split() for line in trace.read_text().splitlines())
    )
    assert len(intervals) == runs > 10
    assert len({pid for _, _, pid in intervals}) >= 2, "only one process ever evicted"
    for (_s1, e1, p1), (s2, _, p2) in itertools.pairwise(intervals):
        assert s2 >= e1, f"evictors {p1} and {p2} overlapped"
    assert list((cache_dir / "locks").glob(".*")) == [], "lease temp files left behind"


def test_lease_left_by_killed_process_is_taken_over(cache_dir: Path) -> None:
    lease = cache_dir / "locks" / "evict.lease"
    for _ in range(5):
        p = spawn("slow_lease_holder", str(cache_dir))
        wait_ready(p)
        deadline = time.monotonic() + 20
        while not lease.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        kill(p)
        if lease.exists():
            break
    assert lease.exists(), "could not catch the holder with its lease"
    other = Store(cache_dir, lock_mode="lease", lease_time=1.0, lock_timeout=0.1)
    assert other.evict(max_size=1)["skipped"], "a fresh lease must be respected"
    time.sleep(1.2)
    r = other.evict(max_size=1)
    assert r["skipped"] is None, r
    assert not lease.exists(), "the new holder released its lease"


# ---------------------------------------------------------------- read-only


def test_read_only_budgeted_store_writes_nothing(cache_dir: Path, tmp_path: Path) -> None:
    w = Store(cache_dir, max_size=1 << 20)
    for i in range(20):
        w.put(f"k{i}", bytes(100_000))
    w.close()
    with read_only_copy(cache_dir, tmp_path / "ro") as ro:
        before = tree_state(ro)
        s = Store(ro, max_size=1 << 10, read_only=True)
        assert sum(s.get(f"k{i}") is not None for i in range(20)) > 0
        assert s.put("new", bytes(100)) is False
        s.stats()
        s.verify()
        s.close()
        assert tree_state(ro) == before


@pytest.mark.parametrize("mode", ["fcntl", "lease"])
def test_both_lock_modes_evict(cache_dir: Path, mode: str) -> None:
    s = Store(cache_dir, max_size=500_000, lock_mode=mode)  # type: ignore[arg-type]
    for i in range(20):
        s.put(f"k{i}", bytes(100_000))
    assert disk_bytes(cache_dir) <= 500_000
