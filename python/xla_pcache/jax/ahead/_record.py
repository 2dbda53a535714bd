"""A module record: what it takes to compile one program again, kept as an entry of the store
beside the executable it was compiled into, as JAX's cache key sees the program.

A record holds the module as JAX hashes it into its key (the ``computation`` component: the
StableHLO module without debug locations, as MLIR bytecode; JAX's own function made it, so it
is the same from any checkout path, notebook or host), the compile options as JAX's key
serializes them (dump flags and host paths cleared), the ids of the devices, the **target**
(the platform, its device kind and count, and for a TPU the topology: what a compile-only
client of the same platform needs) and the readable parts of the key (jaxlib's version, the
platform's version, the XLA flags and ``LIBTPU_INIT_ARGS`` as they entered the key, the
compression JAX used). Two runs of one program, from any path, write byte-identical records.

It lives under ``record_key(jax_key)``: the program's JAX cache key, without the runtime build
every executable's key ends with (``xla_pcache.build_key``): a record is an input of a
compile, which any build of the same jaxlib version can compile. It is compiled only when
JAX's own key of what it holds is the key it is stored under (``_compiler``), so a stale or
planted record costs no compile, and what a compile of it makes is what JAX would compile for
that key.

What is read here is untrusted: whoever can write the cache directory or its bucket can put an
entry under a record's key (a trusting store serves only a signed one). ``decode`` takes
nothing it would not write: an exact length, a known magic, a header of known fields within
their bounds, a body that inflates to exactly the lengths the header gives and no more, device
ids in range, a module that starts as MLIR bytecode does; anything else is refused whole
(``RecordError``). Format 1 (``xla_pcache-module-1:``, a module with its locations) is neither
read nor written: its records age out as any entry, and an older release never meets a record
of this format under the key it reads.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import zlib
from typing import Any

from xla_pcache.jax.ahead import _plan

# The key a record lives under: never a JAX key (those are ``<module>-<64 hex>``) nor a
# plan's.
KEY_PREFIX = "xla_pcache-module-2:"
# What any format's record key starts with (to tell records from executables).
ANY_PREFIX = "xla_pcache-module-"
# The entry's metadata: what it is, and the program's name, for people (``xla-pcache ls``).
META_KIND = "module-record"
META_MODULE = "module"

MAGIC = b"XPCMOD02"
# magic, header length, options length, device count, module length, body length.
_HEAD = struct.Struct("<8sIIIQQ")
# Bounds. A module is its program's StableHLO: kilobytes to a few megabytes, more only when
# the program carries its constants (arrays closed over); a program over the bound is
# compiled as before, never ahead. Options and devices are held to the plan's bounds.
MAX_MODULE_BYTES = 64 << 20
MAX_OPTION_BYTES = _plan.MAX_OPTION_BYTES
MAX_DEVICES = _plan.MAX_DEVICES
MAX_DEVICE_ID = _plan.MAX_DEVICE_ID
MAX_HEADER_BYTES = 64 << 10
MAX_PARTS = 16
MAX_PART_CHARS = 4096
MAX_TEXT_CHARS = 256
_MAX_RAW = MAX_OPTION_BYTES + 4 * MAX_DEVICES + MAX_MODULE_BYTES
# zlib's worst case is a few bytes per 16 KiB block more than its input.
MAX_BODY_BYTES = _MAX_RAW + (_MAX_RAW >> 10) + 64
MAX_RECORD_BYTES = _HEAD.size + MAX_HEADER_BYTES + MAX_BODY_BYTES
# What every MLIR bytecode file starts with.
MLIR_BYTECODE_MAGIC = b"ML\xefR"
# The key's components a record holds as fields of its own (module, options, devices); the
# others it keeps as text (``parts``).
OWN_FIELDS = frozenset({"computation", "compile_options", "accelerator_config"})
# What a module with custom partitioning calls names (its callbacks are a process's own):
# such a program is never recorded nor compiled from a record.
CUSTOM_PARTITIONING = b"CustomSPMDPartitioning"
# zlib's default level: within 2 % of level 9's size on modules, at a third of its time.
_LEVEL = 6

_PLATFORM = re.compile(r"[a-z][a-z0-9_]{0,31}")
_TOPOLOGY = re.compile(r"[a-z0-9]{1,16}:[0-9]{1,4}(x[0-9]{1,4}){1,3}")
_CHIP_CONFIG = re.compile(r"[a-z_]{1,32}")


class RecordError(ValueError):
    """A record that is not one this module writes: refused whole."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What a program was compiled for: ``platform`` (JAX's backend's), its devices' kind and
    count (every device of the client), and on a TPU the topology a compile-only client is
    made of (``topology`` such as ``v5e:2x2``, ``chip_config``, the chips of one host, the
    number of slices)."""

    platform: str
    device_kind: str
    device_count: int
    topology: str | None = None
    chip_config: str | None = None
    chips_per_host: tuple[int, int, int] | None = None
    slices: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "device_kind": self.device_kind,
            "device_count": self.device_count,
            "topology": self.topology,
            "chip_config": self.chip_config,
            "chips_per_host": list(self.chips_per_host) if self.chips_per_host else None,
            "slices": self.slices,
        }

    def valid(self) -> bool:
        return _target_error(self) is None


@dataclasses.dataclass(frozen=True)
class Record:
    """One program as JAX's key sees it, and what it was compiled for."""

    module: bytes
    options: bytes
    devices: tuple[int, ...]
    target: Target
    # The key's readable parts, by JAX's names ("jax_lib version", "XLA flags", ...).
    parts: tuple[tuple[str, str], ...] = ()

    def within_bounds(self) -> bool:
        return (
            0 < len(self.module) <= MAX_MODULE_BYTES
            and self.module.startswith(MLIR_BYTECODE_MAGIC)
            and len(self.options) <= MAX_OPTION_BYTES
            and len(self.devices) <= MAX_DEVICES
            and all(0 <= d <= MAX_DEVICE_ID for d in self.devices)
            and self.target.valid()
            and len(self.parts) <= MAX_PARTS
            and all(
                0 < len(k) <= MAX_TEXT_CHARS and len(v) <= MAX_PART_CHARS for k, v in self.parts
            )
        )


