"""Trusted writers with real JAX, zero code: unmodified programs in fresh processes, the
cache configured by the environment alone (``XLA_PCACHE_SIGNING_KEY``,
``XLA_PCACHE_TRUSTED_KEYS``), keys made by ``xla-pcache keygen``.

The attack these tests stand in for: a writer of the shared directory plants, under the key
of program ``sin``, the executable of another program (``cos``). A reader that trusts every
writer runs it and prints ``cos``'s value; a trusting reader never loads it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import struct
from pathlib import Path

import pytest
import xxhash
from xla_pcache import Store
from xla_pcache.config import Settings

from tests.helpers import cli, executables, keygen
from tests.jax.helpers import scratch_programs, value_and_hits

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed"),
    pytest.mark.skipif(
        not any(
            ep.value == "_xla_pcache_autoload"
            for ep in importlib.metadata.entry_points(group="jax_plugins")
        ),
        reason="xla_pcache is not installed (no jax_plugins entry point): pip install -e .",
    ),
]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    d = tmp_path_factory.mktemp("keys")
    return {n: keygen(d, n) for n in ("ci-1", "ci-2", "mallory-1")}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, bytes, float]]:
    return scratch_programs(tmp_path_factory)


def plant(cache: Path, key: str, payload: bytes, signing_key: tuple[str, bytes] | None) -> None:
    """What an attacker with write access does: its bytes under another program's key."""
    with Store(cache, settings=Settings(), signing_key=signing_key) as s:
        assert s.put(key, payload, meta={"framework": "jax"})


def private(key_file: str) -> tuple[str, bytes]:
    from xla_pcache.config import read_signing_key

    k = read_signing_key(key_file)
    return k.name, k.private


def untrusted_count(cache: Path) -> int:
    with Store(cache, settings=Settings(), read_only=True) as s:
        return int(s.stats()["untrusted"])


