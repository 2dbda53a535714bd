"""The name a JAX plan is found by (``xla_pcache.jax.ahead._plan_name``): the same for the same
program in every copy of its tree, different for what runs differently, and safe whatever the
tree holds (names that are not UTF-8, control characters, a hostile ``pyproject.toml``).
No JAX needed: the name is text made from ``sys.argv``, ``__main__`` and the files around
the script. The real programs run from two checkouts are in tests/jax/test_plan_names.py."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from xla_pcache.jax.ahead import _plan, _plan_name

# ``run(argv0, cwd=None)``: the workload's name of ``python argv0`` started in ``cwd``.
Run = Callable[..., str]


@pytest.fixture
def as_script(monkeypatch: pytest.MonkeyPatch) -> Run:
    """``run(argv0, cwd=None)``: the name of this process's workload were it started as
    ``python argv0`` (in ``cwd``)."""
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)

    def run(argv0: str, cwd: Path | None = None) -> str:
        monkeypatch.setattr(sys, "argv", [argv0, "--steps", "10"])
        if cwd is not None:
            monkeypatch.chdir(cwd)
        return _plan_name.entry_point()

    return run


def _tree(root: Path, pyproject: str | None = None, marker: str | None = None) -> Path:
    """A project at ``root``: ``src/train.py`` and ``notebooks/``, with a ``pyproject.toml``
    of ``pyproject`` or the marker ``marker``."""
    (root / "src").mkdir(parents=True)
    (root / "notebooks").mkdir()
    (root / "src" / "train.py").write_text("print('train')\n")
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    if marker == ".git":
        (root / ".git").mkdir()
    elif marker is not None:
        (root / marker).write_text("")
    return root / "src" / "train.py"


def test_a_script_is_named_the_same_in_every_copy_of_its_project(
    tmp_path: Path, as_script: Run
) -> None:
    run = as_script
    ci = _tree(tmp_path / "builds" / "1234" / "repo", '[project]\nname = "Flax_Examples"\n')
    app = tmp_path / "app"
    shutil.copytree(ci.parents[1], app)
    # A CI job's checkout and a container's copy, started by path or from inside.
    name = run(str(ci))
    assert name == "script flax-examples:src/train.py"
    assert run(str(app / "src" / "train.py")) == name
    assert run("train.py", cwd=app / "src") == name
    assert run("../src/train.py", cwd=app / "notebooks") == name
    # Only a marker (a clone without pyproject.toml): the path in the project.
    for marker in (".git", "setup.py", "setup.cfg", ".hg"):
        other = _tree(tmp_path / f"clone-{marker}" / "clone", marker=marker)
        assert run(str(other)) == "script src/train.py", marker
    # Outside any project: the file's name.
    loose = tmp_path / "loose" / "deeper"
    loose.mkdir(parents=True)
    (loose / "train.py").write_text("")
    assert run(str(loose / "train.py")) == "script train.py"
    # A project's name from poetry's table; a name of other form is no name.
    poetry = _tree(tmp_path / "poetry", '[tool.poetry]\nname = "my.lib"\n')
    assert run(str(poetry)) == "script my-lib:src/train.py"
    bad = _tree(tmp_path / "bad", '[project]\nname = "a\\nb"\n')
    assert run(str(bad)) == "script src/train.py"


def test_what_runs_a_program_for_it_is_named_with_its_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_script: Run
) -> None:
    run = as_script
    project = _tree(tmp_path / "one", '[project]\nname = "one"\n').parents[1]
    unnamed = _tree(tmp_path / "two", marker=".git").parents[1]
    # A console script (pytest as installed beside the interpreter), from any venv.
    scripts = sysconfig.get_path("scripts")
    assert run(os.path.join(scripts, "pytest"), cwd=project) == "command pytest in one"
    assert run(os.path.join(scripts, "pytest"), cwd=unnamed) == "command pytest"
    # Standard input, a REPL.
    assert run("-", cwd=project / "src") == "interactive in one"
    assert run("", cwd=unnamed) == "interactive"
    # python -c: the code, wherever.
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-c", "print(1)", "x"])
    code = run("-c", cwd=unnamed)
    assert code.startswith("code ") and run("-c", cwd=tmp_path) == code
    assert run("-c", cwd=project) == f"{code} in one"
    # python -m: the module, in the project of the working directory when it has a name.
    spec = SimpleNamespace(name="pytest")
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", spec)
    assert run("/venv/lib/pytest/__main__.py", cwd=project) == "module pytest in one"
    assert run("/venv/lib/pytest/__main__.py", cwd=unnamed) == "module pytest"
    # A Jupyter kernel (its argument file is new at every start): the directory it runs in
    # (the notebook's), and the notebook when the server names it.
    spec.name = "ipykernel_launcher"
    kernel = ["/venv/lib/ipykernel_launcher.py", "-f", "/run/kernel-0f3e.json"]
    monkeypatch.setattr(sys, "argv", kernel)
    monkeypatch.chdir(project / "notebooks")
    assert _plan_name.entry_point() == "notebook one:notebooks"
    monkeypatch.setenv("JPY_SESSION_NAME", str(project / "notebooks" / "lm.ipynb"))
    assert _plan_name.entry_point() == "notebook one:notebooks lm.ipynb"
    monkeypatch.chdir(unnamed)
    assert _plan_name.entry_point() == "notebook . lm.ipynb"


def test_names_separate_what_makes_a_plan_unusable_elsewhere() -> None:
    # What the backend says (platform, devices) is each variant's, not the name's: the
    # name is known before the backend starts.
    names = {
        _plan_name.workload("script train.py", "0.10.2", 0),
        _plan_name.workload("script train.py", "0.10.2", 1),
        _plan_name.workload("script train.py", "0.12.0", 0),
        _plan_name.workload("lm", "0.10.2", 0),
    }
    assert len(names) == 4 and len({_plan.plan_key(n) for n in names}) == 4
    assert all(_plan.plan_key(n).startswith(_plan.KEY_PREFIX) for n in names)
    assert _plan.KEY_PREFIX.startswith(_plan.ANY_PREFIX)
    assert not _plan.valid_key(_plan.plan_key(next(iter(names))))
    assert _plan.valid_platform("tpu", 8) and not _plan.valid_platform("t p u", 8)
    assert not _plan.valid_platform("cpu", 0)


def test_hostile_names_are_shown_safely_and_stay_apart(tmp_path: Path, as_script: Run) -> None:
    run = as_script
    # A directory whose name is not UTF-8, and one with a newline: a name that can be hashed
    # and stored (it could not, when the path went in as it was), printable, and distinct.
    odd = os.fsdecode(b"caf\xe9")
    for part in (odd, "two\nlines", "tab\there"):
        script = tmp_path / part / "train.py"
        script.parent.mkdir()
        (script.parent / ".git").mkdir()
        script.write_text("")
    assert run(str(tmp_path / odd / "train.py")) == "script train.py"
    moved = tmp_path / "x" / odd
    moved.mkdir(parents=True)
    (moved / "t\nrain.py").write_text("")
    name = run(str(moved / "t\nrain.py"))
    assert name == "script t\\nrain.py" and name.isprintable()
    text = _plan_name.workload(odd + "\x00" + "\udcff", "0.10\n2", 0)
    assert text.isprintable() and "\\xe9" in text and "\\x00" in text
    _plan.plan_key(text)
    text.encode("utf-8")
    # Long names are cut for people and stay two plans.
    long_a = _plan_name.workload("x" * 5000 + "a", "0.10.2", 0)
    long_b = _plan_name.workload("x" * 5000 + "b", "0.10.2", 0)
    assert len(long_a) < _plan_name.MAX_SHOWN + 40 and long_a != long_b
    assert _plan.plan_key(long_a) != _plan.plan_key(long_b)


@pytest.mark.parametrize("how", ["fifo", "huge", "directory", "garbage", "deep", "link"])
def test_a_hostile_pyproject_gives_no_name_and_never_blocks(tmp_path: Path, how: str) -> None:
    root = tmp_path / "project"
    root.mkdir()
    path = root / "pyproject.toml"
    if how == "fifo":
        os.mkfifo(path)  # opened without blocking, and no regular file: no name
    elif how == "huge":
        path.write_text('[project]\nname = "big"\n' + "#" * (_plan_name.MAX_PROJECT_FILE + 1))
    elif how == "directory":
        path.mkdir()
    elif how == "garbage":
        path.write_bytes(b"\xff\xfe[[[[")
    elif how == "deep":
        path.write_text("x = " + "[" * 100_000 + "]" * 100_000)
    else:
        target = tmp_path / "elsewhere.toml"
        target.write_text('[project]\nname = "linked"\n')
        path.symlink_to(target)
    assert _plan_name.project_root(str(root)) == str(root)
    expected = "linked" if how == "link" else None
    assert _plan_name.project_name(str(root)) == expected
