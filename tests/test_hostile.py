"""A cache directory that others can write: what a hostile (or broken) state of it can do.

Whoever can write the cache directory can put symbolic links, FIFOs, directories, huge sparse
files or unreadable files where the store expects its own. None of that may make the store
touch a file outside the cache, hang, abort the process, or stop the tools (evict, prune,
verify --repair) that recover the cache. Anything that could hang or abort runs in a child
process under a timeout and a memory limit, so this suite itself never hangs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from xla_pcache import CacheError, FormatError, Store, _core

from tests.helpers import tree_state

HANG_TIMEOUT = 30.0
OLD = time.time() - 2 * 86400


def _limit_memory() -> None:
    # A reader that follows /dev/zero or allocates a sparse file's size must fail in the
    # child, not take the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def run_child(
    code: str, env: dict[str, str] | None = None, timeout: float = HANG_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter under a timeout and a memory limit; a hang is a
    failure with the child's output, not a hung suite."""
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            preexec_fn=_limit_memory,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout:.0f} s: {e.stdout!r} {e.stderr!r}")


def expect_ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def open_in_child(
    cache_dir: Path, error: type[Exception], env: dict[str, str] | None = None
) -> str:
    """What a fresh interpreter (``run_child``) prints opening a store at ``cache_dir``:
    "refused: <message>" when the open raised ``error``."""
    return expect_ok(
        run_child(
            f"""
            from xla_pcache import Store
            from {error.__module__} import {error.__name__}
            try:
                Store({str(cache_dir)!r})
            except {error.__name__} as e:
                print("refused:", e)
            """,
            env=env,
        )
    )


def shard_of(key: str) -> str:
    return _core.entry_name(key)[:2]


