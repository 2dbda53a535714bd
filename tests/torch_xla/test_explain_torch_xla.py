"""Why torch_xla missed: the environment torch_xla hashes, recorded and compared (real
torch_xla on CPU, fresh processes). The graph hash itself is C++ and cannot be compared."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from xla_pcache import Store

from tests.helpers import explain_json
from tests.torch_xla.helpers import run_torch_xla

pytestmark = [
    pytest.mark.torch_xla,
    pytest.mark.skipif(
        importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed"
    ),
]


def test_a_flag_change_is_explained_at_the_environment_level(tmp_path: Path) -> None:
    store = tmp_path / "store"
    spec = {"install": {"path": str(store), "local_dir": str(tmp_path / "host")}}
    flags_a = "--xla_cpu_enable_fast_math=true"
    flags_b = "--xla_cpu_enable_fast_math=false"
    first = run_torch_xla({**spec, "graphs": ["add"]}, {"XLA_FLAGS": flags_a})
    second = run_torch_xla({**spec, "graphs": ["add"]}, {"XLA_FLAGS": flags_b})
    assert first["counters"]["PersistentCacheMiss"] == 1
    assert second["counters"]["PersistentCacheMiss"] == 1
    with Store(store, read_only=True) as s:
        metas = [e["meta"] for e in s.entries()]
    assert len(metas) == 2
    parts = json.loads(metas[0]["key_components"])
    names = [p["name"] for p in parts["components"]]
    assert {"XLA_FLAGS", "torch version", "torch_xla version", "device"} <= set(names)
    (newest, older) = explain_json(store)
    assert newest["module"] == "torch_xla" and newest["nearest"] == older["key"]
    assert newest["differs"] == ["XLA_FLAGS"]
    # What is recorded is what torch_xla hashed: some versions (2.7) append flags of
    # their own to the user's on import, the same on both runs.
    values = newest["values"]["XLA_FLAGS"]
    this, nearest = values["this"].split(), values["nearest"].split()
    assert this[0] == flags_b and nearest[0] == flags_a
    assert this[1:] == nearest[1:]
    assert values["this_digest"] != values["nearest_digest"]
    assert any("computed in C++" in note for note in newest["notes"])
