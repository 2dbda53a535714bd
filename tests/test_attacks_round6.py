"""Attacks on the local fallbacks, as another user of the host or whoever writes a job's
configuration would make them: the record of the runtime's build identities where the home
cannot be written (rust/core/src/record_place.rs: ``$XDG_RUNTIME_DIR`` and the temp dir,
which others may write), and ``file:`` URLs whose ``?ro=1`` the rest of the configuration
says otherwise about. Fresh processes, as users run them; each test passes when the defence
holds (the bucket's attacks are in tests/tiers/test_attacks_round6.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from xla_pcache import Store, _core
from xla_pcache.config import Settings

from tests.build_identity import identify
from tests.helpers import clean_env, cli, read_only_copy, tree_state

UID = os.geteuid()
BUILDS = f"xla_pcache-builds-{UID}"


def _fifo(run: Path, victim: Path) -> None:
    os.mkfifo(run / BUILDS)


def _dangling(run: Path, victim: Path) -> None:
    # Where the attacker would like this user's directory made (and then read it).
    (run / BUILDS).symlink_to(victim / "made-through-the-link")


def _link_to_a_fifo(run: Path, victim: Path) -> None:
    os.mkfifo(victim / "fifo")
    (run / BUILDS).symlink_to(victim / "fifo")


def _socket(run: Path, victim: Path) -> None:
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(run / BUILDS))
    s.close()


PLANTS = {
    "a FIFO at the name": _fifo,
    "a dangling link at the name": _dangling,
    "a link to a FIFO": _link_to_a_fifo,
    "a socket at the name": _socket,
}


@pytest.mark.parametrize("how", sorted(PLANTS))
def test_a_fallback_planted_as_a_fifo_or_a_dangling_link_hangs_and_makes_nothing(
    how: str, tmp_path: Path
) -> None:
    """Another user of the host plants, at the fallback's name in a shared directory
    (``$XDG_RUNTIME_DIR`` set to a sticky directory every user writes, as ``/tmp`` is), a
    FIFO, a dangling link to where it would like this user's directory made, a link to a
    FIFO, or a socket: each is refused at once (no open waits on a FIFO), nothing is made
    through the link, and the next place (the temp dir) keeps the record, so the second
    process hashes nothing and the identity is the file's own."""
    lib = tmp_path / "libt.so"
    lib.write_bytes(b"\x7fELF not really: a framework binary's bytes" * 1000)
    (clean,) = _core.identify_binaries([str(lib)], str(tmp_path / "clean"))[0]
    assert not isinstance(clean, str)
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o1777)
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    PLANTS[how](run, victim)
    home = tmp_path / "home-file"
    home.write_bytes(b"no home")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = clean_env(("XDG_",), HOME=str(home), TMPDIR=str(tmp), XDG_RUNTIME_DIR=str(run))
    for n in (1, 2):
        started = time.monotonic()
        got, stderr = identify(lib, env, timeout=60)
        assert time.monotonic() - started < 30
        assert got["id"] == clean[1], (how, got)
        assert got["hashed"] == (1 if n == 1 else 0), (how, n, got, stderr)
        assert got["dir"] == str(tmp / BUILDS), (how, got)
        assert got["problems"] == 1 and "is not used" in stderr, stderr
    assert sorted(p.name for p in victim.iterdir()) == (
        ["fifo"] if how == "a link to a FIFO" else []
    )


# ------------------------------------------------------------------- file: URLs, ?ro=1
@pytest.mark.parametrize(
    "command",
    [
        ("config", "--max-size", "1M"),
        ("verify", "--repair"),
        ("import", "BUNDLE"),
        ("prune", "--older-than", "1s"),
    ],
)
def test_a_read_only_url_stays_read_only_whatever_the_environment_says(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    """``?ro=1`` on the cache's URL, with ``XLA_PERSISTENT_CACHE_READ_ONLY=0`` in the
    environment, and the URL itself in ``XLA_PERSISTENT_CACHE_PATH`` too: every command
    that writes refuses (exit 2, saying read-only) and the directory is left as it was."""
    cache = tmp_path / "c"
    with Store(cache, settings=Settings()) as s:
        for i in range(3):
            assert s.put(f"k{i}", bytes(500 + i))
        s.export_bundle(str(tmp_path / "b.tgz"))
    with Store(tmp_path / "other", settings=Settings()) as s:
        assert s.put("new", bytes(700))
        s.export_bundle(str(tmp_path / "new.tgz"))
    url = f"file://{cache}?ro=1"
    args = [str(tmp_path / "new.tgz") if a == "BUNDLE" else a for a in command]
    before = tree_state(cache)
    for where in (["--path", url], []):
        proc = cli(
            *args,
            *where,
            cwd=tmp_path,
            XLA_PERSISTENT_CACHE_READ_ONLY="0",
            XLA_PERSISTENT_CACHE_PATH=url,
        )
        assert proc.returncode == 2 and "read-only" in proc.stderr, (where, proc.stderr)
    assert tree_state(cache) == before


def test_a_read_only_home_and_tmp_cost_no_hang_with_a_planted_runtime_dir(
    tmp_path: Path,
) -> None:
    """No place can be written (a read-only home and temp dir) and the runtime dir holds a
    FIFO at the fallback's name: the process hashes, says so once, and exits."""
    lib = tmp_path / "libt.so"
    lib.write_bytes(b"\x7fELF bytes" * 1000)
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o1777)
    os.mkfifo(run / BUILDS)
    empty = tmp_path / "empty"
    empty.mkdir()
    with (
        read_only_copy(empty, tmp_path / "ro-home") as home,
        read_only_copy(empty, tmp_path / "ro-tmp") as tmp,
    ):
        env = clean_env(("XDG_",), HOME=str(home), TMPDIR=str(tmp), XDG_RUNTIME_DIR=str(run))
        got, _ = identify(lib, env, timeout=60)
    assert got["hashed"] == 1 and got["dir"] is None, got
