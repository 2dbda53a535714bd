"""The contracts of ``ComputationCache``, ``MemoryCache`` and ``PersistentCache``."""

from __future__ import annotations

import logging
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Blob, ComputationCache, MemoryCache, PersistentCache, Store


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and mtime, to prove nothing was written."""
    result = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            result[os.path.relpath(os.path.join(dirpath, name), root)] = (
                st.st_size,
                st.st_mtime_ns,
            )
    return result


def pickled(path: Path, **kwargs: Any) -> PersistentCache[Any]:
    return PersistentCache(path, pickle.dumps, pickle.loads, **kwargs)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


CacheFactory = Callable[[], ComputationCache[Any]]


@pytest.fixture(params=["memory", "persistent"])
def make_cache(request: pytest.FixtureRequest, root: Path) -> Iterator[CacheFactory]:
    made: list[ComputationCache[Any]] = []

    def make() -> ComputationCache[Any]:
        cache: ComputationCache[Any] = (
            MemoryCache(8) if request.param == "memory" else pickled(root)
        )
        made.append(cache)
        return cache

    yield make
    for cache in made:
        if isinstance(cache, PersistentCache):
            cache.close()


# The shared contract -------------------------------------------------------------------------


def test_is_a_computation_cache(make_cache: CacheFactory) -> None:
    assert isinstance(make_cache(), ComputationCache)


def test_abstract_cache_cannot_be_instantiated() -> None:
    with pytest.raises(TypeError):
        ComputationCache()  # type: ignore[abstract]


def test_add_get_erase(make_cache: CacheFactory) -> None:
    cache = make_cache()
    assert cache.get("k") is None
    assert "k" not in cache
    cache.add("k", {"v": 1})
    assert cache.get("k") == {"v": 1}
    assert "k" in cache
    assert len(cache) == 1
    assert cache.erase("k") is True
    assert cache.get("k") is None
    assert "k" not in cache
    assert cache.erase("k") is False
    assert len(cache) == 0


def test_str_and_bytes_keys(make_cache: CacheFactory) -> None:
    cache = make_cache()
    cache.add(b"\x00\xffbinary", 1)
    cache.add("unicode-\u00e9", 2)
    assert cache.get(b"\x00\xffbinary") == 1
    assert cache.get("unicode-\u00e9") == 2


def test_add_replaces_in_memory(make_cache: CacheFactory) -> None:
    cache = make_cache()
    cache.add("k", 1)
    cache.add("k", 2)
    assert cache.get("k") == 2
    assert len(cache) == 1


def test_clear(make_cache: CacheFactory) -> None:
    cache = make_cache()
    for i in range(5):
        cache.add(f"k{i}", i)
    cache.clear()
    assert len(cache) == 0
    assert all(cache.get(f"k{i}") is None for i in range(5))


@pytest.mark.parametrize("method", ["get", "erase", "contains", "add"])
@pytest.mark.parametrize("key", [b"", ""])
def test_empty_key_is_value_error(make_cache: CacheFactory, method: str, key: str | bytes) -> None:
    cache = make_cache()
    with pytest.raises(ValueError, match="empty"):
        call(cache, method, key)


@pytest.mark.parametrize("method", ["get", "erase", "contains", "add"])
@pytest.mark.parametrize("key", [42, None, bytearray(b"k"), ("a",), 1.5])
def test_wrong_key_type_is_type_error(make_cache: CacheFactory, method: str, key: object) -> None:
    cache = make_cache()
    with pytest.raises(TypeError, match=r"str or bytes, not "):
        call(cache, method, key)


def call(cache: ComputationCache[Any], method: str, key: Any) -> object:
    if method == "contains":
        return key in cache
    if method == "add":
        return cache.add(key, "value")
    return getattr(cache, method)(key)


def test_stats_is_flat_and_counts(make_cache: CacheFactory) -> None:
    cache = make_cache()
    cache.add("k", 1)
    cache.get("k")
    cache.get("missing")
    stats = cache.stats()
    assert stats["hits"] == 1
    assert stats["misses"] == 1
    for value in stats.values():
        assert value is None or isinstance(value, int | float | str)


# MemoryCache ---------------------------------------------------------------------------------


def test_memory_lru_capacity() -> None:
    cache: MemoryCache[int] = MemoryCache(3)
    for i in range(3):
        cache.add(f"k{i}", i)
    cache.get("k0")  # k0 is now the most recently used; k1 the least
    cache.add("k3", 3)
    assert len(cache) == 3
    assert "k1" not in cache
    assert [k for k in ("k0", "k2", "k3") if k in cache] == ["k0", "k2", "k3"]
    assert cache.stats()["evictions"] == 1
    assert cache.stats()["capacity"] == 3


def test_memory_re_add_refreshes_recency() -> None:
    cache: MemoryCache[int] = MemoryCache(2)
    cache.add("a", 1)
    cache.add("b", 2)
    cache.add("a", 10)
    cache.add("c", 3)
    assert "b" not in cache
    assert cache.get("a") == 10


def test_memory_capacity_zero_keeps_nothing() -> None:
    cache: MemoryCache[int] = MemoryCache(0)
    cache.add("a", 1)
    assert len(cache) == 0
    assert cache.get("a") is None


def test_memory_keeps_none_values() -> None:
    cache: MemoryCache[None] = MemoryCache(2)
    cache.add("a", None)
    assert "a" in cache
    assert cache.erase("a") is True


def test_memory_capacity_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_COMPILATION_CACHE_SIZE", "5")
    assert MemoryCache().capacity == 5
    monkeypatch.delenv("XLA_COMPILATION_CACHE_SIZE")
    assert MemoryCache().capacity == 2048
    monkeypatch.setenv("XLA_COMPILATION_CACHE_SIZE", "five")
    with pytest.raises(ValueError, match=r"XLA_COMPILATION_CACHE_SIZE 'five'"):
        MemoryCache()


@pytest.mark.parametrize("capacity", [-1])
def test_memory_bad_capacity(capacity: int) -> None:
    with pytest.raises(ValueError):
        MemoryCache(capacity)


def _on_threads(n: int, work: Callable[[int], None]) -> None:
    """``work(t)`` for each ``t`` below ``n``, each on a thread of its own, all let go at
    once; the first failure of any is raised here."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run(t: int) -> None:
        try:
            barrier.wait()
            work(t)
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_memory_thread_safety() -> None:
    cache: MemoryCache[int] = MemoryCache(50)

    def work(t: int) -> None:
        for i in range(2000):
            key = f"k{(t * 7 + i) % 120}"
            cache.add(key, i)
            cache.get(key)
            if i % 13 == 0:
                cache.erase(key)
            assert len(cache) <= 50

    _on_threads(8, work)
    stats = cache.stats()
    assert stats["adds"] == 8 * 2000
    assert stats["hits"] + stats["misses"] == 8 * 2000  # type: ignore[operator]
    assert len(cache) <= 50


