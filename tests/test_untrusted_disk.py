"""What the store reads from its own directory is untrusted: names, counts, sizes and totals
in index snapshots and journals, and what stands at the evict trace's path. Each test plants
what another user with write access to the cache directory could, then runs what users run
(a put, `evict()`, `xla-pcache prune`, `verify --repair`, `stats`), and checks that nothing
outside the cache changed and that memory stayed bounded."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import snapshot_forge as forge
from xla_pcache import Store

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


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xla_pcache", *args],
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT,
        env={**os.environ, **(env or {})},
        check=False,
    )


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
    s.evict()
    s.evict(older_than=0.0)
    proc = cli("prune", "--path", str(root), "--older-than", "1s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Store(root).put("k2", b"value")
    for p, data in before.items():
        assert p.exists(), f"{p} was removed"
        assert p.read_bytes() == data
    # The planted directory is someone else's: left where it is, never followed.
    assert (root / "journal" / prefix).is_dir()
