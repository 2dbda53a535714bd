"""Files of a later release, made from this release's with every checksum valid: what a
rolling upgrade leaves in a shared directory or bucket (ARCHITECTURE.md, "Formats of other
releases"), and what a writer without a key plants to pass for it."""

from __future__ import annotations

from pathlib import Path

import xxhash

# The entry format's fixed header (``rust/core/src/entry.rs``): the version at byte 4, the
# header's length at 8, its checksum at 56 (xxh3-64 of bytes 0..56 and 64..header length).
_VERSION_AT = 4
_HEADER_LEN_AT = 8
_SUM_AT = 56
FIXED = 64


def as_version(entry: bytes, version: int) -> bytes:
    """The entry file ``entry`` as format ``version`` would hold it: the version changed and
    the header's checksum made again, so that only the version is unknown to this release."""
    f = bytearray(entry)
    f[_VERSION_AT : _VERSION_AT + 2] = version.to_bytes(2, "little")
    header_len = int.from_bytes(f[_HEADER_LEN_AT : _HEADER_LEN_AT + 4], "little")
    body = bytes(f[:_SUM_AT]) + bytes(f[FIXED:header_len])
    f[_SUM_AT:FIXED] = xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")
    return bytes(f)


def entry_files(root: Path) -> list[Path]:
    """Every entry file under the cache directory ``root``."""
    return sorted(p for p in (root / "entries").glob("??/*") if p.is_file())


def rewrite_entries(root: Path, version: int) -> dict[Path, bytes]:
    """Every entry file under ``root`` rewritten as format ``version`` in place (as the later
    release would have written it: a new file renamed over the name); what each holds now."""
    out = {}
    for path in entry_files(root):
        data = as_version(path.read_bytes(), version)
        tmp = path.with_name(path.name + ".later")
        tmp.write_bytes(data)
        tmp.replace(path)
        out[path] = data
    return out


def snapshot_as_version(root: Path, version: int) -> bytes:
    """The index snapshot under ``root`` as a later release's version ``version`` names it
    (its first 8 bytes: magic, version), in place; its bytes now."""
    path = root / "index" / "snapshot"
    data = bytearray(path.read_bytes())
    data[4:8] = version.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return bytes(data)
