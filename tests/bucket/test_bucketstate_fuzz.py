"""The bucket-state fuzzer's short run (tests/bucketstate_fuzz.py): hosts' real operations on
a cache whose path is a bucket of a real SeaweedFS server, behind the relay that lists what
SeaweedFS cannot hold, with hostile objects planted between them and a fixed seed. Every
promise is checked after every step, and the budget once the planted objects are gone; the
long run is `python bench/fuzz_bucket.py --steps N --seed S`."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import obstore
import pytest

from tests import bucketstate_fuzz as bz
from tests.tiers.servers import BucketServer

# Fixed: a failure here is reproduced by `python bench/fuzz_bucket.py --steps 30 --seed 5
# --scale 0.1`.
SEED = 5
STEPS = 30


# A bound on the whole run well past its usual length (half a minute): each hang found
# costs one operation's deadline.
@pytest.mark.timeout(900)
def test_a_hostile_bucket_keeps_every_promise(tmp_path: Path, bucket_server: BucketServer) -> None:
    h = bz.run(STEPS, SEED, tmp_path, server=bucket_server, op_timeout=60.0, scale=0.1)
    report = bz.summary(h.figures, SEED, h.failures)
    f = h.figures
    assert f.steps == STEPS and f.ops > STEPS // 3 and f.plants > STEPS // 4, report
    # Hosts' processes, the command and a read-only host each ran at least once.
    kinds = set(f.by_op)
    assert {"put", "cli_prune", "final_prune", "final_get"} <= kinds, report
    assert f.plants_by_kind["flood"] >= 1, report  # hundreds of keys of one kind
    assert any(k.startswith("ro_") for k in kinds), report
    assert f.final["kept"] and f.final["served"] == f.final["kept"], report
    assert not h.failures, report


@pytest.mark.timeout(300)
def test_the_harness_sees_what_it_checks(tmp_path: Path, bucket_server: BucketServer) -> None:
    """The checks themselves: an object outside the prefix changed, and processes that
    write as read-only hosts, make more requests than their bound, leave a file in their
    working directory, print a traceback or a raw escape, hang, or go past the memory bound
    are each reported."""
    h = bz.Harness(tmp_path / "h", 1, bucket_server)
    try:
        key = sorted(h.outside)[0]
        obstore.put(h.root_client, key, b"changed")
        h.check_outside("test")
        c = h.census()
        write = (
            "from xla_pcache.bucket.upkeep import Bucket; import sys\n"
            "Bucket(sys.argv[1]).put('xla_pcache-1/x', b'1')\n"
        )
        code = {
            "read_only": write,
            "local": "open('left-behind', 'w').close()",
            "traceback": "raise SystemExit(__import__('json').loads('['))",
            "escape": "print('\\x1b]0;title\\x07')",
            "hang": "import time; time.sleep(60)",
            "rss": "x = b'\\x01' * (300 << 20)",
        }
        procs = [
            h._spawn(
                kind,
                [sys.executable, "-c", text, h.url],
                h._host(fresh=True),
                slot,
                Counter(),
                read_only=kind == "read_only",
                # The hang is the child that sleeps: its deadline is what is tested.
                timeout=5.0 if kind == "hang" else None,
            )
            for slot, (kind, text) in enumerate(code.items())
        ]
        h._wait(procs[:1], c)  # a read-only host is judged alone
        h._wait(procs[1:], c)
    finally:
        h.close()
    kinds = sorted({(fl.kind, fl.op) for fl in h.failures})
    assert kinds == sorted(
        [
            ("outside", "test"),
            ("read_only", "read_only"),
            ("requests", "read_only"),
            ("local", "local"),
            ("traceback", "traceback"),
            ("escape", "escape"),
            ("hang", "hang"),
            ("rss", "rss"),
        ]
    ), h.failures