@pytest.mark.parametrize("squatter", ["unsigned", "mallory-1"])
def test_a_squatted_key_is_never_loaded_and_still_served_from_the_trusted_writer(
    tmp_path: Path,
    keys: dict[str, tuple[str, str]],
    programs: dict[str, tuple[str, bytes, float]],
    squatter: str,
) -> None:
    cache = tmp_path / "cache"
    sin_key, _, sin_value = programs["sin"]
    _, cos_exe, cos_value = programs["cos"]
    plant(cache, sin_key, cos_exe, None if squatter == "unsigned" else private(keys[squatter][0]))
    path = {"XLA_PERSISTENT_CACHE_PATH": str(cache)}
    trusting = {**path, "XLA_PCACHE_TRUSTED_KEYS": keys["ci-1"][1]}

    # The attack is real: a reader that trusts every writer runs the planted program.
    assert value_and_hits("sin", **path, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (cos_value, 1)
    # A trusting worker never loads it: a miss, counted, and the right value.
    assert value_and_hits("sin", **trusting, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (sin_value, 0)
    # CI, holding the signing key, compiles and publishes beside the squatter's entry (its
    # miss is counted `untrusted` in the journal: read-only processes write no counters).
    ci = {**trusting, "XLA_PCACHE_SIGNING_KEY": keys["ci-1"][0]}
    assert value_and_hits("sin", **ci) == (sin_value, 0)
    assert untrusted_count(cache) >= 1
    # Read-only trusting workers now hit, on CI's entry.
    assert value_and_hits("sin", **trusting, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (sin_value, 1)
    # The operator's view: the squatter's entry is listed, then removed.
    listed = cli("verify", "--trusted", **trusting)
    assert listed.returncode == 1
    why = "unsigned" if squatter == "unsigned" else "signed by mallory-1, not trusted"
    assert why in listed.stdout
    pruned = cli("prune", "--untrusted", **trusting)
    assert pruned.returncode == 0 and "removed 1 untrusted entries" in pruned.stdout
    assert value_and_hits("sin", **trusting, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (sin_value, 1)
    # The poison is gone for everyone: an untrusting reader, which sees only the plain
    # file, now misses instead of running it.
    assert value_and_hits("sin", **path, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (sin_value, 0)


def test_an_untrusted_writers_entries_are_never_loaded(
    tmp_path: Path, keys: dict[str, tuple[str, str]], programs: dict[str, tuple[str, bytes, float]]
) -> None:
    cache = tmp_path / "cache"
    path = {"XLA_PERSISTENT_CACHE_PATH": str(cache)}
    mallory = {**path, "XLA_PCACHE_SIGNING_KEY": keys["mallory-1"][0]}
    assert value_and_hits("sin", **mallory) == (programs["sin"][2], 0)
    assert value_and_hits("sin", **mallory) == (
        programs["sin"][2],
        1,
    )  # its own entry, untrusted reads
    trusting = {**path, "XLA_PCACHE_TRUSTED_KEYS": keys["ci-1"][1]}
    before = untrusted_count(cache)
    for _ in range(2):
        assert value_and_hits("sin", **trusting, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (
            programs["sin"][2],
            0,
        )
    assert untrusted_count(cache) == before  # read-only: counted in-process, not journaled
    assert value_and_hits("sin", **trusting) == (programs["sin"][2], 0)
    assert untrusted_count(cache) > before


def test_rotation_two_trusted_keys_then_one_revoked(
    tmp_path: Path, keys: dict[str, tuple[str, str]], programs: dict[str, tuple[str, bytes, float]]
) -> None:
    cache = tmp_path / "cache"
    path = {"XLA_PERSISTENT_CACHE_PATH": str(cache)}
    value_and_hits("sin", **path, XLA_PCACHE_SIGNING_KEY=keys["ci-1"][0])
    value_and_hits("cos", **path, XLA_PCACHE_SIGNING_KEY=keys["ci-2"][0])
    both = {**path, "XLA_PCACHE_TRUSTED_KEYS": f"{keys['ci-1'][1]},{keys['ci-2'][1]}"}
    ro = {"XLA_PERSISTENT_CACHE_READ_ONLY": "1"}
    assert value_and_hits("sin", **both, **ro) == (programs["sin"][2], 1)
    assert value_and_hits("cos", **both, **ro) == (programs["cos"][2], 1)
    # ci-1 revoked: its entries are misses; ci-2's still hit. The key set from a file.
    trusted_file = tmp_path / "trusted"
    trusted_file.write_text(f"# ci-1 revoked\n{keys['ci-2'][1]}\n")
    revoked = {**path, "XLA_PCACHE_TRUSTED_KEYS": f"@{trusted_file}"}
    assert value_and_hits("sin", **revoked, **ro) == (programs["sin"][2], 0)
    assert value_and_hits("cos", **revoked, **ro) == (programs["cos"][2], 1)
    # CI re-signs with ci-2: published beside ci-1's entry, and served.
    value_and_hits("sin", **revoked, XLA_PCACHE_SIGNING_KEY=keys["ci-2"][0])
    assert value_and_hits("sin", **revoked, **ro) == (programs["sin"][2], 1)


def _resigned_file(entry: bytes, payload: bytes) -> bytes:
    """``entry`` (a whole entry file) with its payload replaced and its xxh3 checksums made
    right again, its signature fields kept: what an attacker who copies a signature onto
    other bytes writes (format in ARCHITECTURE.md, "On disk")."""
    header_len = struct.unpack_from("<I", entry, 8)[0]
    header = bytearray(entry[:header_len])
    struct.pack_into("<QQ", header, 24, len(payload), xxhash.xxh3_64_intdigest(payload))
    digest = xxhash.xxh3_64_intdigest(bytes(header[:56]) + bytes(header[64:]))
    struct.pack_into("<Q", header, 56, digest)
    return bytes(header) + payload


def test_a_signature_copied_onto_other_bytes_is_refused(
    tmp_path: Path, keys: dict[str, tuple[str, str]], programs: dict[str, tuple[str, bytes, float]]
) -> None:
    cache = tmp_path / "cache"
    path = {"XLA_PERSISTENT_CACHE_PATH": str(cache)}
    sin_key, _, sin_value = programs["sin"]
    value_and_hits("sin", **path, XLA_PCACHE_SIGNING_KEY=keys["ci-1"][0])
    with Store(cache, settings=Settings()) as s:
        (entry,) = executables(s)
        assert entry["signer"] == "ci-1"
        f = cache / "entries" / entry["name"][:2] / entry["name"]
    forged = _resigned_file(f.read_bytes(), programs["cos"][1])
    f.chmod(0o644)
    f.write_bytes(forged)
    # The xxh3 layer alone is fooled: an untrusting reader runs the other program.
    assert value_and_hits("sin", **path, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (
        programs["cos"][2],
        1,
    )
    trusting = {**path, "XLA_PCACHE_TRUSTED_KEYS": keys["ci-1"][1]}
    assert value_and_hits("sin", **trusting, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (sin_value, 0)
    # A writable trusting reader refuses it too (as untrusted when the signature no longer
    # verifies over the new length, as corrupt when the payload no longer hashes to the
    # signed digest) and is served what it compiles and signs.
    assert value_and_hits("sin", **trusting, XLA_PCACHE_SIGNING_KEY=keys["ci-1"][0])[0] == sin_value
    assert value_and_hits("sin", **trusting, XLA_PERSISTENT_CACHE_READ_ONLY="1") == (sin_value, 1)
    # What a trusting reader would not serve is what `prune --untrusted` removes: then an
    # untrusting reader no longer meets the forgery either.
    env = {"XLA_PCACHE_TRUSTED_KEYS": keys["ci-1"][1]}
    with Store(cache, settings=Settings.from_env(env)) as s:
        s.untrusted_entries(remove=True)
    assert value_and_hits("sin", **path, XLA_PERSISTENT_CACHE_READ_ONLY="1")[0] == sin_value
    # The trusted writer's entry stays, for the readers that trust it.
    with Store(cache, settings=Settings.from_env(env), read_only=True) as s:
        assert sin_key in s
