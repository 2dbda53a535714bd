"""Plans for subsets, with real JAX in fresh processes configured by the environment alone: a
program whose reads are a subset of another's (evaluation switched off, ``pytest -k`` after
the whole suite) wastes what the other read at most once, then loads only its own; a run
stopped early (Ctrl-C, a crash) leaves no variant of what it read before it stopped; a plan
planted by a writer without a key (the victim's executables among thousands of keys of
nothing and another program's real ones) stops costing after the victim's next run.

One script runs the programs ``TEST_PROGRAMS`` names (each a jitted function of its own
constant), in order; ``TEST_STOP`` stops it before its fourth (``interrupt``: Ctrl-C;
``crash``: an exception). It waits for loading ahead to settle before it reports, so that
what was loaded does not depend on the machine's speed. The rules, on more sequences than
real processes can afford, are in tests/test_plan_subsets.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.config import Settings
from xla_pcache.jax.ahead import _plan

from tests.helpers import interruptible_child
from tests.jax import scripts
from tests.jax.helpers import COUNT_HITS, JAX_ONLY

pytestmark = JAX_ONLY

PROGRAM = (
    COUNT_HITS
    + """
import signal, time
import xla_pcache.jax as xj

def loading_settled():
    r = xj.prefetch_report()
    pending = ("queued", "fetching", "fetched", "loading")
    return r is None or not any(s in r["states"] for s in pending)

x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
out = []
stop = os.environ.get("TEST_STOP", "")
for n, k in enumerate(int(p) for p in os.environ["TEST_PROGRAMS"].split(",")):
    if stop and n == 3:
        if stop == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)
        raise RuntimeError("the program failed")
    f = jax.jit(lambda a, c=k: jnp.tanh(a @ a.T * c).sum(axis=0) + c)
    out.append(np.asarray(f(x)).tolist())
deadline = time.monotonic() + 120
while not loading_settled():
    assert time.monotonic() < deadline, "loading ahead never settled"
    time.sleep(0.01)
print(json.dumps({"out": out, "hits": len(hits), "prefetch": xj.prefetch_report()}))
"""
)
WHOLE = "0,1,2,3,4,5,6,7"  # B: eight programs
SUBSET = "0,2,5"  # A: three of them
COUNTED = ("prefetch_loaded", "prefetch_used", "prefetch_wasted", "prefetch_plans_written")


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> scripts.Filled:
    """B's cold run on an empty cache."""
    d = tmp_path_factory.mktemp("subsets")
    script = d / "train.py"
    script.write_text(PROGRAM)
    cache = d / "cache"
    cold, _ = scripts.run(script, cache, TEST_PROGRAMS=WHOLE)
    assert cold["hits"] == 0 and scripts.counters(cache)["prefetch_plans_written"] == 1
    return script, cache, cold


