"""What a writer of the cache directory can make the tools print: every name, path, meta
value, error and warning reaches the terminal escaped (``xla_pcache._text.shown``), and
hostile records in the miss log, an entry's metadata or doctor's remembered probe give a
sane line, never a traceback. The commands run as users run them: ``python -m xla_pcache``
in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from xla_pcache import Store
from xla_pcache._text import shown

from tests.helpers import clean_env

# An OSC window title (ended by BEL), a CSI clear-screen, and (for doctor) an OSC 52
# clipboard write ended by ST.
TITLE_AND_CLEAR = "\x1b]0;PWNED\x07\x1b[2J"
CLIPBOARD = "\x1b]52;c;ZXZpbA==\x1b\\"


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "xla_pcache", *args],
        capture_output=True,
        timeout=timeout,
        env=clean_env(),
        check=False,
    )


def _assert_clean(proc: subprocess.CompletedProcess[bytes]) -> str:
    out = proc.stdout + proc.stderr
    assert b"\x1b" not in out, out
    assert b"\x9b" not in out and "\u202e".encode() not in out, out
    assert b"Traceback" not in out, out
    return out.decode("utf-8", "replace")


def test_shown_makes_every_control_and_bidi_character_visible() -> None:
    assert shown("plain/path é 日本") == "plain/path é 日本"
    assert shown(TITLE_AND_CLEAR) == "\\x1b]0;PWNED\\x07\\x1b[2J"
    assert shown("a\x7fb\x9bc\x00") == "a\\x7fb\\x9bc\\x00"
    for ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c":
        assert shown(f"x{ch}y") == f"x\\u{ord(ch):04x}y"
    assert shown("line\nnext\u2028") == "line\\x0anext\\u2028"
    assert shown("line\nnext\ttab", keep="\n\t") == "line\nnext\ttab"
    assert shown(b"\xff\x1b") == "\\xff\\x1b"


@pytest.fixture
def hostile_cache(tmp_path: Path) -> Path:
    """A cache with an entry and, in journal/, a directory whose name holds a window title
    and a clear-screen: every command that reads the index warns about it."""
    root = tmp_path / "cache"
    with Store(root) as s:
        assert s.put("a", b"x", meta={"note": f"meta{TITLE_AND_CLEAR}"})
    (root / "journal" / f"h-1-x{TITLE_AND_CLEAR}\u202e.log").mkdir()
    return root


@pytest.mark.parametrize(
    "args",
    [
        ["stats"],
        ["ls"],
        ["ls", "--json"],
        ["prune", "--max-size", "1"],
        ["verify"],
        ["verify", "--repair"],
        ["explain"],
    ],
)
def test_no_command_prints_a_raw_escape(hostile_cache: Path, args: list[str]) -> None:
    proc = _cli(*args, "--path", str(hostile_cache))
    text = _assert_clean(proc)
    if args[0] in ("stats", "verify"):
        # The warning is there, the name made visible.
        assert "\\x1b]0;PWNED\\x07\\x1b[2J" in text, text


def test_a_user_programs_put_logs_no_raw_escape(hostile_cache: Path) -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from xla_pcache import Store\n"
        "s = Store(sys.argv[1])\n"
        "assert s.put('b', b'y')\n"
        "s.close()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(hostile_cache)],
        capture_output=True,
        timeout=120,
        env=clean_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = _assert_clean(proc)
    assert "\\x1b]0;PWNED" in text, text
