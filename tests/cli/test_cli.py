"""The ``xla-pcache`` command, run as a real subprocess (``python -m xla_pcache``)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from xla_pcache import Store

from tests.helpers import CLI, clean_env, cli

JAX_META = {"framework": "jax", "framework_version": "0.10.2"}
TORCH_META = {"framework": "torch_xla", "framework_version": "2.9.0"}
ENTRIES = {
    "jit_small-aaaa": (b"s" * 100, JAX_META),
    "jit_big-bbbb": (b"b" * 50_000, JAX_META),
    "123456789012345678901234567890": (b"t" * 5_000, TORCH_META),
}


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("xla-pcache: error: ")
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    with Store(root) as store:
        for key, (value, meta) in ENTRIES.items():
            assert store.put(key, value, meta=meta)
        store.get("jit_small-aaaa")
        store.get("jit_small-aaaa")
        store.get("missing")
        store.flush()
    return root


def entry_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "entries").rglob("*") if p.is_file())


# help and wiring -----------------------------------------------------------------------------


def test_help_lists_subcommands() -> None:
    result = cli("--help")
    assert result.returncode == 0
    for command in ("stats", "ls", "prune", "verify", "clear", "demo", "doctor", "config"):
        assert command in result.stdout


def test_no_arguments_shows_help() -> None:
    result = cli()
    assert "Usage" in result.stdout + result.stderr
    assert "stats" in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["stats", "ls", "prune", "verify", "clear", "demo", "doctor"])
def test_every_subcommand_takes_path(command: str) -> None:
    result = cli(command, "--help")
    assert result.returncode == 0
    assert "--path" in result.stdout


def test_version() -> None:
    import xla_pcache

    result = cli("--version")
    assert result.returncode == 0
    assert xla_pcache.__version__ in result.stdout


def test_importing_cli_does_not_import_frameworks() -> None:
    code = (
        "import sys, xla_pcache.cli; "
        "bad = [m for m in ('jax', 'torch', 'torch_xla', 'numpy') if m in sys.modules]; "
        "sys.exit(str(bad) if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# What only a bucket, a remote tier, a bundle or a miss's explanation needs.
_NOT_FOR_A_DIRECTORY = (
    "xla_pcache.tiers",
    "xla_pcache.bucket",
    "xla_pcache.bundle",
    "xla_pcache.explain",
    "obstore",
    "redis",
)


@pytest.mark.parametrize(
    "args",
    [("stats",), ("stats", "--json"), ("ls",), ("ls", "--json"), ("config",), ("verify",)],
)
def test_a_directory_command_loads_only_what_it_needs(cache: Path, args: tuple[str, ...]) -> None:
    # Each command starts in a fresh process (scripts, CI, the tests run hundreds): on a
    # directory it loads none of a bucket's or a tier's machinery, and with --json no rich.
    heavy = (*_NOT_FOR_A_DIRECTORY, *(("rich",) if "--json" in args else ()))
    code = (
        "import sys\n"
        "from xla_pcache.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({heavy!r}))\n"
        "sys.exit(f'loaded: {bad}' if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *args, "--path", str(cache)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr


def test_console_script_entry_point_is_main() -> None:
    from xla_pcache import cli

    assert callable(cli.main)


# errors shared by every cache command ----------------------------------------------------------

CACHE_COMMANDS = [["stats"], ["ls"], ["prune", "--max-size", "0"], ["verify"], ["clear", "--yes"]]


@pytest.mark.parametrize("command", CACHE_COMMANDS)
def test_no_path(command: list[str]) -> None:
    assert_one_line_error(cli(*command), "XLA_PERSISTENT_CACHE_PATH")


@pytest.mark.parametrize("command", CACHE_COMMANDS)
def test_missing_path_is_not_created(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert_one_line_error(cli(*command, "--path", str(missing)), str(missing))
    assert not missing.exists()


@pytest.mark.parametrize("command", CACHE_COMMANDS)
def test_not_a_cache_is_left_alone(command: list[str], tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("precious")
    assert_one_line_error(cli(*command, "--path", str(tmp_path)), "not an xla_pcache cache")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.txt"]


@pytest.mark.parametrize("command", CACHE_COMMANDS)
def test_unknown_format_is_refused(command: list[str], cache: Path) -> None:
    (cache / "FORMAT").write_text("xla_pcache format 999\n")
    before = entry_files(cache)
    result = cli(*command, "--path", str(cache))
    assert_one_line_error(result)
    assert entry_files(cache) == before


def test_malformed_read_only_variable(cache: Path) -> None:
    env = clean_env(XLA_PERSISTENT_CACHE_READ_ONLY="kinda")
    assert_one_line_error(
        cli("clear", "--yes", "--path", str(cache), env=env),
        "XLA_PERSISTENT_CACHE_READ_ONLY",
        "'kinda'",
    )
    assert len(entry_files(cache)) == 3


def test_malformed_read_only_variable_when_only_looking(cache: Path) -> None:
    env = clean_env(XLA_PERSISTENT_CACHE_READ_ONLY="2")
    assert_one_line_error(
        cli("ls", "--path", str(cache), env=env), "XLA_PERSISTENT_CACHE_READ_ONLY"
    )


def test_malformed_max_size_variable(cache: Path) -> None:
    env = clean_env(XLA_PERSISTENT_CACHE_MAX_SIZE="lots")
    assert_one_line_error(
        cli("stats", "--path", str(cache), env=env), "XLA_PERSISTENT_CACHE_MAX_SIZE"
    )


# stats ---------------------------------------------------------------------------------------


def test_stats_table(cache: Path) -> None:
    result = cli("stats", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in ("entries", "bytes on disk", "budget", "hits", "misses", "hit rate", "puts"):
        assert label in out
    assert "unbounded" in out


def test_stats_json_from_environment(cache: Path) -> None:
    env = clean_env(XLA_PERSISTENT_CACHE_PATH=str(cache), XLA_PERSISTENT_CACHE_MAX_SIZE="1M")
    result = cli("stats", "--json", env=env)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["path"] == str(cache)
    assert stats["entries"] == 3
    assert stats["bytes"] >= 55_100
    assert stats["max_size"] == 1 << 20
    assert stats["fill"] == pytest.approx(stats["bytes"] / (1 << 20))
    assert stats["hits"] == 2
    assert stats["misses"] == 1
    assert stats["hit_rate"] == pytest.approx(2 / 3)
    assert stats["puts"] == 3


def test_stats_says_how_fresh_it_is(cache: Path) -> None:
    result = cli("stats", "--json", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    # A local filesystem: read through to the end just now.
    assert stats["view_fresh"] is True
    assert 0 <= stats["view_age_s"] < 30
    table = cli("stats", "--path", str(cache))
    assert "index as of" in table.stdout and " s ago" in table.stdout, table.stdout


def test_stats_read_only_writes_nothing(cache: Path) -> None:
    before = {str(p): p.stat().st_mtime_ns for p in cache.rglob("*")}
    result = cli("stats", "--read-only", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    assert {str(p): p.stat().st_mtime_ns for p in cache.rglob("*")} == before


# ls ------------------------------------------------------------------------------------------


def test_ls_table(cache: Path) -> None:
    result = cli("ls", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    assert "3 entries" in result.stdout
    assert "jit_small-aaaa" in result.stdout
    assert "jax 0.10.2" in result.stdout
    assert "torch_xla 2.9.0" in result.stdout
    assert "48.8K" in result.stdout  # human-readable size of the 50 000-byte payload


def test_ls_shows_hits_recorded(cache: Path) -> None:
    # The fixture's two gets of jit_small fall in one hit interval: one hit recorded.
    entries = json.loads(cli("ls", "--json", "--path", str(cache)).stdout)
    assert {e["key"]: e["hits"] for e in entries} == {
        "jit_small-aaaa": 1,
        "jit_big-bbbb": 0,
        "123456789012345678901234567890": 0,
    }
    with Store(cache) as other:  # another process's hit is recorded too
        assert other.get("jit_small-aaaa") is not None
    table = cli("ls", "--path", str(cache))
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if "last use" in line)
    assert "hits" in header
    row = next(line for line in table.stdout.splitlines() if "jit_small-aaaa" in line)
    assert " 2 " in row


def test_ls_binary_key(tmp_path: Path) -> None:
    with Store(tmp_path / "c") as store:
        store.put(b"\xff\x00bin\n", b"x")
    table = cli("ls", "--path", str(tmp_path / "c"))
    assert table.returncode == 0, table.stderr
    assert "\\xff\\x00bin\\n" in table.stdout
    assert "\x00" not in table.stdout
    [entry] = json.loads(cli("ls", "--json", "--path", str(tmp_path / "c")).stdout)
    assert bytes.fromhex(entry["key_hex"]) == b"\xff\x00bin\n"


def test_ls_json_sorted_by_size(cache: Path) -> None:
    result = cli("ls", "--json", "--sort", "size", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    assert [e["key"] for e in entries] == [
        "jit_big-bbbb",
        "123456789012345678901234567890",
        "jit_small-aaaa",
    ]
    big = entries[0]
    assert big["size"] == 50_000
    assert big["meta"] == JAX_META
    assert isinstance(big["created"], float | int)


def test_ls_sort_age_and_last_use(cache: Path) -> None:
    ages = json.loads(cli("ls", "--json", "--sort", "age", "--path", str(cache)).stdout)
    created = [e["created"] for e in ages]
    assert created == sorted(created)
    uses = json.loads(cli("ls", "--json", "--sort", "last-use", "--path", str(cache)).stdout)
    assert len(uses) == 3


def test_ls_bad_sort(cache: Path) -> None:
    result = cli("ls", "--sort", "colour", "--path", str(cache))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_ls_empty_cache(tmp_path: Path) -> None:
    Store(tmp_path / "c").close()
    result = cli("ls", "--json", "--path", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


# prune ---------------------------------------------------------------------------------------


def test_prune_max_size_zero_removes_everything(cache: Path) -> None:
    result = cli("prune", "--max-size", "0", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    assert "removed 3 entries" in result.stdout
    assert "removed jit_big-bbbb" in result.stdout
    assert entry_files(cache) == []


def test_prune_reconciles_with_the_directory(cache: Path) -> None:
    """Files gone behind the index's back (another host's eviction it has not read) are not
    counted as freed; files it does not know are found and count toward the budget."""
    files = entry_files(cache)
    gone = max(files, key=lambda f: f.stat().st_size)
    gone.unlink()
    left = sum(f.stat().st_blocks * 512 for f in files if f != gone)
    result = cli("prune", "--max-size", "0", "--json", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dropped"] == 1 and report["added"] == 0, report
    assert report["removed"] == 2, report
    assert report["bytes"] == left, "freed: the removed files' blocks"
    assert entry_files(cache) == []
    text = cli("prune", "--max-size", "0", "--path", str(cache))
    assert "removed 0 entries" in text.stdout, text.stdout


def test_prune_max_size_keeps_recent(cache: Path) -> None:
    result = cli("prune", "--max-size", "20K", "--json", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "jit_big-bbbb" in report["keys"]
    with Store(cache, read_only=True) as store:
        assert "jit_big-bbbb" not in store
        assert "jit_small-aaaa" in store


def test_prune_older_than(cache: Path) -> None:
    result = cli("prune", "--older-than", "7d", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    assert "removed 0 entries" in result.stdout
    assert len(entry_files(cache)) == 3


def test_prune_needs_a_target(cache: Path) -> None:
    assert_one_line_error(cli("prune", "--path", str(cache)), "--max-size")


@pytest.mark.parametrize(("option", "value"), [("--max-size", "12Q"), ("--older-than", "soon")])
def test_prune_bad_values(cache: Path, option: str, value: str) -> None:
    assert_one_line_error(cli("prune", option, value, "--path", str(cache)), option, repr(value))


def test_prune_refuses_read_only(cache: Path) -> None:
    assert_one_line_error(
        cli("prune", "--max-size", "0", "--read-only", "--path", str(cache)), "read-only"
    )
    env = clean_env(XLA_PERSISTENT_CACHE_READ_ONLY="true", XLA_PERSISTENT_CACHE_PATH=str(cache))
    assert_one_line_error(cli("prune", "--max-size", "0", env=env), "read-only")
    assert len(entry_files(cache)) == 3


# verify --------------------------------------------------------------------------------------


def corrupt_one(root: Path) -> Path:
    victim = max(entry_files(root), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-10] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim


def test_verify_healthy(cache: Path) -> None:
    result = cli("verify", "--path", str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no problems found" in result.stdout


def test_verify_finds_and_repairs_corruption(cache: Path) -> None:
    victim = corrupt_one(cache)
    found = cli("verify", "--json", "--path", str(cache))
    assert found.returncode == 1, found.stdout + found.stderr
    assert json.loads(found.stdout)["problems"] >= 1
    assert victim.exists()  # plain verify must not touch anything

    repaired = cli("verify", "--repair", "--path", str(cache))
    assert repaired.returncode == 1  # it found problems, even though it fixed them
    assert "problems found" in repaired.stdout
    assert not victim.exists()

    again = cli("verify", "--path", str(cache))
    assert again.returncode == 0, again.stdout + again.stderr


def test_verify_repair_refuses_read_only(cache: Path) -> None:
    corrupt_one(cache)
    result = cli("verify", "--repair", "--read-only", "--path", str(cache))
    assert_one_line_error(result, "read-only")


def run_in_terminal(*args: str) -> tuple[int, str]:
    """Run the command with stdout on a pseudo-terminal; return its status and output."""
    leader, follower = pty.openpty()
    env = clean_env(COLUMNS="120", TERM="xterm")
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the follower side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.stderr is not None
    errors = proc.stderr.read()
    proc.stderr.close()
    assert b"Traceback" not in errors, errors
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


def test_verify_progress_only_on_a_terminal(cache: Path) -> None:
    status, output = run_in_terminal("verify", "--path", str(cache))
    assert status == 0
    assert "verifying" in output
    piped = cli("verify", "--path", str(cache))
    assert "verifying" not in piped.stdout
    assert "\x1b[" not in piped.stdout


# clear ---------------------------------------------------------------------------------------


def test_clear_yes(cache: Path) -> None:
    result = cli("clear", "--yes", "--path", str(cache))
    assert result.returncode == 0, result.stderr
    assert "removed 3 entries" in result.stdout
    assert entry_files(cache) == []
    assert (cache / "FORMAT").is_file()


def test_clear_asks_and_declines(cache: Path) -> None:
    result = cli("clear", "--path", str(cache), input="n\n")
    assert result.returncode == 1
    assert "Delete all 3 entries" in result.stdout
    assert len(entry_files(cache)) == 3


def test_clear_without_an_answer_deletes_nothing(cache: Path) -> None:
    result = cli("clear", "--path", str(cache), input="")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(entry_files(cache)) == 3


def test_clear_asks_and_confirms(cache: Path) -> None:
    result = cli("clear", "--path", str(cache), input="y\n")
    assert result.returncode == 0, result.stderr
    assert entry_files(cache) == []


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--read-only"], {}),
        ([], {"XLA_PERSISTENT_CACHE_READ_ONLY": "1"}),
        ([], {"XLA_PERSISTENT_CACHE_READ_ONLY": "ON"}),
    ],
)
def test_clear_refuses_read_only(cache: Path, args: list[str], env: dict[str, str]) -> None:
    result = cli("clear", "--yes", "--path", str(cache), *args, env=clean_env(**env))
    assert_one_line_error(result, "read-only")
    assert len(entry_files(cache)) == 3


# demo and doctor are implemented in other modules ---------------------------------------------


def run_with_fake_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``xla_pcache.cli._<module>`` replaced by a recorder of its arguments."""
    code = (
        "import sys, types\n"
        f"fake = types.ModuleType('xla_pcache.cli._{module}')\n"
        "def main(*args):\n"
        "    print('called', repr(args))\n"
        "    return 3\n"
        "fake.main = main\n"
        f"sys.modules['xla_pcache.cli._{module}'] = fake\n"
        "from xla_pcache.cli import main as cli_main\n"
        f"sys.argv = ['xla-pcache', '{module}', *{list(args)!r}]\n"
        "cli_main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60
    )


