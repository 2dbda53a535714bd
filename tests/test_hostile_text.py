"""What a writer of the cache directory can make the tools print: every name, path, meta
value, error and warning reaches the terminal escaped (``xla_pcache._text.shown``), and
hostile records in the miss log, an entry's metadata or doctor's remembered probe give a
sane line, never a traceback. The commands run as users run them: ``python -m xla_pcache``
in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from xla_pcache import Store
from xla_pcache._text import shown

from tests.helpers import CLI, clean_env, cli, hooks_env, interruptible_child

# An OSC window title (ended by BEL), a CSI clear-screen, and (for doctor) an OSC 52
# clipboard write ended by ST.
TITLE_AND_CLEAR = "\x1b]0;PWNED\x07\x1b[2J"
CLIPBOARD = "\x1b]52;c;ZXZpbA==\x1b\\"


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    # Bytes, so that every escape sequence is seen as written; wide enough that rich neither
    # wraps nor cuts a table cell.
    return cli(*args, timeout=timeout, text=False, COLUMNS="400")


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
    assert shown("line\nnext\u2028\r") == "line\\nnext\\u2028\\r"
    assert shown("line\nnext\ttab", keep="\n\t") == "line\nnext\ttab"
    assert shown(b"\xff\x1b") == "\\xff\\x1b"


@pytest.fixture
def hostile_cache(tmp_path: Path) -> Path:
    """A cache whose path holds a window title and a clear-screen, with an entry and, in
    journal/, a directory whose name holds them too: every command that reads the index warns
    about the name it will not follow (the name gate drops it, so the warning names the
    journal directory, under the hostile path)."""
    root = tmp_path / f"cache{TITLE_AND_CLEAR}"
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


# --- doctor: its remembered probe results are entries anyone can write --------------------


@pytest.mark.parametrize("hostile", ["not an object", "clipboard write"])
def test_doctor_on_hostile_probe_entries_prints_a_clear_line(
    hostile_cache: Path, hostile: str
) -> None:
    """A remembered probe that is not a JSON object is probed again, with a line that says
    so; one whose strings hold an OSC 52 clipboard write is shown escaped. No traceback (on
    main: AttributeError on the list; the sequence reached stdout raw). Planted under JAX's
    probe key, the framework every venv running this file has."""
    from xla_pcache.cli import _doctor as doctor

    body = (
        b"[1, 2, 3]"
        if hostile == "not an object"
        else json.dumps({"backend": f"cpu{CLIPBOARD}", "serialize": True, "load": True}).encode()
    )
    with Store(hostile_cache) as s:
        fw = doctor.FRAMEWORKS["jax"]
        versions = {d: doctor._dist_version(d) for d in fw.versions}
        key = doctor.probe_key(fw, versions, fw.backend_hint(), fw.build().digest)
        assert s.put(key, body)
    proc = _cli("doctor", "--path", str(hostile_cache), timeout=600)
    text = _assert_clean(proc)
    if hostile == "not an object":
        assert "not one doctor wrote" in text, text
        return
    assert "\\x1b]52;c;ZXZpbA==\\x1b\\" in text, text
    proc = _cli("doctor", "--json", "--path", str(hostile_cache), timeout=600)
    _assert_clean(proc)
    report = json.loads(proc.stdout)
    assert report["frameworks"]["jax"]["remembered"] is True


# --- explain: misses.log and key_components are written by any process -------------------


def _write_misses(root: Path, *records: str) -> None:
    with open(root / "misses.log", "a", encoding="utf-8") as f:
        for r in records:
            f.write(r + "\n")


def test_explain_on_hostile_records_gives_sane_lines(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    deep = "[" * 100_000 + "]" * 100_000
    comps = [{"name": "computation", "digest": "d1", "value": "m"}]
    with Store(root) as s:
        # An entry of the same program whose recorded components nest without end.
        assert s.put(
            "jit_f-entry",
            b"x",
            meta={"key_components": '{"module": "jit_f", "components": ' + deep[:20000] + "}"},
        )
        # One of the same program with compile_options recorded, for the miss below.
        full = [*comps, {"name": "compile_options", "digest": "o1", "parts": {"rest": "r"}}]
        full.append({"name": "XLA flags", "digest": "f1"})
        assert s.put(
            "jit_f-other",
            b"x",
            meta={"key_components": json.dumps({"module": "jit_f", "components": full})},
        )
    no_options = [*comps, {"name": "XLA flags", "digest": "f2"}]
    _write_misses(
        root,
        '{"key": "jit_f-deep", "t": 1, "x": ' + deep + "}",
        '{"key": "jit_f-t", "module": "jit_f", "t": ' + "9" * 400 + "}",
        json.dumps(
            {"key": "jit_f-noopts", "module": "jit_f", "t": time.time(), "components": no_options}
        ),
    )
    proc = _cli("explain", "--path", str(root))
    assert proc.returncode == 0, proc.stderr
    text = _assert_clean(proc)
    assert "jit_f-noopts" in text and "differs: compile_options" in text, text
    proc = _cli("explain", "jit_f-noopts", "--path", str(root))
    text = _assert_clean(proc)
    assert proc.returncode == 0 and "no miss and no entry" not in text, text
    proc = _cli("explain", "jit_f-entry", "--path", str(root))
    _assert_clean(proc)
    assert proc.returncode == 0, proc.stderr


# --- export: its temporary file beside the bundle ------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_export_interrupted_leaves_no_temporary_file(tmp_path: Path, sig: int) -> None:
    """SIGTERM (or Ctrl-C) while ``xla-pcache export`` writes leaves no
    ``.NAME.<random>.tmp`` in the output directory (on main SIGTERM left it). The signal
    comes once the export has written its first member: the test hook
    (``XLA_PCACHE_TEST_HOOKS``) holds it there and writes ``export.<pid>``."""
    root = tmp_path / "cache"
    with Store(root) as s:
        for i in range(8):
            assert s.put(f"k{i}", os.urandom(4096))
    out_dir, hooks = tmp_path / "out", tmp_path / "hooks"
    out_dir.mkdir()
    hooks.mkdir()
    proc = subprocess.Popen(
        [
            *CLI,
            "export",
            "--path",
            str(root),
            "-o",
            str(out_dir / "b.tar.gz"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(**hooks_env(hooks)),
        preexec_fn=interruptible_child,
    )
    inside = hooks / f"export.{proc.pid}"
    while not inside.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    assert any(n.endswith(".tmp") for n in os.listdir(out_dir)), "no temporary file to leave"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err, err
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
    assert b"interrupted" in err, err
    assert [n for n in os.listdir(out_dir) if n.endswith(".tmp")] == []


def test_every_package_logger_escapes_what_it_logs() -> None:
    """A module that made its logger with ``logging.getLogger`` would log names read from the
    cache raw: every module of the package makes it with ``package_logger``."""
    import re

    package = Path(__file__).resolve().parent.parent / "python" / "xla_pcache"
    offenders = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.name != "_text.py"
        and re.search(r"^\w+\s*=\s*logging\.getLogger\(", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []
