"""Index snapshots as a hostile writer of the cache directory would make them: the on-disk
formats of `rust/core/src/snapshot/` (version 2, and version 1 as older writers made it),
with whatever counts, names and totals a test wants, checksummed so that a reader accepts
everything up to what it must refuse on its own."""

from __future__ import annotations

import struct

import xxhash

MAGIC = b"XPCS"
BLOCK = 4096
REC = 40
PER_BLOCK = (BLOCK - 8) // REC


def _sum(b: bytes) -> bytes:
    return struct.pack("<Q", xxhash.xxh3_64_intdigest(b))


def meta(journals: list[tuple[bytes, int]], n_counters: int = 0) -> bytes:
    """The meta section: journal marks (name, offset) with `n_counters` zero counters each."""
    parts = [struct.pack("<II", len(journals), n_counters)]
    zeros = b"\0" * (8 * n_counters)
    for name, offset in journals:
        parts.append(struct.pack("<H", len(name)) + name + struct.pack("<Q", offset) + zeros)
    parts.append(zeros)
    body = b"".join(parts)
    return body + _sum(body)


def v2(
    entries: list[tuple[int, int, int]] = (),  # type: ignore[assignment]
    journals: list[tuple[bytes, int]] = (),  # type: ignore[assignment]
    total: int | None = None,
    meta_bytes: bytes | None = None,
) -> bytes:
    """A version-2 snapshot of `entries` (name, disk bytes, last use), sorted by name, whose
    header claims `total` bytes (their sum by default)."""
    entries = sorted(entries)
    blocks = []
    fence = []
    for i in range(0, len(entries), PER_BLOCK):
        chunk = entries[i : i + PER_BLOCK]
        fence.append(chunk[0][0])
        b = b"".join(
            n.to_bytes(16, "little") + struct.pack("<QQII", d, t, 0, 0) for n, d, t in chunk
        )
        b = b.ljust(BLOCK - 8, b"\0")
        blocks.append(b + _sum(b))
    m = meta_bytes if meta_bytes is not None else meta(list(journals))
    meta_at = (len(blocks) + 1) * BLOCK
    fence_body = b"".join(n.to_bytes(16, "little") for n in fence)
    fence_at = meta_at + len(m)
    # Sized as the writer sizes it (10 bits an entry, a power of two, at least 64), all
    # set: every name may be there, so lookups read the block.
    bits = 1 << (max(64, len(entries) * 10) - 1).bit_length()
    filt = b"\xff" * (bits // 8)
    if total is None:
        total = sum(d for _, d, _ in entries)
    head = (
        MAGIC
        + struct.pack("<IQ", 2, len(entries))
        + total.to_bytes(16, "little")
        + struct.pack("<QQQQQ", len(blocks), meta_at, len(m), fence_at, len(filt))
    )
    head += _sum(head)
    return (
        head.ljust(BLOCK, b"\0")
        + b"".join(blocks)
        + m
        + fence_body
        + _sum(fence_body)
        + filt
        + _sum(filt)
    )


def v1(n_entries: int, n_journals: int = 0) -> bytes:
    """A version-1 snapshot of `n_entries` distinct entries (no journals' counters)."""
    body = bytearray(MAGIC + struct.pack("<IQII", 1, n_entries, n_journals, 0))
    rec = struct.Struct("<QQQQ")
    for i in range(n_entries):
        body += rec.pack(i + 1, 0, 4096, i)  # name as u128 little-endian: low, high
    for i in range(n_journals):
        name = b"h-1-%x.log" % i
        body += struct.pack("<H", len(name)) + name + struct.pack("<Q", 0)
    return bytes(body) + _sum(bytes(body))
