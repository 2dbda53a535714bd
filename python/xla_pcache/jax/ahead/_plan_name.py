"""JAX: the name a workload's plan is found by, the same for the same program wherever it
lives (another checkout, a container's copy, a CI job's directory), known before JAX's
backend starts.

The name says what was started, never where its tree lies:

- a script: its path relative to its **project** (the nearest directory above it holding
  ``.git``, ``.hg``, ``pyproject.toml``, ``setup.py`` or ``setup.cfg``), after the project's
  name when its ``pyproject.toml`` gives one (``[project]`` or ``[tool.poetry]``); a script
  in no project, its file name. ``script flax:examples/seq2seq/train.py``;
- a console script (``pytest``, installed beside the interpreter): ``command pytest``;
- ``python -m pkg``: ``module pkg``;
- a Jupyter kernel (``python -m ipykernel_launcher -f <new file each start>``): the
  kernel's working directory, where Jupyter starts it (the notebook's), as a script's path,
  and the notebook's file name when the server says it (``JPY_SESSION_NAME``);
- ``python -c``: a digest of the code; standard input or a REPL: ``interactive``.

Commands, modules, code and ``interactive`` name the program by what runs it, not by what it
runs (``python -m pytest`` in two repositories, pytest-xdist's workers started by ``-c``), so
the project of the working directory is added when it has a name (``module pytest in
flax``). Nothing else of the command line is
part of the name: arguments change at every start and programs behind one name are told
apart by what they read (``_recognition``). Unrelated programs of the same name (``train.py``
at the root of two unnamed projects) share a plan the same way, each keeping its variant.

Names are what a person reads in ``xla-pcache ls``: anything unprintable in a path or a
project's name (a file name of bytes that are not UTF-8, a newline) is escaped, and a name
past ``MAX_SHOWN`` characters is cut and followed by a digest of the whole, so that two
long names stay two plans.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import sysconfig

from xla_pcache._core import hash_key

# What marks a project's top directory.
MARKERS = (".git", ".hg", "pyproject.toml", "setup.py", "setup.cfg")
# Directories looked at above a script, and the bytes of a pyproject.toml read for its name.
MAX_DEPTH = 64
MAX_PROJECT_FILE = 256 << 10
# A name as shown; longer ones are cut and followed by a digest of the whole.
MAX_SHOWN = 480
# Modules that start a Jupyter kernel (ipykernel's, Colab's).
KERNELS = frozenset(
    {"ipykernel_launcher", "ipykernel", "ipykernel.__main__", "colab_kernel_launcher"}
)
# A project's name as ``pyproject.toml`` gives it, normalized as package indexes do.
_PROJECT_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")


def printable(text: str) -> str:
    """``text`` with what cannot be shown or stored as UTF-8 escaped: bytes of a file name
    that were not UTF-8 (surrogates), control and other unprintable characters."""
    raw = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in raw)


def shown(text: str) -> str:
    """``text`` printable and at most ``MAX_SHOWN`` characters, a cut one followed by a
    digest of the whole."""
    safe = printable(text)
    if len(safe) <= MAX_SHOWN:
        return safe
    return f"{safe[: MAX_SHOWN - 34]}..{hash_key(safe)}"


def project_root(directory: str) -> str | None:
    """The nearest directory at or above ``directory`` holding a project marker."""
    here = os.path.abspath(directory)
    for _ in range(MAX_DEPTH):
        if any(os.path.lexists(os.path.join(here, m)) for m in MARKERS):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return None


def project_name(root: str) -> str | None:
    """The project's name in ``root``'s ``pyproject.toml``, normalized (lower case, runs of
    ``-_.`` one dash); None where there is none, or no regular file of at most
    ``MAX_PROJECT_FILE`` bytes that TOML reads."""
    path = os.path.join(root, "pyproject.toml")
    # Here, not at the top: most programs run where there is no pyproject.toml to read.
    import tomllib

    try:
        # Never blocks on a FIFO, never follows the read past the bound.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_PROJECT_FILE:
            return None
        data = os.read(fd, MAX_PROJECT_FILE + 1)
        doc = tomllib.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return None
    finally:
        os.close(fd)
    for table in (doc.get("project"), doc.get("tool", {}).get("poetry")):
        name = table.get("name") if isinstance(table, dict) else None
        if isinstance(name, str) and _PROJECT_NAME.fullmatch(name):
            return re.sub(r"[-_.]+", "-", name).lower()
    return None


def place(path: str) -> str:
    """Where ``path`` (a file or a directory) lies, as the same in every copy of its
    project: ``<project name>:<path in the project>``, the path alone in a project without a
    name, the last component outside any project."""
    path = os.path.abspath(path)
    root = project_root(path if os.path.isdir(path) else os.path.dirname(path))
    if root is None:
        return os.path.basename(path) or path
    inside = os.path.relpath(path, root).replace(os.sep, "/")
    name = project_name(root)
    return f"{name}:{inside}" if name else inside


def _in_project() -> str:
    """`` in <name>`` for a working directory in a named project, else nothing."""
    try:
        root = project_root(os.getcwd())
    except OSError:
        return ""
    name = project_name(root) if root is not None else None
    return f" in {name}" if name else ""


def _console_script(path: str) -> bool:
    """Whether ``path`` is a command installed with the interpreter (``pytest``), in its
    environment's or the user's scripts, or linked from elsewhere to one (pipx)."""
    dirs = {os.path.dirname(sys.executable), sysconfig.get_path("scripts")}
    with contextlib.suppress(KeyError, ValueError):
        dirs.add(sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user")))
    places = {os.path.abspath(d) for d in dirs if d}
    here = {os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path))}
    return bool(places & here)


def entry_point() -> str:
    """What names this process's workload (the module docstring's forms), printable."""
    return printable(_entry_point())


def _entry_point() -> str:
    argv = list(sys.argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", None)
    if isinstance(module, str) and module and module != "__main__":
        if module in KERNELS:
            notebook = os.environ.get("JPY_SESSION_NAME", "")
            try:
                where = place(os.getcwd())
            except OSError:
                where = ""
            tail = f" {os.path.basename(notebook)}" if notebook else ""
            return f"notebook {where}{tail}"
        return f"module {module}{_in_project()}"
    first = argv[0] if argv else ""
    if first == "-c":
        orig = list(getattr(sys, "orig_argv", []))
        code = orig[orig.index("-c") + 1] if "-c" in orig[:-1] else ""
        return f"code {hash_key(printable(code))}{_in_project()}"
    if first in ("", "-"):
        return f"interactive{_in_project()}"
    if _console_script(first):
        return f"command {os.path.basename(first)}{_in_project()}"
    return f"script {place(first)}"


def workload(name: str | None, jax_version: str, process: int) -> str:
    """The text a plan's key is hashed from: ``name`` (``XLA_PCACHE_PREFETCH_NAME``) or the
    entry point, the JAX version and the process index: all known before the backend
    starts (the platform and device count are each variant's)."""
    what = name if name else entry_point()
    return f"{shown(what)} | jax {printable(jax_version)} | process {process}"
