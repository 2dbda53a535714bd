"""The trust matrix's rows and what is planted, shared by its columns (the paths by which
bytes reach a process): tests/tiers/test_trust_matrix.py (the store's get, the Redis and
S3 tiers, backfill, bundle import) and tests/torch_xla/test_torch_xla_trust.py (the
torch_xla host pool, with real torch_xla). A path is a column; a new path (JAX adoption,
``import --from-jax``) is a new column over the same readers and plants.

The attacker can write the shared directory or bucket but holds no trusted key. In every
cell, a process that trusts keys never gets a byte no trusted key vouches for, and nothing
any process writes lets a trusting process get one later (checked by a trusting reader of
what it wrote)."""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash
from xla_pcache import Store, _core
from xla_pcache.config import Settings

KeyPair = tuple[tuple[str, bytes], tuple[str, bytes]]


def key_pair(name: str) -> KeyPair:
    """((name, private), (name, public)), made in this process."""
    seed = _core.generate_signing_key()
    return (name, seed), (name, _core.signing_public_key(seed))


@dataclass(frozen=True)
class Keys:
    ci: KeyPair
    ci2: KeyPair
    mallory: KeyPair

    @classmethod
    def make(cls) -> Keys:
        return cls(key_pair("ci-1"), key_pair("ci-2"), key_pair("mallory-1"))


@dataclass(frozen=True)
class Reader:
    """A process: which keys it trusts (``ci``: ci-1; ``other``: ci-2 only, as after ci-1
    was revoked), whether it is read-only, whether it signs its puts with ci-1."""

    trusts: str | None
    read_only: bool = False
    signs: bool = False

    @property
    def trusting(self) -> bool:
        return self.trusts is not None

    def store(self, root: Path, keys: Keys, **kw: Any) -> Store:
        trusted = {"ci": [keys.ci[1]], "other": [keys.ci2[1]], None: None}[self.trusts]
        return Store(
            root,
            settings=Settings(),
            read_only=self.read_only,
            signing_key=keys.ci[0] if self.signs else None,
            trusted_keys=trusted,
            **kw,
        )


READERS = {
    "trusts_none": Reader(None),
    "trusts_ci": Reader("ci"),
    "trusting_read_only": Reader("ci", read_only=True),
    "signer_trusting": Reader("ci", signs=True),
    "signer_alone": Reader(None, signs=True),
    "revoked": Reader("other"),
}

# What the attacker puts at the key's plain name (where the first writer's entry goes):
# an unsigned entry of the key; one signed by their own key; ci's genuine header over other
# bytes of the same length (its xxh3 checksums made right: the untrusting layer is fooled);
# a directory (or what stands for one in a tier); ci's genuine entry, changed after a first
# read verified it.
PLANTS = ("unsigned", "mallory", "copied_header", "directory", "changed")

GOOD = b"ci compiled this program " * 40
EVIL = b"mallory's other program! " * 40
assert len(GOOD) == len(EVIL)


def entry_file(key: str, payload: bytes, signer: tuple[str, bytes] | None) -> bytes:
    """The whole entry file a store writes for ``key`` (signed when ``signer``)."""
    with tempfile.TemporaryDirectory() as d:
        with Store(d, settings=Settings(), signing_key=signer) as s:
            assert s.put(key, payload, meta={"framework": "jax"})
            name = _core.entry_name(key)
        return (Path(d) / "entries" / name[:2] / name).read_bytes()


def with_payload(entry: bytes, payload: bytes) -> bytes:
    """``entry`` with its payload replaced and its xxh3 checksums made right again, its
    signature fields kept (format: ARCHITECTURE.md, "On disk")."""
    header_len = struct.unpack_from("<I", entry, 8)[0]
    header = bytearray(entry[:header_len])
    struct.pack_into("<QQ", header, 24, len(payload), xxhash.xxh3_64_intdigest(payload))
    digest = xxhash.xxh3_64_intdigest(bytes(header[:56]) + bytes(header[64:]))
    struct.pack_into("<Q", header, 56, digest)
    return bytes(header) + payload


def planted_file(plant: str, key: str, keys: Keys, good: bytes, evil: bytes) -> bytes:
    """The entry file the attacker writes for ``plant`` (not ``directory``)."""
    if plant == "unsigned":
        return entry_file(key, evil, None)
    if plant == "mallory":
        return entry_file(key, evil, keys.mallory[0])
    if plant in ("copied_header", "changed"):
        return with_payload(entry_file(key, good, keys.ci[0]), evil)
    raise ValueError(plant)


def plant_in_dir(root: Path, name: str, data: bytes | None) -> None:
    """Writes ``data`` at entry name ``name`` of the cache at ``root`` as the attacker does
    (replacing what is there); None plants a directory."""
    path = root / "entries" / name[:2] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        os.rename(path, path.with_suffix(".gone"))
    elif path.exists():
        path.unlink()
    if data is None:
        (path / "inner").mkdir(parents=True)
    else:
        path.write_bytes(data)


def trusted_view(root: Path, key: str, keys: Keys) -> bytes | None:
    """What a process trusting ci-1, reading ``root`` later, is served for ``key``."""
    with Store(root, settings=Settings(), trusted_keys=[keys.ci[1]], read_only=True) as s:
        blob = s.get(key)
        return None if blob is None else bytes(blob)
