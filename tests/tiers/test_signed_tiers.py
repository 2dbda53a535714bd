"""Signed entries in remote tiers, against a real S3 service (SeaweedFS ``weed mini``) and a
real redis-server on loopback: what a writer of the bucket or server who holds no trusted key
can plant there never reaches a trusting reader, and hides no trusted writer's entry from it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import obstore
import pytest
import redis
from xla_pcache import Store, entry_name
from xla_pcache._core import generate_signing_key, signed_entry_name, signing_public_key
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.tiers.redis import KEY_PREFIX

from tests.helpers import keygen
from tests.jax.helpers import scratch_programs, value_and_hits
from tests.tiers.servers import (
    BucketServer,
    RedisServer,
    bucket_client,
    fresh_prefix,
)

CI = generate_signing_key()
CI_KEY = ("ci-1", signing_public_key(CI))
PAYLOAD = b"trusted program " * 500


def _put(path: Path, remote: str, key: str, value: bytes, *, signed: bool) -> None:
    """One writer process's put, written through to the tiers."""
    signing: dict[str, Any] = {"signing_key": ("ci-1", CI)} if signed else {}
    with Store(path, remote=remote, **signing) as w:
        assert w.put(key, value)
        assert w.remote is not None
        w.remote.flush()


def _reader(path: Path, remote: str) -> Store:
    return Store(path, remote=remote, trusted_keys=[CI_KEY])


def _s3_object(server: BucketServer, prefix: str, name: str) -> bytes:
    return bytes(obstore.get(bucket_client(server, prefix), f"{ENTRY_DIR}/{name}").bytes())


def _s3_replace(server: BucketServer, prefix: str, name: str, data: bytes) -> None:
    obstore.put(bucket_client(server, prefix), f"{ENTRY_DIR}/{name}", data, mode="overwrite")