def test_demo_delegates() -> None:
    result = run_with_fake_module("demo", "--path", "/some/where", "--keep")
    assert result.returncode == 3, result.stderr
    assert "called ('/some/where', True)" in result.stdout
    result = run_with_fake_module("demo")
    assert "called (None, False)" in result.stdout


def test_doctor_delegates() -> None:
    result = run_with_fake_module("doctor", "--json")
    assert result.returncode == 3, result.stderr
    assert "called (None, True)" in result.stdout


def test_stats_shows_single_flight(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with Store(root) as holder, Store(root) as waiter:
        with holder.claim("k", wait=0):
            assert waiter.claim("k", wait=0.2).state == "timed_out"
        holder.put("j", b"v")
    result = cli("stats", "--path", str(root), "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["claims"] == 1 and stats["claims_abandoned"] == 1, stats
    assert stats["claim_waits"] == 1 and stats["claim_wait_timeouts"] == 1, stats
    assert stats["claim_wait_ms"] >= 200, stats
    table = cli("stats", "--path", str(root)).stdout
    for label in ("compile claims taken", "waits for another's compile", "waits that ran out"):
        assert label in table, table
    assert " s" in table.split("time spent waiting")[1].splitlines()[0]


def test_help_rewraps_descriptions_instead_of_breaking_them() -> None:
    # A docstring's source line ends must not show: each description is one paragraph,
    # wrapped to the terminal (80 columns here).
    proc = cli("--help", COLUMNS="80")
    assert proc.returncode == 0, proc.stderr
    rows = [line.strip("│ ").strip() for line in proc.stdout.splitlines() if line.startswith("│")]
    # The source breaks stats' docstring after "compile time saved,": rewrapped, the next
    # words follow on the same line.
    assert any("compile time saved, evictions" in row for row in rows), proc.stdout
    assert any("of the same program and the key" in row for row in rows), proc.stdout
