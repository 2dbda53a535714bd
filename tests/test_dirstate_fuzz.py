"""The directory-state fuzzer's short run (tests/dirstate_fuzz.py): a few hundred steps of
real operations on a cache directory with hostile state planted between them, against a real
SeaweedFS server, with a fixed seed. Every promise is checked after every step; the long run
is `python bench/fuzz_dir.py --steps N --seed S`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import dirstate_fuzz as dz

# Fixed: a failure here is reproduced by `python bench/fuzz_dir.py --steps 200 --seed 29
# --scale 1`.
SEED = 29
STEPS = 200


# A bound on the whole run well past its usual length (a minute or two): each hang found
# costs one operation's deadline.
@pytest.mark.timeout(1800)
def test_a_hostile_directory_keeps_every_promise(tmp_path: Path) -> None:
    h = dz.run(
        STEPS,
        SEED,
        tmp_path,
        with_s3=True,
        # Deadlines, not timings: an operation still running after this long is hung.
        op_timeout=60.0,
        scale=1.0,
    )
    report = dz.summary(h.figures, SEED, h.failures)
    f = h.figures
    assert f.steps == STEPS and f.ops > STEPS // 3 and f.plants > STEPS // 4, report
    # Every kind of operation and plant was reached at least once.
    assert {"put", "cli_prune", "cli_explain", "tier_get"} <= set(f.ops_by_kind), report
    assert {"snapshot_v2", "journal", "link", "bucket"} <= set(f.plants_by_kind), report
    assert not h.failures, report


def test_the_harness_sees_a_change_outside_and_what_a_child_prints(tmp_path: Path) -> None:
    """The checks themselves: a file changed outside the cache, a raw escape, a traceback,
    a signal and a hang in an operation's process are each reported."""
    h = dz.Harness(tmp_path / "h", 1, op_timeout=5.0)
    (h.outside / "victim" / "precious.log").write_bytes(b"changed")
    h.check_outside("test")
    code = {
        "escape": "print('\\x1b]0;title\\x07')",
        "traceback": "raise SystemExit(__import__('json').loads('['))",
        "abort": "import os; os.abort()",
        "hang": "import time; time.sleep(60)",
    }
    procs = [h._spawn(kind, [sys.executable, "-c", c]) for kind, c in code.items()]
    h._wait(procs)
    assert sorted(fl.kind for fl in h.failures) == sorted(["outside", *code]), h.failures


def test_the_memory_bound_is_each_operations_own(tmp_path: Path) -> None:
    """Under a harness that holds 600 MiB itself, an operation that allocates 600 MiB goes
    past the 512 MiB bound and one that allocates 10 MiB stays under it (on e1a808d both
    failed: the bound read the harness's own high-water mark)."""
    h = dz.Harness(tmp_path / "h", 1, op_timeout=60.0, rss_bound_kib=512 << 10)
    held = b"\x01" * (600 << 20)  # written, so resident
    alloc = "x = b'\\x01' * ({} << 20)"
    procs = [
        h._spawn(op, [sys.executable, "-c", alloc.format(mib)])
        for op, mib in (("big", 600), ("small", 10))
    ]
    h._wait(procs)
    assert len(held) == 600 << 20
    del held
    assert [(fl.kind, fl.op) for fl in h.failures] == [("rss", "big")], h.failures
    peaks = {op: kib >> 10 for kib, op, _, _ in h.figures.top_peaks}
    assert peaks["big"] >= 600 and peaks["small"] < 100, peaks