def test_a_tampered_bucket_entry_is_refused_and_never_served(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    _put(tmp_path / "ci", url, "k", PAYLOAD, signed=True)
    _put(tmp_path / "ci-other", url, "j", PAYLOAD.upper(), signed=True)
    plain, own = entry_name("k"), signed_entry_name("k", "ci-1")
    good = _s3_object(server, prefix, plain)
    assert _s3_object(server, prefix, own) == good  # the signer's own copy, signature and all

    # Bytes flipped after the trusted writer's put, in both of its objects.
    flipped = good[:-1] + bytes([good[-1] ^ 0xFF])
    for name in (plain, own):
        _s3_replace(server, prefix, name, flipped)
    with _reader(tmp_path / "r1", url) as r:
        assert r.get("k") is None
        stats: Any = r.stats()
        assert stats["remote_rejected"] == 2 and stats.get("remote_hits", 0) == 0
        assert "k" not in r

    # A valid signature (of "k") copied onto the payload of another signed entry.
    other = _s3_object(server, prefix, entry_name("j"))
    header_len = len(good) - len(PAYLOAD)
    forged = good[:header_len] + other[len(other) - len(PAYLOAD) :]
    assert forged != good and len(forged) == len(good)
    for name in (plain, own):
        _s3_replace(server, prefix, name, forged)
    with _reader(tmp_path / "r2", url) as r:
        assert r.get("k") is None
        stats = r.stats()
        assert stats["remote_rejected"] == 2 and stats.get("remote_hits", 0) == 0
        assert "k" not in r


def test_an_unsigned_object_squatting_the_bucket_key_hides_no_trusted_entry(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    # The squatter is first: the bucket's conditional create keeps its object at the plain
    # name, and the trusted writer's put of the plain name is refused.
    _put(tmp_path / "mallory", url, "k", b"attacker's program", signed=False)
    _put(tmp_path / "ci", url, "k", PAYLOAD, signed=True)
    assert b"attacker" in _s3_object(server, prefix, entry_name("k"))

    with _reader(tmp_path / "r", url) as r:
        got = r.get("k")
        assert got is not None and bytes(got) == PAYLOAD and got.signer == "ci-1"
        stats: Any = r.stats()
        assert stats["untrusted"] >= 1 and stats["remote_rejected"] == 1
        assert stats["remote_hits"] == 1


def test_a_squatter_overwriting_redis_after_the_trusted_writer_hides_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = redis_server.url
    _put(tmp_path / "ci", url, "k", PAYLOAD, signed=True)
    # Redis overwrites: the squatter's put comes after and replaces the plain value.
    _put(tmp_path / "mallory", url, "k", b"attacker's program", signed=False)
    client = redis.Redis.from_url(url)
    assert b"attacker" in client.get(KEY_PREFIX + entry_name("k"))

    with _reader(tmp_path / "r", url) as r:
        got = r.get("k")
        assert got is not None and bytes(got) == PAYLOAD and got.signer == "ci-1"
        stats: Any = r.stats()
        assert stats["untrusted"] >= 1 and stats["remote_rejected"] == 1


def test_a_refused_value_in_one_tier_does_not_stop_the_chain_and_backfill_keeps_the_signature(
    tmp_path: Path, server: BucketServer, redis_server: RedisServer
) -> None:
    prefix = fresh_prefix()
    bucket = server.url(prefix)
    _put(tmp_path / "ci", bucket, "k", PAYLOAD, signed=True)
    # The faster tier holds only a squatter's value, under the plain name.
    _put(tmp_path / "mallory", redis_server.url, "k", b"attacker's program", signed=False)

    chain = f"{redis_server.url},{bucket}"
    with _reader(tmp_path / "r", chain) as r:
        got = r.get("k")
        assert got is not None and bytes(got) == PAYLOAD and got.signer == "ci-1"
        stats: Any = r.stats()
        assert stats["tier1_rejected"] == 1 and stats["tier2_hits"] == 1
        assert stats["tier1_backfills"] == 1
        assert r.remote is not None
        r.remote.flush()
    # The local copy (no tier behind it now) is the signed entry, as verified.
    with Store(tmp_path / "r", trusted_keys=[CI_KEY]) as again:
        local = again.get("k")
        assert local is not None and local.signer == "ci-1" and bytes(local) == PAYLOAD
    # Redis was backfilled with the signed entry file, under the signer's own name: a
    # trusting reader of Redis alone is served from there, past the squatter's value.
    client = redis.Redis.from_url(redis_server.url)
    backfilled = client.get(KEY_PREFIX + signed_entry_name("k", "ci-1"))
    assert backfilled == _s3_object(server, prefix, entry_name("k"))
    with _reader(tmp_path / "redis-only", redis_server.url) as r:
        got = r.get("k")
        assert got is not None and got.signer == "ci-1" and bytes(got) == PAYLOAD


def test_trust_required_serves_only_trusted_entries_and_needs_trusted_keys(
    tmp_path: Path, server: BucketServer, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    required = server.url(prefix, trust="required")
    _put(tmp_path / "plain", url, "u", b"unsigned program", signed=False)
    _put(tmp_path / "ci", url, "k", PAYLOAD, signed=True)

    with _reader(tmp_path / "r", required) as r:
        assert r.get("u") is None
        got = r.get("k")
        assert got is not None and got.signer == "ci-1"
        stats: Any = r.stats()
        assert stats["remote"].endswith("?trust=required")
        assert stats["tier1_rejected"] == 1 and stats["tier1_hits"] == 1
        # This reader signs nothing: its own puts are not written to the tier.
        assert r.put("mine", b"reader's program")
        assert r.remote is not None
        r.remote.flush()
    assert not [
        o
        for o in obstore.list(bucket_client(server, prefix)).collect()
        if entry_name("mine") in o["path"]
    ]

    # No trusted key in this process: the tier is dropped, with one warning naming it and
    # the variable to set; the local cache goes on.
    with (
        caplog.at_level(logging.WARNING, logger="xla_pcache"),
        Store(tmp_path / "untrusting", remote=required) as u,
    ):
        assert u.get("u") is None
        assert u.get("k") is None
        assert u.put("x", b"local")
        assert u.get("x") is not None
        stats = u.stats()
        assert stats["remote_dropped"] == server.url(prefix, trust="required")
    warned = [m for m in caplog.messages if "XLA_PCACHE_TRUSTED_KEYS" in m]
    assert len(warned) == 1 and prefix in warned[0] and server.secret not in warned[0]


def test_the_trust_option_is_parsed_beside_ro_and_shown(caplog: pytest.LogCaptureFixture) -> None:
    from xla_pcache.tiers.base import redact
    from xla_pcache.tiers.chain import open_chain

    assert redact("s3://b/p?trust=required&ro=1") == "s3://b/p?trust=required&ro=1"
    chain = open_chain("redis://:pw-9d1f@127.0.0.1:1/0?trust=required&ro=1", trusting=True)
    assert chain.url == "redis://***@127.0.0.1:1/0?ro=1&trust=required"
    assert [t["trust_required"] for t in chain.describe()] == [True]
    chain.close()
    # Any other value is a bad option: that tier is dropped with a warning, the rest go on.
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        chain = open_chain("s3://b/p?trust=yes,redis://127.0.0.1:1/0", trusting=True)
    assert chain.dropped == ["s3://b/p?trust=yes"] and len(chain) == 1
    assert any("trust='yes'" in m for m in caplog.messages)
    chain.close()


@pytest.fixture(scope="module")
def jax_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, bytes, float]]:
    """Each program's cache key, executable (payload) and value, from an unsigned cache."""
    return scratch_programs(tmp_path_factory)


@pytest.mark.jax
def test_jax_a_squatted_or_tampered_bucket_entry_is_never_loaded(
    tmp_path: Path,
    server: BucketServer,
    jax_programs: dict[str, tuple[str, bytes, float]],
) -> None:
    """Real JAX, zero code, hosts sharing only the bucket: a writer of the bucket plants
    program ``cos``'s executable under ``sin``'s key before CI; CI's signed entry is served
    all the same to trusting workers, and once its objects are tampered with, nothing is."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    sin_key, _, sin_value = jax_programs["sin"]
    _, cos_exe, cos_value = jax_programs["cos"]
    key_file, trusted = keygen(tmp_path, "ci-1")
    with Store(tmp_path / "mallory", settings=Settings(), remote=url) as m:
        assert m.put(sin_key, cos_exe, meta={"framework": "jax"})
        assert m.remote is not None
        m.remote.flush()
    bucket = {"XLA_PCACHE_REMOTE": url, **server.env()}

    def host(name: str, **env: str) -> dict[str, str]:
        return {"XLA_PERSISTENT_CACHE_PATH": str(tmp_path / name), **bucket, **env}

    # The attack is real: a host that trusts every writer runs the planted program.
    assert value_and_hits("sin", **host("naive")) == (cos_value, 1)
    # CI: the bucket's plain object is the squatter's (refused); it compiles and publishes.
    ci = host("ci", XLA_PCACHE_TRUSTED_KEYS=trusted, XLA_PCACHE_SIGNING_KEY=key_file)
    assert value_and_hits("sin", **ci) == (sin_value, 0)
    # A trusting worker on a fresh host hits, on CI's entry from the bucket.
    worker = {"XLA_PCACHE_TRUSTED_KEYS": trusted}
    assert value_and_hits("sin", **host("w1", **worker)) == (sin_value, 1)

    # The bytes of CI's objects flipped in the bucket: refused, recompiled, never loaded.
    for name in (entry_name(sin_key), signed_entry_name(sin_key, "ci-1")):
        good = _s3_object(server, prefix, name)
        if b"xla_pcache.sig.signer" in good:
            _s3_replace(server, prefix, name, good[:-1] + bytes([good[-1] ^ 0xFF]))
    assert value_and_hits("sin", **host("w2", **worker)) == (sin_value, 0)
