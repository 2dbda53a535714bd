"""The suite's own rule, checked: where skips fail (``CI`` set, as by scripts/test.sh), a skip at
run time and a module skipped while collected both make pytest exit non-zero."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

RUN_TIME_SKIP = "import pytest\n\ndef test_it():\n    pytest.skip('not here')\n"
COLLECTION_SKIP = (
    "import pytest\n\npytest.importorskip('no_such_module_xla_pcache')\n\n"
    "def test_it():\n    pass\n"
)


def _pytest(tmp_path: Path, body: str, ci: bool) -> subprocess.CompletedProcess[str]:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_module.py").write_text(body)
    # Beside a test that passes, as in the real suite (alone, pytest exits 5: nothing ran).
    (tmp_path / "test_passes.py").write_text("def test_passes():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("body", [RUN_TIME_SKIP, COLLECTION_SKIP], ids=["run-time", "collection"])
def test_a_skip_fails_where_skips_fail(tmp_path: Path, body: str) -> None:
    strict = _pytest(tmp_path, body, ci=True)
    assert strict.returncode != 0, strict.stdout
    assert "in CI, where every test must run" in strict.stdout
    lenient = _pytest(tmp_path, body, ci=False)
    assert lenient.returncode == 0, lenient.stdout
    assert "skipped" in lenient.stdout


def test_the_readme_command_makes_skips_fail() -> None:
    # scripts/test.sh is the README's test command: it must run pytest as CI does.
    script = (REPO / "scripts" / "test.sh").read_text()
    assert "export CI=${CI:-true}" in script
