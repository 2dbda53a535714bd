"""The frames a process and its compiler process (``_compiler``) exchange over two pipes.

A frame is a fixed head (a magic, its kind, the lengths of its header and payload), a JSON
header (an object) and a payload of bytes. Both sides read what the other wrote as untrusted:
``Reader`` takes bytes as they come and gives whole frames only, each within the bounds it was
made with; anything else (a wrong magic, a kind it does not know, a length over its bound, a
header that is not an object) is ``ProtocolError``, after which the stream is not read again.

Parent to child: ``TARGET`` (first, once: the target and the bounds), ``JOB`` (a key and its
record's bytes), ``CANCEL`` (a key). Child to parent: ``READY`` (its client is made: the
platform and its version), ``STARTED`` (a key whose record's key is the key: compiling),
``DONE`` (a key, what became of it, the compile's time; the serialized executable when
compiled), ``FATAL`` (no client could be made: why; the child then exits).

Precompiling (``_precompile``), the child says the key it will store a record's executable
under before compiling it (``KEYED``: the job's key and ``as``), and compiles it only when
the parent answers ``GO``; ``CANCEL`` there means the key is present (``DONE`` says
``present``).
"""

from __future__ import annotations

import json
import struct
from typing import Any

MAGIC = b"XPC1"
_HEAD = struct.Struct("<4scIQ")

TARGET = b"T"
JOB = b"J"
CANCEL = b"C"
GO = b"G"
READY = b"R"
STARTED = b"S"
DONE = b"D"
FATAL = b"F"
KEYED = b"K"
TO_CHILD = frozenset({TARGET, JOB, CANCEL, GO})
TO_PARENT = frozenset({READY, STARTED, DONE, FATAL, KEYED})

MAX_HEADER_BYTES = 64 << 10

# What became of a job (``DONE``'s ``status``).
COMPILED = "compiled"
MISMATCH = "key mismatch"
UNDECODABLE = "undecodable"
OVER_BOUNDS = "over bounds"
FAILED = "failed"
PRESENT = "present"
STATUSES = frozenset({COMPILED, MISMATCH, UNDECODABLE, OVER_BOUNDS, FAILED, PRESENT})


class ProtocolError(ValueError):
    """What was read is not a frame this protocol writes."""


def frame(kind: bytes, header: dict[str, Any], payload: bytes | memoryview = b"") -> bytes:
    """One frame, as ``Reader`` reads it back."""
    head_json = json.dumps(header, separators=(",", ":")).encode()
    if len(head_json) > MAX_HEADER_BYTES:
        raise ProtocolError("a header over its bound")
    return b"".join((_HEAD.pack(MAGIC, kind, len(head_json), len(payload)), head_json, payload))


class Reader:
    """Whole frames out of a stream's bytes, of ``kinds`` only, payloads of at most
    ``max_payload`` bytes."""

    def __init__(self, kinds: frozenset[bytes], max_payload: int) -> None:
        self._kinds = kinds
        self._max = max_payload
        self._buf = bytearray()
        self._need: tuple[bytes, int, int] | None = None

    def feed(self, data: bytes) -> list[tuple[bytes, dict[str, Any], bytes]]:
        """The frames ``data`` completes, in order; ``ProtocolError`` for a malformed one."""
        self._buf += data
        out: list[tuple[bytes, dict[str, Any], bytes]] = []
        while True:
            if self._need is None:
                if len(self._buf) < _HEAD.size:
                    return out
                magic, kind, n_head, n_payload = _HEAD.unpack_from(self._buf)
                if magic != MAGIC or kind not in self._kinds:
                    raise ProtocolError("not a frame of this protocol")
                if n_head > MAX_HEADER_BYTES or n_payload > self._max:
                    raise ProtocolError("a frame over its bounds")
                del self._buf[: _HEAD.size]
                self._need = (kind, n_head, n_payload)
            kind, n_head, n_payload = self._need
            if len(self._buf) < n_head + n_payload:
                return out
            try:
                header = json.loads(bytes(self._buf[:n_head]).decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise ProtocolError("a header that is not JSON") from None
            if not isinstance(header, dict):
                raise ProtocolError("a header that is not an object")
            with memoryview(self._buf) as view:
                payload = bytes(view[n_head : n_head + n_payload])
            del self._buf[: n_head + n_payload]
            self._need = None
            out.append((kind, header, payload))
