"""A signer publishes what a tier hands it unsigned unless its own key verifies it, against
a real redis-server on loopback: a local miss in a process holding only a signing key (no
trusted keys) must not turn a value anyone could write to the server into its own."""

from __future__ import annotations

from pathlib import Path

from xla_pcache import Store
from xla_pcache._core import generate_signing_key, signing_public_key

from tests.tiers.servers import RedisServer

CI = ("ci-1", generate_signing_key())
MALLORY = ("mallory-1", generate_signing_key())


def test_a_tier_value_published_locally_keeps_only_a_signature_its_key_verifies(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = redis_server.url
    writers = {"plain": None, "mallory": MALLORY, "ci": CI}
    for key, signing_key in writers.items():
        with Store(tmp_path / f"w-{key}", remote=url, signing_key=signing_key) as w:
            assert w.put(key, key.encode() * 100)
            assert w.remote is not None
            w.remote.flush()
    with Store(tmp_path / "ci", remote=url, signing_key=CI) as s:
        for key in writers:
            blob = s.get(key)  # a local miss, answered by the server and published here
            assert blob is not None and bytes(blob) == key.encode() * 100
    with Store(tmp_path / "ci", read_only=True) as local:
        signers = {key: getattr(local.get(key), "signer", "missing") for key in writers}
    assert signers == {"plain": None, "mallory": None, "ci": "ci-1"}
    trusted = [("ci-1", signing_public_key(CI[1]))]
    with Store(tmp_path / "ci", read_only=True, trusted_keys=trusted) as reader:
        assert reader.get("plain") is None and reader.get("mallory") is None
        assert reader.get("ci") is not None
