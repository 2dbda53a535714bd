"""The core counts remote activity per tier, by the name its caller gives the tier (data: the
core knows no kind of tier), sums it across processes, and reports nothing remote for a store
that never had a tier."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from xla_pcache import Store, _core
from xla_pcache._reports import TIER_COUNTERS, tier_counters


def test_a_store_without_tiers_reports_no_remote_counters(tmp_path: Path) -> None:
    with Store(tmp_path / "cache") as store:
        assert store.put("k", b"v") and store.get("k") is not None
        for report in (store.stats(), store.process_stats()):
            assert not [k for k in report if k.startswith("remote")], report


def _count(root: Path, tier: str, counter: str, n: int) -> None:
    code = (
        "import sys; from xla_pcache import _core\n"
        "s = _core.Store(sys.argv[1])\n"
        "s.add_tier_counters([(sys.argv[2], sys.argv[3], int(sys.argv[4]))]); s.close()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(root), tier, counter, str(n)], check=True, timeout=120
    )


def test_tier_counters_by_name_sum_across_processes_and_compaction(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    _count(root, "s3", "hits", 2)
    _count(root, "s3", "hits", 3)
    _count(root, "a-new-kind.0", "get_ms", 7)
    _count(root, "s3", "put_exists", 1)
    store = _core.Store(root)
    st = store.stats()
    tiers = tier_counters(st)
    assert set(tiers) == {"s3", "a-new-kind.0"}, st
    assert tiers["s3"]["hits"] == 5 and tiers["s3"]["put_exists"] == 1, st
    assert tiers["a-new-kind.0"]["get_ms"] == 7, st
    assert st["remote_hits"] == 5 and st.get("remote_get_ms") == 7, st
    assert set(tiers["s3"]) == set(TIER_COUNTERS)
    # Folded into a snapshot with the journals of the processes gone: still there.
    for i in range(40):
        store.put(f"k{i}", b"v" * 10)
    store.evict(max_size=1 << 30)
    store.close()
    again = _core.Store(root, read_only=True)
    assert tier_counters(again.stats()) == tiers
    again.close()


@pytest.mark.parametrize(
    ("tier", "counter"),
    [("S3", "hits"), ("", "hits"), ("a b", "hits"), ("t" * 41, "hits"), ("s3", "nonsense")],
)
def test_bad_tier_names_and_counters_are_refused(tmp_path: Path, tier: str, counter: str) -> None:
    store = _core.Store(tmp_path / "cache")
    with pytest.raises(ValueError, match="tier"):
        # All are checked first: a valid count beside the bad one is not added either.
        store.add_tier_counters([("s3", "hits", 1), (tier, counter, 1)])
    assert not [k for k in store.process_stats() if k.startswith("remote")]
    store.close()
