"""The Store contract: API, bad input, integrity, processes, threads, read-only."""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import xla_pcache
from xla_pcache import Blob, CacheError, FormatError, ReadOnlyError, Store

from tests.helpers import read_only_copy, run_python, tree_state


def entry_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "entries").glob("*/*") if p.is_file())


def only_entry(root: Path) -> Path:
    files = entry_files(root)
    assert len(files) == 1, files
    return files[0]


# ---------------------------------------------------------------- API


def test_round_trip_and_metadata(cache_dir: Path) -> None:
    store = Store(cache_dir)
    assert store.put("key", b"value", meta={"framework": "jax", "framework_version": "0.10.2"})
    blob = store.get("key")
    assert isinstance(blob, Blob)
    assert bytes(blob) == b"value"
    assert len(blob) == 5
    assert blob.key == "key"
    assert blob.meta == {"framework": "jax", "framework_version": "0.10.2"}
    assert blob.created > 1.6e9
    assert store.get("other") is None
    assert "key" in store and "other" not in store
    assert len(store) == 1
    assert store.keys() == ["key"]


def test_format_file_records_version(cache_dir: Path) -> None:
    Store(cache_dir)
    first = (cache_dir / "FORMAT").read_text().splitlines()[0]
    assert first == f"xla_pcache-format {xla_pcache.FORMAT_VERSION}"


def test_values_of_every_buffer_kind(cache_dir: Path) -> None:
    store = Store(cache_dir)
    arr = np.arange(1000, dtype=np.float64)
    values: dict[str, object] = {
        "bytes": b"abc",
        "bytearray": bytearray(b"def"),
        "memoryview": memoryview(b"xyzw")[1:3],
        "numpy": arr,
        "empty": b"",
    }
    for k, v in values.items():
        assert store.put(k, v), k  # type: ignore[arg-type]
    assert bytes(store.get("memoryview")) == b"yz"  # type: ignore[arg-type]
    assert np.array_equal(np.frombuffer(store.get("numpy"), dtype=np.float64), arr)  # type: ignore[arg-type]
    assert bytes(store.get("empty")) == b""  # type: ignore[arg-type]


def test_bytes_and_str_keys(cache_dir: Path) -> None:
    store = Store(cache_dir)
    assert store.put(b"\x00\xffbinary", b"1")
    assert store.get(b"\x00\xffbinary").key == b"\x00\xffbinary"  # type: ignore[union-attr]
    # A str key is its UTF-8 bytes: the same entry.
    assert store.put("é", b"2")
    assert not store.put("é".encode(), b"3")
    assert bytes(store.get("é".encode())) == b"2"  # type: ignore[arg-type]
    long_key = "k" * 4096
    assert store.put(long_key, b"4")
    assert bytes(store.get(long_key)) == b"4"  # type: ignore[arg-type]
    # Unsafe characters never reach a file name.
    assert store.put("../../etc/passwd", b"5")
    assert all(len(p.name) == 32 for p in entry_files(cache_dir))


def test_first_writer_wins(cache_dir: Path) -> None:
    store = Store(cache_dir)
    assert store.put("k", b"first") is True
    assert store.put("k", b"second") is False
    assert bytes(store.get("k")) == b"first"  # type: ignore[arg-type]
    assert store.stats()["put_exists"] == 1


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (lambda s: s.put("", b"x"), ValueError, "empty"),
        (lambda s: s.get(b""), ValueError, "empty"),
        (lambda s: "" in s, ValueError, "empty"),
        (lambda s: s.delete(""), ValueError, "empty"),
        (lambda s: s.put("k" * 4097, b"x"), ValueError, "4096"),
        (lambda s: s.put(1, b"x"), TypeError, "str or bytes"),
        (lambda s: s.get(None), TypeError, "str or bytes"),
        (lambda s: s.put(bytearray(b"k"), b"x"), TypeError, "str or bytes"),
        (lambda s: s.put("k", "text"), TypeError, "not str"),
        (lambda s: s.put("k", 5), TypeError, "bytes-like"),
        (lambda s: s.put("k", np.arange(10)[::2]), TypeError, "contiguous"),
        (lambda s: s.put("k", b"x", meta={"a": 1}), TypeError, "meta"),
        (lambda s: s.evict(older_than=-1.0), ValueError, "older_than"),
    ],
)
def test_bad_input_is_a_clear_exception(cache_dir: Path, call, exc, words) -> None:  # type: ignore[no-untyped-def]
    store = Store(cache_dir)
    with pytest.raises(exc, match=words):
        call(store)


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"max_size": "ten gigs"}, ValueError, "ten gigs"),
        ({"max_size": -5}, ValueError, "negative"),
        ({"max_size": 0}, ValueError, "positive"),
        ({"max_size": 1.5}, TypeError, "max_size"),
        ({"lock_mode": "flock"}, ValueError, "flock"),
        ({"lease_time": -1.0}, ValueError, "lease_time"),
        # A misspelt option is refused, as by any signature, never silently dropped.
        ({"max_sise": "1G"}, TypeError, "max_sise"),
        ({"max_size": 1 << 63}, ValueError, "maximum"),
    ],
)
def test_bad_options(cache_dir: Path, kwargs, exc, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc, match=words):
        Store(cache_dir, **kwargs)


