"""The bucket tests' fixtures: the servers' (redis, the bucket servers, the relay), shared
with tests/tiers/ (tests/tiers/fixtures.py)."""

from tests.tiers.fixtures import (  # noqa: F401 - fixtures, found by name
    bucket_server,
    redis_server,
    relay,
    server,
    small_redis,
)
