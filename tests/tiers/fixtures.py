"""Fixtures of the tests of tiers and buckets (tests/tiers/ and tests/bucket/ import them in
their conftest.py): redis-server,
started per test, and a bucket server, started per module and stopped after (the servers:
servers.py). ``bucket_server`` is each protocol in turn: ``s3`` (SeaweedFS's ``weed mini``)
and ``gs`` (``tests/gcs_server.py``), so that a test of a bucket runs on both; the ``gs``
runs are marked ``gcs`` (``pytest -m gcs`` runs them alone)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tiers.relay import Relay
from tests.tiers.servers import (
    BucketServer,
    RedisServer,
    start_gcs,
    start_redis,
    start_s3,
)

PROTOCOLS = ("s3", "gs")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def small_redis() -> Iterator[RedisServer]:
    """A server whose proto-max-bulk-len is 1 MB, the smallest it accepts."""
    server = start_redis("--proto-max-bulk-len", "1mb")
    yield server
    server.stop()


def start_bucket_server(protocol: str, tmp_path_factory: pytest.TempPathFactory) -> BucketServer:
    if protocol == "gs":
        return start_gcs(tmp_path_factory.mktemp("gcs"))
    return start_s3(tmp_path_factory.mktemp("weed"))


@pytest.fixture(
    scope="module",
    params=[pytest.param(p, marks=[pytest.mark.gcs] if p == "gs" else []) for p in PROTOCOLS],
)
def bucket_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BucketServer]:
    server = start_bucket_server(request.param, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture
def server(bucket_server: BucketServer, monkeypatch: pytest.MonkeyPatch) -> BucketServer:
    """The module's bucket server, with this process's variables (AWS_* or GOOGLE_*)
    pointing at it."""
    for k, v in bucket_server.env().items():
        monkeypatch.setenv(k, v)
    return bucket_server


@pytest.fixture
def relay(server: BucketServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Relay]:
    """A relay in front of the module's server (tests/tiers/relay.py), this process's
    endpoint variables pointing at it: keys planted on it are listed as the service lists
    them, and it counts the requests that pass."""
    r = Relay(server)
    for k, v in server.point_at(r.endpoint).items():
        monkeypatch.setenv(k, v)
    yield r
    r.close()
