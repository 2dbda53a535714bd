"""Plans that follow the program: programs that share an entry point and its arguments keep a
variant each, told apart by what they read, and the plan settles. Real JAX in fresh processes
(or a real Jupyter kernel), configured by the environment alone, as users start them:

- one script whose configuration a variable chooses, with the same arguments;
- two scripts fed on standard input (``python - < a.py``);
- ``python -m pytest`` in two directories (two repositories' test suites);
- scripts of the same name in two unrelated projects without names (``train.py`` at the
  root of two clones), which share a plan's name;
- two notebooks run by a real kernel (nbclient), whose ``-f kernel-<uuid>.json`` argument
  changes at every start, from two copies of their project.

And one program run from two checkouts of its project (a CI job's directory, a container's
copy): the second's first run loads everything ahead and writes no plan.

Each program jits one program both share and three of its own. What is checked: after its
first run each program loads from its own variant (what both share before it is told, its
own after its first read of one of its programs), wastes nothing and writes nothing; each
program's first run is the one plan write it ever causes; a run with loading ahead off
writes nothing either. (Read-only runs write no plan: tests/jax/test_prefetch.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.config import Settings
from xla_pcache.jax.ahead import _plan

from tests.helpers import is_plan
from tests.jax.helpers import COUNT_HITS, JAX_ONLY, worker_env

pytestmark = JAX_ONLY

# The program's body: ``WHICH`` is "a" or "b". Knows nothing of xla_pcache but the
# report it writes.
BODY = (
    COUNT_HITS
    + """
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
out = [np.asarray(jax.jit(lambda a: jnp.tanh(a).sum(axis=0))(x)).tolist()]
base = {"a": 10, "b": 20}[WHICH]
for k in range(3):
    c = base + k
    f = jax.jit(lambda a, c=c: jnp.sin(a @ a.T * c).sum(axis=0) + c)
    out.append(np.asarray(f(x)).tolist())