class Runs:
    """Runs of the script on one cache, each with what it added to the cache's counters."""

    def __init__(self, script: Path, cache: Path) -> None:
        self.script, self.cache = script, cache

    def _counted(self) -> dict[str, int]:
        stats = scripts.counters(self.cache)
        return {c: stats.get(c, 0) for c in COUNTED}

    def run(self, programs: str, **env: str) -> tuple[dict[str, Any], dict[str, int]]:
        before = self._counted()
        report, _ = scripts.run(self.script, self.cache, TEST_PROGRAMS=programs, **env)
        after = self._counted()
        return report, {c.removeprefix("prefetch_"): after[c] - before[c] for c in COUNTED}

    def stopped(self, programs: str, how: str) -> dict[str, int]:
        """A run stopped before its fourth program (it exits with an error): what it added."""
        before = self._counted()
        env = scripts.environment(self.cache, TEST_PROGRAMS=programs, TEST_STOP=how)
        proc = subprocess.run(
            [sys.executable, str(self.script)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
            preexec_fn=interruptible_child,
        )
        expected = "KeyboardInterrupt" if how == "interrupt" else "the program failed"
        assert proc.returncode != 0 and expected in proc.stderr, proc.stderr[-3000:]
        after = self._counted()
        return {c.removeprefix("prefetch_"): after[c] - before[c] for c in COUNTED}


def test_a_subset_program_wastes_at_most_once(filled: scripts.Filled, tmp_path: Path) -> None:
    script, _, cold = filled
    runs = Runs(script, scripts.copy(filled, tmp_path))
    # A's first run: B's variant is the only candidate, loaded whole; A uses three of the
    # eight and keeps a variant of its own.
    first, added = runs.run(SUBSET)
    assert first["prefetch"]["planned"] == 8 and first["hits"] == 3
    assert added == {"loaded": 8, "used": 3, "wasted": 5, "plans_written": 1}, added
    # Its next runs load only what A's and B's variants both hold: A's three.
    for _ in range(2):
        again, added = runs.run(SUBSET)
        assert again["out"] == first["out"] and again["hits"] == 3
        assert again["prefetch"]["states"] == {"taken": 3}, again["prefetch"]
        assert added == {"loaded": 3, "used": 3, "wasted": 0, "plans_written": 0}, added
    # B, after: its first read past A's tells it (that one read goes JAX's way), the rest is
    # loaded; nothing wasted or written. And A once more: settled.
    whole, added = runs.run(WHOLE)
    assert whole["out"] == cold["out"] and whole["hits"] == 8
    assert whole["prefetch"]["states"] == {"taken": 7, "skipped": 1}, whole["prefetch"]
    assert added == {"loaded": 7, "used": 7, "wasted": 0, "plans_written": 0}, added
    _, added = runs.run(SUBSET)
    assert added == {"loaded": 3, "used": 3, "wasted": 0, "plans_written": 0}, added


def test_a_run_stopped_early_leaves_no_variant_of_what_it_read(
    filled: scripts.Filled, tmp_path: Path
) -> None:
    # Ctrl-C after three programs, then a crash after three: neither writes a variant of
    # its three (which would make every whole run load only those before its fourth read
    # told it apart). The next whole run loads all eight ahead.
    script, _, cold = filled
    runs = Runs(script, scripts.copy(filled, tmp_path))
    for how in ("interrupt", "crash"):
        added = runs.stopped(WHOLE, how)
        assert added["plans_written"] == 0 and added["used"] == 3, (how, added)
    whole, added = runs.run(WHOLE)
    assert whole["out"] == cold["out"] and whole["prefetch"]["candidates"] == 1
    assert whole["prefetch"]["states"] == {"taken": 8}, whole["prefetch"]
    assert added == {"loaded": 8, "used": 8, "wasted": 0, "plans_written": 0}, added


def _plan_of(cache: Path, key: str) -> _plan.Plan:
    with Store(cache, read_only=True, settings=Settings()) as store:
        blob = store.get(key, count=False)
    assert blob is not None
    return _plan.decode(memoryview(blob))


def test_a_planted_plan_stops_costing_after_the_victims_run(
    filled: scripts.Filled, tmp_path: Path
) -> None:
    script, _, _ = filled
    cache = scripts.copy(filled, tmp_path)
    runs = Runs(script, cache)
    # The victim (four programs) and another program under another name, for its real keys.
    victim, _ = runs.run("0,1,2,3")
    other, _ = runs.run("10,11,12,13", XLA_PCACHE_PREFETCH_NAME="another workload")
    key = victim["prefetch"]["plan_key"]
    (own,) = [v for v in _plan_of(cache, key).variants if len(v.entries) == 4]
    (theirs,) = _plan_of(cache, other["prefetch"]["plan_key"]).variants
    # Planted as a writer without a key would: the victim's keys among the other program's
    # and 2,000 real-looking keys of nothing, dated a year ahead, at the victim's plan key.
    made_up = tuple(
        _plan.Entry(f"jit__lambda-{i:064x}", own.entries[0].options, own.entries[0].devices)
        for i in range(2000)
    )
    entries = own.entries + theirs.entries + made_up
    planted = _plan.Plan((_plan.Variant(time.time() + 86400 * 365, "cpu", 1, entries),))
    with Store(cache, settings=Settings()) as store:
        assert store.replace(key, _plan.encode(planted), meta={"kind": _plan.META_KIND})
    first, added = runs.run("0,1,2,3")
    assert first["out"] == victim["out"] and first["prefetch"]["planned"] == len(entries)
    assert added == {"loaded": 8, "used": 4, "wasted": 4, "plans_written": 1}, added
    # From the victim's next run on: its own four, nothing else, nothing written.
    for _ in range(2):
        again, added = runs.run("0,1,2,3")
        assert again["out"] == victim["out"] and again["prefetch"]["states"] == {"taken": 4}
        assert added == {"loaded": 4, "used": 4, "wasted": 0, "plans_written": 0}, added
    plan = _plan_of(cache, key)
    assert [len(v.entries) for v in plan.variants] == [4, len(entries)]
    assert plan.variants[0].written >= plan.variants[1].written
    assert first["prefetch"]["states"] == {"taken": 4, "loaded": 4, "missing": 2000}
