"""Adopting a directory JAX's own cache filled (``xla_pcache.jax._adopt``, read through
``_cache_dir``): first on files written as JAX writes them (``<key>-cache``: 4 bytes of
compile time and the executable, zlib- or zstd-compressed) and on hostile ones, in this
process; then with real JAX in fresh processes.

The real-JAX tests first let JAX alone fill a directory (``JAX_COMPILATION_CACHE_DIR``,
xla_pcache off with ``XLA_PCACHE_DISABLE=1``). The filling run sets JAX's own
``jax_persistent_cache_min_compile_time_secs`` to 0: the test programs compile in
milliseconds and JAX's default (1 s) would store none of them; it stands for a user whose
JAX cache holds entries, which is what is being adopted. The runs through xla_pcache then
use the README's set-up only (``XLA_PERSISTENT_CACHE_PATH``, beside the user's
``JAX_COMPILATION_CACHE_DIR``), activated without code by the ``jax_plugins`` hook. Both
formats JAX writes are checked: zstd (``zstandard`` installed) and zlib (a process that
cannot import it, as JAX then falls back to zlib).

What adoption does under trusted keys and signing keys is in tests/test_received_trust.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import xla_pcache
from xla_pcache import Store, build_key
from xla_pcache.jax import _adopt
from xla_pcache.jax import _build as jax_build
from xla_pcache.jax import _cache_dir as jcd

from tests.helpers import clean_env, cli, executable_keys, run_worker
from tests.jax.helpers import WORKER, results, runs, store_keys

requires_jax = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="jax is not installed"
)

KEY = "jit_step-" + "ab" * 32
OTHER = "jit_other-" + "cd" * 32
ZLIB = frozenset({jcd.ZLIB})
ZSTD = frozenset({jcd.ZSTD})
BOTH = ZLIB | ZSTD


def value(payload: bytes = b"serialized executable " * 50, secs: int = 3) -> bytes:
    return zlib.compress(secs.to_bytes(4, "big") + payload)


def jax_dir(tmp_path: Path, entries: dict[str, bytes], atime: bool = True) -> Path:
    d = tmp_path / "jaxcache"
    d.mkdir(exist_ok=True)
    for key, data in entries.items():
        (d / f"{key}-cache").write_bytes(data)
        if atime:
            (d / f"{key}-atime").write_bytes((123).to_bytes(8, "little"))
    return d


def zstd_bomb(blocks: int = 8192, declared: int | None = None) -> bytes:
    """A zstd frame of RLE blocks, 4 bytes each for 128 KiB of output (8192 of them: 32 KiB
    that decompress to 1 GiB), declaring its size or (``None``) not."""
    # No size: not single segment, an 8 MiB window. A size: single segment, 4 bytes of it.
    no_size = bytes([0x00, 0x68])
    header = no_size if declared is None else bytes([0xA0]) + declared.to_bytes(4, "little")
    out = bytearray(b"\x28\xb5\x2f\xfd" + header)
    for i in range(blocks):
        last = i == blocks - 1
        out += ((128 << 10) << 3 | 1 << 1 | last).to_bytes(3, "little") + b"\x07"
    return bytes(out)


# --- files, in this process -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        (f"{KEY}-cache", KEY),
        (f"{KEY}-atime", None),
        (f"{KEY}", None),
        ("jit_f-1234-cache", None),  # not a sha256
        ("-" + "ab" * 32 + "-cache", None),  # no module name
        ("a/b-" + "ab" * 32 + "-cache", None),
        ("x" * 200 + "-" + "ab" * 32 + "-cache", None),  # over a file name's length
        (".lockfile", None),
    ],
)
def test_key_of(name: str, key: str | None) -> None:
    assert jcd.key_of(name) == key


def test_check_value_accepts_what_jax_writes_and_rejects_the_rest() -> None:
    assert jcd.check_value(value(), ZLIB) == jcd.ZLIB
    good = value()
    for bad, why in (
        (good[: len(good) // 2], "ends early"),
        (good + b"junk", "after the end"),
        (b"not compressed at all", "not a zlib stream"),
        (b"\x78\x9c" + b"\xff" * 40, "does not decompress"),
        (zlib.compress(b"abc"), "no executable"),
        (b"", "not a zlib stream"),
    ):
        with pytest.raises(jcd.Rejected, match=why):
            jcd.check_value(bad, ZLIB)
    # A zstd frame where this JAX reads zlib only: JAX would fail on it.
    with pytest.raises(jcd.Rejected, match="reads zlib only"):
        jcd.check_value(b"\x28\xb5\x2f\xfd" + b"\0" * 20, ZLIB)
    # A bomb: refused before it is all decompressed.
    with pytest.raises(jcd.Rejected, match="more than the bound"):
        jcd.check_value(zlib.compress(b"\0" * (64 << 20)), ZLIB)


def test_check_value_zstd_and_its_bombs() -> None:
    import zstandard

    raw = (7).to_bytes(4, "big") + b"executable" * 100
    good = zstandard.ZstdCompressor().compress(raw)
    assert jcd.check_value(good, ZSTD) == jcd.ZSTD
    assert jcd.value_seconds(good) == 7
    big = zstandard.ZstdCompressor().compress(raw + os.urandom(3 << 20))  # several pieces
    assert jcd.check_value(big, ZSTD) == jcd.ZSTD
    for bad, why in (
        (good[:-5], "ends early"),
        (good + b"junk", "does not decompress|after the end"),
        (good + good, "more than its frame declares"),
        # No size declared: JAX's zstandard cannot read it, and nothing is decompressed.
        (zstd_bomb(), "declares no size"),
        (zstd_bomb(declared=1 << 30), "declares more decompressed bytes than the bound"),
        # A size declared within the bound, and blocks past it.
        (zstd_bomb(declared=1 << 20), "more than its frame declares|does not decompress"),
        (b"\x28\xb5\x2f\xfd\xff", "not a zstd frame"),
        (zstandard.ZstdCompressor().compress(b"\0\0\0\1"), "no executable"),
    ):
        with pytest.raises(jcd.Rejected, match=why):
            jcd.check_value(bad, ZSTD)


def test_adopt_publishes_under_the_key_and_removes_jax_files(tmp_path: Path) -> None:
    data = value()
    d = jax_dir(tmp_path, {KEY: data, OTHER: value(b"other" * 30, secs=0)})
    src = jcd.JaxCacheDir(d)
    with Store(tmp_path / "store") as store:
        out = _adopt.adopt(store, src, KEY, formats=ZLIB, meta={"framework": "jax"})
        assert out.status == _adopt.ADOPTED
        assert out.value == data
        blob = store.get(KEY)
        assert blob is not None and bytes(blob) == data
        assert blob.meta["framework"] == "jax"
        assert blob.meta["adopted_from"] == "jax_cache"
        # JAX's own figure, whole seconds.
        assert blob.meta["compile_time_s"] == "3.000000"
        # Kept once: JAX's file and its atime are gone, the other entry is untouched.
        assert sorted(os.listdir(d)) == [f"{OTHER}-atime", f"{OTHER}-cache"]
        assert _adopt.adopt(store, src, KEY, formats=ZLIB).status == _adopt.MISSING
        # JAX wrote 0: under a second, so unknown, never "0 s".
        assert _adopt.adopt(store, src, OTHER, formats=ZLIB).status == _adopt.ADOPTED
        other = store.get(OTHER)
        assert other is not None and other.meta["compile_time_s"] == "unknown"


def test_adopt_under_an_alias_publishes_under_the_asked_key(tmp_path: Path) -> None:
    data = value()
    d = jax_dir(tmp_path, {OTHER: data})
    with Store(tmp_path / "store") as store:
        out = _adopt.adopt(store, jcd.JaxCacheDir(d), KEY, names=[OTHER], formats=ZLIB)
        assert (out.status, out.name) == (_adopt.ADOPTED, OTHER)
        assert KEY in store and OTHER not in store
        assert os.listdir(d) == []


def test_adopt_present_removes_the_duplicate(tmp_path: Path) -> None:
    d = jax_dir(tmp_path, {KEY: value()})
    with Store(tmp_path / "store") as store:
        store.put(KEY, b"ours")
        out = _adopt.adopt(store, jcd.JaxCacheDir(d), KEY, formats=ZLIB)
        assert out.status == _adopt.PRESENT
        assert bytes(store.get(KEY) or b"") == b"ours"
        assert os.listdir(d) == []


def test_read_only_store_serves_but_moves_nothing(tmp_path: Path) -> None:
    data = value()
    d = jax_dir(tmp_path, {KEY: data})
    Store(tmp_path / "store").close()
    with Store(tmp_path / "store", read_only=True) as store:
        out = _adopt.adopt(store, jcd.JaxCacheDir(d), KEY, formats=ZLIB)
        assert (out.status, out.value) == (_adopt.SERVED, data)
        assert KEY not in store
    assert sorted(os.listdir(d)) == [f"{KEY}-atime", f"{KEY}-cache"]


def test_one_size_bound_the_stored_budget_capped_by_the_entry_cap(tmp_path: Path) -> None:
    data = value(os.urandom(4000))
    d = jax_dir(tmp_path, {KEY: data})
    src = jcd.JaxCacheDir(d)
    root = tmp_path / "store"
    with Store(root) as store:
        assert _adopt.entry_bound(store) == jcd.MAX_ENTRY_BYTES
        assert _adopt.entry_bound(store, 5000) == 5000
        # The budget stored in the cache bounds it, though this process set none.
        store.write_cache_settings(max_size=1000)
    with Store(root) as store:
        assert _adopt.entry_bound(store) == 1000
        assert _adopt.entry_bound(store, 500) == 500
        out = _adopt.adopt(store, src, KEY, formats=ZLIB)
        assert out.status == _adopt.REJECTED and "larger than 1000" in (out.reason or "")
        assert KEY not in store
    assert (d / f"{KEY}-cache").exists()


def test_hostile_files_are_rejected_and_left_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(value())
    d = jax_dir(tmp_path, {})
    link = f"jit_link-{'11' * 32}"
    fifo = f"jit_fifo-{'22' * 32}"
    sub = f"jit_dir-{'33' * 32}"
    torn = f"jit_torn-{'44' * 32}"
    big = f"jit_big-{'55' * 32}"
    sparse = f"jit_sparse-{'66' * 32}"
    bomb = f"jit_bomb-{'77' * 32}"
    (d / f"{link}-cache").symlink_to(outside)
    os.mkfifo(d / f"{fifo}-cache")  # opening it must not block
    (d / f"{sub}-cache").mkdir()
    (d / f"{torn}-cache").write_bytes(value()[:-7])
    (d / f"{big}-cache").write_bytes(value(os.urandom(5000)))
    with open(d / f"{sparse}-cache", "wb") as f:
        f.truncate(64 << 20)
    (d / f"{bomb}-cache").write_bytes(zstd_bomb())
    before = sorted(os.listdir(d))
    src = jcd.JaxCacheDir(d)
    assert sorted(src.keys()) == sorted([link, fifo, sub, torn, big, sparse, bomb])
    with Store(tmp_path / "store") as store:
        for key in (link, fifo, sub, torn, sparse, bomb):
            out = _adopt.adopt(store, src, key, formats=BOTH)
            assert out.status == _adopt.REJECTED, (key, out)
            assert key not in store
        out = _adopt.adopt(store, src, big, formats=ZLIB, cap=1000)
        assert out.status == _adopt.REJECTED and "larger" in (out.reason or "")
        with pytest.raises(jcd.Rejected):
            src.read("../escape-" + "ab" * 32, 1000, ZLIB)
    assert sorted(os.listdir(d)) == before
    assert outside.exists()


def test_remove_leaves_a_file_replaced_since_it_was_read(tmp_path: Path) -> None:
    d = jax_dir(tmp_path, {KEY: value()})
    src = jcd.JaxCacheDir(d)
    read = src.read(KEY, jcd.MAX_ENTRY_BYTES, ZLIB)
    assert read is not None
    os.unlink(d / f"{KEY}-cache")
    (d / f"{KEY}-cache").write_bytes(value(b"new"))
    assert not src.remove(KEY, read)
    assert (d / f"{KEY}-cache").exists()


def test_a_key_jax_never_files_is_missing_not_rejected(tmp_path: Path) -> None:
    d = jax_dir(tmp_path, {KEY: value()})
    with Store(tmp_path / "store") as store:
        out = _adopt.adopt(store, jcd.JaxCacheDir(d), "jit_f-0123", formats=ZLIB)
        assert out.status == _adopt.MISSING
        out = _adopt.adopt(store, jcd.JaxCacheDir(d), "../x", names=[KEY], formats=ZLIB)
        assert (out.status, out.name) == (_adopt.ADOPTED, KEY)


def test_the_version_rule() -> None:
    assert _adopt.keys_hold_the_path("0.10.2") and _adopt.keys_hold_the_path("0.4.36")
    assert not _adopt.keys_hold_the_path("0.11.0") and not _adopt.keys_hold_the_path("0.12.0.1")
    assert not _adopt.keys_hold_the_path("0.12.1")
    assert not _adopt.keys_hold_the_path("unknown")


# The command in a process without jax: it checks the formats it can read. With jax it
# checks the one that jax reads (test_import_from_jax below, on every JAX in CI).
NO_JAX = (
    "import sys\n"
    "sys.modules['jax'] = None\n"
    "from xla_pcache.cli import main\n"
    "sys.argv = ['xla-pcache', *sys.argv[1:]]\n"
    "main()\n"
)


def test_import_from_jax_cli(tmp_path: Path) -> None:
    import zstandard

    raw = (2).to_bytes(4, "big") + b"executable" * 40
    entries = {
        "jit_a-" + "01" * 32: zlib.compress(raw),
        "jit_b-" + "02" * 32: zstandard.ZstdCompressor().compress(raw),
    }
    junk = "jit_c-" + "03" * 32
    # Written before this jaxlib was installed: maybe by another build, so left in place.
    old = "jit_d-" + "04" * 32
    d = jax_dir(tmp_path, {**entries, junk: b"garbage", old: zlib.compress(raw)})
    os.utime(d / f"{old}-cache", (1e9, 1e9))
    ours = tmp_path / "store"
    cmd = [sys.executable, "-c", NO_JAX, "import", "--from-jax", str(d), "--path", str(ours)]
    result = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert "adopted 2, already present 0, skipped as bad 1" in result.stdout, result.stderr
    assert "before this jaxlib was installed (they may be another build's) 1" in result.stdout
    assert result.returncode == 1, result.stderr
    assert sorted(os.listdir(d)) == sorted(
        [f"{junk}-atime", f"{junk}-cache", f"{old}-atime", f"{old}-cache"]
    )
    # Filed under the build installed here, which the programs here ask for.
    build = jax_build.build()
    with Store(ours, read_only=True) as store:
        assert len(store) == 2
        keys = store.keys()
        for key in keys:
            jax_key, digest = build_key.split(key)
            assert digest == build.digest
            blob = store.get(key)
            assert blob is not None and bytes(blob) == entries[jax_key]
            assert blob.meta["adopted_from"] == "jax_cache"
            assert blob.meta["compile_time_s"] == "2.000000"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("import",), "give either a bundle file or --from-jax DIR"),
        (("import", "b.tar.gz", "--from-jax", "d"), "give either a bundle file or --from-jax"),
        (("import", "--from-jax", "/nonexistent/jax", "--path", "p"), "not a directory"),
    ],
)
def test_import_from_jax_cli_errors(args: tuple[str, ...], needle: str) -> None:
    result = cli(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert needle in result.stderr


# Imports JAX's directories through the command, in one process, and prints how much its
# peak resident memory (VmHWM, its own, from /proc/self/status) rose over each.
PEAK = """
import json, re, sys
sys.modules['jax'] = None
from xla_pcache.cli import main

