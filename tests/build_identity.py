"""One framework binary's identity, as the package computes a build, in a fresh process: what
the tests of where the build identities' record is kept run (tests/test_build_record_place.py,
tests/test_planted_record_places_never_hang.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

IDENTIFY = textwrap.dedent(
    """
    import json, sys
    from xla_pcache import builds
    b = builds.identify("t", [("lib", sys.argv[1], "libt.so")])
    (f,) = b.files
    print(json.dumps({"id": f.id, "hashed": b.hashed, "dir": getattr(b, "record_dir", None),
                      "unkept": getattr(b, "record_unkept", None),
                      "problems": b.record_problems}))
    """
)


def identify(lib: Path, env: dict[str, str], timeout: float) -> tuple[dict[str, Any], str]:
    """``lib``'s identity, computed by a fresh process with all of ``env`` its environment,
    which must exit with 0: what it printed (``id``, ``hashed``, the record's ``dir``, what it
    left ``unkept``, ``problems``) and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", IDENTIFY, str(lib)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    got: dict[str, Any] = json.loads(proc.stdout)
    return got, proc.stderr
