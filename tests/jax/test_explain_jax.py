"""Why did it miss, against the real jax on CPU: key components recorded on puts and misses,
``xla-pcache explain``, and the compile time the hits saved (fresh subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

from xla_pcache import Store

from tests.helpers import cli_out, executables, explain_json
from tests.jax.helpers import JAX_ONLY, hits, run_jax, runs, store_keys

pytestmark = JAX_ONLY

FLAGS_A = "--xla_cpu_enable_fast_math=true"
FLAGS_B = "--xla_cpu_enable_fast_math=false"


def test_flags_and_compiler_options_are_explained(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    install = {"op": "install", "path": str(root)}

    first = run_jax([install, *runs(0)], {"XLA_FLAGS": FLAGS_A})
    assert hits(first) == [0]
    (key_a,) = store_keys(root)
    with Store(root, read_only=True) as store:
        (meta,) = [e["meta"] for e in executables(store)]
    parts = json.loads(meta["key_components"])
    assert parts["module"] == "jit_step" and parts["verified"] is True
    names = [p["name"] for p in parts["components"]]
    assert {"computation", "XLA flags", "compile_options", "accelerator_config"} <= set(names)
    flags = next(p for p in parts["components"] if p["name"] == "XLA flags")
    assert flags["value"] == FLAGS_A
    log = root / "misses.log"
    before = log.read_bytes()
    assert json.loads(before.splitlines()[-1])["key"] == key_a

    # A read-only process under other flags misses, writes nothing, and logs why.
    ro = run_jax([{**install, "read_only": True}, *runs(0)], {"XLA_FLAGS": FLAGS_B})
    assert hits(ro) == [0] and store_keys(root) == {key_a}
    assert log.read_bytes() == before
    why = [r["msg"] for r in ro["log"] if "read-only cache missed" in r["msg"]]
    assert len(why) == 1 and "differs in XLA flags" in why[0], ro["log"]
    assert FLAGS_A in why[0] and FLAGS_B in why[0]

    # The same program under other flags: a miss, explained as "XLA flags" alone.
    second = run_jax([install, *runs(0)], {"XLA_FLAGS": FLAGS_B})
    assert hits(second) == [0] and [r["miss"] for r in second["runs"]] == [1]
    (key_b,) = store_keys(root) - {key_a}
    (newest, *_) = explain_json(root)
    assert newest["key"] == key_b and newest["nearest"] == key_a
    assert newest["differs"] == ["XLA flags"]
    assert newest["values"]["XLA flags"]["this"] == FLAGS_B
    assert newest["values"]["XLA flags"]["nearest"] == FLAGS_A

    # The same program with a compiler option of its own: explained as "compile_options".
    options = {"xla_cpu_enable_fast_math": True}
    third = run_jax(
        [install, {"op": "run", "program": 0, "layers": 2, "compiler_options": options}],
        {"XLA_FLAGS": FLAGS_B},
    )
    assert hits(third) == [0]
    (key_c,) = store_keys(root) - {key_a, key_b}
    (newest, *older) = explain_json(root)
    assert newest["key"] == key_c and newest["nearest"] == key_b
    assert newest["differs"] == ["compile_options"]
    values = newest["values"]["compile_options"]
    assert values["this"]["env_option_overrides"] == {"xla_cpu_enable_fast_math": "True"}
    assert values["nearest"]["env_option_overrides"] == {}
    assert [r["key"] for r in older[:2]] == [key_b, key_a]

    text = cli_out("explain", "--path", str(root), "--last", "1")
    assert key_c in text and "differs: compile_options" in text
    # An entry's key explains that entry against the nearest other one.
    by_key = json.loads(cli_out("explain", "--path", str(root), "--json", key_a))
    assert by_key[0]["nearest"] == key_b and by_key[0]["differs"] == ["XLA flags"]


def test_compile_time_saved(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    install = {"op": "install", "path": str(root)}
    cold = run_jax([install, *runs(3, layers=12)])
    warm = run_jax([install, *runs(3, layers=12)])
    assert hits(cold) == [0] and hits(warm) == [1]
    measured = cold["runs"][0]["compile_seconds"]
    assert measured > 0
    with Store(root, read_only=True) as store:
        saved = store.stats()["compile_saved_ms"]
    assert isinstance(saved, int)
    assert abs(saved / 1000 - measured) <= 0.2 * measured, (saved, measured)

    from prometheus_client.parser import text_string_to_metric_families

    text = cli_out("stats", "--path", str(root), "--format", "prometheus")
    samples = {
        (s.name, s.labels.get("tier")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("xla_pcache_compile_time_saved_seconds_total", "local")] == saved / 1000
    assert samples[("xla_pcache_hits_total", "local")] == 1
    # The program's entry, its module record and the prefetch plan its process wrote.
    assert samples[("xla_pcache_entries", None)] == 3
    table = cli_out("stats", "--path", str(root))
    assert "compile time saved" in table
