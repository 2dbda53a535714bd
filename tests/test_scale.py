"""A cache of many entries: totals across processes over an on-disk snapshot, journals left
by many short processes, and the CLI streaming, limiting, sorting and stopping on Ctrl-C.
Small sizes: the costs at a million entries are measured by bench/scale.py, not here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from xla_pcache import Store

from tests.helpers import CLI, clean_env, cli, hooks_env, interruptible_child, run_python


def entry_files(root: Path) -> list[Path]:
    return [p for p in (root / "entries").rglob("*") if p.is_file()]


def fill(root: Path, n: int, size: int = 100, start: int = 0) -> None:
    with Store(root) as s:
        for i in range(start, start + n):
            assert s.put(f"k{i}", b"v" * size)


def on_disk(root: Path) -> tuple[int, int]:
    files = entry_files(root)
    return len(files), sum(f.stat().st_blocks * 512 for f in files)


STATS = """
import json, sys
from xla_pcache import Store
with Store(sys.argv[1]) as s:
    st = s.stats()
print(json.dumps({"entries": st["entries"], "bytes": st["bytes"]}))
"""


def stats_elsewhere(root: Path) -> dict[str, int]:
    r = run_python(STATS, str(root))
    assert r.returncode == 0, r.stderr
    out: dict[str, int] = json.loads(r.stdout)
    return out


def forked_puts(root: Path, n: int, tag: str) -> None:
    """``n`` short-lived processes, each putting one entry and exiting."""
    store = Store(root)
    for i in range(n):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                code = 0 if store.put(f"{tag}{i}", b"c" * 100) else 1
                store.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    store.close()


def test_churn_leaves_few_journals_and_totals_match_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "c"
    fill(root, 200)
    forked_puts(root, 150, "churn")
    journals = list((root / "journal").iterdir())
    # Compaction folds the journals of processes that are gone once there are more than 64.
    assert len(journals) <= 66, len(journals)
    snapshot = (root / "index" / "snapshot").read_bytes()
    assert snapshot[:8] == b"XPCS\x02\x00\x00\x00", "a snapshot of the current version"
    files, blocks = on_disk(root)
    assert files == 350
    assert stats_elsewhere(root) == {"entries": files, "bytes": blocks}
    # Deletes and an eviction in another process, then totals read by a third: the
    # snapshot's entries under the journals' records since.
    code = """
    import sys
    from xla_pcache import Store
    with Store(sys.argv[1]) as s:
        for i in range(0, 200, 7):
            assert s.delete(f"k{i}")
        s.put("late", b"l" * 9000)
        s.evict(max_size=300 * 4096)
    """
    r = run_python(code, str(root))
    assert r.returncode == 0, r.stderr
    files, blocks = on_disk(root)
    assert files < 350 - 28
    st = stats_elsewhere(root)
    assert (st["entries"], st["bytes"]) == (files, blocks)


# ls ------------------------------------------------------------------------------------------


def rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if re.fullmatch(r"k\d+", line.split()[-1])]


def test_ls_limit_shows_the_first_and_says_how_many_more(tmp_path: Path) -> None:
    root = tmp_path / "c"
    fill(root, 50)
    r = cli("ls", "--limit", "5", "--path", str(root))
    assert r.returncode == 0, r.stderr
    assert len(rows(r.stdout)) == 5
    assert "50 entries" in r.stdout
    assert "about 45 more" in r.stdout
    # Piped without --limit: every entry.
    r = cli("ls", "--path", str(root))
    assert len(rows(r.stdout)) == 50
    assert "more" not in r.stdout
    assert len(json.loads(cli("ls", "--json", "--limit", "3", "--path", str(root)).stdout)) == 3
    assert len(json.loads(cli("ls", "--json", "--path", str(root)).stdout)) == 50


def test_ls_sort_with_limit_keeps_the_first_in_that_order(tmp_path: Path) -> None:
    root = tmp_path / "c"
    with Store(root) as s:
        for i in range(1, 11):
            s.put(f"k{i}", b"x" * (i * 5000))
    r = cli("ls", "--json", "--sort", "size", "--limit", "3", "--path", str(root))
    assert r.returncode == 0, r.stderr
    assert [e["key"] for e in json.loads(r.stdout)] == ["k10", "k9", "k8"]
    r = cli("ls", "--json", "--sort", "age", "--limit", "2", "--path", str(root))
    assert [e["key"] for e in json.loads(r.stdout)] == ["k1", "k2"]
    everything = json.loads(cli("ls", "--json", "--sort", "size", "--path", str(root)).stdout)
    assert [e["key"] for e in everything] == [f"k{i}" for i in range(10, 0, -1)]


def test_ls_stops_when_its_reader_does(tmp_path: Path) -> None:
    """``xla-pcache ls | head``: the lines come as each shard is read, and the reader
    closing the pipe ends the command quietly, with status 0."""
    root = tmp_path / "c"
    fill(root, 3000)
    proc = subprocess.Popen(
        [*CLI, "ls", "--path", str(root)],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = [proc.stdout.readline() for _ in range(4)]
    assert b"3,000 entries" in first[0]
    assert all(line.endswith(b"\n") for line in first)
    proc.stdout.close()
    errors = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0
    assert b"Traceback" not in errors and b"Broken" not in errors, errors


# Ctrl-C --------------------------------------------------------------------------------------


def interrupt_running(args: list[str], hooks: Path) -> subprocess.CompletedProcess[str]:
    """Runs the command and sends it SIGINT once it is inside its walk: the core's test hook
    (``XLA_PCACHE_TEST_HOOKS``) pauses the walk after its first entry and writes
    ``walk.<pid>``, and the walk goes on only once the interrupt has reached it. So the
    signal always lands mid-walk, however fast or slow the machine."""
    hooks.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [*CLI, *args],
        env={**clean_env(), **hooks_env(hooks)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible_child,
    )
    inside = hooks / f"walk.{proc.pid}"
    while not inside.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("command", [["verify"], ["prune", "--max-size", "0"]])
def test_ctrl_c_stops_the_walk_and_leaves_a_valid_cache(tmp_path: Path, command: list[str]) -> None:
    root = tmp_path / "c"
    n = 300
    fill(root, n)
    r = interrupt_running([*command, "--path", str(root)], tmp_path / "hooks")
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert "interrupted" in r.stderr and "Traceback" not in r.stderr, r.stderr
    check = cli("verify", "--json", "--path", str(root))
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads(check.stdout)
    assert report["problems"] == 0 and not report["interrupted"], report
    files, blocks = on_disk(root)
    if command[0] == "prune":
        # Stopped in the middle: the first entry removed, the rest left.
        assert 0 < files < n
    st = stats_elsewhere(root)
    assert (st["entries"], st["bytes"]) == (files, blocks)


def test_an_idle_interrupt_stops_no_later_walk(tmp_path: Path) -> None:
    """`interrupt()` with no walk running is nobody's: the next `verify()` and `evict()`
    run to the end (a running walk is stopped: the Ctrl-C test above)."""
    root = tmp_path / "c"
    fill(root, 50)
    with Store(root) as s:
        s.interrupt()
        v = s.verify()
        assert not v["interrupted"] and v["entries"] == 50, v
        s.interrupt()
        r = s.evict(max_size=0)
        assert not r["interrupted"] and r["removed"] == 50, r
