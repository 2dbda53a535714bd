"""Accounting and eviction under realistic stale views: the two-host bed with
sshfs's default cache (20 s) and with 60 s, as long as an NFS client may keep attributes.

Eight processes (four per mount) share a 3 MiB cache for 10 s (get 55%, put 40%, delete 5%
of 120 keys, values of 0.5-256 KiB) while the server's disk is sampled; 2 s after they stop,
a process on host A calls evict(). The scenario is ``scenarios.stale_budget``;
``bench/reliability_report.py`` runs the same code for docs/reliability.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import scenarios
from testbed import TwoHosts

pytestmark = pytest.mark.netfs

# Worker warnings these runs may log: a read that saw a stale (short) view of a replaced
# entry (a miss), a put refused over budget when no eviction made room for it within the
# lock timeout (not cached), and, rarely under this churn (the budget turns over several
# times a second), a lease or a file that another host replaced or removed between two
# calls (a skipped eviction, or a miss). Each is a logged, counted degradation.
ALLOWED_WARNINGS = {
    "incomplete view of cache entry",
    "not caching an entry",
    "cannot take the evictor lock",
    "cannot read",
}


def check(r: dict[str, Any]) -> None:
    assert not r["crashed"], r["crashed"]
    assert r["exceptions"] == [], r["exceptions"]
    assert r["torn_reads"] == 0 and r["wrong_reads"] == 0, r
    assert set(r["worker_warning_kinds"]) <= ALLOWED_WARNINGS, r["worker_warning_kinds"]
    # The run means something only if the puts went over the budget, so that evictions had
    # to make room; how many times it turned over is speed, the bench's business.
    assert r["published"] * 64 * 1024 > r["max_size"], r["ops"]
    # During the run the disk never went over 1.5x the budget (sampled every 0.1 s; the peaks
    # measured, and those before puts waited for room, are in docs/reliability.md)...
    assert r["peak_ratio"] <= 1.5, (r["peak_ratio"], r["timeline"])
    # ...without turning puts away: a put over budget waits for an eviction to make room.
    assert r["puts_refused"] <= 0.1 * (r["published"] + r["puts_refused"]), (
        r["puts_refused"],
        r["published"],
    )
    # evict() leaves the directory itself under the budget...
    assert r["evict"]["skipped"] is None, r["evict"]
    assert r["over_budget_after_evict"] == 0, (r["disk_after"], r["evict"])
    # ...and stats() right after agrees with the files on the server's disk.
    assert r["stats_after"]["view_age_s"] is not None, r["stats_after"]
    assert r["stats_error_after"] <= 0.10, (r["stats_after"], r["disk_after"])
    # No published entry lost that an eviction or a delete did not choose.
    assert r["lost_count"] == 0, r["lost"]


@pytest.mark.parametrize("lock_mode", ["fcntl", "lease"])
def test_default_sshfs_cache(
    two_hosts_default_cache: TwoHosts, tmp_path: Path, lock_mode: str
) -> None:
    check(
        scenarios.stale_budget(
            two_hosts_default_cache, tmp_path, cache_timeout=None, lock_mode=lock_mode
        )
    )


@pytest.mark.slow
def test_sixty_second_cache(two_hosts_60s_cache: TwoHosts, tmp_path: Path) -> None:
    check(scenarios.stale_budget(two_hosts_60s_cache, tmp_path, cache_timeout=60))