def hwm():
    with open('/proc/self/status') as f:
        return int(re.search(r'VmHWM:\\s+(\\d+)', f.read()).group(1)) << 10

def reset():
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # the peak starts again from what is resident now
    except OSError:
        pass  # the rise above this process's peak so far is measured instead

out = {}
# Read before the loop: each command below replaces sys.argv.
store, dirs = sys.argv[1], json.loads(sys.argv[2])
for name, d in dirs.items():
    reset()
    before = hwm()
    sys.argv = ['xla-pcache', 'import', '--from-jax', d, '--path', store]
    try:
        main()
    except SystemExit as e:
        out[name + '_exit'] = e.code
    out[name] = hwm() - before
print(json.dumps(out))
"""


def test_hostile_files_do_not_raise_the_importers_peak_memory(tmp_path: Path) -> None:
    """A sparse 512 MiB file (no disk) and 32 KiB of zstd that would decompress to 1 GiB:
    each costs the reader at most a piece and a window, not the file or its output."""
    dirs = {}
    for name in ("warm", "sparse", "bomb", "declared_bomb"):
        d = tmp_path / name
        d.mkdir()
        dirs[name] = str(d)
        path = d / f"jit_{name}-{'ab' * 32}-cache"
        if name == "sparse":
            with open(path, "wb") as f:
                f.truncate(512 << 20)
        else:
            path.write_bytes(
                {
                    "warm": value(),
                    "bomb": zstd_bomb(),
                    "declared_bomb": zstd_bomb(declared=1 << 25),
                }[name]
            )
    rise = run_worker("-c", PEAK, str(tmp_path / "store"), json.dumps(dirs), timeout=300)
    assert rise["warm_exit"] is None or rise["warm_exit"] == 0, rise
    for name in ("sparse", "bomb", "declared_bomb"):
        assert rise[f"{name}_exit"] == 1, rise  # skipped as bad
        assert rise[name] < 48 << 20, (name, rise)


# --- real JAX, fresh processes ------------------------------------------------------------------

PROGRAMS = list(range(10))
PACKAGE_ROOT = Path(xla_pcache.__file__).resolve().parent.parent
PURELIB = PACKAGE_ROOT / "xla_pcache.data" / "purelib"


@pytest.fixture(params=["zstd", "zlib"])
def compression(request: pytest.FixtureRequest) -> str:
    if request.param == "zstd":
        import zstandard  # noqa: F401  (JAX compresses with zstd only when it is there)
    return str(request.param)


def _plugin_path(tmp_path: Path) -> str:
    """A ``jax_plugins`` namespace module calling the autoload hook, as the installed entry
    point does: activation from the environment alone, also under a bare PYTHONPATH."""
    plugins = tmp_path / "plugins" / "jax_plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    (plugins / "xla_pcache_test_hook.py").write_text(
        "from _xla_pcache_autoload import initialize  # noqa: F401\n"
    )
    return os.pathsep.join([str(plugins.parent), str(PACKAGE_ROOT), str(PURELIB)])


def run(
    programs: list[int], env: dict[str, str], compression: str, tmp_path: Path
) -> dict[str, Any]:
    full = clean_env(("JAX_",), JAX_PLATFORMS="cpu", PYTHONPATH=_plugin_path(tmp_path), **env)
    if compression == "zlib":
        full["TEST_JAX_NO_ZSTD"] = "1"
    return run_worker(str(WORKER), json.dumps({"steps": runs(*programs)}), env=full)


def fill(jax_dir: Path, programs: list[int], compression: str, tmp_path: Path) -> dict[str, Any]:
    """JAX alone fills ``jax_dir``; its threshold at 0 (see the module docstring)."""
    env = {
        "JAX_COMPILATION_CACHE_DIR": str(jax_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "XLA_PCACHE_DISABLE": "1",
    }
    report = run(programs, env, compression, tmp_path)
    assert sum(r["hit"] for r in report["runs"]) == 0
    return report


def cache_files(jax_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(jax_dir) if n.endswith("-cache"))


def jax_files(jax_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(jax_dir) if n.endswith(("-cache", "-atime")))


def hits(report: dict[str, Any]) -> int:
    return sum(1 for r in report["runs"] if r["hit"])


@pytest.mark.jax
@requires_jax
def test_jax_cache_is_served_from_the_first_run_and_kept_once(
    tmp_path: Path, compression: str
) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    filled = fill(jax_dir, PROGRAMS, compression, tmp_path)
    assert len(cache_files(jax_dir)) == len(PROGRAMS)
    env = {"XLA_PERSISTENT_CACHE_PATH": str(ours), "JAX_COMPILATION_CACHE_DIR": str(jax_dir)}

    first = run(PROGRAMS, env, compression, tmp_path)
    assert hits(first) >= 0.9 * len(PROGRAMS), first["runs"]
    assert results(first) == results(filled)
    # Each hit moved JAX's entry into the store: kept once, counted in the store's budget.
    assert len(cache_files(jax_dir)) == len(PROGRAMS) - hits(first)
    assert len(jax_files(jax_dir)) == len(cache_files(jax_dir))  # no atime file left behind
    assert len(store_keys(ours)) >= hits(first)
    assert not any(r["level"] == "WARNING" for r in first["log"]), first["log"]
    # Adopted entries are entries like any other: the key's components (for explain) and
    # JAX's compile time, computed under the adapter's key.
    with Store(ours, read_only=True) as store:
        keys = executable_keys(store)
        metas = [store.get(k).meta for k in keys]  # type: ignore[union-attr]
    known_ms = 0
    for meta in metas:
        assert meta["adopted_from"] == "jax_cache"
        assert meta["framework"] == "jax"
        assert "key_components" in meta, meta
        # JAX's own whole seconds, or unknown where it wrote 0: never "0 s".
        secs = meta["compile_time_s"]
        assert secs == "unknown" or float(secs) >= 1, meta
        known_ms += 0 if secs == "unknown" else round(float(secs) * 1000)
    # A takeover counts as hits, each adopted, with no miss for them; Prometheus says so.
    from xla_pcache.metrics import prometheus_text

    with Store(ours, read_only=True) as store:
        stats = store.stats()
    assert (stats["hits"], stats["adopted"]) == (hits(first), hits(first)), stats
    assert stats["misses"] == len(PROGRAMS) - hits(first), stats
    text = prometheus_text(stats)
    for counter in ("adopted", "hits"):
        line = f'xla_pcache_{counter}_total{{cache="{stats["path"]}",tier="local"}}'
        assert f"{line} {hits(first)}.0" in text, text

    second = run(PROGRAMS, env, compression, tmp_path)
    assert hits(second) == len(store_keys(ours)) >= 0.9 * len(PROGRAMS)
    assert results(second) == results(filled)
    # Hits of adopted entries count only the compile times JAX recorded.
    with Store(ours, read_only=True) as store:
        after = store.stats()
    assert after["compile_saved_ms"] - stats["compile_saved_ms"] == known_ms, after


@pytest.mark.jax
@requires_jax
def test_store_in_jax_own_directory(tmp_path: Path, compression: str) -> None:
    """Only JAX_COMPILATION_CACHE_DIR: the store opens in the directory JAX filled."""
    jax_dir = tmp_path / "jax-cache"
    filled = fill(jax_dir, PROGRAMS, compression, tmp_path)
    first = run(PROGRAMS, {"JAX_COMPILATION_CACHE_DIR": str(jax_dir)}, compression, tmp_path)
    assert hits(first) >= 0.9 * len(PROGRAMS), first["runs"]
    assert results(first) == results(filled)
    assert len(cache_files(jax_dir)) == len(PROGRAMS) - hits(first)
    assert len(store_keys(jax_dir)) >= hits(first)


@pytest.mark.jax
@requires_jax
def test_read_only_store_serves_jax_entries_and_moves_nothing(tmp_path: Path) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    fill(jax_dir, PROGRAMS, "zlib", tmp_path)
    Store(ours).close()
    before = jax_files(jax_dir)
    env = {
        "XLA_PERSISTENT_CACHE_PATH": str(ours),
        "XLA_PERSISTENT_CACHE_READ_ONLY": "1",
        "JAX_COMPILATION_CACHE_DIR": str(jax_dir),
    }
    report = run(PROGRAMS, env, "zlib", tmp_path)
    assert hits(report) >= 0.9 * len(PROGRAMS)
    assert jax_files(jax_dir) == before
    assert store_keys(ours) == set()


@pytest.mark.jax
@requires_jax
def test_corrupt_jax_entry_is_a_miss_and_not_adopted(tmp_path: Path, compression: str) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    others = [p for p in PROGRAMS if p != 3]
    fill(jax_dir, others, compression, tmp_path)
    before = set(cache_files(jax_dir))
    fill(jax_dir, [3], compression, tmp_path)
    (bad,) = set(cache_files(jax_dir)) - before
    data = (jax_dir / bad).read_bytes()
    torn = data[: len(data) // 2]  # as a file JAX was still writing
    (jax_dir / bad).write_bytes(torn)

    env = {"XLA_PERSISTENT_CACHE_PATH": str(ours), "JAX_COMPILATION_CACHE_DIR": str(jax_dir)}
    report = run(PROGRAMS, env, compression, tmp_path)
    by_program = {r["program"]: r["hit"] for r in report["runs"]}
    assert by_program[3] == 0
    assert sum(by_program[p] for p in others) >= 0.9 * len(others)
    # Left as it was, not adopted; one warning names it.
    assert cache_files(jax_dir) == [bad]
    assert (jax_dir / bad).read_bytes() == torn
    warnings = [r["msg"] for r in report["log"] if r["level"] == "WARNING"]
    assert len(warnings) == 1 and "adoption" in warnings[0], report["log"]


@pytest.mark.jax
@requires_jax
def test_import_from_jax(tmp_path: Path, compression: str) -> None:
    jax_dir, ours = tmp_path / "jax-cache", tmp_path / "xla-pcache"
    filled = fill(jax_dir, PROGRAMS, compression, tmp_path)
    junk = "jit_step-" + "0" * 64 + "-cache"
    (jax_dir / junk).write_bytes(b"not a value JAX wrote")
    env = clean_env(("JAX_",), PYTHONPATH=str(PACKAGE_ROOT))
    if compression == "zlib":
        env["TEST_JAX_NO_ZSTD"] = "1"
    code = (
        "import os, sys\n"
        "if os.environ.get('TEST_JAX_NO_ZSTD'):\n"
        "    sys.modules['zstandard'] = None; sys.modules['compression.zstd'] = None\n"
        "from xla_pcache.cli import main\n"
        "sys.argv = ['xla-pcache', *sys.argv[1:]]\n"
        "main()\n"
    )
    cmd = [sys.executable, "-c", code, "import", "--from-jax", str(jax_dir), "--path", str(ours)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    version = importlib.metadata.version("jax")
    if tuple(int(x) for x in version.split(".")[:2]) < (0, 11):
        # Before 0.11 JAX's own keys hold its directory's path: moved entries would never be
        # found under the adapter's keys, so the command refuses and moves nothing.
        assert proc.returncode == 2, proc.stdout
        assert "nothing was moved" in proc.stderr and "JAX_COMPILATION_CACHE_DIR" in proc.stderr
        assert len(cache_files(jax_dir)) == len(PROGRAMS) + 1
        assert not ours.exists() or store_keys(ours) == set()
        return
    assert proc.returncode == 1, proc.stderr  # 1: one file was bad
    assert f"adopted {len(PROGRAMS)}, already present 0, skipped as bad 1" in proc.stdout
    assert cache_files(jax_dir) == [junk]
    assert len(store_keys(ours)) == len(PROGRAMS)

    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert "adopted 0, already present 0, skipped as bad 1" in again.stdout, again.stderr

    report = run(PROGRAMS, {"XLA_PERSISTENT_CACHE_PATH": str(ours)}, compression, tmp_path)
    assert hits(report) >= 0.9 * len(PROGRAMS), report["runs"]
    assert results(report) == results(filled)
