"""JAX on a cache directory a later release shares (ARCHITECTURE.md, "Formats of other
releases"), real JAX in fresh processes: a start of this release compiles what the later
release keeps in its entry format (executables, module records, the plan), and leaves every
file as it was; a later plan or record format lives under its own key, never read nor
replaced here; and a plan or record under this release's key that claims a later format
stops no upkeep: refused, and replaced by the run's own."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
from xla_pcache import Store, _core
from xla_pcache.config import Settings
from xla_pcache.jax.ahead import _plan, _plan_name
from xla_pcache.jax.ahead import _record as _module_record

from tests.helpers import is_module_record
from tests.jax.helpers import JAX_ONLY, WORKER, hits, jax_keys, results, run_jax, runs
from tests.later_format import entry_files, rewrite_entries

pytestmark = JAX_ONLY


def _run(root: Path) -> dict:  # type: ignore[type-arg]
    return run_jax([{"op": "install", "path": str(root)}, *runs(0, layers=1)])


def _plan_key() -> str:
    """The key of the plan the worker's processes keep (``worker_plan_name``'s)."""
    version = importlib.metadata.version("jax")
    name = f"script {_plan_name.place(str(WORKER))}"
    return _plan.plan_key(_plan_name.workload(name, version, 0))


def test_a_start_compiles_what_a_later_release_keeps_and_leaves_every_file(tmp_path: Path) -> None:
    root = tmp_path / "c"
    first = _run(root)
    (jax_key,) = jax_keys(root)
    later = rewrite_entries(root, 2)
    assert len(later) == 3, later  # the executable, its module record, the plan
    # A later release's plan and module record formats, under their own keys (in this entry
    # format: what a release that changed only those would write).
    later_plan = f"{_plan.ANY_PREFIX}{_plan.VERSION + 1}:" + _core.hash_key("a later workload")
    record3 = "xla_pcache-module-3:" + jax_key
    with Store(root) as s:
        later_doc = {"format": _plan.FORMAT, "version": _plan.VERSION + 1}
        assert s.put(later_plan, json.dumps(later_doc).encode())
        assert s.put(record3, b"XPCMOD03 a later record")
    others = {p: p.read_bytes() for p in entry_files(root) if p not in later}
    assert len(others) == 2

    second = _run(root)
    assert hits(second) == [0] and results(second) == results(first)
    assert {p: p.read_bytes() for p in later} == later
    assert {p: p.read_bytes() for p in entry_files(root) if p not in later} == others
    with Store(root, read_only=True) as s:
        stats = s.stats()
    assert stats["newer_format"] >= 1 and stats["corrupt"] == 0, stats


def test_a_plan_claiming_a_later_format_under_this_releases_key_is_replaced(
    tmp_path: Path,
) -> None:
    """A writer without a key plants, under this release's plan key, a plan that says it is
    of a later format (a later release writes its own key: ``plan-<its version>:``):
    refused, and the run writes its own in its place, so it stops no upkeep."""
    root = tmp_path / "c"
    _run(root)
    key = _plan_key()
    with Store(root, settings=Settings()) as s:
        blob = s.get(key)
        assert blob is not None
        doc = json.loads(bytes(blob))
        doc["version"] = _plan.VERSION + 1
        assert s.replace(key, json.dumps(doc).encode())
    second = _run(root)
    assert not second["errors"], second["errors"]
    with Store(root, read_only=True) as s:
        blob = s.get(key)
        assert blob is not None
        assert _plan.decode(memoryview(blob)).variants, "the run's own plan, of this format"
        assert s.stats()["prefetch_plans_refused"] == 1


def test_a_record_claiming_a_later_format_is_refused_as_any_record_of_other_shape(
    tmp_path: Path,
) -> None:
    """A record under this release's key (``module-2:``) whose magic names a later record
    format is refused whole (``RecordError``): a run that reads it compiles as before and its
    put writes its own record in its place (``tests/jax/test_compile_ahead.py``, a record
    that is not one). A later format's records have a key of their own."""
    root = tmp_path / "c"
    _run(root)
    with Store(root, read_only=True) as s:
        keys = s.keys()
        (key,) = [k for k in keys if is_module_record(k)]
        blob = s.get(key)
        assert blob is not None
        data = bytes(blob)
    later = _module_record.MAGIC[:-1] + b"3" + data[len(_module_record.MAGIC) :]
    with pytest.raises(_module_record.RecordError):
        _module_record.decode(later)
    assert _module_record.decode(data).module
    assert not str(key).startswith("xla_pcache-module-3:")
