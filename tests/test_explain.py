"""The miss log, the explain comparison, compile time saved and the metrics, without a
framework (the JAX side is tests/jax/test_explain_jax.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store, build_key, explain, metrics
from xla_pcache._reports import TIER_COUNTERS
from xla_pcache.misslog import META_COMPILE_TIME, META_COMPONENTS, module_name


def parts(**digests: str) -> list[dict[str, Any]]:
    return [{"name": n.replace("_", " "), "digest": d, "value": d} for n, d in digests.items()]


def test_miss_log_stays_bounded_and_keeps_the_latest(tmp_path: Path) -> None:
    Store(tmp_path).close()
    pad = "x" * 1000
    for i in range(800):
        assert explain.append_miss(str(tmp_path), {"key": f"jit_f-{i:04x}", "t": i, "pad": pad})
    sizes = [os.path.getsize(tmp_path / n) for n in (explain.MISS_LOG, explain.MISS_LOG_OLD)]
    assert all(0 < s <= explain.MAX_LOG_BYTES for s in sizes), sizes
    misses = explain.read_misses(str(tmp_path))
    assert misses[-1]["key"] == "jit_f-031f"
    assert [m["t"] for m in misses] == sorted(m["t"] for m in misses)
    assert 200 < len(misses) < 800


def test_miss_log_refuses_planted_links_and_fifos(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    Store(root).close()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (root / explain.MISS_LOG).symlink_to(victim)
    assert not explain.append_miss(str(root), {"key": "jit_f-1", "t": 1})
    assert victim.read_text() == "keep"
    assert explain.read_misses(str(root)) == []
    (root / explain.MISS_LOG).unlink()
    os.mkfifo(root / explain.MISS_LOG)
    # A FIFO with no reader would block an ordinary open forever; this must return at once.
    done = threading.Event()
    result: list[bool] = []

    def attempt() -> None:
        result.append(explain.append_miss(str(root), {"key": "jit_f-1", "t": 1}))
        result.append(explain.read_misses(str(root)) == [])
        done.set()

    threading.Thread(target=attempt, daemon=True).start()
    assert done.wait(10) and result == [False, True]


def test_malformed_records_are_skipped(tmp_path: Path) -> None:
    Store(tmp_path).close()
    good = {"key": "jit_f-1", "t": 1.0, "components": parts(computation="a")}
    lines = [
        "not json",
        json.dumps({"key": 3}),
        json.dumps(good),
        json.dumps({"key": "k", "components": [1]}),
    ]
    (tmp_path / explain.MISS_LOG).write_text("\n".join(lines) + "\n")
    assert [m["key"] for m in explain.read_misses(str(tmp_path))] == ["jit_f-1"]


def entry(key: str, created: float, comps: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"key": key, "module": key.rpartition("-")[0], "created": created, "components": comps}


def test_nearest_entry_prefers_the_same_computation() -> None:
    miss = {"key": "jit_f-9", "t": 5.0, "components": parts(computation="c1", XLA_flags="b")}
    entries = [
        # Another program, and the same one with a different computation but same flags.
        entry("jit_g-1", 4.0, parts(computation="c1", XLA_flags="b")),
        entry("jit_f-2", 4.0, parts(computation="c2", XLA_flags="b")),
        entry("jit_f-1", 1.0, parts(computation="c1", XLA_flags="a")),
    ]
    (result,) = explain.explain_records([miss], entries)
    assert result["nearest"] == "jit_f-1"
    assert result["differs"] == ["XLA flags"]
    assert result["values"]["XLA flags"]["this"] == "b"
    assert result["values"]["XLA flags"]["nearest"] == "a"

    (none,) = explain.explain_records([{**miss, "key": "jit_h-1"}], entries)
    assert none["nearest"] is None and none["answer"] == "No entry of this program yet"
    (old,) = explain.explain_records([miss], [entry("jit_f-1", 1.0, None)])
    assert old["nearest"] is None and "without key components" in old["answer"]


def test_a_changed_computation_is_said_so_with_how_to_see_it() -> None:
    """The computation is recorded by digest only: when it alone differs, the line says the
    program changed and how to see both modules, never "(not recorded) here, (not recorded)
    there"; another component with no value recorded on either side shows its digests."""

    def bare(**digests: str) -> list[dict[str, Any]]:
        return [{"name": n, "digest": d} for n, d in digests.items()]

    miss = {"key": "jit_f-9", "t": 5.0, "components": bare(computation="c2", custom_hook="h2")}
    (result,) = explain.explain_records(
        [miss], [entry("jit_f-1", 1.0, bare(computation="c1", custom_hook="h1"))]
    )
    assert result["differs"] == ["computation", "custom_hook"]
    line = explain.one_line(result)
    text = "\n".join(explain.lines(result, now=10.0))
    for shown in (line, text):
        assert "(not recorded)" not in shown, shown
        assert "computation changed (a different HLO module)" in shown, shown
        assert "JAX_DUMP_IR_TO=<dir>" in shown, shown
        assert "digest h2 here, h1 there" in shown, shown
    # In the JSON form too, as a note.
    assert any("computation changed" in note for note in result["notes"]), result