import xla_pcache.jax as xj
REPORT = json.dumps({"out": out, "hits": len(hits), "prefetch": xj.prefetch_report()})
"""
)
OWN = 3  # each program's own executables, besides the one both share


def _script(which: str) -> str:
    """The program as a script whose configuration comes from the environment."""
    head = 'import os\nWHICH = os.environ["TEST_PROGRAM"]\n' if which == "env" else ""
    head += f"WHICH = {which!r}\n" if which != "env" else ""
    tail = 'open(os.environ["TEST_REPORT"], "w").write(REPORT)\n'
    return head + BODY + tail


def _pytest_suite(which: str) -> str:
    """The program as a test of a suite that ``python -m pytest`` runs."""
    body = textwrap.indent(BODY, "    ")
    tail = '    open(os.environ["TEST_REPORT"], "w").write(REPORT)\n'
    return f"def test_programs():\n    WHICH = {which!r}\n{body}{tail}"


class Launch:
    """How the programs are started: ``start(which, env)`` runs one in a fresh process and
    returns its report."""

    def __init__(self, how: str, root: Path, cache: Path) -> None:
        self.how, self.root, self.cache = how, root, cache
        root.mkdir(parents=True, exist_ok=True)
        if how == "script":
            (root / "train.py").write_text(_script("env"))
        elif how == "stdin":
            for which in "ab":
                (root / f"{which}.py").write_text(_script(which))
        elif how == "pytest":
            for which in "ab":
                (root / which).mkdir()
                (root / which / "test_suite.py").write_text(_pytest_suite(which))
        elif how == "projects":
            # Two clones of unrelated projects, each with its train.py at the top.
            for which in "ab":
                (root / which / ".git").mkdir(parents=True)
                (root / which / "train.py").write_text(_script(which))

    def run(self, which: str, **extra: str) -> dict[str, Any]:
        env = {"TEST_PROGRAM": which} if self.how == "script" else {}
        stdin = None
        cwd = self.root
        if self.how == "script":
            argv = [sys.executable, str(self.root / "train.py"), "--steps", "3"]
        elif self.how == "stdin":
            argv = [sys.executable, "-"]
            stdin = self.root / f"{which}.py"
        elif self.how == "projects":
            argv = [sys.executable, str(self.root / which / "train.py")]
        else:
            # The same command in each repository.
            argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider"]
            argv += ["test_suite.py"]
            cwd = self.root / which
        return _run(argv, self.cache, cwd, stdin=stdin, **env, **extra)


def _run(
    argv: list[str], cache: Path, cwd: Path, stdin: Path | None = None, **extra: str
) -> dict[str, Any]:
    """``argv`` in a fresh process in ``cwd`` on ``cache`` (``stdin`` its input): the report
    the program wrote."""
    report = cache.parent / "report.json"
    report.unlink(missing_ok=True)
    env = worker_env({"XLA_PERSISTENT_CACHE_PATH": str(cache), "TEST_REPORT": str(report), **extra})
    with open(stdin if stdin is not None else os.devnull, "rb") as given:
        proc = subprocess.run(
            argv,
            stdin=given,
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=300,
            check=False,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def counters(cache: Path) -> dict[str, int]:
    with Store(cache, read_only=True) as store:
        return {k: v for k, v in store.stats().items() if isinstance(v, int)}


def plan_bytes(cache: Path) -> bytes:
    with Store(cache, read_only=True, settings=Settings()) as store:
        keys = store.keys()
        (key,) = [k for k in keys if is_plan(k)]
        blob = store.get(key)
        assert blob is not None
        return bytes(blob)


def check_own_plan(report: dict[str, Any], cold: dict[str, Any]) -> None:
    """A warm run of a program the plan knows: the executable both share loaded before it
    was told, its first own program read JAX's way (the read that told it), the rest loaded
    from its own variant; every read a hit, the same results."""
    prefetch = report["prefetch"]
    assert report["out"] == cold["out"] and report["hits"] == 1 + OWN
    assert prefetch["variants"] == 2 and prefetch["candidates"] == 1, prefetch
    assert prefetch["states"] == {"taken": OWN, "skipped": 1}, prefetch
    assert prefetch["counters"]["prefetch_wasted"] == 0, prefetch
    assert prefetch["counters"]["prefetch_plans_written"] == 0, prefetch


@pytest.mark.parametrize("how", ["script", "stdin", "pytest", "projects"])
def test_programs_sharing_an_entry_point_each_keep_their_own_plan(how: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    launch = Launch(how, tmp_path / "programs", cache)
    cold_a = launch.run("a")
    assert cold_a["hits"] == 0
    assert counters(cache)["prefetch_plans_written"] == 1
    # B's first run: A's variant is the only candidate, so it is loaded (what B does not
    # read of it is wasted, once), and B's variant joins it.
    cold_b = launch.run("b")
    assert cold_b["hits"] == 1 and cold_b["prefetch"]["candidates"] == 1
    assert counters(cache)["prefetch_plans_written"] == 2
    plan = _plan.decode(plan_bytes(cache))
    assert len(plan.variants) == 2

    check_own_plan(launch.run("a"), cold_a)
    if how == "script":
        # Loading ahead off (nothing recorded, nothing written) between runs with it on,
        # and B's warm start as A's (the other launches run A's only, to spare time).
        plain = launch.run("a", XLA_PCACHE_PREFETCH="0")
        assert plain["prefetch"] is None and plain["out"] == cold_a["out"]
        check_own_plan(launch.run("b"), cold_b)
    stats = counters(cache)
    assert stats["prefetch_plans_written"] == 2, "one write per program, its first run"
    assert _plan.decode(plan_bytes(cache)) == plan
    assert stats["prefetch_wasted"] == OWN, "only A's own, in B's first run"


# ----------------------------------------------------------------------------- checkouts


def _checkout(root: Path) -> Path:
    """A project as a clone holds it: its ``pyproject.toml``, program A's script in
    ``src/``, and the two notebooks as ``.ipynb`` files in ``notebooks/``."""
    import nbformat

    (root / "src").mkdir(parents=True)
    (root / "notebooks").mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    (root / "src" / "train.py").write_text(_script("a"))
    for which in "ab":
        nbformat.write(_notebook(which), root / "notebooks" / f"{which}.ipynb")
    return root


def test_one_program_from_two_checkouts_loads_its_plan_in_both(tmp_path: Path) -> None:
    # A CI job's checkout, then a container's copy of it at another prefix, started from
    # another directory: the same plan, found and loaded whole at the copy's first run.
    cache = tmp_path / "cache"
    ci = _checkout(tmp_path / "builds" / "1234" / "repo")
    app = tmp_path / "container" / "app"
    shutil.copytree(ci, app)
    cold = _run([sys.executable, str(ci / "src" / "train.py")], cache, ci)
    assert cold["hits"] == 0 and counters(cache)["prefetch_plans_written"] == 1
    warm = _run([sys.executable, str(app / "src" / "train.py")], cache, app / "src")
    prefetch = warm["prefetch"]
    assert warm["out"] == cold["out"] and warm["hits"] == 1 + OWN
    assert prefetch["plan_key"] == cold["prefetch"]["plan_key"]
    assert prefetch["states"] == {"taken": 1 + OWN}, prefetch
    stats = counters(cache)
    assert stats["prefetch_loaded"] == stats["prefetch_used"] == 1 + OWN
    assert stats["prefetch_wasted"] == 0 and stats["prefetch_plans_written"] == 1
    assert len(_plan.decode(plan_bytes(cache)).variants) == 1


def test_a_name_that_is_not_utf8_keeps_its_plan(tmp_path: Path) -> None:
    # A plan's name of bytes that are not UTF-8 (XLA_PCACHE_PREFETCH_NAME from a shell of
    # another encoding; a notebook's directory named so): taken as it is, it cannot be
    # hashed into the plan's key (nothing loaded ahead or written, a warning at every
    # start); escaped, it names its plan. (JAX itself cannot run a script whose own path
    # is not UTF-8.)
    cache = tmp_path / "cache"
    (tmp_path / "train.py").write_text(_script("a"))
    name = os.fsdecode(b"lm-\xe9")
    argv = [sys.executable, str(tmp_path / "train.py")]
    cold = _run(argv, cache, tmp_path, XLA_PCACHE_PREFETCH_NAME=name)
    warm = _run(argv, cache, tmp_path, XLA_PCACHE_PREFETCH_NAME=name)
    assert warm["out"] == cold["out"] and warm["prefetch"]["states"] == {"taken": 1 + OWN}
    assert warm["prefetch"]["workload"].startswith("lm-\\xe9 | jax ")
    assert counters(cache)["prefetch_plans_written"] == 1


# ----------------------------------------------------------------------------- notebooks


def _notebook(which: str) -> Any:
    import nbformat

    body = BODY.replace("REPORT = ", "print(").rstrip() + ")\n"
    return nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(f"WHICH = {which!r}"), nbformat.v4.new_code_cell(body)]
    )


def _run_notebook(path: Path, cache: Path) -> dict[str, Any]:
    """The notebook file at ``path`` run by a real ipykernel kernel (``python -m
    ipykernel_launcher -f <new connection file>``) in its directory, as Jupyter runs it; the
    report its last cell printed."""
    import nbformat
    from nbclient import NotebookClient

    env = worker_env({"XLA_PERSISTENT_CACHE_PATH": str(cache)})
    nb = nbformat.read(path, as_version=4)
    where = str(path.parent)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": where}}
    )
    client.execute(env=env, cwd=where)
    (output,) = [o for o in nb.cells[-1].outputs if o.get("name") == "stdout"]
    result: dict[str, Any] = json.loads(output["text"].strip().splitlines()[-1])
    return result


def test_notebooks_of_one_kernel_each_keep_their_own_plan_in_every_checkout(
    tmp_path: Path,
) -> None:
    # Both notebooks' first runs in one clone; their next runs in another clone of the
    # project (fresh kernels each time): each loads its own variant and writes nothing.
    cache = tmp_path / "cache"
    first = _checkout(tmp_path / "work" / "demo")
    second = tmp_path / "elsewhere" / "demo-2"
    shutil.copytree(first, second)
    cold_a = _run_notebook(first / "notebooks" / "a.ipynb", cache)
    cold_b = _run_notebook(first / "notebooks" / "b.ipynb", cache)
    assert (cold_a["hits"], cold_b["hits"]) == (0, 1)
    assert counters(cache)["prefetch_plans_written"] == 2
    check_own_plan(_run_notebook(second / "notebooks" / "a.ipynb", cache), cold_a)
    check_own_plan(_run_notebook(second / "notebooks" / "b.ipynb", cache), cold_b)
    assert counters(cache)["prefetch_plans_written"] == 2