# PersistentCache -----------------------------------------------------------------------------


def test_persistent_survives_a_new_instance(root: Path) -> None:
    with pickled(root) as first:
        first.add("k", [1, 2, 3])
    with pickled(root) as second:
        assert len(second) == 0
        assert "k" in second
        assert second.get("k") == [1, 2, 3]
        assert len(second) == 1  # now held in memory too
        stats = second.stats()
        assert stats["store_hits"] == 1
        assert stats["memory_hits"] == 0
        second.get("k")
        assert second.stats()["memory_hits"] == 1


def test_deserialize_receives_the_blob(root: Path) -> None:
    seen: list[object] = []

    def deserialize(blob: Blob) -> bytes:
        seen.append(blob)
        view = memoryview(blob)
        assert view.readonly
        return view.tobytes()

    with PersistentCache[bytes](root, lambda v: v, bytes) as writer:
        writer.add("k", b"payload")
    with PersistentCache(root, lambda v: v, deserialize) as reader:
        assert reader.get("k") == b"payload"
    assert len(seen) == 1
    assert type(seen[0]) is Blob


def test_serialize_may_return_any_buffer(root: Path) -> None:
    with PersistentCache[bytearray](root, memoryview, bytearray) as writer:
        writer.add("k", bytearray(b"abc"))
    with PersistentCache[bytes](root, lambda v: v, bytes) as reader:
        assert reader.get("k") == b"abc"


def test_memory_capacity_bounds_memory_not_disk(root: Path) -> None:
    with pickled(root, memory_capacity=2) as cache:
        for i in range(5):
            cache.add(f"k{i}", i)
        assert len(cache) == 2
        assert len(cache.store) == 5
        assert cache.get("k0") == 0  # reloaded from the store


