"""Why an entry made on one host misses on another, against the real jax on CPU (fresh
processes, the environment alone): ``explain`` names the host's setting that differs (the
compression, the flags) and says what to change; ``doctor`` shows the compression and the
flags in this host's keys and the store's entries made under others; where the program
itself changed, the miss's explanation (``XLA_PCACHE_ON_MISS``, ``explain``) diffs its
module against the nearest module record. What a key-less writer of the cache plants as a
record never makes explain fail: no diff, and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.jax.ahead import _record as _module_record
from xla_pcache.jax.ahead._record import MLIR_BYTECODE_MAGIC, Record, Target, encode

from tests.helpers import clean_env, cli, cli_out, executables, explain_json
from tests.jax.helpers import JAX_ONLY, SIN_COS_PROGRAM, run_program, without_zstandard

pytestmark = JAX_ONLY

# A cache holding two programs of one name, and their records' keys (``two_programs``).
Two = tuple[Path, str, str]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return clean_env(
        ("JAX_", "XLA_FLAGS"),
        JAX_PLATFORMS="cpu",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        XLA_PERSISTENT_CACHE_PATH=str(cache),
        **extra,
    )


def _run(program: str, env: dict[str, str]) -> tuple[int, str]:
    """``SIN_COS_PROGRAM`` running ``program``: JAX's hit count and its stderr."""
    _, count, stderr = run_program(SIN_COS_PROGRAM, program, env=env)
    assert "Traceback" not in stderr, stderr[-3000:]
    return count, stderr