def record_key(jax_key: str) -> str:
    """The store key of the record of the program JAX keys ``jax_key`` (no build suffix)."""
    return KEY_PREFIX + jax_key


def is_record_key(key: object) -> bool:
    """Whether ``key`` is a record's, of any format."""
    return isinstance(key, str) and key.startswith(ANY_PREFIX)


def program_name(jax_key: str) -> str:
    """The program's name in a JAX key (``<module>-<64 hex>``): its module's ``sym_name``."""
    return jax_key.rpartition("-")[0]


def encode(record: Record) -> bytes:
    """The record as ``decode`` reads it (the same bytes for the same record);
    ``RecordError`` when it is over a bound."""
    if not record.within_bounds():
        raise RecordError("over the record's bounds")
    header = json.dumps(
        {"target": record.target.to_json(), "parts": dict(record.parts)},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise RecordError("its header is over its bound")
    devices = b"".join(struct.pack("<I", d) for d in record.devices)
    body = zlib.compress(b"".join((record.options, devices, record.module)), _LEVEL)
    head = _HEAD.pack(
        MAGIC, len(header), len(record.options), len(record.devices), len(record.module), len(body)
    )
    return b"".join((head, header, body))


def decode(data: bytes | memoryview) -> Record:
    """The record in ``data``; ``RecordError`` saying why for anything this module would
    not have written."""
    view = memoryview(data).cast("B")
    if view.nbytes > MAX_RECORD_BYTES:
        raise RecordError(f"{view.nbytes} bytes, more than {MAX_RECORD_BYTES}")
    if view.nbytes < _HEAD.size:
        raise RecordError("shorter than its header")
    magic, n_header, n_options, n_devices, n_module, n_body = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise RecordError("not a module record of this format")
    if n_header > MAX_HEADER_BYTES:
        raise RecordError(f"a header over {MAX_HEADER_BYTES} bytes")
    if n_options > MAX_OPTION_BYTES:
        raise RecordError(f"compile options over {MAX_OPTION_BYTES} bytes")
    if n_devices > MAX_DEVICES:
        raise RecordError(f"more than {MAX_DEVICES} devices")
    if not 0 < n_module <= MAX_MODULE_BYTES:
        raise RecordError(f"a module of {n_module} bytes (at most {MAX_MODULE_BYTES})")
    if n_body > MAX_BODY_BYTES or view.nbytes != _HEAD.size + n_header + n_body:
        raise RecordError("its length is not the one its header gives")
    at = _HEAD.size
    target, parts = _header(bytes(view[at : at + n_header]))
    raw_len = n_options + 4 * n_devices + n_module
    raw = _inflate(view[at + n_header :], raw_len)
    options = raw[:n_options]
    devices = struct.unpack_from(f"<{n_devices}I", raw, n_options)
    if any(d > MAX_DEVICE_ID for d in devices):
        raise RecordError("a device id is not one")
    module = raw[n_options + 4 * n_devices :]
    if not module.startswith(MLIR_BYTECODE_MAGIC):
        raise RecordError("its module is not MLIR bytecode")
    return Record(module, options, tuple(devices), target, parts)


def _inflate(body: memoryview, size: int) -> bytes:
    """``body`` inflated: exactly ``size`` bytes, one whole zlib stream, nothing after it.
    Never inflates more than ``size`` + 1 bytes, whatever the stream claims."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(body, size + 1)
    except zlib.error as exc:
        raise RecordError(f"its body is not zlib ({exc})") from None
    if len(raw) != size or inflater.unconsumed_tail or inflater.unused_data or not inflater.eof:
        raise RecordError("its body does not inflate to the lengths its header gives")
    return raw


def _text(value: object, what: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT_CHARS:
        raise RecordError(f"its {what} is not a text of at most {MAX_TEXT_CHARS} characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise RecordError(f"its {what} is not one")
    return value


def _count(value: object, what: str, limit: int) -> int:
    if type(value) is not int or not 1 <= value <= limit:
        raise RecordError(f"its {what} is not a count of at most {limit}")
    return value


def _target_error(t: Target) -> str | None:
    """Why ``t`` is not a target this module writes, or None."""
    try:
        _text(t.platform, "platform", _PLATFORM)
        _text(t.device_kind, "device kind")
        _count(t.device_count, "device count", MAX_DEVICES)
        _count(t.slices, "slice count", MAX_DEVICES)
        if t.topology is not None:
            _text(t.topology, "topology", _TOPOLOGY)
        if t.chip_config is not None:
            _text(t.chip_config, "chip configuration", _CHIP_CONFIG)
        if t.chips_per_host is not None:
            if len(t.chips_per_host) != 3:
                raise RecordError("its chips per host are not three counts")
            for n in t.chips_per_host:
                _count(n, "chips per host", MAX_DEVICES)
    except RecordError as exc:
        return str(exc)
    return None


_TARGET_FIELDS = {
    "platform",
    "device_kind",
    "device_count",
    "topology",
    "chip_config",
    "chips_per_host",
    "slices",
}


def target_from_json(raw: object) -> Target:
    """The target ``Target.to_json`` wrote; ``RecordError`` for anything else."""
    if not isinstance(raw, dict) or set(raw) != _TARGET_FIELDS:
        raise RecordError("its target is not an object of the target's fields")
    chips = raw["chips_per_host"]
    if chips is not None:
        if not isinstance(chips, list) or len(chips) != 3:
            raise RecordError("its chips per host are not three counts")
        chips = tuple(_count(n, "chips per host", MAX_DEVICES) for n in chips)
    return Target(
        platform=_text(raw["platform"], "platform", _PLATFORM),
        device_kind=_text(raw["device_kind"], "device kind"),
        device_count=_count(raw["device_count"], "device count", MAX_DEVICES),
        topology=None if raw["topology"] is None else _text(raw["topology"], "topology", _TOPOLOGY),
        chip_config=None
        if raw["chip_config"] is None
        else _text(raw["chip_config"], "chip configuration", _CHIP_CONFIG),
        chips_per_host=chips,
        slices=_count(raw["slices"], "slice count", MAX_DEVICES),
    )


def _header(data: bytes) -> tuple[Target, tuple[tuple[str, str], ...]]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RecordError("its header is not JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"target", "parts"}:
        raise RecordError("its header is not an object of the record's fields")
    target = target_from_json(doc["target"])
    parts_raw = doc["parts"]
    if not isinstance(parts_raw, dict) or len(parts_raw) > MAX_PARTS:
        raise RecordError(f"its key parts are not an object of at most {MAX_PARTS}")
    parts = []
    for name, value in sorted(parts_raw.items()):
        _text(name, "key part's name")
        if not isinstance(value, str) or len(value) > MAX_PART_CHARS:
            raise RecordError(f"its key part {name!r} is not a text")
        parts.append((name, value))
    return target, tuple(parts)