def test_hits_count_the_compile_time_their_entries_recorded(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.put("jit_f-1", b"x" * 100, meta={META_COMPILE_TIME: "1.5"})
        store.put("jit_f-2", b"y" * 100, meta={META_COMPILE_TIME: "not a number"})
        store.put("jit_f-3", b"z" * 100)
        for key in ("jit_f-1", "jit_f-1", "jit_f-2", "jit_f-3"):
            assert store.get(key) is not None
        assert store.process_stats()["compile_saved_ms"] == 3000
    # Another process's hits add up in the aggregated counters.
    code = (
        "import sys; from xla_pcache import Store\nwith Store(sys.argv[1]) as s: s.get('jit_f-1')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60)
    with Store(tmp_path, read_only=True) as store:
        report = store.stats()
    assert report["compile_saved_ms"] == 4500
    text = metrics.prometheus_text(report)
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    (sample,) = families["xla_pcache_compile_time_saved_seconds"].samples
    assert sample.name == "xla_pcache_compile_time_saved_seconds_total"
    assert sample.value == 4.5 and sample.labels == {"cache": str(tmp_path), "tier": "local"}
    assert families["xla_pcache_hits"].type == "counter"
    assert families["xla_pcache_entries"].type == "gauge"


def test_remote_counters_carry_the_remote_tier() -> None:
    text = metrics.prometheus_text({"path": "/c", "hits": 2, "remote_hits": 5, "entries": 1})
    assert 'xla_pcache_hits_total{cache="/c",tier="local"} 2.0' in text
    assert 'xla_pcache_hits_total{cache="/c",tier="remote"} 5.0' in text


def _tier(name: str, **counts: int) -> dict[str, int]:
    # A tier as the store reports it: every counter of the tier, by its name.
    return {f"remote_{name}_{c}": counts.get(c, 0) for c in TIER_COUNTERS}


def test_remote_counters_per_tier_name() -> None:
    """Each tier the store counted has its own ``tier`` label, by its name (data: any name);
    what they do not account for (counted by an older version, without tier names) stays
    ``remote``: the sum over the label is the whole cache's. No label for a tier the report
    does not hold."""
    report: dict[str, object] = {"path": "/c", "remote_hits": 5, "remote_misses": 7}
    report |= _tier("s3", hits=3, misses=4) | _tier("my-redis", hits=2)
    # A tier's own process counter with a tier-like name is no tier.
    report["remote_get_errors"] = 1
    text = metrics.prometheus_text(report)
    assert 'xla_pcache_hits_total{cache="/c",tier="s3"} 3.0' in text
    assert 'xla_pcache_hits_total{cache="/c",tier="my-redis"} 2.0' in text
    assert 'xla_pcache_hits_total{cache="/c",tier="remote"}' not in text
    assert 'xla_pcache_misses_total{cache="/c",tier="s3"} 4.0' in text
    assert 'xla_pcache_misses_total{cache="/c",tier="remote"} 3.0' in text
    for absent in ("gs", "az", "redis", "get"):
        assert f'tier="{absent}"' not in text


def test_no_tier_no_remote_metrics() -> None:
    text = metrics.prometheus_text({"path": "/c", "hits": 1})
    assert "remote" not in text and 'tier="local"' in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0.0 s"),
        (42.46, "42.5 s"),
        (125, "2 min 5 s"),
        (11520, "3 h 12 min"),
        (3 * 86400, "3 d 0 h"),
    ],
)
def test_human_duration(seconds: float, text: str) -> None:
    assert metrics.human_duration(seconds) == text


