"""Two builds of torch_xla on one cache and one host: each is served only its own entries,
neither loads the other's (from the store or from the host's local copy), and the
alternation alone evicts nothing.

The second build is a venv beside this one whose ``_XLAC`` extension differs only in its
GNU build-id note, as a rebuild does (``tests/rebuild.py``); torch_xla's program, which
knows nothing of xla_pcache, runs in both, alternately, configured by the environment alone
(the import hook of a real install), on one host-local directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from xla_pcache import Store, build_key, builds
from xla_pcache.torch_xla import _build as torch_xla_build

from tests.helpers import explain_json
from tests.rebuild import second_build
from tests.torch_xla.helpers import NEEDS_THE_HOOK, PROGRAM, cold, program_env, served

pytestmark = NEEDS_THE_HOOK


def _run(python: Path, tmp: Path, store: Path) -> dict[str, Any]:
    env = program_env(
        tmp, "host", XLA_PERSISTENT_CACHE_PATH=str(store), XDG_CACHE_HOME=str(tmp / "xdg")
    )
    proc = subprocess.run(
        [str(python), str(PROGRAM), json.dumps({"graphs": ["add"]})],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["stderr"] = proc.stderr
    assert report["results"] == {"add": 376.0}
    return report


def test_two_torch_xla_builds_alternate_on_one_cache(tmp_path: Path) -> None:
    (xlac,) = [Path(p) for role, p, name in torch_xla_build.wanted() if name.startswith("_XLAC.")]
    python_b, how = second_build(tmp_path / "venv-b", xlac, xlac)
    assert how == "build-id"
    python_a, store = Path(sys.executable), tmp_path / "store"

    cold(_run(python_a, tmp_path, store))
    # B, on the same host, with A's entry in the store and A's copy in the host's pool.
    cold(_run(python_b, tmp_path, store))
    served(_run(python_a, tmp_path, store))
    served(_run(python_b, tmp_path, store))

    with Store(store, read_only=True) as s:
        entries = {str(e["key"]): e for e in s.entries()}
        stats = dict(s.stats())
    split = {k: build_key.split(k) for k in entries}
    assert len(entries) == 2 and len({name for name, _ in split.values()}) == 1
    key_a = next(k for k, (_, d) in split.items() if d == torch_xla_build.build().digest)
    (key_b,) = set(entries) - {key_a}
    assert (stats["puts"], stats["evictions"], stats["entries"]) == (2, 0, 2)
    # Each entry served once, to its own build's second run, from its own host directory.
    assert {k: e["hits"] for k, e in entries.items()} == {key_a: 1, key_b: 1}
    assert len(list((tmp_path / "host").iterdir())) == 2
    # B's graph missed with A's entry there: counted, and explained with both binaries.
    assert stats["other_build"] == 1
    (b_miss,) = [r for r in explain_json(store) if r["key"] == key_b]
    assert b_miss["nearest"] == key_a
    assert builds.COMPONENT in b_miss["differs"]
    assert b_miss["build"].startswith(f"built by another torch_xla binary ({xlac.name}: build-id ")
