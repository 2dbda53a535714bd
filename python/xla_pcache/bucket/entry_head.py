"""What an entry file's first bytes say: the key it holds, read from a ranged GET of its
first ``HEAD_BYTES`` (untrusted: what is fetched under that key is verified whole by the
core), so that a torch_xla host start and a prune learn which graph an entry is of without
reading it whole."""

from __future__ import annotations

from xla_pcache import build_key
from xla_pcache.bucket.layout import TORCH_XLA_KEYS

# The fixed header and the key (a torch_xla key is far shorter than the rest).
HEAD_BYTES = 4096
_FIXED_HEADER = 64
_MAGIC = b"XPCE"
_TEXT_KEY = 1
# No object smaller than this holds an entry file: the fixed header and a key of one byte.
SMALLEST_ENTRY = _FIXED_HEADER + 1


def key_in_header(head: bytes | None) -> str | None:
    """The text key an entry file's first bytes ``head`` name (the core's entry format:
    magic, flags at 6, key length at 12, the key after the 64-byte fixed header), None when
    they name none. Untrusted: what is fetched under it is verified whole."""
    if head is None or len(head) < _FIXED_HEADER or head[:4] != _MAGIC:
        return None
    flags = int.from_bytes(head[6:8], "little")
    size = int.from_bytes(head[12:16], "little")
    if not flags & _TEXT_KEY or size == 0 or _FIXED_HEADER + size > len(head):
        return None
    try:
        return head[_FIXED_HEADER : _FIXED_HEADER + size].decode()
    except UnicodeDecodeError:
        return None


def torch_xla_graph(key: str | None) -> str | None:
    """torch_xla's file name (its graph) in the store key ``key``, whatever build it names;
    None for any other key."""
    if key is None:
        return None
    bare = build_key.strip(key)
    return bare.removeprefix(TORCH_XLA_KEYS) if bare.startswith(TORCH_XLA_KEYS) else None
