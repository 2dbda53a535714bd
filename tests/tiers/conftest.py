"""Fixtures of the tier tests: redis-server, started per test, and an S3 service (SeaweedFS's
``weed mini``), started per module and stopped after (the servers: servers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tiers.relay import S3Relay
from tests.tiers.servers import RedisServer, S3Server, start_redis, start_s3


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


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_s3(tmp_path_factory.mktemp("weed"))
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The module's server, with this process's AWS variables pointing at it."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def relay(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Relay]:
    """A relay in front of the module's server (tests/tiers/relay.py), this process's
    AWS_ENDPOINT_URL pointing at it: keys planted on it are listed as a real S3 lists
    them, and it counts the requests that pass."""
    r = S3Relay(s3.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", r.endpoint)
    yield r
    r.close()
