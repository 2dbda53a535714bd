"""The module record's format (``xla_pcache.jax.ahead._record``) and the frames a program and
its compiler process exchange (``_protocol``), against whatever a writer of the cache, or a
compiler process gone wrong, can hand them: each is refused whole, with why, and nothing past
its bounds is ever read or inflated. No JAX needed."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from xla_pcache.jax.ahead import _protocol, _record
from xla_pcache.jax.ahead._record import Record, RecordError, Target, decode, encode

MODULE = _record.MLIR_BYTECODE_MAGIC + b"\x00module bytes" * 40
CPU = Target("cpu", "cpu", 1)
TPU = Target("tpu", "TPU v5 lite", 4, "v5e:2x2", "default", (2, 2, 1), 1)
RECORD = Record(
    MODULE, b"\x08\x01options", (0,), CPU, (("XLA flags", ""), ("jax_lib version", "0.10.2"))
)
HEAD = struct.Struct("<8sIIIQQ")


def test_a_record_reads_back_as_written_and_twice_the_same_bytes() -> None:
    for record in (RECORD, Record(MODULE, b"", (0, 1, 2, 3), TPU, ())):
        data = encode(record)
        assert decode(data) == record
        assert encode(decode(data)) == data
    assert _record.record_key("jit_f-" + "0" * 64) == "xla_pcache-module-2:jit_f-" + "0" * 64
    assert _record.is_record_key("xla_pcache-module-1:jit_f-" + "0" * 64)
    assert not _record.is_record_key("jit_f-" + "0" * 64)


def test_records_are_compressed() -> None:
    module = MODULE * 50
    assert len(encode(Record(module, b"", (0,), CPU))) < len(module) // 4


def _parts(data: bytes) -> tuple[tuple[int, ...], bytes, bytes]:
    head = HEAD.unpack_from(data)
    n_header = head[1]
    return head[1:], data[HEAD.size : HEAD.size + n_header], data[HEAD.size + n_header :]


def _made(head: tuple[int, ...], header: bytes, body: bytes, magic: bytes = _record.MAGIC) -> bytes:
    return HEAD.pack(magic, *head) + header + body


def _refused(data: bytes, why: str) -> None:
    with pytest.raises(RecordError, match=why):
        decode(data)


def test_every_field_a_writer_can_get_wrong_is_refused_whole() -> None:
    data = encode(RECORD)
    head, header, body = _parts(data)
    n_header, n_options, n_devices, n_module, n_body = head
    doc = json.loads(header)
    raw = zlib.decompress(body)

    def with_header(changed: dict[str, object]) -> bytes:
        h = json.dumps(changed).encode()
        return _made((len(h), *head[1:]), h, body)

    def with_raw(new_raw: bytes, *, module: int = n_module, options: int = n_options) -> bytes:
        z = zlib.compress(new_raw)
        return _made((n_header, options, n_devices, module, len(z)), header, z)

    _refused(b"", "shorter than its header")
    _refused(data[:-1], "length")
    _refused(data + b"\0", "length")
    _refused(_made(head, header, body, b"XPCMOD01"), "not a module record of this format")
    _refused(b"\0" * (_record.MAX_RECORD_BYTES + 1), "more than")
    _refused(_made((_record.MAX_HEADER_BYTES + 1, *head[1:]), header, body), "header over")
    _refused(_made((n_header, _record.MAX_OPTION_BYTES + 1, *head[2:]), header, body), "options")
    _refused(
        _made((n_header, n_options, _record.MAX_DEVICES + 1, *head[3:]), header, body), "devices"
    )
    _refused(_made((n_header, n_options, n_devices, 0, n_body), header, body), "a module of 0")
    _refused(
        _made((n_header, n_options, n_devices, _record.MAX_MODULE_BYTES + 1, n_body), header, body),
        "a module of",
    )
    # The header: JSON, an object of exactly the record's fields, each within its bounds.
    _refused(_made((5, *head[1:]), b"nope!", body), "not JSON")
    _refused(with_header({"target": doc["target"]}), "record's fields")
    _refused(with_header({**doc, "more": 1}), "record's fields")
    for field, value, why in (
        ("platform", "CPU!", "platform"),
        ("platform", "", "platform"),
        ("device_kind", "x" * 300, "device kind"),
        ("device_count", 0, "device count"),
        ("device_count", True, "device count"),
        ("device_count", 1.0, "device count"),
        ("topology", "v5e:2x2;rm -rf", "topology"),
        ("chip_config", "Mega Core", "chip configuration"),
        ("chips_per_host", [2, 2], "chips per host"),
        ("chips_per_host", [2, 2, -1], "chips per host"),
        ("slices", 0, "slice count"),
    ):
        _refused(with_header({**doc, "target": {**doc["target"], field: value}}), why)
    _refused(with_header({**doc, "target": {**doc["target"], "extra": 1}}), "target's fields")
    _refused(with_header({**doc, "parts": [1]}), "key parts")
    _refused(with_header({**doc, "parts": {str(i): "" for i in range(17)}}), "key parts")
    _refused(with_header({**doc, "parts": {"XLA flags": 1}}), "is not a text")
    _refused(with_header({**doc, "parts": {"x": "y" * 5000}}), "is not a text")
    # The body: one whole zlib stream of exactly the header's lengths, nothing after it.
    _refused(_made(head, header, b"not zlib" + body[8:]), "zlib|inflate")
    _refused(_made((*head[:-1], n_body + 4), header, body + b"tail"), "inflate")
    _refused(with_raw(raw[:-1]), "inflate")
    _refused(with_raw(raw + b"\0"), "inflate")
    # A bomb: a few bytes that would inflate to far more than the header says.
    bomb = zlib.compress(b"\0" * (64 << 20), 9)
    _refused(_made((*head[:-1], len(bomb)), header, bomb), "inflate")
    # What the body holds: device ids in range, a module that is MLIR bytecode.
    devices = raw[n_options : n_options + 4 * n_devices]
    module = raw[n_options + 4 * n_devices :]
    big_id = struct.pack("<I", _record.MAX_DEVICE_ID + 1)
    _refused(with_raw(raw[:n_options] + big_id + module), "device id")
    _refused(with_raw(raw[:n_options] + devices + b"NOTMLIR" + module[7:]), "MLIR bytecode")


def test_a_record_over_its_bounds_is_never_written() -> None:
    for bad in (
        Record(b"", b"", (0,), CPU),
        Record(b"not mlir", b"", (0,), CPU),
        Record(MODULE, b"", (_record.MAX_DEVICE_ID + 1,), CPU),
        Record(MODULE, b"", (0,), Target("cpu", "cpu", 0)),
        Record(MODULE, b"", (0,), CPU, (("x", "y" * 5000),)),
    ):
        with pytest.raises(RecordError):
            encode(bad)


def test_frames_read_back_whole_in_any_pieces() -> None:
    data = _protocol.frame(_protocol.DONE, {"key": "k", "status": "compiled"}, b"x" * 1000)
    data += _protocol.frame(_protocol.STARTED, {"key": "k2"})
    reader = _protocol.Reader(_protocol.TO_PARENT, 4096)
    got = []
    for i in range(0, len(data), 7):
        got += reader.feed(data[i : i + 7])
    assert got == [
        (_protocol.DONE, {"key": "k", "status": "compiled"}, b"x" * 1000),
        (_protocol.STARTED, {"key": "k2"}, b""),
    ]


def test_a_frame_that_is_not_one_is_refused() -> None:
    good = _protocol.frame(_protocol.DONE, {"key": "k"}, b"x" * 100)
    head = struct.Struct("<4scIQ")
    for bad in (
        b"\xff" * 64,  # garbage
        _protocol.frame(_protocol.JOB, {"key": "k"}),  # a kind the parent never reads
        head.pack(_protocol.MAGIC, _protocol.DONE, 10, 1 << 40) + b"{}",  # over the payload bound
        head.pack(_protocol.MAGIC, _protocol.DONE, _protocol.MAX_HEADER_BYTES + 1, 0),
        head.pack(_protocol.MAGIC, _protocol.DONE, 4, 0) + b"[1] ",  # not an object
        head.pack(_protocol.MAGIC, _protocol.DONE, 4, 0) + b"\xff\xfe{}",  # not JSON
    ):
        reader = _protocol.Reader(_protocol.TO_PARENT, 4096)
        with pytest.raises(_protocol.ProtocolError):
            reader.feed(good + bad)
