"""A bucket as the cache path, offline: how a URL is routed, where its host-local store
lives, what chain it gets, and that nothing is ever created under a name made of a URL.
Building an object-store client makes no request, so gs:// and az:// are checked here with
their standard credential variables; the S3 service itself is in tests/bucket/test_bucket.py.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from xla_pcache import Store, bucket, cache_path, open_store
from xla_pcache.caches import MemoryCache, PersistentCache, from_env
from xla_pcache.config import Settings


def test_urls_route_to_a_bucket_or_are_refused_with_the_reason() -> None:
    assert cache_path.route("gs://bkt/jax/cache") == cache_path.Route(
        "bucket", "gs://bkt/jax/cache"
    )
    assert cache_path.route(" S3://bkt/p?ro=1 ").kind == "bucket"
    assert cache_path.route("az://ctr/p?trust=required").kind == "bucket"
    assert cache_path.route("file:///tmp/x") == cache_path.Route("local", "/tmp/x")
    assert cache_path.route("rel/dir").path == os.path.abspath("rel/dir")
    assert cache_path.route("~/c").path == os.path.expanduser("~/c")
    for url, why in (
        ("hdfs://nn/cache", "not hdfs://"),
        ("gcs://bkt/p", "not gcs://"),
        ("s3://", "no bucket"),
        ("s3://key:secret@bkt/p", "credentials"),
        ("gs://bkt/p?token=x", "an option other than ro, read_only and trust"),
        ("gs://bkt/p#x", "a '#' part"),
        ("s3://bkt/p?trust=maybe", "trust"),
    ):
        r = cache_path.route(url)
        assert (r.kind, r.own_cache) == ("unserved", False), r
        assert why in r.reason, r
    assert not cache_path.is_url("/a/b:c") and cache_path.is_url("x+y://z")


def test_the_host_local_store_is_named_after_the_bucket_and_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = bucket.local_name("gs://bkt/jax/cache")
    assert name.startswith("gs-bkt_jax_cache-") and len(name.split("-")[-1]) == 12
    # One name per cache, whatever the spelling: options and slashes do not count.
    assert bucket.local_name("GS://bkt/jax/cache/?ro=1") == name
    assert bucket.local_name("gs://bkt/jax") != name != bucket.local_name("s3://bkt/jax/cache")
    odd = bucket.local_name("s3://b/" + "x/" * 200 + "..%2F..")
    assert "/" not in odd and ".." not in odd and len(odd) <= 93
    settings = Settings(xdg_cache_home=str(tmp_path / "xdg"))
    assert bucket.local_path("gs://bkt/jax/cache", settings) == str(
        tmp_path / "xdg" / "xla_pcache" / "remote" / name
    )
    monkeypatch.setenv("XLA_PCACHE_LOCAL_PATH", str(tmp_path / "mine"))
    assert bucket.local_path("gs://bkt/x", Settings.from_env()) == str(tmp_path / "mine")
    monkeypatch.setenv("XLA_PCACHE_LOCAL_PATH", "s3://b/p")
    with pytest.raises(ValueError, match="XLA_PCACHE_LOCAL_PATH"):
        Settings.from_env()


def test_a_bucket_store_is_local_with_the_bucket_behind_it_and_nothing_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XLA_PCACHE_REMOTE", "redis://cache:6379/0,gs://bkt/jax/")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "xpcaccount")
    settings = Settings.from_env()
    gs = open_store("gs://bkt/jax", settings=settings)
    az = open_store("az://ctr/p?trust=required", settings=settings, read_only=True)
    assert isinstance(gs, bucket.BucketStore) and gs.bucket_url == "gs://bkt/jax"
    # Redis from XLA_PCACHE_REMOTE in front, the bucket last (named once).
    assert gs.stats()["remote"] == "redis://cache:6379/0,gs://bkt/jax"
    # Read-only: every tier read-only, and the local store still takes what is fetched.
    assert az.stats()["remote"] == (
        "redis://cache:6379/0?ro=1,gs://bkt/jax/?ro=1,az://ctr/p?trust=required&ro=1"
    )
    assert not az.read_only and az._recorder is None and gs._recorder is not None
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        chain = az.remote  # a trust=required tier needs trusted keys: dropped, one warning
    assert chain is not None and chain.dropped == ["az://ctr/p?trust=required&ro=1"]
    assert [t["url"] for t in chain.describe()] == ["redis://cache:6379/0", "gs://bkt/jax"]
    assert "XLA_PCACHE_TRUSTED_KEYS" in caplog.text
    for s in (gs, az):
        s.close()
    assert list(work.iterdir()) == []
    remote = tmp_path / "xdg" / "xla_pcache" / "remote"
    assert sorted(p.name for p in remote.iterdir()) == sorted(
        [bucket.local_name("gs://bkt/jax"), bucket.local_name("az://ctr/p")]
    )
    # A URL is never a directory: not for a Store, nor for the cache API.
    with pytest.raises(ValueError, match="path 'gs://bkt/x' is a URL"):
        Store("gs://bkt/x")
    with pytest.raises(ValueError, match="hdfs://nn/x"):
        PersistentCache("hdfs://nn/x", bytes, bytes)
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", "hdfs://nn/x")
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        assert isinstance(from_env(), MemoryCache)
    assert "XLA_PERSISTENT_CACHE_PATH=hdfs://nn/x cannot be served" in caplog.text
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", "gs://bkt/jax")
    cache = from_env()
    assert isinstance(cache, PersistentCache) and cache.store.path == gs.path
    cache.close()
    assert list(work.iterdir()) == []


def test_directory_commands_refuse_a_url_and_name_the_host_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner
    from xla_pcache.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for args, needle in (
        (["ls", "--path", "s3://bkt/p"], bucket.local_name("s3://bkt/p")),
        (["stats", "--path", "hdfs://nn/p"], "serves gs://, s3:// and az://"),
        (["verify", "--path", "gs://bkt/p?ro=1"], "stats, prune and config take a bucket"),
    ):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 2 and needle in " ".join(out.output.split()), out.output
    assert list(tmp_path.iterdir()) == []
