"""The Redis remote tier against a real redis-server."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis
from xla_pcache import Store, entry_name
from xla_pcache.tiers.base import redact
from xla_pcache.tiers.redis import KEY_PREFIX

from tests.jax.helpers import hits, results, run_jax, runs
from tests.tiers.servers import RedisServer, start_redis


def _store(path: Path, server: RedisServer, **kw: object) -> Store:
    return Store(path, remote=server.url, **kw)  # type: ignore[arg-type]


def test_two_hosts_share_through_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    a = _store(tmp_path / "a", redis_server)
    b = _store(tmp_path / "b", redis_server)
    assert a.put("k", b"x" * 100_000, meta={"m": "1"})
    assert a.remote is not None
    a.remote.flush()
    blob = b.get("k")
    assert blob is not None and bytes(blob) == b"x" * 100_000 and blob.meta["m"] == "1"
    assert b.stats()["remote_hits"] == 1
    assert "k" in b  # published locally
    assert b.get("missing") is None and b.stats()["remote_misses"] == 1


def test_jax_program_compiled_on_one_host_hits_on_the_other(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    env = {"XLA_PCACHE_REMOTE": redis_server.url}
    first = run_jax([{"op": "install", "path": str(tmp_path / "a")}, *runs(0)], env=env)
    assert hits(first) == [0]
    second = run_jax([{"op": "install", "path": str(tmp_path / "b")}, *runs(0)], env=env)
    assert hits(second) == [1]
    assert results(second)[0] == results(first)[0]


def _damage(server: RedisServer, key: str, how: str) -> None:
    client = redis.Redis.from_url(server.url)
    rkey = KEY_PREFIX + entry_name(key)
    value = client.get(rkey)
    assert value is not None
    if how == "truncate":
        value = value[:-1]
    else:
        value = value[:-10] + bytes([value[-10] ^ 0xFF]) + value[-9:]
    client.set(rkey, value)


def test_corrupted_and_truncated_remote_values_are_counted_misses(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    a = _store(tmp_path / "a", redis_server)
    for k in ("flip", "cut"):
        assert a.put(k, bytes(range(256)) * 100)
    assert a.remote is not None
    a.remote.flush()
    _damage(redis_server, "flip", "flip")
    _damage(redis_server, "cut", "truncate")
    b = _store(tmp_path / "b", redis_server)
    assert b.get("flip") is None and b.get("cut") is None
    assert b.stats()["remote_rejected"] == 2
    assert len(b) == 0  # nothing bad published


def test_server_stopped_mid_run_is_a_miss_without_hang(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    s = _store(tmp_path / "a", redis_server)
    assert s.put("before", b"1")
    assert s.remote is not None
    s.remote.flush()
    redis_server.stop()
    # No hang: each call returns (the suite's timeout would fail a hang), with its outcome.
    assert s.put("after", b"2")  # local put goes on
    s.remote.flush()
    assert s.get("other") is None
    assert bytes(s.get("after") or b"") == b"2"
    st = s.stats()
    assert st.get("remote_put_errors", 0) + st.get("remote_get_errors", 0) >= 1


def test_value_over_the_server_limit_is_skipped(tmp_path: Path, small_redis: RedisServer) -> None:
    s = _store(tmp_path / "a", small_redis)
    assert s.put("big", b"z" * (2 << 20))
    assert s.remote is not None
    s.remote.flush()
    assert s.stats()["remote_put_errors"] == 1
    assert redis.Redis.from_url(small_redis.url).dbsize() == 0
    # A client-side limit skips before sending, counted apart.
    from xla_pcache.tiers.redis import RedisTier as RemoteTier

    tier = RemoteTier(small_redis.url, max_value_bytes=1 << 20)
    tier.put_async("n", b"z" * (2 << 20))
    tier.flush()
    assert tier.stats()["remote_too_large"] == 1


def test_read_only_writes_nothing_remote(tmp_path: Path, redis_server: RedisServer) -> None:
    rw = Store(tmp_path / "a")
    assert rw.put("k", b"v")
    rw.close()
    ro = _store(tmp_path / "a", redis_server, read_only=True)
    assert ro.put("k2", b"v") is False
    assert bytes(ro.get("k") or b"") == b"v"
    assert redis.Redis.from_url(redis_server.url).dbsize() == 0


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    }


def test_read_only_reads_the_remote_without_writing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    writer = _store(tmp_path / "a", redis_server)
    assert writer.put("k", b"payload" * 1000, meta={"m": "2"})
    assert writer.put("bad", bytes(range(256)) * 50)
    assert writer.remote is not None
    writer.remote.flush()
    _damage(redis_server, "bad", "flip")
    client = redis.Redis.from_url(redis_server.url)
    before_remote = {k: client.get(k) for k in client.keys("*")}
    Store(tmp_path / "b").close()  # an empty cache directory
    before = _tree(tmp_path / "b")
    ro = _store(tmp_path / "b", redis_server, read_only=True)
    blob = ro.get("k")
    assert blob is not None and bytes(blob) == b"payload" * 1000 and blob.meta["m"] == "2"
    assert ro.get("bad") is None
    st = ro.stats()
    assert st["remote_hits"] == 1 and st["remote_rejected"] == 1
    assert "k" not in ro
    ro.close()
    assert _tree(tmp_path / "b") == before
    assert {k: client.get(k) for k in client.keys("*")} == before_remote


def test_passwords_are_redacted() -> None:
    assert redact("rediss://user:secret@host:6380/1") == "rediss://***@host:6380/1"
    assert "secret" not in redact("redis://:secret@h/0")


def test_auth_error_is_a_miss_and_the_password_is_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis("--requirepass", "s3cret-pw")
    try:
        good = f"redis://:s3cret-pw@127.0.0.1:{server.port}/0"
        bad = f"redis://:wrong-pw@127.0.0.1:{server.port}/0"
        a = Store(tmp_path / "a", remote=good)
        assert a.put("k", b"v")
        assert a.remote is not None
        a.remote.flush()
        b = Store(tmp_path / "b", remote=bad)
        with caplog.at_level(logging.WARNING, logger="xla_pcache"):
            assert b.get("k") is None
        assert b.stats()["remote_get_errors"] == 1
        assert "s3cret" not in caplog.text and "wrong-pw" not in caplog.text
        assert "wrong-pw" not in str(b.stats())
        c = Store(tmp_path / "c", remote=good)
        assert bytes(c.get("k") or b"") == b"v"
    finally:
        server.stop()


def test_a_subclass_keeps_the_tier(tmp_path: Path, redis_server: RedisServer) -> None:
    class Mine(Store):
        pass

    with Mine(tmp_path / "a", remote=redis_server.url) as a:
        assert type(a) is Mine
        assert a.put("k", b"shared")
        assert a.remote is not None
        a.remote.flush()
    with Mine(tmp_path / "b", remote=redis_server.url) as b:
        blob = b.get("k")
        assert blob is not None and bytes(blob) == b"shared"
        assert b.stats()["remote_hits"] == 1  # type: ignore[typeddict-item]


def test_the_tier_comes_from_the_environment(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XLA_PCACHE_REMOTE", redis_server.url)
    monkeypatch.setenv("XLA_PCACHE_REMOTE_MAX_BYTES", "512M")
    with Store(tmp_path / "a") as a:
        assert type(a) is Store
        a.put("k", b"v")
        assert a.remote is not None
        a.remote.flush()
        assert getattr(a.remote.tiers[0], "max_value_bytes", None) == 512 << 20
    with Store(tmp_path / "b") as b:
        assert b.get("k") is not None
