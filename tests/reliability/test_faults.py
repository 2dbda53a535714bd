"""Faults a fleet meets: a full disk, a read-only mount, a cache directory that vanishes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import pytest
import scenarios
from worker import make_value
from xla_pcache import CacheError, Store

pytestmark = pytest.mark.netfs


def test_full_disk(full_disk: Path) -> None:
    r = scenarios.full_disk(full_disk)
    assert r["exceptions"] == [], r["exceptions"]
    # 24 MiB of puts into 16 MB: the first ones land, the rest return False.
    assert 10 <= r["stored"] < r["puts"], r
    assert r["refused"] == r["puts"] - r["stored"]
    assert r["stored_after_first_refusal"] == 0, r
    # Each failure counted and logged (the log is rate-limited, so at least once).
    assert r["errors"] >= r["refused"], r["stats"]
    assert r["warnings_while_full"] >= 1
    assert any("No space left" in w for w in r["first_warnings"]), r["first_warnings"]
    # The store stays valid: no temp file left, every earlier entry still a whole hit.
    assert r["tmp_files"] == []
    assert r["bad_reads"] == [] and r["hits"] == r["stored"], r
    assert r["verify"]["problems"] == 0 and r["verify"]["entries"] == r["stored"], r["verify"]
    # And it recovers once there is room again.
    assert r["evict"]["removed"] > 0, r["evict"]
    assert r["put_after_evict"] and r["get_after_evict"], r
    assert r["verify_after_evict"]["problems"] == 0, r["verify_after_evict"]
    assert r["fresh_view"]["entries"] == r["entries_on_disk"], r


def test_read_only_mount(readonly_cache: scenarios.ReadOnlyCache) -> None:
    r = scenarios.read_only_mount(readonly_cache)
    n = len(readonly_cache.keys)
    ro = r["read_only"]
    assert ro["exceptions"] == [], ro["exceptions"]
    assert ro["len"] == n and ro["entries"] == n and ro["contains"] == n and ro["hits"] == n
    assert ro["keys"] == sorted(readonly_cache.keys)
    assert ro["miss"] and not ro["contains_missing"]
    assert ro["stats"]["entries"] == n and ro["stats"]["errors"] == 0, ro["stats"]
    assert ro["verify"]["problems"] == 0, ro["verify"]
    assert ro["put"] is False
    assert ro["warnings"] == 0, "a read-only store has nothing to warn about"
    # A process that did not say read-only still reads everything and raises nothing.
    rw = r["writable_open"]
    assert rw["exceptions"] == [], rw["exceptions"]
    assert rw["hits"] == n and rw["put"] is False, rw
    # Nothing was written (the mount would refuse it, and the source tree is unchanged).
    assert r["tree_unchanged"]
    # The operator's commands work on the read-only mount.
    cli = r["cli"]
    for cmd, done in cli.items():
        assert done["rc"] == 0, (cmd, done)
        assert "Traceback" not in done["stderr"], (cmd, done["stderr"])
    assert json.loads(cli["stats --json"]["stdout"])["entries"] == n
    listed = json.loads(cli["ls --json"]["stdout"])
    assert sorted(e["key"] for e in listed) == sorted(readonly_cache.keys)
    assert json.loads(cli["verify --json"]["stdout"])["problems"] == 0


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_vanishing_directory(tmp_path: Path, how: str) -> None:
    r = scenarios.vanishing_directory(tmp_path, how)
    assert r["exceptions"] == [], r["exceptions"]
    gone = r["while_gone"]
    # While the directory is gone: misses, never an error, and a warning.
    assert gone["get_misses"] == 10 and gone["get_hits"] == 0, gone
    assert gone["contains"] is False and gone["delete"] is False, gone
    if how == "deleted":
        assert gone["put"] is False, gone
        assert not r["root_recreated_while_gone"], "a missing root must not be re-created"
    else:
        # An empty directory in its place is laid out again and used.
        assert gone["put"] is True, gone
        assert r["put_into_replacement"] and r["get_from_replacement"], r
    assert r["warnings_while_gone"] >= 1, r
    # The directory returns: the same store object hits again and writes again.
    assert r["hits_after_return"] == 10, r
    assert r["put_after_return"] and r["get_after_return"], r
    assert r["verify_after_return"]["problems"] == 0, r["verify_after_return"]


def _vanished(tmp_path: Path) -> tuple[Store, Path]:
    root = tmp_path / "cache"
    store = Store(root, max_size=1 << 20)
    assert store.put("k", make_value("k", 1, 1_000))
    os.rename(root, tmp_path / "aside")
    return store, root


def test_evict_never_recreates_a_vanished_root(tmp_path: Path) -> None:
    """Regression: evict() re-created <root>/locks, i.e. the missing root (fixed in 99101dc)."""
    store, root = _vanished(tmp_path)
    # Reporting the failure is fine; writing where the cache was is not.
    with contextlib.suppress(CacheError):
        store.evict()
    assert not root.exists(), f"evict() created {sorted(os.listdir(root))} in {root}"


def test_len_of_a_vanished_root_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = _vanished(tmp_path)
    """Regression: len() raised CacheError on a vanished root (fixed in 99101dc)."""
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        assert len(store) == 0
    assert not (tmp_path / "cache").exists()