def test_size_strings(cache_dir: Path) -> None:
    assert Store(cache_dir, max_size="1.5G").max_size == int(1.5 * (1 << 30))
    assert Store(cache_dir, max_size="500M").max_size == 500 << 20
    assert Store(cache_dir, max_size=1234).max_size == 1234
    assert Store(cache_dir).max_size is None


def test_newer_format_is_refused(cache_dir: Path) -> None:
    Store(cache_dir)
    (cache_dir / "FORMAT").write_text("xla_pcache-format 99\n")
    with pytest.raises(FormatError, match="format 99"):
        Store(cache_dir)
    (cache_dir / "FORMAT").write_text("something else\n")
    with pytest.raises(FormatError, match="not an xla_pcache format"):
        Store(cache_dir, read_only=True)
    assert issubclass(FormatError, CacheError)


def test_read_only_of_missing_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="does not exist"):
        Store(tmp_path / "nope", read_only=True)


def test_delete_clear_len(cache_dir: Path) -> None:
    store = Store(cache_dir)
    for i in range(10):
        store.put(f"k{i}", b"v" * i)
    assert len(store) == 10
    assert store.delete("k3") is True
    assert store.delete("k3") is False
    assert store.get("k3") is None
    assert len(store) == 9
    assert store.clear() == 9
    assert len(store) == 0
    assert entry_files(cache_dir) == []
    assert store.put("k1", b"again")


def test_stats_count_operations(cache_dir: Path) -> None:
    store = Store(cache_dir)
    store.put("a", b"1")
    store.get("a")
    store.get("a")
    store.get("b")
    s = store.stats()
    assert (s["hits"], s["misses"], s["puts"], s["entries"]) == (2, 1, 1, 1)
    assert s["bytes"] > 0 and s["hit_rate"] == pytest.approx(2 / 3)


def test_close_and_context_manager(cache_dir: Path) -> None:
    with Store(cache_dir) as store:
        store.put("a", b"1")
    with pytest.raises(CacheError, match="closed"):
        store.get("a")


def test_durable_put(cache_dir: Path) -> None:
    store = Store(cache_dir, durable=True)
    assert store.put("k", b"v" * 1000)
    assert bytes(store.get("k")) == b"v" * 1000  # type: ignore[arg-type]


def test_hash_key_and_hasher() -> None:
    h = xla_pcache.hash_key("module", b"\x00proto", memoryview(b"opts"))
    assert len(h) == 32 and int(h, 16) >= 0
    hasher = xla_pcache.Hasher("module")
    hasher.update(b"\x00proto")
    hasher.update(bytearray(b"opts"))
    assert hasher.hexdigest() == h
    assert hasher.digest().hex() == h
    assert xla_pcache.hash_key("ab", "c") != xla_pcache.hash_key("a", "bc")
    with pytest.raises(TypeError):
        xla_pcache.hash_key(3)  # type: ignore[arg-type]


# ---------------------------------------------------------------- integrity


def corrupt_flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))


def corrupt_truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-7])


def corrupt_empty(p: Path) -> None:
    p.write_bytes(b"")


def corrupt_garbage(p: Path) -> None:
    p.write_bytes(os.urandom(4096))