def test_deserialize_failure_is_a_counted_miss_and_removed(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pickled(root) as writer:
        writer.add("good", 1)
        writer.store.put("bad", b"not a pickle")

    with pickled(root) as reader, caplog.at_level(logging.WARNING, logger="xla_pcache.caches"):
        assert reader.get("bad") is None
        assert reader.get("good") == 1
        stats = reader.stats()
        assert stats["deserialize_failures"] == 1
        assert stats["misses"] == 1
        assert "bad" not in reader.store
        assert "good" in reader.store
    assert any(
        "deserialize" in r.getMessage() and "'bad'" in r.getMessage() for r in caplog.records
    )


def test_deserialize_failure_read_only_keeps_entry(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pickled(root) as writer:
        writer.store.put("bad", b"not a pickle")
    before = snapshot(root)
    with pickled(root, read_only=True) as reader, caplog.at_level(logging.WARNING):
        assert reader.get("bad") is None
        # It must not even try to delete (the store would refuse, but that is a second line).
        assert not any("could not remove" in r.getMessage() for r in caplog.records)
        assert not any("removing it" in r.getMessage() for r in caplog.records)
        assert reader.stats()["deserialize_failures"] == 1
        assert "bad" in reader.store
    assert snapshot(root) == before


def test_serialize_failure_keeps_memory_only(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    def serialize(value: object) -> bytes:
        raise RuntimeError("cannot serialize")

    with PersistentCache[object](root, serialize, bytes) as cache:
        with caplog.at_level(logging.WARNING, logger="xla_pcache.caches"):
            cache.add("k", "value")
        assert cache.get("k") == "value"
        assert "k" not in cache.store
        assert cache.stats()["serialize_failures"] == 1
    assert any("serialize" in r.getMessage() for r in caplog.records)


def test_read_only_writes_nothing(root: Path) -> None:
    with pickled(root) as writer:
        writer.add("existing", "old")
    before = snapshot(root)
    with pickled(root, read_only=True) as reader:
        assert reader.read_only
        reader.add("new", "value")
        assert reader.get("new") == "value"  # memory still works
        assert "new" not in reader.store
        assert reader.get("existing") == "old"
        reader.erase("existing")
        reader.clear()
        assert len(reader) == 0
        assert "existing" in reader.store
        assert reader.get("existing") == "old"
    assert snapshot(root) == before


def test_erase_and_clear_reach_the_store(root: Path) -> None:
    with pickled(root) as cache:
        cache.add("a", 1)
        cache.add("b", 2)
        assert cache.erase("a") is True
        assert "a" not in cache.store
        cache.clear()
        assert len(cache.store) == 0
    with pickled(root) as cache:
        assert cache.get("b") is None


def test_erase_finds_entries_only_on_disk(root: Path) -> None:
    with pickled(root) as cache:
        cache.add("a", 1)
    with pickled(root) as cache:
        assert cache.erase("a") is True
        assert "a" not in cache


def test_max_size_string_and_meta(root: Path) -> None:
    meta = {"framework": "jax", "framework_version": "0.10.2"}
    with pickled(root, max_size="1M", meta=meta) as cache:
        assert cache.store.max_size == 1 << 20
        cache.add("k", b"x" * 100)
        entries = cache.store.entries()
    assert len(entries) == 1
    assert entries[0]["meta"] == meta


def test_persistent_stats_include_store_counters(root: Path) -> None:
    with pickled(root) as cache:
        cache.add("k", 1)
        stats = cache.stats()
    assert stats["kind"] == "persistent"
    assert stats["path"] == str(root)
    assert stats["writes"] == 1
    assert stats["memory_entries"] == 1
    assert stats["store_entries"] == 1


def test_persistent_thread_safety(root: Path) -> None:
    with pickled(root, memory_capacity=16) as cache:

        def work(t: int) -> None:
            for i in range(100):
                key = f"t{t}-{i % 40}"
                cache.add(key, (t, i % 40))
                value = cache.get(key)
                assert value == (t, i % 40)

        _on_threads(6, work)
        assert len(cache) <= 16
        assert len(cache.store) == 6 * 40


def test_store_is_the_python_store(root: Path) -> None:
    with pickled(root) as cache:
        assert isinstance(cache.store, Store)


def test_str_key_and_its_utf8_bytes_are_one_entry(root: Path) -> None:
    # The store names entries by the key's bytes; the memory layer must agree with it.
    with pickled(root) as cache:
        cache.add("caf\u00e9", 1)
        assert "caf\u00e9".encode() in cache
        assert cache.get("caf\u00e9".encode()) == 1
        assert cache.erase("caf\u00e9".encode()) is True
        assert cache.get("caf\u00e9") is None
        assert len(cache) == 0
