"""JAX: a module record, what it takes to compile one program again, kept as an entry of the
store beside the executable it was compiled into.

A record holds the StableHLO module JAX handed its backend (MLIR bytecode, as JAX's own
``module_to_bytecode`` writes it), the serialized compile options and the ids of the devices
it was compiled for (none on JAX before 0.6.2, whose options carry them). It lives under
``record_key(jax_key)``: the program's JAX cache key, without the runtime build every
executable's key ends with (``xla_pcache.build_key``). A record is an input to a compile, not a
build's output: any build of the same jaxlib version (JAX's key names it, and the platform's
version) may compile it, and what it compiles is handed to JAX only for a module and options
byte-identical to the ones JAX then compiles (``_compile_ahead``).

What is read here is untrusted: whoever can write the cache directory or its bucket can put an
entry under a record's key (a trusting store serves only a signed one). ``decode`` takes
nothing it would not write: an exact length, a known magic, bounded counts and lengths, device
ids in range, a module that starts as MLIR bytecode does; anything else is refused whole
(``RecordError``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct

from xla_pcache.jax import _plan

# The key a record lives under: never a JAX key (those are ``<module>-<64 hex>``) nor a
# plan's.
KEY_PREFIX = "xla_pcache-module-1:"
# The entry's metadata: what it is, and the program's name, for people (``xla-pcache ls``).
META_KIND = "module-record"
META_MODULE = "module"

MAGIC = b"XPCMOD01"
_HEAD = struct.Struct("<8sIIQ")
# Bounds. A module is its program's StableHLO: kilobytes to a few megabytes, more only when
# the program carries its constants (arrays closed over); a program over the bound is
# compiled as before, never ahead. Options and devices are held to the plan's bounds.
MAX_MODULE_BYTES = 64 << 20
MAX_OPTION_BYTES = _plan.MAX_OPTION_BYTES
MAX_DEVICES = _plan.MAX_DEVICES
MAX_DEVICE_ID = _plan.MAX_DEVICE_ID
MAX_RECORD_BYTES = _HEAD.size + MAX_OPTION_BYTES + 4 * MAX_DEVICES + MAX_MODULE_BYTES
# What every MLIR bytecode file starts with.
MLIR_BYTECODE_MAGIC = b"ML\xefR"
_DIGEST_TAG = b"xla_pcache module record v1\0"


class RecordError(ValueError):
    """A record that is not one this module writes: refused whole."""


@dataclasses.dataclass(frozen=True)
class Record:
    """One program as JAX handed it to its backend's compile."""

    module: bytes
    options: bytes
    devices: tuple[int, ...]

    def digest(self) -> bytes:
        """What a compile's inputs are compared by: the module, the serialized options and
        the devices, each exactly (SHA-256 over their lengths and bytes)."""
        return digest(self.module, self.options, self.devices)

    def within_bounds(self) -> bool:
        return (
            0 < len(self.module) <= MAX_MODULE_BYTES
            and len(self.options) <= MAX_OPTION_BYTES
            and len(self.devices) <= MAX_DEVICES
            and all(0 <= d <= MAX_DEVICE_ID for d in self.devices)
        )


def digest(module: bytes, options: bytes, devices: tuple[int, ...]) -> bytes:
    h = hashlib.sha256(_DIGEST_TAG)
    h.update(struct.pack("<QII", len(module), len(options), len(devices)))
    h.update(options)
    h.update(b"".join(struct.pack("<I", d) for d in devices))
    h.update(module)
    return h.digest()


def record_key(jax_key: str) -> str:
    """The store key of the record of the program JAX keys ``jax_key`` (no build suffix)."""
    return KEY_PREFIX + jax_key


def program_name(jax_key: str) -> str:
    """The program's name in a JAX key (``<module>-<64 hex>``): its module's ``sym_name``."""
    return jax_key.rpartition("-")[0]


def encode(record: Record) -> bytes:
    """The record as ``decode`` reads it; ``RecordError`` when it is over a bound."""
    if not record.within_bounds():
        raise RecordError("over the record's bounds")
    devices = b"".join(struct.pack("<I", d) for d in record.devices)
    head = _HEAD.pack(MAGIC, len(record.options), len(record.devices), len(record.module))
    return b"".join((head, record.options, devices, record.module))


def decode(data: bytes | memoryview) -> Record:
    """The record in ``data``; ``RecordError`` saying why for anything this module would
    not have written."""
    view = memoryview(data).cast("B")
    if view.nbytes > MAX_RECORD_BYTES:
        raise RecordError(f"{view.nbytes} bytes, more than {MAX_RECORD_BYTES}")
    if view.nbytes < _HEAD.size:
        raise RecordError("shorter than its header")
    magic, n_options, n_devices, n_module = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise RecordError("not a module record")
    if n_options > MAX_OPTION_BYTES:
        raise RecordError(f"compile options over {MAX_OPTION_BYTES} bytes")
    if n_devices > MAX_DEVICES:
        raise RecordError(f"more than {MAX_DEVICES} devices")
    if not 0 < n_module <= MAX_MODULE_BYTES:
        raise RecordError(f"a module of {n_module} bytes (at most {MAX_MODULE_BYTES})")
    if view.nbytes != _HEAD.size + n_options + 4 * n_devices + n_module:
        raise RecordError("its length is not the one its header gives")
    at = _HEAD.size
    options = bytes(view[at : at + n_options])
    at += n_options
    devices = struct.unpack_from(f"<{n_devices}I", view, at)
    at += 4 * n_devices
    if any(d > MAX_DEVICE_ID for d in devices):
        raise RecordError("a device id is not one")
    module = bytes(view[at:])
    if not module.startswith(MLIR_BYTECODE_MAGIC):
        raise RecordError("its module is not MLIR bytecode")
    return Record(module, options, tuple(devices))