def corrupt_header(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[70] ^= 1  # inside the key
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", [corrupt_flip, corrupt_truncate, corrupt_empty, corrupt_garbage, corrupt_header]
)
@pytest.mark.parametrize("size", [1000, 3_000_000])  # read into memory / mapped
def test_corrupt_entry_is_a_miss_and_removed(
    cache_dir: Path, damage, size: int, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    store = Store(cache_dir)
    store.put("k", os.urandom(size))
    damage(only_entry(cache_dir))
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        assert store.get("k") is None
    assert "corrupt" in caplog.text
    assert store.stats()["corrupt"] == 1
    assert entry_files(cache_dir) == []
    # The key can be stored again.
    assert store.put("k", b"fresh")
    assert bytes(store.get("k")) == b"fresh"  # type: ignore[arg-type]


def test_corrupt_entry_in_read_only_store_is_kept(cache_dir: Path) -> None:
    Store(cache_dir).put("k", b"x" * 100)
    corrupt_flip(only_entry(cache_dir))
    ro = Store(cache_dir, read_only=True)
    assert ro.get("k") is None
    assert ro.stats()["corrupt"] == 1
    assert len(entry_files(cache_dir)) == 1


def test_symlink_in_cache_is_not_followed(cache_dir: Path, tmp_path: Path) -> None:
    store = Store(cache_dir)
    store.put("k", b"v")
    target = tmp_path / "outside"
    target.write_bytes(only_entry(cache_dir).read_bytes())
    p = only_entry(cache_dir)
    p.unlink()
    p.symlink_to(target)
    assert store.get("k") is None
    assert target.exists(), "removing the link must not touch the file outside the root"


def test_blob_outlives_deletion(cache_dir: Path) -> None:
    store = Store(cache_dir)
    big = os.urandom(3 << 20)
    store.put("big", big)
    store.put("small", b"s" * 100)
    blobs = [store.get("big"), store.get("small")]
    assert blobs[0] is not None and blobs[0].mapped
    views = [memoryview(b) for b in blobs]  # type: ignore[arg-type]
    store.clear()
    assert store.get("big") is None
    assert bytes(views[0]) == big
    assert bytes(views[1]) == b"s" * 100


def test_memoryview_is_zero_copy_and_read_only(cache_dir: Path) -> None:
    store = Store(cache_dir)
    store.put("k", b"abc")
    blob = store.get("k")
    mv1, mv2 = memoryview(blob), memoryview(blob)  # type: ignore[arg-type]
    assert mv1.readonly
    # Both views point at the same memory: no copy was made.
    assert np.frombuffer(mv1, np.uint8).ctypes.data == np.frombuffer(mv2, np.uint8).ctypes.data
    with pytest.raises(TypeError):
        mv1[0] = 1  # type: ignore[index]


def test_pread_mode_reads_into_memory(cache_dir: Path) -> None:
    out = run_python(
        """
        import sys, os
        from xla_pcache import Store
        s = Store(sys.argv[1])
        v = os.urandom(1 << 20)
        s.put("k", v)
        b = s.get("k")
        assert not s.mmap_reads and not b.mapped and bytes(b) == v
        print("ok")
        """,
        str(cache_dir),
        env={"XLA_PCACHE_READ_MODE": "pread"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------- processes and threads


def test_value_written_by_one_process_is_read_by_another(cache_dir: Path) -> None:
    w = run_python(
        "import sys; from xla_pcache import Store; "
        "print(Store(sys.argv[1]).put('shared', bytes(range(256)) * 400))",
        str(cache_dir),
    )
    assert w.stdout.strip() == "True", w.stderr
    r = run_python(
        "import sys; from xla_pcache import Store; "
        "b = Store(sys.argv[1]).get('shared'); print(bytes(b) == bytes(range(256)) * 400)",
        str(cache_dir),
    )
    assert r.stdout.strip() == "True", r.stderr


def test_concurrent_writers_of_one_key_leave_one_valid_entry(cache_dir: Path) -> None:
    Store(cache_dir)
    code = """
        import os, sys, time
        from xla_pcache import Store
        s = Store(sys.argv[1])
        me = int(sys.argv[2])
        value = bytes([me]) * (4 << 20)
        start = float(sys.argv[3])
        while time.time() < start:
            pass
        print(s.put("same-key", value))
    """
    import subprocess
    import time

    start = str(time.time() + 1.5)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                __import__("textwrap").dedent(code),
                str(cache_dir),
                str(i),
                start,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    wins = [out.strip() for out, _ in results]
    assert wins.count("True") == 1, wins
    winner = wins.index("True")
    blob = Store(cache_dir).get("same-key")
    assert blob is not None and bytes(blob) == bytes([winner]) * (4 << 20)
    assert len(entry_files(cache_dir)) == 1
    assert list((cache_dir / "tmp").iterdir()) == []


def test_get_releases_the_gil(cache_dir: Path) -> None:
    """While one thread is inside get (hashing a large entry), another thread keeps running."""
    store = Store(cache_dir)
    store.put("big", os.urandom(64 << 20))
    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    old = sys.getswitchinterval()
    # With a long switch interval this thread keeps the GIL unless a call releases it (a
    # second: many times a get of 64 MiB; each get's return waits up to that for the GIL).
    sys.setswitchinterval(1.0)
    t = threading.Thread(target=spin)
    t.start()
    try:
        progressed = 0
        for _ in range(3):
            before = counter[0]
            blob = store.get("big")
            progressed = max(progressed, counter[0] - before)
            assert blob is not None
    finally:
        stop.set()
        sys.setswitchinterval(old)
        t.join()
    assert progressed > 1000, f"the other thread advanced only {progressed} times during get"


def test_parallel_readers_see_whole_entries(cache_dir: Path) -> None:
    store = Store(cache_dir)
    values = {f"k{i}": os.urandom(300_000 + i) for i in range(8)}
    for k, v in values.items():
        store.put(k, v)
    errors: list[str] = []

    def read(k: str) -> None:
        for _ in range(20):
            b = store.get(k)
            if b is None or bytes(b) != values[k]:
                errors.append(k)

    threads = [threading.Thread(target=read, args=(k,)) for k in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---------------------------------------------------------------- read-only


def test_read_only_directory_gets_hits_and_writes_nothing(cache_dir: Path, tmp_path: Path) -> None:
    writer = Store(cache_dir)
    for i in range(5):
        writer.put(f"k{i}", os.urandom(1000 * (i + 1)))
    writer.put("big", os.urandom(1 << 20))
    writer.flush()
    del writer
    with read_only_copy(cache_dir, tmp_path / "ro") as ro_path:
        before = tree_state(ro_path)
        out = run_python(
            """
            import sys
            import xla_pcache
            from xla_pcache import Store
            s = Store(sys.argv[1], read_only=True)
            assert s.read_only
            hits = sum(s.get(f"k{i}") is not None for i in range(5)) + (s.get("big") is not None)
            assert s.get("missing") is None
            assert s.put("new", b"x") is False
            assert "k1" in s and len(s) == 6 and len(s.keys()) == 6
            st = s.stats()
            assert st["hits"] == 6 and st["misses"] == 1, st
            assert s.verify()["problems"] == 0
            for op in (lambda: s.delete("k1"), s.clear, s.evict, lambda: s.verify(repair=True)):
                try:
                    op()
                except xla_pcache.ReadOnlyError:
                    pass
                else:
                    raise AssertionError("mutation allowed on a read-only store")
            s.flush()
            s.close()
            print(hits)
            """,
            str(ro_path),
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "6"
        assert tree_state(ro_path) == before
    assert issubclass(ReadOnlyError, CacheError)


def test_read_only_store_over_an_empty_directory_is_an_empty_cache(tmp_path: Path) -> None:
    ro = Store(tmp_path, read_only=True)
    assert len(ro) == 0 and ro.get("k") is None and ro.keys() == []
    assert ro.verify()["problems"] == 0
    assert ro.stats()["entries"] == 0
    assert list(tmp_path.iterdir()) == []


def test_hits_are_recorded_without_a_write_on_the_read_path(cache_dir: Path) -> None:
    Store(cache_dir).put("k", b"v")
    journals = set((cache_dir / "journal").iterdir())
    reader = Store(cache_dir, hit_interval=0)
    assert reader.get("k") is not None
    assert set((cache_dir / "journal").iterdir()) == journals, "a hit created a journal"
    reader.close()  # ...and the hit reaches the journal when the reader flushes
    assert len(set((cache_dir / "journal").iterdir()) - journals) == 1


# the constructor and the tier ----------------------------------------------------------------


def test_store_is_a_store_whatever_the_environment(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XLA_PCACHE_REMOTE", "redis://127.0.0.1:9/0")
    with Store(cache_dir) as store:
        assert type(store) is Store
        assert store.stats()["remote"] == "redis://127.0.0.1:9/0"  # type: ignore[typeddict-item]
    with Store(cache_dir, remote="redis://127.0.0.1:9/0") as store:
        assert type(store) is Store


def test_enter_returns_the_subclass(cache_dir: Path) -> None:
    class Mine(Store):
        pass

    with Mine(cache_dir) as store:
        assert type(store) is Mine


def test_a_configured_tier_starts_nothing_until_used(cache_dir: Path) -> None:
    # Looking at a store (what `xla-pcache stats` does) with a tier configured must not load
    # the client, start its writer thread or register its exit hook; the first miss does.
    code = """
        import atexit, sys, threading
        from xla_pcache import Store

        before = (threading.active_count(), atexit._ncallbacks())
        store = Store(sys.argv[1])
        store.stats(), len(store), "k" in store, store.entries()
        after = (threading.active_count(), atexit._ncallbacks())
        print("redis" in sys.modules, before == after, store._chain is None)
        assert store.get("k") is None  # a miss asks the tier (refused connection: a miss)
        print("redis" in sys.modules, store._chain is not None)
        store.close()
    """
    out = run_python(code, str(cache_dir), env={"XLA_PCACHE_REMOTE": "redis://127.0.0.1:9/0"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True", "True", "True"], out.stdout


def test_a_directory_store_loads_no_tier_or_bucket_module(cache_dir: Path) -> None:
    # Every JAX process with the package installed imports it, and every command opens a
    # store: a directory's, through the one door, never loads the modules only a remote
    # tier or a bucket needs; a file: URL loads the tiers' option parser, not the chain.
    code = """
        import sys
        import xla_pcache

        def loaded(*names):
            return sorted(m for m in sys.modules if m.startswith(names))

        with xla_pcache.open_store(sys.argv[1]) as store:
            store.stats(), store.get("k")
        print(loaded("xla_pcache.tiers", "xla_pcache.bucket", "obstore", "redis"))
        with xla_pcache.open_store("file://" + sys.argv[1]) as store:
            store.get("k")
        print(loaded("xla_pcache.tiers.", "xla_pcache.bucket", "obstore", "redis"))
    """
    out = run_python(code, str(cache_dir))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "['xla_pcache.tiers.base']"], out.stdout


def test_a_tierless_store_serves_gets_from_the_binding(cache_dir: Path) -> None:
    # No Python frame between the caller and the Rust get when there is no tier: the
    # Python class does not override get or put at all.
    assert "get" not in Store.__dict__ and "put" not in Store.__dict__
    with Store(cache_dir) as store:
        assert store.put("k", b"v")
        blob = store.get("k")
        assert blob is not None and bytes(blob) == b"v"
        assert store._chain_text is None


def test_a_remote_value_naming_no_url_names_its_source(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="remote"):
        Store(cache_dir, remote=" , ")
    monkeypatch.setenv("XLA_PCACHE_REMOTE", ",")
    with pytest.raises(ValueError, match="XLA_PCACHE_REMOTE"):
        Store(cache_dir)


def test_an_unusable_remote_url_leaves_the_local_cache_working(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # One bad tier must not turn the cache off: it is dropped with one warning naming it.
    monkeypatch.setenv("XLA_PCACHE_REMOTE", "memcached://host")
    with caplog.at_level("WARNING", logger="xla_pcache"), Store(cache_dir) as store:
        assert store.put("k", b"v")
        assert store.get("k") is not None
        assert store.get("absent") is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "memcached://host" in warnings[0], warnings


def test_settings_argument_replaces_the_environment(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XLA_PCACHE_LOCK_MODE", "flock")  # malformed, but not read
    monkeypatch.setenv("XLA_PCACHE_REMOTE", "redis://127.0.0.1:9/0")
    with Store(cache_dir, settings=xla_pcache.Settings()) as store:
        assert "remote" not in store.stats()
        assert store.settings == xla_pcache.Settings()


def test_take_entry_file_gathers_pieces_verifies_once_and_publishes(tmp_path: Path) -> None:
    """A remote value in pieces (an object store's ranged reads): gathered, verified and
    published as one entry; a damaged or short one, or one filed under another key, is None
    and writes nothing; asked not to publish, it is served but not written."""
    with Store(tmp_path / "src") as src:
        payload = os.urandom(300_000)
        assert src.put("k", payload, meta={"m": "1"})
        data = src.get_entry_file("k")
    assert data is not None
    whole = bytes(data)
    pieces = [whole[i : i + 70_000] for i in range(0, len(whole), 70_000)]
    damaged = bytearray(whole)
    damaged[-1] ^= 0xFF
    with Store(tmp_path / "dst") as dst:
        for key, bad in [
            ("k", [whole[:100_000], whole[100_001:]]),
            ("k", [bytes(damaged)]),
            ("k", [whole, b"x"]),
            ("other", pieces),
            ("k", []),
        ]:
            assert dst.take_entry_file(key, bad, True) is None
        assert dst.get("k") is None and len(dst) == 0
        blob = dst.take_entry_file("k", pieces, False)
        assert blob is not None and bytes(blob) == payload and blob.meta["m"] == "1"
        assert len(dst) == 0
        blob = dst.take_entry_file("k", pieces, True)
        assert blob is not None and bytes(blob) == payload
        stored = dst.get("k")
        assert stored is not None and bytes(stored) == payload
        with pytest.raises(TypeError):
            dst.take_entry_file("k", [1, 2], True)
