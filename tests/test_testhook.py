"""The test hooks (a test build only) never write through a link: whoever made the hook
directory can plant a link at the name a process will mark, ``<point>.<pid>``, to any file
that process may write; the mark is created exclusively beneath the directory, so the link
is left as it is and its target is neither truncated nor created. Both kinds of points: the
core's (a compile claim's ``claimed``) and the package's (``_testhook.reached``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import clean_env, hooks_env

# Plants links at this process's marks (argv: hooks, victim, absent target, cache), then
# reaches the points: the package's own, and the core's through a claim (its `.go` is there
# already, so the hold ends at once).
PLANTED = """
import os, sys
from xla_pcache import Store, _testhook
hooks, victim, absent, cache = sys.argv[1:5]
pid = os.getpid()
os.symlink(victim, os.path.join(hooks, f"export.{pid}"))
os.symlink(absent, os.path.join(hooks, f"claimed.{pid}"))
open(os.path.join(hooks, "claimed.go"), "w").close()
print(_testhook.reached("export"))
with Store(cache) as s:
    claim = s.claim("k", 5.0)
    print(claim.state)
    claim.release()
print(_testhook.reached("walk"))
"""


def test_a_link_planted_at_a_mark_is_never_followed(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"a file the process may write")
    absent = tmp_path / "absent"
    r = subprocess.run(
        [sys.executable, "-c", PLANTED, str(hooks), str(victim), str(absent), str(tmp_path / "c")],
        env=clean_env(**hooks_env(hooks)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    # Each point counts as reached (its name is taken), so a test waiting on it goes on.
    assert r.stdout.split() == ["True", "claimed", "True"], r.stdout
    assert victim.read_bytes() == b"a file the process may write"
    assert not absent.exists()
    marks = sorted(p.name for p in hooks.iterdir() if not p.is_symlink())
    assert [m.split(".")[0] for m in marks] == ["claimed", "walk"], marks
    assert marks[0] == "claimed.go"  # the test's own; the process's marks are the links