def test_each_process_logs_one_summary_at_exit(tmp_path: Path) -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "from xla_pcache import Store, metrics\n"
        "s = Store(sys.argv[1]); metrics.log_exit_summary(s); metrics.log_exit_summary(s)\n"
        "s.put('jit_f-1', b'v' * 2048, meta={'compile_time_s': '90'})\n"
        "s.get('jit_f-1'); s.get('jit_f-2')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stderr
    lines = [line for line in out.splitlines() if "this process" in line]
    assert len(lines) == 1, out
    assert lines[0].startswith("INFO ")
    assert "1 hits, 1 misses, 1 puts" in lines[0] and "compile time saved 1 min 30 s" in lines[0]


def test_entry_components_ignore_foreign_metadata() -> None:
    assert explain.entry_components({META_COMPONENTS: "{"}) is None
    assert explain.entry_components({META_COMPONENTS: json.dumps({"components": "x"})}) is None
    assert explain.entry_components({META_COMPONENTS: "x" * (explain.MAX_META_CHARS + 1)}) is None
    ok = {"module": "jit_f", "components": parts(computation="a")}
    assert explain.entry_components({META_COMPONENTS: json.dumps(ok)}) == ok


def test_an_entry_key_is_explained_against_the_other_entries(tmp_path: Path) -> None:
    def meta(flags: str) -> dict[str, str]:
        comps = {"module": "jit_f", "components": parts(computation="c", XLA_flags=flags)}
        return {META_COMPONENTS: json.dumps(comps)}

    with Store(tmp_path) as store:
        store.put("jit_f-1", b"a", meta=meta("--xla_a=1"))
        store.put("jit_f-2", b"b", meta=meta("--xla_a=2"))
        (result,) = explain.explain(store, "jit_f-2")
        assert result["nearest"] == "jit_f-1" and result["differs"] == ["XLA flags"]
        assert explain.explain(store) == []  # no misses logged
        with pytest.raises(KeyError):
            explain.explain(store, "jit_g-1")


def test_builds_are_said_in_words_and_keys_keep_their_program_name() -> None:
    """The runtime build as explain says it (builds/build.py, explain.build_sentence): the main
    binary's identity when it differs, the other files' digest when only they do, a role on
    one side only, and an entry of a release that keyed no build."""

    def role(ident: str, digest: str = "d1", files: int = 31) -> dict[str, object]:
        return {"file": "libjax_common.so", "id": ident, "files": files, "digest": digest}

    here = {"jaxlib": role("blake3 " + "a" * 64)}
    there = {"jaxlib": role("blake3 " + "b" * 64, "d2")}
    assert explain.build_sentence({"this": here, "nearest": there}) == (
        "built by another jaxlib binary (libjax_common.so: blake3 aaaaaaaaaaaaaaaa here, "
        "blake3 bbbbbbbbbbbbbbbb there)"
    )
    kernels = {"jaxlib": role("blake3 " + "a" * 64, "d3")}
    assert explain.build_sentence({"this": here, "nearest": kernels}) == (
        "built by another jaxlib build (31 files, digest d1 here; 31, d3 there)"
    )
    tpu = {**here, "libtpu": role("build-id 0102", "d4")}
    assert explain.build_sentence({"this": tpu, "nearest": here}) == "libtpu here only"
    assert explain.build_sentence({"this": here, "nearest": None}) == explain.NO_BUILD_THERE

    key = "jit_step-" + "c" * 64
    stored = key + "@build-" + "0123456789abcdef" * 2
    assert build_key.split(stored) == (key, "0123456789abcdef" * 2)
    assert build_key.split(key) == (key, None)
    assert build_key.split(key + "@build-xyz") == (key + "@build-xyz", None)
    assert module_name(stored) == module_name(key) == "jit_step"
