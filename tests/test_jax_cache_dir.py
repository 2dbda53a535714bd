"""Reading and adopting a directory JAX's own cache filled, on files written as JAX writes
them (``<key>-cache``: 4 bytes of compile time and the executable, zlib- or zstd-compressed)
and on hostile ones. The adapter tests with real JAX are in tests/adapters/test_jax_adopt.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from helpers import clean_env
from xla_pcache import Store
from xla_pcache.jax import _cache_dir as jcd

KEY = "jit_step-" + "ab" * 32
OTHER = "jit_other-" + "cd" * 32
ZLIB = frozenset({jcd.ZLIB})


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
        (b"not compressed at all", "does not decompress"),
        (zlib.compress(b"abc"), "no executable"),
        (b"", "ends early"),
    ):
        with pytest.raises(jcd.Rejected, match=why):
            jcd.check_value(bad, ZLIB)
    # A zstd frame where this JAX reads zlib only: JAX would fail on it.
    with pytest.raises(jcd.Rejected, match="reads zlib only"):
        jcd.check_value(b"\x28\xb5\x2f\xfd" + b"\0" * 20, ZLIB)
    # A bomb: refused before it is all decompressed.
    with pytest.raises(jcd.Rejected, match="more than the bound"):
        jcd.check_value(zlib.compress(b"\0" * (64 << 20)), ZLIB)


def test_check_value_zstd() -> None:
    import zstandard

    good = zstandard.ZstdCompressor().compress((7).to_bytes(4, "big") + b"executable" * 100)
    assert jcd.check_value(good, frozenset({jcd.ZSTD})) == jcd.ZSTD
    assert jcd.compile_time(good) == 7.0
    with pytest.raises(jcd.Rejected):
        jcd.check_value(good[:-5], frozenset({jcd.ZSTD}))


def test_adopt_publishes_under_the_key_and_removes_jax_files(tmp_path: Path) -> None:
    data = value()
    d = jax_dir(tmp_path, {KEY: data, OTHER: value(b"other" * 30)})
    with Store(tmp_path / "store") as store:
        out = jcd.adopt(store, jcd.JaxCacheDir(d), KEY, formats=ZLIB, meta={"framework": "jax"})
        assert out.status == jcd.ADOPTED
        assert out.value == data
        blob = store.get(KEY)
        assert blob is not None and bytes(blob) == data
        assert blob.meta["framework"] == "jax"
        # Kept once: JAX's file and its atime are gone, the other entry is untouched.
        assert sorted(os.listdir(d)) == [f"{OTHER}-atime", f"{OTHER}-cache"]
        assert jcd.adopt(store, jcd.JaxCacheDir(d), KEY, formats=ZLIB).status == jcd.MISSING


def test_adopt_under_an_alias_publishes_under_the_asked_key(tmp_path: Path) -> None:
    data = value()
    d = jax_dir(tmp_path, {OTHER: data})
    with Store(tmp_path / "store") as store:
        out = jcd.adopt(store, jcd.JaxCacheDir(d), KEY, names=[OTHER], formats=ZLIB)
        assert (out.status, out.name) == (jcd.ADOPTED, OTHER)
        assert KEY in store and OTHER not in store
        assert os.listdir(d) == []


def test_adopt_present_removes_the_duplicate(tmp_path: Path) -> None:
    d = jax_dir(tmp_path, {KEY: value()})
    with Store(tmp_path / "store") as store:
        store.put(KEY, b"ours")
        out = jcd.adopt(store, jcd.JaxCacheDir(d), KEY, formats=ZLIB)
        assert out.status == jcd.PRESENT
        assert bytes(store.get(KEY) or b"") == b"ours"
        assert os.listdir(d) == []


def test_read_only_store_serves_but_moves_nothing(tmp_path: Path) -> None:
    data = value()
    d = jax_dir(tmp_path, {KEY: data})
    Store(tmp_path / "store").close()
    with Store(tmp_path / "store", read_only=True) as store:
        out = jcd.adopt(store, jcd.JaxCacheDir(d), KEY, formats=ZLIB)
        assert (out.status, out.value) == (jcd.SERVED, data)
        assert KEY not in store
    assert sorted(os.listdir(d)) == [f"{KEY}-atime", f"{KEY}-cache"]


def test_over_budget_is_served_and_left_in_place(tmp_path: Path) -> None:
    data = value(os.urandom(4000))
    d = jax_dir(tmp_path, {KEY: data})
    with Store(tmp_path / "store", max_size=1000) as store:
        out = jcd.adopt(store, jcd.JaxCacheDir(d), KEY, formats=ZLIB)
        assert out.status in (jcd.SERVED, jcd.REJECTED)
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
    (d / f"{link}-cache").symlink_to(outside)
    os.mkfifo(d / f"{fifo}-cache")  # opening it must not block
    (d / f"{sub}-cache").mkdir()
    (d / f"{torn}-cache").write_bytes(value()[:-7])
    (d / f"{big}-cache").write_bytes(value(os.urandom(5000)))
    before = sorted(os.listdir(d))
    src = jcd.JaxCacheDir(d)
    assert sorted(src.keys()) == sorted([link, fifo, sub, torn, big])
    with Store(tmp_path / "store") as store:
        for key in (link, fifo, sub, torn):
            out = jcd.adopt(store, src, key, formats=ZLIB)
            assert out.status == jcd.REJECTED, (key, out)
            assert key not in store
        out = jcd.adopt(store, src, big, formats=ZLIB, max_bytes=1000)
        assert out.status == jcd.REJECTED and "larger" in (out.reason or "")
        with pytest.raises(jcd.Rejected):
            src.read("../escape-" + "ab" * 32)
    assert sorted(os.listdir(d)) == before
    assert outside.exists()


def test_remove_leaves_a_file_replaced_since_it_was_read(tmp_path: Path) -> None:
    d = jax_dir(tmp_path, {KEY: value()})
    src = jcd.JaxCacheDir(d)
    read = src.read(KEY)
    assert read is not None
    os.unlink(d / f"{KEY}-cache")
    (d / f"{KEY}-cache").write_bytes(value(b"new"))
    assert not src.remove(KEY, read)
    assert (d / f"{KEY}-cache").exists()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xla_pcache", *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


# The command in a process without jax: it checks the formats it can read. With jax it
# checks the one that jax reads (tests/adapters/test_jax_adopt.py, on every JAX in CI).
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
    d = jax_dir(tmp_path, {**entries, junk: b"garbage"})
    ours = tmp_path / "store"
    cmd = [sys.executable, "-c", NO_JAX, "import", "--from-jax", str(d), "--path", str(ours)]
    result = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert "adopted 2, already present 0, skipped as bad 1" in result.stdout, result.stderr
    assert result.returncode == 1, result.stderr
    assert sorted(os.listdir(d)) == [f"{junk}-atime", f"{junk}-cache"]
    with Store(ours, read_only=True) as store:
        assert len(store) == 2
        keys = store.keys()
        for key in keys:
            blob = store.get(key)
            assert blob is not None and bytes(blob) == entries[key]
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


def test_a_key_jax_never_files_is_missing_not_rejected(tmp_path: Path) -> None:
    d = jax_dir(tmp_path, {KEY: value()})
    with Store(tmp_path / "store") as store:
        out = jcd.adopt(store, jcd.JaxCacheDir(d), "jit_f-0123", formats=ZLIB)
        assert out.status == jcd.MISSING
        out = jcd.adopt(store, jcd.JaxCacheDir(d), "../x", names=[KEY], formats=ZLIB)
        assert (out.status, out.name) == (jcd.ADOPTED, KEY)
