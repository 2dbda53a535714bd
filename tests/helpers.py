"""Helpers shared by the tests (``tests.helpers``): the environment of a child process, the
command line run as a user runs it, a worker's report, trees compared before and after."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def is_plan(key: object) -> bool:
    """Whether ``key`` is a JAX prefetch plan's: an entry of the store beside the executables
    (docs/jax.md, "Loading ahead"), which tests counting executables leave out."""
    from xla_pcache.jax.ahead._plan import ANY_PREFIX

    return str(key).startswith(ANY_PREFIX)


def is_module_record(key: object) -> bool:
    """Whether ``key`` is a JAX module record's: what it takes to compile a program again, an
    entry of the store beside its executable (docs/jax.md, "Compiling ahead")."""
    from xla_pcache.jax.ahead._record import is_record_key

    return is_record_key(key)


def is_beside(key: object) -> bool:
    """Whether ``key`` is a plan's or a module record's, not an executable's."""
    return is_plan(key) or is_module_record(key)


def entry_file_key(data: bytes) -> str:
    """The key an entry file (a bucket's object, a tier's value) names in its header: after
    the fixed 64 bytes, its length at byte 12 (``rust/core/src/entry.rs``)."""
    n = int.from_bytes(data[12:16], "little")
    return data[64 : 64 + n].decode()


def executable_keys(store: Any) -> list[Any]:
    """``store.keys()`` without prefetch plans and module records."""
    keys = store.keys()
    return [k for k in keys if not is_beside(k)]


def executables(store: Any) -> list[Any]:
    """``store.entries()`` without prefetch plans and module records."""
    return [e for e in store.entries() if not is_beside(e["key"])]


def clean_env(drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """The environment for a child process: this one's, less every variable ``Settings``
    reads (already unset in a test by conftest.py's fixture; cleared here too for scripts
    run outside pytest) and those starting with a prefix in ``drop`` (such as ``"JAX_"``,
    ``"PJRT_"``, or ``"XLA_"`` to leave out ``XLA_FLAGS`` too), plus ``extra``."""
    from xla_pcache.config import VARIABLE_NAMES

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in VARIABLE_NAMES and not (drop and k.startswith(drop))
    }
    env.update(extra)
    return env


def run_python(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter (as a separate process, like a real user)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


def hooks_env(hooks: Path) -> dict[str, str]:
    """The variable that turns the test hooks on in a child process, marking into
    ``hooks``. A build without them (the wheel, or an editable install made without the
    cargo feature ``test-hooks``) would leave the test waiting for a mark that never comes:
    it fails here instead, saying how to build them in."""
    from xla_pcache import _core

    assert _core.TEST_HOOKS, (
        "this test needs the test hooks, which this build of xla_pcache._core lacks: "
        "install it with MATURIN_PEP517_ARGS='--features test-hooks' (scripts/test.sh does)"
    )
    return {_core.TEST_HOOKS_VAR: str(hooks)}


REPO = Path(__file__).resolve().parent.parent

# The command line, as a user types ``xla-pcache``: for the tests that start it themselves
# (under a terminal, through a pipe, to interrupt it).
CLI = (sys.executable, "-m", "xla_pcache")


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    input: str | None = None,
    cwd: Path | None = None,
    text: bool = True,
    **variables: str,
) -> subprocess.CompletedProcess[Any]:
    """``xla-pcache ARGS`` in a fresh process, its output captured (bytes where ``text`` is
    false). Its environment is ``env`` (``clean_env()`` when None: nothing from the shell
    that runs the suite) plus ``variables``. The status is the caller's to check: many tests
    expect a failure."""
    full = clean_env() if env is None else dict(env)
    full.update(variables)
    return subprocess.run(
        [*CLI, *args],
        env=full,
        input=input,
        cwd=cwd,
        capture_output=True,
        text=text,
        timeout=timeout,
        check=False,
    )


def cli_out(*args: str, **kwargs: Any) -> str:
    """The output of a command that must succeed (``cli``'s arguments)."""
    proc = cli(*args, **kwargs)
    assert proc.returncode == 0, f"xla-pcache {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return str(proc.stdout)


def cli_here(*args: str) -> Any:
    """``xla-pcache ARGS`` run in this process (typer's runner: the same settings and
    servers as the test); its status is the caller's to check, but it must end in an exit
    status, not an exception."""
    from typer.testing import CliRunner
    from xla_pcache.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception,
        result.output,
    )
    return result


def explain_json(root: Path) -> list[dict[str, Any]]:
    """``xla-pcache explain --json`` of the cache at ``root``: one record a miss."""
    records: list[dict[str, Any]] = json.loads(cli_out("explain", "--path", str(root), "--json"))
    return records


def start_worker(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[str]:
    """``python ARGV`` (a worker script and its arguments, or ``-c CODE``) in a fresh
    interpreter, its output piped and not waited for: for the tests that run several at
    once. ``env`` is its whole environment (``clean_env()`` when None)."""
    return subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env() if env is None else env,
        cwd=cwd,
    )


def finish_worker(proc: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
    """The report of a worker once it exits: the JSON object on its last line of output,
    with its stderr added. It must exit with 0 and report no error: the workers that catch
    their steps' exceptions list them in ``errors`` (a traceback each), and a test that
    never looks there would pass on a worker that failed."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-4000:]}"
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    report["stderr"] = err
    errors = report.get("errors") or []
    assert errors == [], "\n".join(e["traceback"] if isinstance(e, dict) else e for e in errors)
    return report


def run_worker(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
) -> dict[str, Any]:
    """A worker run to its end (``start_worker``), and its report (``finish_worker``)."""
    return finish_worker(start_worker(*argv, env=env, cwd=cwd), timeout)


def tree_state(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path under root with its size, mtime and content (files): for before/after checks."""
    state: dict[str, tuple[int, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            data = p.read_bytes() if p.is_file() else b""
            state[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, data)
    return state


@contextlib.contextmanager
def read_only_copy(src: Path, dest: Path) -> Iterator[Path]:
    """`src` seen through a read-only path: a read-only bind mount when we are root (root
    ignores permission bits), else the same tree with write permission removed."""
    if os.geteuid() == 0:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(src), str(dest)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(dest)], check=True)
            yield dest
        finally:
            subprocess.run(["umount", "-l", str(dest)], check=False)
    else:
        shutil.copytree(src, dest, symlinks=True)
        for dirpath, dirnames, filenames in os.walk(dest):
            for n in dirnames + filenames:
                os.chmod(Path(dirpath) / n, 0o555 if n in dirnames else 0o444)
        os.chmod(dest, 0o555)
        try:
            yield dest
        finally:
            for dirpath, dirnames, _ in os.walk(dest):
                os.chmod(dirpath, 0o755)
                for n in dirnames:
                    os.chmod(Path(dirpath) / n, 0o755)


def keygen(tmp_path: Path, name: str) -> tuple[str, str]:
    """(private key file, public key NAME:BASE64), made by the CLI (``xla-pcache keygen``)
    in a fresh process; the file is private to its owner."""
    out = tmp_path / f"{name}.key"
    proc = cli("keygen", name, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert os.stat(out).st_mode & 0o777 == 0o600
    public = proc.stdout.strip().splitlines()[-1]
    assert public.startswith(f"{name}:")
    return str(out), public


def interruptible_child() -> None:
    """``preexec_fn`` for a child a test sends SIGINT: Ctrl-C's default action, whatever this
    process inherited. A shell starts background jobs with SIGINT ignored, and Python keeps
    an ignored SIGINT ignored, so a suite started in the background would send a signal
    its child never sees."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
