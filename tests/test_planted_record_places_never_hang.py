"""Attacks on the record of the runtime's build identities where the home cannot be written
(rust/core/src/record_place.rs: ``$XDG_RUNTIME_DIR`` and the temp dir, which others may
write), as another user of the host would make them: what is planted at a fallback's name (a
FIFO, a link, a socket) is refused at once, never waited on, and nothing is made through it.
Fresh processes, as users run them; each test passes when the defence holds (the record's
places themselves: tests/test_build_record_place.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from xla_pcache import _core

from tests.build_identity import identify
from tests.helpers import clean_env, read_only_copy

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