def _doctor(env: dict[str, str], cache: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(cli_out("doctor", "--path", str(cache), "--json", env=env))
    keys: dict[str, Any] = report["jax_keys"]
    return keys


def test_hosts_split_by_zstandard_are_told_apart(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with_zstd = _env(cache)
    without = without_zstandard(_env(cache), tmp_path)
    assert _run("sin", with_zstd)[0] == 0
    # The same program on a host without zstandard: another key, a miss.
    assert _run("sin", without)[0] == 0
    (newest, *_) = explain_json(cache)
    assert newest["differs"] == ["compression"], newest
    assert newest["values"]["compression"]["this"] == "zlib"
    assert newest["values"]["compression"]["nearest"] == "zstandard"
    said = newest["settings"]["compression"]
    assert said.startswith("compressed with zlib here, zstandard there: JAX compresses with zstd")
    text = cli_out("explain", "--path", str(cache), "--last", "1")
    assert f"why:     {said}" in text

    # Each host's doctor: the compression in its keys, and the entry it never reads.
    here = _doctor(without, cache)
    assert here["host"] == {"compression": "zlib", "flags": []}
    assert here["entries"]["recorded"] == 2
    assert here["entries"]["other"] == [{"part": "compression", "value": "zstandard", "entries": 1}]
    assert here["entries"]["other_left_out"] == 0
    there = _doctor(with_zstd, cache)
    assert there["host"]["compression"] == "zstandard"
    assert there["entries"]["other"] == [{"part": "compression", "value": "zlib", "entries": 1}]
    shown = cli_out("doctor", "--path", str(cache), env=without)
    assert "JAX's keys on this host: compression zlib, flags none" in shown
    assert "1 of the store's 2 JAX entries were made with compression zstandard" in shown


def test_other_flags_are_named_and_shown_by_doctor(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fast = "--xla_cpu_enable_fast_math=false"
    _run("sin", _env(cache))
    _run("sin", _env(cache, XLA_FLAGS=fast))
    (newest, *_) = explain_json(cache)
    assert newest["differs"] == ["XLA flags"]
    assert newest["settings"]["XLA flags"].startswith(f"flags here only: {fast}; there only: none")
    keys = _doctor(_env(cache, XLA_FLAGS=fast), cache)
    assert keys["host"]["flags"] == [fast]
    assert keys["entries"]["other"] == [{"part": "flags", "value": "", "entries": 1}]


# The target a record of this host names.
CPU = Target("cpu", "cpu", 1)


def _records(cache: Path) -> dict[str, bytes]:
    with Store(cache, read_only=True) as store:
        out = {}
        keys = store.keys()
        for key in keys:
            if str(key).startswith(_module_record.KEY_PREFIX):
                blob = store.get(key)
                assert blob is not None
                out[str(key)] = bytes(blob)
        return out


def test_a_changed_program_is_diffed_against_the_nearest_record(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _run("sin", _env(cache))[0] == 0
    (sin_record,) = _records(cache)
    # The same program's name with another computation: the miss's warning shows the change.
    _, stderr = _run("cos", _env(cache, XLA_PCACHE_ON_MISS="warn"))
    assert "cache miss for program 'jit__lambda" in stderr
    assert f"its module against the nearest record's ({sin_record})" in stderr
    # One line (what is logged shows control characters escaped), the diff's lines in it.
    assert "\\n-    %0 = stablehlo.sine %arg0" in stderr
    assert "\\n+    %0 = stablehlo.cosine %arg0" in stderr

    # Later, from the command: the missed program was compiled and recorded since.
    (newest, *_) = explain_json(cache)
    assert newest["differs"] == ["computation"]
    diff = newest["module_diff"]
    assert diff["against"] == sin_record
    assert any(line.startswith("-") and "stablehlo.sine" in line for line in diff["lines"])
    assert any(line.startswith("+") and "stablehlo.cosine" in line for line in diff["lines"])
    assert not any("loc(" in line for line in diff["lines"])
    text = cli_out("explain", "--path", str(cache), "--last", "1")
    assert "its module against the nearest record's" in text and "stablehlo.cosine" in text


def _plant(cache: Path, key: str, value: bytes) -> None:
    with Store(cache) as store:
        store.delete(key)
        store.put(key, value, meta={"kind": _module_record.META_KIND, "framework": "jax"})


def _miss_diff(cache: Path) -> dict[str, Any]:
    (newest, *_) = explain_json(cache)
    assert newest["differs"] == ["computation"]
    diff: dict[str, Any] = newest["module_diff"]
    return diff


@pytest.fixture(scope="module")
def two_programs(tmp_path_factory: pytest.TempPathFactory) -> Two:
    """A cache with the sin program and then the cos one (a miss), and both records' keys."""
    cache = tmp_path_factory.mktemp("two") / "cache"
    _run("sin", _env(cache))
    (sin_record,) = _records(cache)
    _run("cos", _env(cache))
    (cos_record,) = set(_records(cache)) - {sin_record}
    return cache, sin_record, cos_record


def _copy(two: Two, tmp_path: Path) -> Two:
    cache, sin_record, cos_record = two
    shutil.copytree(cache, tmp_path / "cache", symlinks=True)
    return tmp_path / "cache", sin_record, cos_record


def test_a_planted_record_that_is_not_one_is_no_diff(two_programs: Two, tmp_path: Path) -> None:
    cache, sin_record, _ = _copy(two_programs, tmp_path)
    _plant(cache, sin_record, b"not a module record")
    diff = _miss_diff(cache)
    assert "lines" not in diff
    assert f"refused: {sin_record}: shorter than its header" in diff["why"]
    assert cli(*("explain", "--path", str(cache))).returncode == 0


def test_a_planted_module_that_is_not_mlir_is_no_diff(two_programs: Two, tmp_path: Path) -> None:
    cache, sin_record, _ = _copy(two_programs, tmp_path)
    garbage = MLIR_BYTECODE_MAGIC + bytes(range(256)) * 64
    _plant(cache, sin_record, encode(Record(garbage, b"", (0,), CPU)))
    diff = _miss_diff(cache)
    assert "lines" not in diff and diff["why"]
    assert cli(*("explain", "--path", str(cache))).returncode == 0


def test_a_record_planted_under_the_missed_key_is_said_not_to_be_its_programs(
    two_programs: Two, tmp_path: Path
) -> None:
    """A record planted under the missed program's own key (the nearest program's module):
    no diff, and the records said not to be their programs'; nothing is compiled or stored
    by explain."""
    cache, sin_record, cos_record = _copy(two_programs, tmp_path)
    planted = _records(cache)[sin_record]
    _plant(cache, cos_record, planted)
    before = sorted(p.name for p in cache.rglob("*") if p.is_file())
    diff = _miss_diff(cache)
    assert "lines" not in diff and "one record is not its program's" in diff["why"]
    with Store(cache, read_only=True) as store:
        assert len(executables(store)) == 2
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == before


def test_a_record_over_the_bounds_is_no_diff(two_programs: Two, tmp_path: Path) -> None:
    cache, sin_record, _ = _copy(two_programs, tmp_path)
    from xla_pcache.jax import _module_diff

    big = MLIR_BYTECODE_MAGIC + b"\0" * (_module_diff.MAX_MODULE_BYTES + 1)
    _plant(cache, sin_record, encode(Record(big, b"", (0,), CPU)))
    diff = _miss_diff(cache)
    assert "lines" not in diff and "diffed up to" in diff["why"]


def test_planted_key_components_never_mislead_doctor(tmp_path: Path) -> None:
    """Entries a key-less writer made with components of its choosing: values that are not
    text are passed over, long ones clipped, control characters shown escaped, and however
    many values it makes, ten are shown and the rest counted."""
    cache = tmp_path / "cache"
    with Store(cache) as store:
        for i in range(40):
            parts = {
                "module": "jit_x",
                "components": [
                    {"name": "compression", "digest": "0", "value": f"zstd-{i:02d}\x1b[31m"},
                    {"name": "XLA flags", "digest": "0", "value": {"not": "text"}},
                    {"name": "jax_lib version", "digest": "0", "value": "9" * 5000},
                ],
            }
            meta = {"framework": "jax", "key_components": json.dumps(parts)}
            store.put(f"jit_x-{i:064x}", b"x", meta=meta)
        store.put("jit_y-" + "0" * 64, b"x", meta={"framework": "jax", "key_components": "[["})
    env = without_zstandard(_env(cache), tmp_path)
    keys = _doctor(env, cache)
    entries = keys["entries"]
    assert entries["recorded"] == 40
    assert len(entries["other"]) == 10
    # One jaxlib value (clipped) on all 40, then 40 compressions of one entry each: the jaxlib
    # and nine compressions shown, 31 left out; the flags (not text) passed over.
    jaxlib, *compressions = entries["other"]
    assert jaxlib["part"] == "jaxlib" and jaxlib["entries"] == 40
    assert len(jaxlib["value"]) <= 400
    assert [c["part"] for c in compressions] == ["compression"] * 9
    assert entries["other_left_out"] == 31
    shown = cli_out("doctor", "--path", str(cache), env=env)
    assert "\x1b" not in shown and "more made under still other settings" in shown


def test_a_diff_of_texts_a_writer_chose_stays_bounded() -> None:
    """What is matched line by line is only what lies between the lines two modules share
    at their start and end, and at most 2,000 lines of it; the diff shown, 80 lines."""
    from xla_pcache.jax._module_diff import MAX_DIFF_LINES, diff_lines

    head = [f"  %{i} = stablehlo.add %a, %b : tensor<8xf32>" for i in range(5000)]
    one = "\n".join([*head, "  %x = stablehlo.sine %a", *head])
    two = "\n".join([*head, "  %x = stablehlo.cosine %a", *head])
    assert diff_lines(two, one, "r") == [
        "--- r",
        "+++ this",
        "@@ -5000,3 +5000,3 @@",
        f" {head[-1]}",
        "-  %x = stablehlo.sine %a",
        "+  %x = stablehlo.cosine %a",
        f" {head[0]}",
    ]
    # Lines of few distinct values that share nothing: shown as removed then added.
    a = "\n".join(str(i % 110) for i in range(100_000))
    b = "\n".join(str(i % 97) for i in range(100_000))
    out = diff_lines(b, a, "r")
    assert len(out) == MAX_DIFF_LINES + 1 and out[-1].startswith("...")
    assert out[2].startswith("@@ -97,") and out[3] == "-96"
    assert all(line.startswith("-") for line in out[3:-1])
