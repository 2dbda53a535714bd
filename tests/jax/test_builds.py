"""Two builds of jaxlib on one cache: each hits only its own entries, neither loads the
other's, and the alternation alone evicts nothing; with loading ahead on (the default) the
builds share the workload's plan (their JAX keys are the same) and each loads ahead only its
own entries; a build's first run, finding only the other's, compiles them ahead from the
module records and computes what the other's cold run did; entries of an earlier release (no
build in their key) are never loaded, and say why.

The second build is a venv beside this one whose ``libjax_common.so`` (``xla_extension.so``
before 0.5) differs only in bytes appended after the ELF image (``tests/rebuild.py``); a
real program that knows nothing of xla_pcache runs in both, alternately, activated by the
environment alone.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from xla_pcache import Store, build_key, builds
from xla_pcache.jax import _build as jax_build

from tests.helpers import (
    clean_env,
    cli_out,
    explain_json,
    hooks_env,
    is_beside,
    is_module_record,
    is_plan,
)
from tests.jax.helpers import SIN_COS_PROGRAM, run_program
from tests.rebuild import build_id_span, second_build

EXPECTED = 3 * sum(math.sin(i) for i in range(8))


def _jaxlib_main() -> tuple[Path, Path]:
    """The largest object of jaxlib (the one that compiles and loads executables) and the
    jaxlib directory."""
    wanted = [w for w in jax_build.wanted() if w[0] == "jaxlib"]
    assert wanted, "jaxlib's objects were not found"
    main = max((Path(p) for _, p, _ in wanted), key=lambda p: p.stat().st_size)
    (top,) = builds.package_dirs("jaxlib")[:1]
    return main, Path(top)


def _run(python: Path, cache: Path, xdg: Path, hooks: Path | None = None) -> tuple[int, float]:
    """The program in a fresh process of ``python``: its JAX hit count and its value. With
    ``hooks``, JAX's compile of a program compiling ahead was given waits until compiling
    ahead has done all it was given, so that what it compiled is there to be taken."""
    env = clean_env(
        ("JAX_",),
        JAX_PLATFORMS="cpu",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        XLA_PERSISTENT_CACHE_PATH=str(cache),
        XDG_CACHE_HOME=str(xdg),
    )
    done = threading.Event()
    if hooks is not None:
        hooks.mkdir(exist_ok=True)
        for old in hooks.iterdir():
            old.unlink()
        (hooks / "claimed.go").touch()
        env.update(hooks_env(hooks))

        def release() -> None:
            deadline = time.monotonic() + 120
            while not done.is_set() and time.monotonic() < deadline:
                if list(hooks.glob("compile-ahead-idle.*")):
                    break
                time.sleep(0.02)
            (hooks / "compile-ahead-take.go").touch()

        threading.Thread(target=release, daemon=True).start()
    try:
        value, count, stderr = run_program(SIN_COS_PROGRAM, "sin", env=env, python=str(python))
    finally:
        done.set()
    assert value == pytest.approx(EXPECTED, rel=1e-6)
    assert "Traceback" not in stderr, stderr[-3000:]
    return count, value


def _stats(cache: Path) -> dict[str, int]:
    with Store(cache, read_only=True) as store:
        return dict(store.stats())  # type: ignore[arg-type]


def _keys(cache: Path, plans: bool = False) -> dict[str, tuple[str, str | None]]:
    """The executables' keys (``plans``: the prefetch plans' instead), each split into the
    framework's key and the build."""
    with Store(cache, read_only=True) as store:
        keys = store.keys()
    return {
        str(k): build_key.split(str(k))
        for k in keys
        if is_plan(k) == plans and not is_module_record(k)
    }


def _prefetch(cache: Path) -> dict[str, int]:
    return {k: v for k, v in _stats(cache).items() if k.startswith("prefetch_")}


