"""The wheel users install: built by maturin, manylinux, and working where no Rust is.

Builds the wheel (``maturin build --release``; scripts/test.sh passes the one it built as
``XLA_PCACHE_WHEEL``), checks it with ``auditwheel show``, installs
it with the ``jax`` extra into a fresh Python 3.12 venv that already has the newest JAX, and
runs ``xla-pcache demo`` and the zero-code JAX path there on a PATH without cargo/rustc.
Slow (a release build, a venv); pip's downloads are cached under ~/.cache so reruns are
quicker. Every tool it needs is required: a missing one fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from xla_pcache.config import TEST_HOOKS_VAR

from tests.helpers import clean_env
from tests.jax.helpers import ACTIVATION_PROGRAM

# A release build and a venv with the newest JAX take minutes on two cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PIP_CACHE = Path.home() / ".cache" / "xla-pcache-pip"


# Claims a key of the cache at argv[1]; prints whether this build has test hooks, how the
# claim ended and whether the job's memory is read from the hooks' laid-out root.
CLAIM_PROGRAM = """
import sys
from xla_pcache import Store, _core, _memory
with Store(sys.argv[1]) as s:
    claim = s.claim("hook-probe", 5.0)
    print(_core.TEST_HOOKS, claim.state, _memory.default_root() != "/")
    claim.release()
"""


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 900) -> str:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=ROOT
    )
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, f"{name} is needed (pip install -e '.[test]')"
    return found


def _python312() -> str:
    """A Python 3.12 that runs (a pyenv shim may exist but refuse outside its version)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [
        shutil.which("python3.12"),
        *map(str, pyenv.glob("versions/3.12*/bin/python3.12")),
    ]
    for cand in filter(None, candidates):
        probe = subprocess.run([cand, "-c", "pass"], capture_output=True, check=False)
        if probe.returncode == 0:
            return cand
    raise AssertionError(f"a python3.12 is needed to test the wheel; tried {candidates}")


def _jax_version(python: Path, env: dict[str, str]) -> str:
    return _run([str(python), "-c", "import jax; print(jax.__version__)"], env).strip()


def test_wheel_installs_without_rust_and_activates_jax(tmp_path: Path) -> None:
    built = os.environ.get("XLA_PCACHE_WHEEL")
    if built:
        # scripts/test.sh built this checkout's wheel once, for every venv that installs it.
        dist = Path(built).parent
    else:
        dist = tmp_path / "dist"
        _run([_tool("maturin"), "build", "--release", "-o", str(dist)])
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    assert re.fullmatch(r"xla_pcache-[^-]+-cp311-abi3-manylinux\S*\.whl", wheels[0]), wheels
    wheel = dist / wheels[0]
    shown = _run([_tool("auditwheel"), "show", str(wheel)])
    assert 'consistent with the following platform tag: "manylinux' in " ".join(shown.split()), (
        shown
    )

    venv = tmp_path / "venv"
    _run([_python312(), "-m", "venv", str(venv)])
    vbin = venv / "bin"
    # Only the venv and the system: no cargo or rustc, no other venv, no PYTHONPATH.
    path = os.pathsep.join([str(vbin), "/usr/bin", "/bin"])
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    env = clean_env(
        ("XLA_", "JAX_", "PYTHON", "VIRTUAL_ENV", "CARGO", "RUSTUP"),
        PATH=path,
        PIP_CACHE_DIR=str(PIP_CACHE),
        JAX_PLATFORMS="cpu",
    )
    pip = [str(vbin / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, "jax[cpu]>=0.12"], env)
    newest = _jax_version(vbin / "python", env)
    _run([*pip, f"{wheel}[jax]"], env)
    assert _jax_version(vbin / "python", env) == newest

    demo = tmp_path / "demo"
    _run([str(vbin / "xla-pcache"), "demo", "--path", str(demo)], env)
    assert (demo / "FORMAT").exists()

    cache = tmp_path / "cache"
    # The README's set-up: the path, nothing about what is cached.
    jenv = {**env, "XLA_PERSISTENT_CACHE_PATH": str(cache)}
    cold = _run([str(vbin / "python"), "-c", ACTIVATION_PROGRAM], jenv).split()
    warm = _run([str(vbin / "python"), "-c", ACTIVATION_PROGRAM], jenv).split()
    assert (cold[1], warm[0]) == ("0", cold[0])
    assert int(warm[1]) > 0
    assert (cache / "FORMAT").read_text().startswith("xla_pcache-format")
    verify = _run([str(vbin / "xla-pcache"), "verify", "--path", str(cache)], env)
    assert "no problems found" in verify
    report = json.loads(_run([str(vbin / "xla-pcache"), "doctor", "--json"], jenv))
    assert report["activation"]["jax"].startswith("on"), report["activation"]

    # No test hooks in what users install: with their variable set, a claim, an export and
    # a verify (points where a test build marks its progress, and the first three hold for
    # up to two minutes) write nothing in the directory and wait for nothing.
    # Nor is a tree laid out there read in place of /proc and the cgroups.
    hooks = tmp_path / "hooks"
    (hooks / "memory-root").mkdir(parents=True)
    henv = {**env, TEST_HOOKS_VAR: str(hooks)}
    claimed = _run([str(vbin / "python"), "-c", CLAIM_PROGRAM, str(cache)], henv, timeout=60)
    assert claimed.split() == ["False", "claimed", "False"], claimed
    bundle = tmp_path / "bundle.tar.gz"
    _run([str(vbin / "xla-pcache"), "export", "--path", str(cache), "-o", str(bundle)], henv, 60)
    assert bundle.stat().st_size > 0
    _run([str(vbin / "xla-pcache"), "verify", "--path", str(cache)], henv, timeout=60)
    assert sorted(hooks.iterdir()) == [hooks / "memory-root"]
