"""The typed reports against the runtime: every method that returns a report is called on a
real store, and the keys and value types it returns are compared with its TypedDict
(``xla_pcache._reports``, which ``_core.pyi`` uses). A key the runtime adds that the TypedDict
lacks, or one it declares that the runtime never returns, fails here."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, NotRequired, Required, get_args, get_origin, get_type_hints

import pytest
from xla_pcache import Store, _core, _reports
from xla_pcache._reports import tier_counters


def _conforms(value: Any, tp: Any) -> bool:
    origin = get_origin(tp)
    if origin in (Required, NotRequired):
        return _conforms(value, get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, t) for t in get_args(tp))
    if tp is None or tp is type(None):
        return value is None
    if origin is list:
        (item,) = get_args(tp)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is dict:
        k, v = get_args(tp)
        return isinstance(value, dict) and all(
            _conforms(a, k) and _conforms(b, v) for a, b in value.items()
        )
    if typing.is_typeddict(tp):
        return isinstance(value, dict) and not _mismatches(value, tp)
    if tp is float:
        return type(value) in (float, int)
    # Exact: a bool where an int is declared (or the reverse) is a drift too.
    return type(value) is tp


def _mismatches(report: dict[str, Any], td: Any) -> list[str]:
    hints = get_type_hints(td)
    required: frozenset[str] = td.__required_keys__
    if td is _reports.Stats:
        # The counters per tier are keyed by the tiers' names, which are data: declared as
        # a pattern (remote_<tier>_<counter>, every counter of TIER_COUNTERS), read back by
        # tier_counters; each one an int.
        for tier, counts in tier_counters(report).items():
            hints |= {f"remote_{tier}_{c}": int for c in counts}
    problems = [f"{k}: returned, not declared" for k in report if k not in hints]
    problems += [f"{k}: declared, not returned" for k in required if k not in report]
    problems += [
        f"{k}: {report[k]!r} is not {hints[k]}"
        for k in report
        if k in hints and not _conforms(report[k], hints[k])
    ]
    return problems


def _filled(root: Path) -> _core.Store:
    store = _core.Store(root, max_size=1 << 20)
    for i in range(8):
        assert store.put(f"k{i}", b"v" * 20_000, meta={"framework": "test"})
    assert store.get("k0") is not None
    assert store.get("absent") is None
    return store


def test_every_report_matches_its_typeddict(tmp_path: Path) -> None:
    store = _filled(tmp_path / "cache")
    assert _mismatches(dict(store.stats()), _reports.Stats) == []
    entries = store.entries()
    assert entries and all(_mismatches(dict(e), _reports.Entry) == [] for e in entries)
    for shard in store.entry_shards():
        assert all(_mismatches(dict(e), _reports.Entry) == [] for e in store.entries(shard))
    assert _mismatches(dict(store.verify()), _reports.VerifyReport) == []
    assert _mismatches(dict(store.verify(repair=True)), _reports.VerifyReport) == []
    evicted = store.evict(max_size=40_000)
    assert evicted["removed"] > 0
    assert _mismatches(dict(evicted), _reports.EvictReport) == []
    assert _mismatches(dict(store.evict(older_than=0)), _reports.EvictReport) == []
    assert _mismatches(dict(store.cache_settings()), _reports.CacheSettings) == []
    store.write_cache_settings(max_size=1 << 20, max_age=3600.0)
    assert _mismatches(dict(store.cache_settings()), _reports.CacheSettings) == []
    # The plain-dict reports: their declared types hold for every item.
    assert _conforms(store.process_stats(), dict[str, int])
    assert _conforms(store.trashed_keys(list(evicted["names"])), dict[str, _reports.Key])
    store.close()


def test_an_interrupted_walk_reports_it_in_declared_keys(tmp_path: Path) -> None:
    store = _filled(tmp_path / "cache")
    store.interrupt()
    report = store.evict(max_size=0)
    assert _mismatches(dict(report), _reports.EvictReport) == []
    store.interrupt()
    verified = store.verify()
    assert _mismatches(dict(verified), _reports.VerifyReport) == []
    store.close()


def test_a_store_with_tiers_counted_matches_too(tmp_path: Path) -> None:
    store = _filled(tmp_path / "cache")
    store.add_tier_counters([("s3", "hits", 2), ("redis", "misses", 1)])
    st = dict(store.stats())
    assert set(tier_counters(st)) == {"s3", "redis"}
    assert _mismatches(st, _reports.Stats) == []
    store.close()


def test_the_python_store_reports_match_too(tmp_path: Path) -> None:
    with Store(tmp_path / "cache") as store:
        assert store.put("k", b"v")
        assert _mismatches(dict(store.stats()), _reports.Stats) == []
        assert _mismatches(dict(store.evict(max_size=0)), _reports.EvictReport) == []


def test_the_stats_docstring_names_every_figure(tmp_path: Path) -> None:
    # The stub's prose is not checked by stubtest: a counter the core gains must be named in
    # it too (a store without tiers reports no remote_* figure, which the prose names as a
    # pattern).
    import ast
    import re

    stub = ast.parse((Path(_core.__file__).parent / "_core.pyi").read_text())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Store")
    stats = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "stats")
    named = set(re.findall(r"\w+", ast.get_docstring(stats) or ""))
    with _core.Store(tmp_path / "cache") as store:
        figures = set(store.stats())
    assert {"other_build", "prefetch_used", "prefetch_plans_refused"} <= figures
    assert sorted(figures - named) == []


def test_the_checker_catches_drift() -> None:
    # A test that cannot fail is a defect: the comparison itself, shown failing.
    class Small(typing.TypedDict):
        a: int
        b: str | None

    assert _mismatches({"a": 1, "b": None}, Small) == []
    assert _mismatches({"a": 1, "b": None, "c": 2}, Small) == ["c: returned, not declared"]
    assert _mismatches({"a": 1}, Small) == ["b: declared, not returned"]
    assert _mismatches({"a": True, "b": "x"}, Small) == ["a: True is not <class 'int'>"]


@pytest.mark.parametrize("name", ["Stats", "Entry", "EvictReport", "VerifyReport", "CacheSettings"])
def test_the_stub_uses_the_checked_typeddicts(name: str) -> None:
    # _core.pyi must not grow a second, unchecked copy of a report type.
    stub = (Path(_core.__file__).parent / "_core.pyi").read_text()
    assert f"class {name}(" not in stub
    assert name in stub.split("from xla_pcache._reports import", 1)[1].splitlines()[0]


def test_the_stub_states_the_cores_defaults() -> None:
    # The stub cannot compute: the defaults it states (a None duration means the core's) are
    # held here to the ones the runtime exports from the core.
    import re

    stub = (Path(_core.__file__).parent / "_core.pyi").read_text()
    stated = {
        name: float(value)
        for name, value in re.findall(r"(\w+)\s+([\d.]+)\s+s\b", stub.split("STORE_DEFAULTS``:")[1])
    }
    assert stated == _core.STORE_DEFAULTS
    assert _core.MAX_DURATION_S == 1e9
    from xla_pcache import config, sizes

    assert sizes.MAX_DURATION_S == _core.MAX_DURATION_S
    assert _core.STORE_DEFAULTS["claim_lease"] == config.DEFAULT_CLAIM_LEASE_S
    with pytest.raises(ValueError, match="lease_time"):
        _core.Store("/nonexistent-never-created", lease_time=_core.MAX_DURATION_S * 2)