def entry_path(root: Path, key: str) -> Path:
    name = _core.entry_name(key)
    return root / "entries" / name[:2] / name


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the cache, with old files a sweep would take for leftovers."""
    d = tmp_path / "outside"
    d.mkdir()
    for name in ("victim", ".victim", "victim.tmp", "0123.lease"):
        (d / name).write_bytes(b"not the cache's")
        os.utime(d / name, (OLD, OLD))
    return d


def swap_for_link(path: Path, target: Path) -> None:
    """Replaces the directory `path` by a symbolic link to `target` (as another user with
    write access to the cache directory could, while stores have it open)."""
    path.rename(path.with_name(path.name + ".moved"))
    path.symlink_to(target, target_is_directory=True)


# ---------------------------------------------------------------- nothing outside the cache


@pytest.mark.parametrize("sub", ["tmp", "trash", "locks", "index", "journal", "entries"])
def test_a_directory_swapped_for_a_link_while_open_touches_nothing_outside(
    cache_dir: Path, outside: Path, sub: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="xla_pcache")
    s = Store(cache_dir, max_size=64 << 10, tmp_grace=0.0, trash_grace=0.0)
    for i in range(8):
        s.put(f"k{i}", os.urandom(4000))
    # Enough journals of processes that are gone that an eviction compacts the index.
    host = (cache_dir / "journal").iterdir().__next__().name.rsplit("-", 2)[0]
    for i in range(70):
        (cache_dir / "journal" / f"{host}-{4_000_000 + i}-1.log").write_bytes(b"")
    before = tree_state(outside)
    swap_for_link(cache_dir / sub, outside)
    for i in range(8, 40):
        s.put(f"k{i}", os.urandom(4000))
        s.get(f"k{i - 4}")
    for op in (
        lambda: s.delete("k1"),
        lambda: s.evict(max_size=4096),
        lambda: s.evict(older_than=0.0),
        lambda: s.verify(repair=True),
        lambda: s.claim("k77", wait=0.0),
        s.stats,
        s.__len__,
        s.clear,
    ):
        # Refusing is fine; touching the outside is not.
        with contextlib.suppress(CacheError):
            op()
    s.close()
    assert tree_state(outside) == before
    warned = [r.getMessage() for r in caplog.records if "not a real directory" in r.getMessage()]
    assert warned, [r.getMessage() for r in caplog.records]


def test_prune_does_not_sweep_a_linked_claims_directory(cache_dir: Path, outside: Path) -> None:
    s = Store(cache_dir)
    s.put("k", b"v" * 100)
    s.close()
    claims = cache_dir / "locks" / "claims"
    if claims.exists():
        shutil.rmtree(claims)
    claims.symlink_to(outside, target_is_directory=True)
    before = tree_state(outside)
    proc = run_child(
        f"""
        from xla_pcache.cli import app
        import sys
        sys.argv = ["xla-pcache", "prune", "--path", {str(cache_dir)!r}, "--max-size", "1G"]
        try:
            app()
        except SystemExit as e:
            print("exit", e.code)
        """
    )
    expect_ok(proc)
    s = Store(cache_dir)
    c = s.claim("some key", wait=0.0)
    c.release()
    s.evict(max_size=1)
    assert tree_state(outside) == before
    assert s.stats()["unsafe_paths"] >= 1


def test_a_linked_shard_is_neither_written_nor_evicted_through(
    cache_dir: Path, outside: Path
) -> None:
    s = Store(cache_dir)
    assert s.put("first", b"1" * 1000)
    shard = cache_dir / "entries" / shard_of("first")
    # The shard's files now live outside, the shard is a link to them.
    for f in shard.iterdir():
        shutil.copy2(f, outside / f.name)
    before = tree_state(outside)
    shutil.rmtree(shard)
    shard.symlink_to(outside, target_is_directory=True)
    same_shard = next(k for k in (f"k{i}" for i in range(5000)) if shard_of(k) == shard.name)
    assert s.put(same_shard, b"2" * 1000) is False
    assert s.get("first") is None
    s.evict(max_size=1)
    s.verify(repair=True)
    assert tree_state(outside) == before
    assert s.stats()["unsafe_paths"] >= 1


# ---------------------------------------------------------------- no hang


def test_a_fifo_as_format_is_refused_without_hanging(cache_dir: Path) -> None:
    cache_dir.mkdir()
    os.mkfifo(cache_dir / "FORMAT")
    out = open_in_child(cache_dir, FormatError)
    assert "refused" in out and "FIFO" in out


@pytest.mark.parametrize("where", ["snapshot", "journal", "entry", "claim"])
def test_a_fifo_in_the_cache_never_hangs(cache_dir: Path, where: str) -> None:
    s = Store(cache_dir)
    s.put("k", b"v" * 1000)
    s.close()
    if where == "snapshot":
        os.mkfifo(cache_dir / "index" / "snapshot")
    elif where == "entry":
        p = entry_path(cache_dir, "k")
        p.unlink()
        os.mkfifo(p)
    elif where == "claim":
        (cache_dir / "locks" / "claims").mkdir(exist_ok=True)
        os.mkfifo(cache_dir / "locks" / "claims" / f"{_core.entry_name('c')}.lease")
    out = expect_ok(
        run_child(
            f"""
            import os
            from pathlib import Path
            from xla_pcache import Store
            s = Store({str(cache_dir)!r})
            if {where == "journal"!r}:
                # A journal this reader has read part of becomes a FIFO.
                s.put("k0", b"x" * 100)
                s.stats()
                for j in Path({str(cache_dir)!r}, "journal").iterdir():
                    j.unlink()
                    os.mkfifo(j)
            print("get", s.get("k") is not None)
            print("put", s.put("k2", b"w" * 1000))
            print("stats", s.stats()["entries"], len(s))
            c = s.claim("c", wait=0.5)
            print("claim", c.state)
            c.release()
            s.verify()
            print("done")
            """
        )
    )
    results = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    # The entry that became a FIFO is a miss; every other file a FIFO leaves the entry a hit.
    assert results["get"] == str(where != "entry"), out
    # A put goes on, and the claim is taken (a FIFO where its lease belongs is replaced).
    assert results["put"] == "True", out
    assert results["claim"] == "claimed", out
    # stats() and len() agree, and count the new entry at least.
    entries, length = map(int, results["stats"].split())
    assert entries == length >= 1, out
    assert out.rstrip().endswith("done"), out


# ---------------------------------------------------------------- no abort


def test_a_huge_sparse_journal_does_not_abort_a_put(cache_dir: Path) -> None:
    s = Store(cache_dir)
    s.put("k", b"v" * 1000)
    s.close()
    journal = next((cache_dir / "journal").iterdir())
    os.truncate(journal, 1 << 40)
    out = expect_ok(
        run_child(
            f"""
            from xla_pcache import Store
            s = Store({str(cache_dir)!r}, max_size="10M")
            print("put", s.put("k2", b"w" * 1000), s.stats()["entries"])
            """
        )
    )
    assert "put True" in out


def test_a_huge_sparse_entry_read_with_pread_is_a_miss(cache_dir: Path) -> None:
    s = Store(cache_dir)
    s.put("k", b"v" * 1000)
    s.close()
    os.truncate(entry_path(cache_dir, "k"), 1 << 40)
    out = expect_ok(
        run_child(
            f"""
            from xla_pcache import Store
            s = Store({str(cache_dir)!r}, read_only=True)
            print("got", s.get("k"))
            """,
            env={"XLA_PCACHE_READ_MODE": "pread"},
        )
    )
    assert "got None" in out


@pytest.mark.parametrize("which", ["FORMAT", "index/snapshot"])
def test_a_link_to_dev_zero_is_not_read(cache_dir: Path, which: str) -> None:
    s = Store(cache_dir)
    s.put("k", b"v" * 1000)
    s.close()
    target = cache_dir / which
    target.unlink(missing_ok=True)
    target.symlink_to("/dev/zero")
    proc = run_child(
        f"""
        from xla_pcache import Store, FormatError
        try:
            s = Store({str(cache_dir)!r})
            print("stats", s.stats()["entries"], s.put("k2", b"w"))
        except FormatError as e:
            print("refused:", e)
        """
    )
    out = expect_ok(proc)
    # Read, it would fill memory (here, the child's 3 GiB limit).
    assert "out of memory" not in proc.stderr
    if which == "FORMAT":
        assert "refused" in out and "symbolic link" in out
    else:
        assert "stats" in out and "symbolic link" in proc.stderr


@pytest.mark.parametrize(
    "arg", ["lock_timeout", "lease_time", "hit_interval", "trash_grace", "tmp_grace", "claim_lease"]
)
@pytest.mark.parametrize("value", [1e20, float("inf"), float("nan"), -1.0])
def test_every_duration_is_validated(cache_dir: Path, arg: str, value: float) -> None:
    with pytest.raises(ValueError, match=arg):
        Store(cache_dir, **{arg: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1e20, float("inf"), float("nan"), -1.0])
def test_durations_of_calls_are_validated(cache_dir: Path, value: float) -> None:
    s = Store(cache_dir)
    with pytest.raises(ValueError, match="wait"):
        s.claim("k", wait=value)
    with pytest.raises(ValueError, match="timeout"):
        s.wait_for("k", value)
    with pytest.raises(ValueError, match="older_than"):
        s.evict(older_than=value)


def test_a_huge_claim_lease_variable_is_a_value_error(cache_dir: Path) -> None:
    out = open_in_child(cache_dir, ValueError, env={"XLA_PCACHE_CLAIM_LEASE": "9" * 20})
    assert "refused" in out and "XLA_PCACHE_CLAIM_LEASE" in out


# ---------------------------------------------------------------- FORMAT messages


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_format_that_is_not_a_file_says_what_it_is(
    cache_dir: Path, tmp_path: Path, kind: str
) -> None:
    cache_dir.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("xla_pcache-format SECRET-CONTENT\n")
    if kind == "directory":
        (cache_dir / "FORMAT").mkdir()
        expected = "a directory"
    else:
        (cache_dir / "FORMAT").symlink_to(secret)
        expected = "symbolic link"
    with pytest.raises(FormatError) as e:
        Store(cache_dir)
    assert expected in str(e.value)
    assert "SECRET" not in str(e.value)


@pytest.mark.parametrize("kind", ["directory", "FIFO", "symbolic link"])
def test_the_cli_says_what_a_format_that_is_not_a_file_is(
    cache_dir: Path, tmp_path: Path, kind: str
) -> None:
    Store(cache_dir).close()
    fmt = cache_dir / "FORMAT"
    fmt.unlink()
    if kind == "directory":
        fmt.mkdir()
    elif kind == "FIFO":
        os.mkfifo(fmt)
    else:
        (tmp_path / "elsewhere").write_text("xla_pcache-format 1\n")
        fmt.symlink_to(tmp_path / "elsewhere")
    proc = run_child(
        f"""
        import sys
        from xla_pcache.cli import app
        sys.argv = ["xla-pcache", "stats", "--path", {str(cache_dir)!r}]
        app()
        """
    )
    assert proc.returncode != 0
    assert kind in proc.stderr and "no FORMAT file" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- stray directories


def test_clear_removes_a_stray_directory(cache_dir: Path) -> None:
    s = Store(cache_dir)
    s.put("k", b"v")
    stray = cache_dir / "entries" / "00" / "stray"
    (stray / "deeper").mkdir(parents=True)
    (stray / "deeper" / "f").write_bytes(b"x")
    assert s.clear() >= 2
    assert not stray.exists()
    assert s.get("k") is None


def test_a_directory_in_place_of_an_entry_is_not_left_in_trash(cache_dir: Path) -> None:
    s = Store(cache_dir, trash_grace=0.0, tmp_grace=0.0)
    p = entry_path(cache_dir, "k")
    (p / "inside").mkdir(parents=True)
    assert s.get("k") is None
    s.evict(older_than=0.0)
    s.verify(repair=True)
    left = [q for q in (cache_dir / "trash").iterdir() if q.is_dir()]
    assert left == []
    assert not p.exists(), "verify --repair removes it"
    assert s.stats()["unsafe_paths"] >= 1


# ---------------------------------------------------------------- fork


def _journal_writers(root: Path, key: str) -> list[str]:
    """Journal files holding a put record of `key`."""
    name = int(_core.entry_name(key), 16).to_bytes(16, "little")
    marker = b"\xa5\x01\x20\x00" + name
    return [j.name for j in (root / "journal").iterdir() if marker in j.read_bytes()]


def test_fork_while_another_thread_uses_the_store(cache_dir: Path) -> None:
    # A budget (so puts take the admission and eviction paths) that this test never fills:
    # the children's puts are then all published, and no eviction or compaction removes
    # what the journals are checked for afterwards.
    s = Store(cache_dir, max_size=256 << 20)
    s.put("warm", b"w" * 1000)
    stop = threading.Event()

    def busy() -> None:
        i = 0
        while not stop.is_set():
            s.put(f"busy{i}", os.urandom(2000))
            s.get(f"busy{i // 2}")
            s.stats()
            i += 1

    t = threading.Thread(target=busy)
    t.start()
    children: dict[int, int] = {}
    try:
        for i in range(24):
            time.sleep(0.005)
            pid = os.fork()
            if pid == 0:  # the child: a get and a put, then out
                code = 1
                try:
                    ok = s.get("warm") is not None and s.put(f"child{i}", b"c" * 500)
                    s.flush()
                    code = 0 if ok else 2
                finally:
                    os._exit(code)
            children[i] = pid
    finally:
        stop.set()
        t.join()
    deadline = time.monotonic() + 60
    pending = dict(children)
    status: dict[int, int] = {}
    while pending and time.monotonic() < deadline:
        for i, pid in list(pending.items()):
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status[i] = os.waitstatus_to_exitcode(st)
                del pending[i]
        time.sleep(0.02)
    for pid in pending.values():
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert not pending, f"{len(pending)} of {len(children)} children hung after fork"
    assert all(code == 0 for code in status.values()), status
    s.flush()
    for i, pid in children.items():
        writers = _journal_writers(cache_dir, f"child{i}")
        assert len(writers) == 1 and f"-{pid}-" in writers[0], (i, pid, writers)
    parent = _journal_writers(cache_dir, "busy0")
    assert all(f"-{os.getpid()}-" in j for j in parent), parent
    s.close()


# ---------------------------------------------------------------- another user's files


def _as_other_user(fn_code: str, root: Path) -> dict[str, object]:
    """Runs `fn_code` (defines `run(root) -> dict`) in a child that cannot read the files
    made unreadable: as the user nobody when we are root (root reads everything), as
    ourselves otherwise (the files are then mode 000). Returns its dict."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            scope: dict[str, object] = {}
            exec(textwrap.dedent(fn_code), scope)
            result = scope["run"](root)  # type: ignore[operator]
            os.write(w, json.dumps(result).encode())
            code = 0
        except BaseException as e:  # report anything, exit in every case
            os.write(w, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the other user's process hung")
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    return json.loads(b"".join(chunks) or b"{}")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def unreadable_cache() -> Iterator[dict[str, object]]:
    """A cache where a colleague's journal and snapshot, and one entry, are mode 0600 (or
    000): then 200 puts under a 100 KiB budget, stats, evict, verify --repair, by a user
    who cannot read them."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="xla-pcache-hostile-"))
    os.chmod(base, 0o755)
    root = base / "cache"
    old_umask = os.umask(0)
    try:
        s = Store(root, max_size=100 << 10)
        for i in range(20):
            s.put(f"colleague{i}", os.urandom(3000))
        s.evict(max_size=100 << 10)  # leaves a snapshot too
        s.flush()
        s.close()
    finally:
        os.umask(old_umask)
    mode = 0o600 if os.geteuid() == 0 else 0o000
    for f in (root / "journal").iterdir():
        os.chmod(f, mode)
    if (root / "index" / "snapshot").exists():
        os.chmod(root / "index" / "snapshot", mode)
    os.chmod(entry_path(root, "colleague0"), mode)
    for d, _, _ in os.walk(root):
        os.chmod(d, 0o777)
    code = """
    import logging, os
    from xla_pcache import Store

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []
        def emit(self, record):
            self.messages.append(record.getMessage())

    def run(root):
        keep = Keep()
        logging.getLogger("xla_pcache").addHandler(keep)
        s = Store(root, max_size=100 << 10, lock_timeout=0.05)
        stored = sum(bool(s.put(f"mine{i}", os.urandom(2000))) for i in range(200))
        stats = s.stats()
        out = {"stored": stored, "entries": stats["entries"], "bytes": stats["bytes"],
               "unreadable": stats["unreadable"], "refused": stats["puts_refused"]}
        try:
            out["verify"] = s.verify(repair=True)
        except Exception as e:
            out["verify_error"] = repr(e)
        try:
            out["evict"] = s.evict(max_size=50 << 10)
        except Exception as e:
            out["evict_error"] = repr(e)
        # One store's warnings (the prune below opens a store of its own).
        out["messages"] = list(keep.messages)
        from xla_pcache.cli import app
        try:
            rc = app(["prune", "--path", str(root), "--max-size", "40K"], standalone_mode=False)
            out["prune_rc"] = rc or 0
        except BaseException as e:
            out["prune_rc"] = repr(e)
        return out
    """
    # The other user cannot read this interpreter's files (under root's home): everything
    # the child runs is imported here first, by one prune of a scratch cache.
    from xla_pcache.cli import app

    app(["prune", "--path", str(base / "scratch"), "--max-size", "1G"], standalone_mode=False)
    result = _as_other_user(code, root)
    yield result
    shutil.rmtree(base, ignore_errors=True)


def test_puts_go_on_under_the_budget_past_an_unreadable_journal(
    unreadable_cache: dict[str, object],
) -> None:
    r = unreadable_cache
    assert "error" not in r, r
    assert int(r["stored"]) >= 150, r  # type: ignore[call-overload]
    assert int(r["bytes"]) <= 100 << 10, r  # type: ignore[call-overload]


def test_stats_count_what_is_readable(unreadable_cache: dict[str, object]) -> None:
    r = unreadable_cache
    assert int(r["entries"]) > 0, r  # type: ignore[call-overload]
    assert int(r["unreadable"]) >= 1, r  # type: ignore[call-overload]


def test_one_warning_names_the_unreadable_file_and_its_owner(
    unreadable_cache: dict[str, object],
) -> None:
    messages = [str(m) for m in unreadable_cache["messages"]]  # type: ignore[attr-defined]
    journal_warnings = [m for m in messages if ".log" in m and "owner" in m]
    assert len(journal_warnings) == 1, messages
    assert not any("another process held the evictor lock" in m for m in messages), messages


def test_evict_and_verify_repair_complete_and_report_what_they_skipped(
    unreadable_cache: dict[str, object],
) -> None:
    r = unreadable_cache
    assert "evict_error" not in r and "verify_error" not in r, r
    assert r["prune_rc"] == 0, r
    evict = r["evict"]
    verify = r["verify"]
    assert isinstance(evict, dict) and isinstance(verify, dict)
    assert any(".log" in f for f in evict["skipped_files"]), evict
    skipped = verify["skipped_files"]
    name = _core.entry_name("colleague0")
    assert any(name in f for f in skipped), verify  # the unreadable entry, reported


def test_logging_is_quiet_for_a_healthy_cache(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="xla_pcache")
    s = Store(cache_dir, max_size=64 << 10)
    for i in range(40):
        s.put(f"k{i}", os.urandom(3000))
    s.evict()
    s.verify()
    assert s.stats()["unsafe_paths"] == 0 and s.stats()["unreadable"] == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
