"""The prune lease on each protocol: a stale lease is taken over, a held one rewritten
while a prune runs and released only while still ours. Its rewrites are overwrites
conditional on the write they replace: the ETag on S3, the generation on GCS (object_store
refuses a GCS update without it; on main every takeover and every heartbeat failed
there, so a prune lost its lease after its first beat)."""

from __future__ import annotations

import json
import threading
import time

import obstore
import pytest
from xla_pcache.bucket import prune_lease, upkeep
from xla_pcache.bucket.objects import BucketObjects

from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix


def _lease(server: BucketServer, prefix: str) -> dict[str, object]:
    """The lease's body as the server holds it."""
    got = obstore.get(bucket_client(server, prefix), upkeep.LEASE)
    return dict(json.loads(bytes(got.bytes())))


def test_a_stale_lease_is_taken_over_and_released(server: BucketServer) -> None:
    prefix = fresh_prefix()
    client = bucket_client(server, prefix)
    obstore.put(client, upkeep.LEASE, json.dumps({"owner": "gone-host"}).encode())
    objects = BucketObjects(server.url(prefix))
    # Held (written just now): busy.
    with pytest.raises(prune_lease.BusyError), prune_lease.hold(objects):
        pass
    # Stale by this host's clock: taken over with the conditional overwrite.
    with prune_lease.hold(objects, stale_after=0.0) as lost:
        assert _lease(server, prefix)["owner"] != "gone-host" and not lost.is_set()
    assert not obstore.list(client, upkeep.LEASE).collect(), "released"


def test_a_held_lease_is_rewritten_and_a_taken_one_is_left_to_its_taker(
    server: BucketServer, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prune_lease, "LEASE_S", 0.3)  # a beat every 0.1 s
    prefix = fresh_prefix()
    client = bucket_client(server, prefix)
    objects = BucketObjects(server.url(prefix))
    with prune_lease.hold(objects) as lost:
        relay.take()
        puts = 0
        deadline = time.monotonic() + 60
        while puts < 3 and time.monotonic() < deadline and not lost.is_set():
            threading.Event().wait(0.05)
            puts += relay.take().get("put", 0)
        # Three beats, each a conditional overwrite that the service took.
        assert not lost.is_set() and puts >= 3, puts
        # Another host overwrites it (as a takeover does): the next beat finds it gone
        # from us and stops; the release leaves the taker's lease in place.
        obstore.put(client, upkeep.LEASE, json.dumps({"owner": "taker"}).encode())
        assert lost.wait(60)
    assert _lease(server, prefix)["owner"] == "taker"
