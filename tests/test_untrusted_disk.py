"""What the store reads from its own directory is untrusted: names, counts, sizes and totals
in index snapshots and journals, and what stands at the evict trace's path. Each test plants
what another user with write access to the cache directory could, then runs what users run
(a put, `evict()`, `xla-pcache prune`, `verify --repair`, `stats`), and checks that nothing
outside the cache changed and that memory stayed bounded."""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import xxhash
from xla_pcache import Store, _core

from tests import snapshot_forge as forge
from tests.helpers import cli

HANG_TIMEOUT = 60.0
OLD = 1_000_000_000  # 2001: older than any age a sweep or compaction waits for


def this_host() -> str:
    """The host name as the store writes it into journal names."""
    h = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64]
    return h or "unknown"


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def plant_snapshot(root: Path, data: bytes) -> None:
    (root / "index" / "snapshot").write_bytes(data)


# ---------------------------------------------------------------- names from a snapshot


def test_journal_names_from_a_forged_snapshot_never_reach_outside(tmp_path: Path) -> None:
    """A snapshot whose journal list names paths (`<host>-<dead pid>-x/../../../victim/..`
    with a directory of that name planted in journal/, and `../../x/f.log`) at offsets that
    match the victims' lengths: the first put's compaction, `evict()` and `prune` must leave
    the files outside the cache as they were."""
    root = tmp_path / "cache"
    Store(root).put("seed", b"v")  # lays the cache out
    victim = tmp_path / "victim" / "precious.log"
    victim.parent.mkdir()
    victim.write_bytes(b"precious")
    other = tmp_path / "x" / "f.log"
    other.parent.mkdir()
    other.write_bytes(b"other data")
    for f in (victim, other):
        os.utime(f, (OLD, OLD))
    pid = dead_pid()
    prefix = f"{this_host()}-{pid}-x"
    (root / "journal" / prefix).mkdir()
    marks = [
        (f"{prefix}/../../../victim/precious.log".encode(), len(b"precious")),
        (b"../../x/f.log", len(b"other data")),
        (f"{this_host()}-{pid}-y/../../../victim/precious.log".encode(), len(b"precious")),
    ]
    # Past the journal count that makes the next put compact.
    marks += [(f"{this_host()}-{pid}-{i:x}.log".encode(), 0) for i in range(80)]
    plant_snapshot(root, forge.v2(journals=marks))
    before = {p: p.read_bytes() for p in (victim, other)}

    s = Store(root)
    assert s.put("k1", b"value")
    assert s.stats()["unsafe_paths"] >= 3  # the three paths, counted
    s.evict()
    s.evict(older_than=0.0)
    proc = cli("prune", "--path", str(root), "--older-than", "1s", timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Store(root).put("k2", b"value")
    for p, data in before.items():
        assert p.exists(), f"{p} was removed"
        assert p.read_bytes() == data
    # The planted directory is someone else's: left where it is, never followed.
    assert (root / "journal" / prefix).is_dir()


# ---------------------------------------------------------------- sizes and counts


def run_limited(code: str, limit: int = 1 << 30) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter under an address-space limit of `limit` bytes:
    a reader that sizes its memory by what a file claims fails there (MemoryError, or an
    abort), not on the machine. Prints the child's peak RSS (KiB) last."""
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec.
    body = textwrap.dedent(code) + textwrap.dedent(
        """
        import re
        with open("/proc/self/status") as f:
            print(re.search(r"VmHWM:\\s+(\\d+)", f.read()).group(1))
        """
    )
    limiter = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))\n"
    try:
        return subprocess.run(
            [sys.executable, "-c", limiter + body],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: {e.stdout!r} {e.stderr!r}")


def peak_rss_mib(proc: subprocess.CompletedProcess[str]) -> float:
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return int(proc.stdout.split()[-1]) / 1024


def put_and_count(root: Path, n: int = 1) -> str:
    return f"""
        from xla_pcache import Store
        s = Store({str(root)!r})
        stored = sum(bool(s.put(f"k{{i}}", b"v" * 100)) for i in range({n}))
        print("stored", stored)
        st = s.stats()
        print("entries", st["entries"], "bytes", st["bytes"])
    """


def test_a_forged_legacy_snapshot_of_the_old_cap_costs_no_gigabytes(tmp_path: Path) -> None:
    """A version-1 snapshot of 256 MiB (8 million entries) made a writer's first put decode
    it whole (about 2 GB): under a 1 GiB address-space limit the put must still work."""
    root = tmp_path / "cache"
    Store(root)
    n = ((256 << 20) - 64) // 32  # just under the old cap
    plant_snapshot(root, forge.v1(n))
    proc = run_limited(put_and_count(root))
    assert peak_rss_mib(proc) < 512
    assert "stored 1" in proc.stdout, proc.stdout + proc.stderr


def test_a_legacy_snapshot_at_the_cap_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """The largest version-1 snapshot still read (16 MiB: 520,000 entries) is decoded whole
    in about 113 MiB (at the earlier 64 MiB cap: 489 MiB); one a byte past it is refused,
    and the index goes on from the journals."""
    root = tmp_path / "cache"
    Store(root)
    n = (16 << 20) // 32 - 1
    plant_snapshot(root, forge.v1(n))
    assert (root / "index" / "snapshot").stat().st_size == 16 << 20
    proc = run_limited(put_and_count(root))
    assert peak_rss_mib(proc) < 160
    assert f"entries {n + 1}" in proc.stdout, proc.stdout + proc.stderr
    plant_snapshot(root, forge.v1(n + 1))
    proc = run_limited(put_and_count(root))
    assert "ignoring unreadable index snapshot" in proc.stderr, proc.stderr
    assert "larger than 16777216 bytes" in proc.stderr, proc.stderr
    assert peak_rss_mib(proc) < 160


def long_journal_names(n: int, length: int = 200) -> list[tuple[bytes, int]]:
    pid = dead_pid()
    out = []
    for i in range(n):
        stem = f"{this_host()}-{pid}-{i:x}"
        host = ("h" * (length - len(stem) - 4)) + stem
        out.append((f"{host}.log".encode(), 0))
    return out


def test_compaction_writes_back_only_the_journals_that_exist(tmp_path: Path) -> None:
    """A snapshot listing 200,000 journals that are not there: the next compaction wrote
    them all back (with counters, past the readers' own cap), and from then on every process
    ignored the index. Now the snapshot it writes lists what exists, and a new process
    reads it."""
    root = tmp_path / "cache"
    Store(root)
    plant_snapshot(root, forge.v2(journals=long_journal_names(200_000)))
    proc = run_limited(put_and_count(root, 3))
    assert "stored 3" in proc.stdout, proc.stdout + proc.stderr
    assert (root / "index" / "snapshot").stat().st_size < 1 << 20
    proc = run_limited(put_and_count(root, 0))
    assert "entries 3" in proc.stdout, proc.stdout + proc.stderr
    assert "ignoring unreadable index snapshot" not in proc.stderr


def test_a_journal_list_past_any_writer_is_refused_and_replaced(tmp_path: Path) -> None:
    """Three million journal marks in one snapshot: refused as no writer makes it (not
    decoded into gigabytes), and replaced by the next compaction; `verify --repair` then
    leaves a snapshot every process reads."""
    root = tmp_path / "cache"
    s = Store(root)
    assert s.put("a", b"v")
    pid = dead_pid()
    marks = [(b"h-%d-%x.log" % (pid, i), 0) for i in range(3_000_000)]
    plant_snapshot(root, forge.v2(journals=marks))
    proc = run_limited(put_and_count(root, 2))
    assert peak_rss_mib(proc) < 512
    assert "stored 2" in proc.stdout, proc.stdout + proc.stderr
    proc = cli("verify", "--path", str(root), "--repair", timeout=HANG_TIMEOUT)
    assert "Traceback" not in proc.stderr, proc.stderr
    proc = run_limited(put_and_count(root, 0))
    assert "entries 3" in proc.stdout, proc.stdout + proc.stderr
    assert "unreadable index snapshot" not in proc.stderr, proc.stderr
    assert (root / "index" / "snapshot").stat().st_size < 1 << 20


def test_a_header_total_no_filesystem_holds_blocks_no_put(tmp_path: Path) -> None:
    """A snapshot header claiming 2**100 bytes in a bounded store: every put is stored,
    stats show the real total, and prune and `verify --repair` leave a snapshot with it."""
    root = tmp_path / "cache"
    Store(root, max_size=10 << 20)
    plant_snapshot(root, forge.v2(total=1 << 100))
    s = Store(root, max_size=10 << 20)
    assert sum(bool(s.put(f"k{i}", b"v" * 1000)) for i in range(10)) == 10
    st = s.stats()
    assert st["entries"] == 10
    assert 10_000 <= st["bytes"] < 1 << 20
    for args in (["prune", "--max-size", "1G"], ["verify", "--repair"]):
        proc = cli(*args, "--path", str(root), timeout=HANG_TIMEOUT)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert "18446744073709551615" not in proc.stdout
        st = Store(root, max_size=10 << 20).stats()
        assert 10_000 <= st["bytes"] < 1 << 20, args


def test_a_journal_record_no_filesystem_holds_evicts_nothing(tmp_path: Path) -> None:
    """A planted journal whose one put record says an existing entry takes 2**62 bytes:
    the record is skipped (counted in unsafe_paths), so the next puts into a bounded store
    evict none of the real entries, and stats show the real total."""
    root = tmp_path / "cache"
    with Store(root, max_size=10 << 20) as s:
        assert all(s.put(f"k{i}", b"v" * 10_000) for i in range(5))
    victim = next(p for p in (root / "entries").rglob("*") if p.is_file())
    body = int(victim.name, 16).to_bytes(16, "little") + struct.pack("<QQ", 1 << 62, time.time_ns())
    record = bytes([0xA5, 1]) + struct.pack("<H", len(body)) + body
    record += struct.pack("<Q", xxhash.xxh3_64_intdigest(record))
    (root / "journal" / f"{this_host()}-{dead_pid()}-abcdef.log").write_bytes(record)
    with Store(root, max_size=10 << 20) as s:
        assert all(s.put(f"n{i}", b"w" * 10_000) for i in range(3))
        assert all(s.get(f"k{i}") is not None for i in range(5))
        st = s.stats()
        assert st["entries"] == 8
        assert 80_000 <= st["bytes"] < 1 << 20
        assert st["unsafe_paths"] >= 1


# ---------------------------------------------------------------- the evict trace


def evict_with_trace(root: Path, trace: Path) -> subprocess.CompletedProcess[str]:
    code = f"""
        from xla_pcache import Store
        s = Store({str(root)!r}, max_size=1 << 20)
        for i in range(3):
            s.put(f"k{{i}}", b"v" * 1000)
        s.evict()
        print("done")
    """
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=HANG_TIMEOUT,
            env={**os.environ, "XLA_PCACHE_EVICT_TRACE": str(trace)},
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung on the evict trace: {e.stdout!r} {e.stderr!r}")


def test_a_fifo_at_the_evict_trace_path_is_no_trace_and_no_hang(tmp_path: Path) -> None:
    trace = tmp_path / "evict.trace"
    os.mkfifo(trace)
    proc = evict_with_trace(tmp_path / "cache", trace)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert "evict trace" in proc.stderr
    assert proc.stderr.count("evict trace") == 1, proc.stderr


def test_a_link_at_the_evict_trace_path_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    trace = tmp_path / "evict.trace"
    trace.symlink_to(victim)
    proc = evict_with_trace(tmp_path / "cache", trace)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert victim.read_bytes() == b"keep"
    assert "evict trace" in proc.stderr


def test_a_regular_evict_trace_is_written(tmp_path: Path) -> None:
    trace = tmp_path / "evict.trace"
    proc = evict_with_trace(tmp_path / "cache", trace)
    assert proc.returncode == 0, proc.stderr
    assert trace.read_text().strip(), "no line traced"


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("param", "call"),
    [
        ("read_only", lambda d: _core.Store(d, read_only="yes")),
        ("durable", lambda d: _core.Store(d, durable=1.5)),
        ("path", lambda d: _core.Store(123)),
        ("path", lambda d: _core.Store(f"{d}/a\0b")),
        ("evict_trace", lambda d: _core.Store(d, evict_trace=5)),
        ("meta", lambda d: _core.Store(d).put("k", b"v", meta=[("a", "b")])),
        ("meta", lambda d: _core.Store(d).put("k", b"v", meta={"a": 1})),
        ("pieces", lambda d: _core.Store(d).take_entry_file("k", 5, True)),
        ("publish", lambda d: _core.Store(d).take_entry_file("k", [b"x"], "yes")),
        ("shard", lambda d: _core.Store(d).entries(shard=5)),
        ("names", lambda d: _core.Store(d).trashed_keys("abc")),
        ("names", lambda d: _core.Store(d).trashed_keys([1])),
        ("settings", lambda d: Store(d, settings=5)),
        ("settings", lambda d: Store(d, settings={"max_size": 1})),
    ],
)
def test_a_bad_argument_is_named(tmp_path: Path, param: str, call: object) -> None:
    with pytest.raises((TypeError, ValueError)) as e:
        call(str(tmp_path / "cache"))  # type: ignore[operator]
    assert param in str(e.value), str(e.value)


def test_an_idle_interrupt_does_not_stop_the_next_verify_or_evict(tmp_path: Path) -> None:
    s = Store(tmp_path / "cache")
    for i in range(20):
        s.put(f"k{i}", b"v" * 100)
    s.interrupt()
    v = s.verify()
    assert not v["interrupted"] and v["entries"] == 20, v
    s.interrupt()
    r = s.evict(max_size=0)
    assert not r["interrupted"] and r["removed"] == 20, r