def test_two_jaxlib_builds_alternate_on_one_cache(tmp_path: Path) -> None:
    main, top = _jaxlib_main()
    python_b, how = second_build(tmp_path / "venv-b", main, top)
    assert how == ("build-id" if build_id_span(main) is not None else "appended")
    python_a = Path(sys.executable)
    cache, xdg, hooks = tmp_path / "cache", tmp_path / "xdg", tmp_path / "hooks"

    # A, then B, then each again: a miss each first, then each its own entry.
    count, cold = _run(python_a, cache, xdg)
    assert count == 0
    (key_a,) = _keys(cache)
    jax_key, digest_a = build_key.split(key_a)
    assert digest_a == jax_build.build().digest
    # The workload's plan: no build in its key, naming JAX's key.
    ((_, (_, plan_digest)),) = _keys(cache, plans=True).items()
    assert plan_digest is None
    # B's first run finds the plan and only A's entry: it loads nothing of A's, compiles the
    # program ahead from its module record, and JAX's read takes it (JAX's event counts a
    # hit; the store, a miss): the same value as A's cold run, bit for bit, and B's own entry
    # stored.
    count, value = _run(python_b, cache, xdg, hooks)
    assert count == 1 and value == cold
    first_b = _prefetch(cache)
    assert (first_b["prefetch_planned"], first_b["prefetch_loaded"]) == (1, 0)
    assert (first_b["prefetch_compiled"], first_b["prefetch_compiled_used"]) == (1, 1)
    keys = _keys(cache)
    assert len(keys) == 2 and {k for k, _ in keys.values()} == {jax_key}
    (key_b,) = set(keys) - {key_a}
    digest_b = keys[key_b][1]
    assert digest_b not in (None, digest_a)
    # One plan for both: B's run read what it holds, and wrote nothing.
    assert list(_keys(cache, plans=True)) == [next(iter(_keys(cache, plans=True)))]
    assert first_b["prefetch_plans_written"] == 1
    assert _run(python_a, cache, xdg)[0] == 1
    assert _run(python_b, cache, xdg)[0] == 1
    with Store(cache, read_only=True) as store:
        hits = {str(e["key"]): e["hits"] for e in store.entries() if not is_beside(e["key"])}
        stats = dict(store.stats())
    # Each entry served once, to its own build's second run, loaded ahead from the one plan;
    # both kept, and the plan written once.
    assert hits == {key_a: 1, key_b: 1}
    # Puts: each build's executable, the plan and the program's module record, once: a
    # record is of JAX's key, the same for both builds (docs/jax.md, "Compiling ahead").
    assert (stats["misses"], stats["hits"], stats["puts"]) == (2, 2, 4)
    assert (stats["evictions"], stats["entries"]) == (0, 4)
    prefetch = _prefetch(cache)
    assert (prefetch["prefetch_planned"], prefetch["prefetch_loaded"]) == (3, 2)
    assert (prefetch["prefetch_used"], prefetch["prefetch_plans_written"]) == (2, 1)
    assert (prefetch["prefetch_wasted"], prefetch["prefetch_errors"]) == (0, 0)

    # B's first miss had A's entry there: counted, and explained with both binaries.
    assert stats["other_build"] == 1
    (b_miss,) = [r for r in explain_json(cache) if r["key"] == key_b]
    assert b_miss["nearest"] == key_a
    assert b_miss["differs"] == [builds.COMPONENT]
    name = main.relative_to(top).as_posix()
    assert b_miss["answer"].startswith(f"built by another jaxlib binary ({name}: blake3 ")
    text = cli_out("explain", key_b, "--path", str(cache))
    assert "built by another jaxlib binary" in text and " here, blake3 " in text
    prom = cli_out("stats", "--path", str(cache), "--format", "prometheus")
    assert re.search(r"^xla_pcache_other_build_misses_total\{[^}]*\} 1(\.0)?$", prom, re.M), prom

    # The plan names the key, but only A's entry is there: B loads nothing ahead (its own
    # build's key is missing), never A's executable, and compiles it ahead again.
    with Store(cache) as store:
        assert store.delete(key_b)
    assert _run(python_b, cache, xdg, hooks) == (1, cold)
    after = _prefetch(cache)
    assert after["prefetch_planned"] == 4
    assert (after["prefetch_loaded"], after["prefetch_used"]) == (2, 2)
    assert (after["prefetch_compiled"], after["prefetch_compiled_used"]) == (2, 2)
    assert after["prefetch_errors"] == 0
    with Store(cache, read_only=True) as store:
        assert {str(e["key"]): e["hits"] for e in store.entries()}[key_a] == 1
    assert _stats(cache)["other_build"] == 2

    # An entry of an earlier release (JAX's key alone) with A's bytes: never loaded.
    with Store(cache) as store:
        blob = store.get(key_a)
        assert blob is not None
        meta = {k: v for k, v in blob.meta.items() if not k.startswith("xla_pcache.")}
        parts = json.loads(meta["key_components"])
        parts["components"] = [c for c in parts["components"] if c["name"] != builds.COMPONENT]
        meta["key_components"] = json.dumps(parts)
        assert store.put(jax_key, bytes(blob), meta=meta)
        del blob
        assert store.delete(key_a) and store.delete(key_b)
    assert _run(python_a, cache, xdg)[0] == 0
    stats = _stats(cache)
    assert stats["other_build"] == 3 and stats["evictions"] == 0
    explained = explain_json(cache)
    assert explained[0]["key"] == key_a and explained[0]["nearest"] == jax_key
    assert explained[0]["answer"].startswith("the nearest entry names no runtime build")
    assert jax_key in _keys(cache)  # left to age out, not removed
