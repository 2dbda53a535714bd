"""JAX: the warm-start plan, what one workload read from the cache and what loading each
entry ahead of its read takes, kept as an entry of the store.

A plan is named by its workload (``workload``): the entry point (the main module or script;
``XLA_PCACHE_PREFETCH_NAME`` instead when set), the JAX version, the platform, the number
of devices and the process index, hashed into the key ``plan_key``, to which the session adds
its runtime build's suffix (``builds.Build.suffix``, as on every key the adapter stores): a
plan per build. Its body holds up to ``MAX_VARIANTS`` variants, one per set of command-line
arguments (hashed): the variant of this process's arguments is loaded when there is one,
else the one written last. Each variant is the ordered list of what a process read: JAX's
cache key (an entry's store key is it with the build's suffix), the serialized compile
options the read passed and the device ids (the devices' place in the options on JAX before
0.7), with options and device lists kept once each and entries pointing at them.

What is read here is untrusted: whoever can write the cache directory or its bucket can put
an entry under a plan's key (a trusting store serves only a signed one). ``decode`` takes
nothing it would not write: a bounded size, then a whole JSON document of exactly this
shape, keys of JAX's form, indices in range, counts and lengths within the bounds below,
and refuses the whole plan (``PlanError``) for anything else. An entry a plan names is
still read through the store, its one gate (checksums, signatures, trust), and is used only
by a read that asks for that key with those options and devices (``_prefetch``).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from xla_pcache._core import hash_key

# The key a plan lives under: never a JAX key (those are ``<module>-<64 hex>``).
KEY_PREFIX = "xla_pcache-prefetch-plan-1:"
FORMAT = "xla_pcache-prefetch-plan"
VERSION = 1
# The entry's metadata: what it is, for people (``xla-pcache ls``).
META_KIND = "prefetch-plan"
# An executable's metadata, written by the process that compiled it: the digest of the
# compile options (as JAX's cache key sees them) and devices it was compiled for
# (``load_digest``). A plan's options and devices for that key must match it to be used (the
# entry, checked and perhaps signed with it, vouches for them; the plan does not).
META_LOAD_DIGEST = "load_digest"

# Bounds, each above what a real workload writes: a plan of 1,024 executables of one
# device assignment is about 120 KB (most of it keys).
MAX_PLAN_BYTES = 4 << 20
MAX_VARIANTS = 4
MAX_ENTRIES = 1024
MAX_OPTIONS = 256
MAX_OPTION_BYTES = 256 << 10
MAX_DEVICE_LISTS = 256
MAX_DEVICES = 65536
MAX_DEVICE_ID = (1 << 31) - 1
MAX_KEY_CHARS = 1024
MAX_NAME_CHARS = 512

# JAX's cache key: the module's name, a dash, a SHA-256 in hex (jax._src.cache_key.get).
_JAX_KEY = re.compile(rf"[^\x00-\x20\x7f]{{1,{MAX_KEY_CHARS - 65}}}-[0-9a-f]{{64}}")
_ARGS = re.compile(r"[0-9a-f]{32}")


class PlanError(ValueError):
    """A plan that is not one this module writes: refused whole."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One read: the key, the compile options it passed (serialized), the devices' ids."""

    key: str
    options: bytes
    devices: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Variant:
    """What one process of the workload read, in order, under its arguments' digest."""

    args: str
    written: float
    entries: tuple[Entry, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    variants: tuple[Variant, ...]

    def choose(self, args: str) -> Variant | None:
        """The variant of these arguments, else the one written last, else None."""
        for variant in self.variants:
            if variant.args == args:
                return variant
        return max(self.variants, key=lambda v: v.written, default=None)


def load_digest(options: bytes, devices: tuple[int, ...]) -> str:
    """What an executable's ``META_LOAD_DIGEST`` holds: ``options`` is the digest of the
    compile options as JAX's key sees them (``_prefetch``), ``devices`` their ids."""
    return hash_key(options, " ".join(map(str, devices)))


def valid_key(key: object) -> bool:
    """Whether ``key`` has the form of a JAX cache key."""
    return isinstance(key, str) and len(key) <= MAX_KEY_CHARS and bool(_JAX_KEY.fullmatch(key))


def entry_point() -> tuple[str, list[str]]:
    """What names this process's workload: the main module (``python -m``), the script's
    absolute path, the code of ``python -c`` (hashed), or ``interactive``; and the
    command-line arguments after it."""
    argv = list(sys.argv)
    rest = argv[1:]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", None)
    if isinstance(module, str) and module and module != "__main__":
        return f"module {module}", rest
    first = argv[0] if argv else ""
    if first == "-c":
        orig = list(getattr(sys, "orig_argv", []))
        code = orig[orig.index("-c") + 1] if "-c" in orig[:-1] else ""
        return f"code {hash_key(code)}", rest
    if first in ("", "-"):
        return "interactive", rest
    return f"script {os.path.abspath(first)}", rest


def args_digest(args: Sequence[str]) -> str:
    return hash_key(*args)


def workload(name: str | None, jax_version: str, platform: str, devices: int, process: int) -> str:
    """The text a plan's key is hashed from: ``name`` (``XLA_PCACHE_PREFETCH_NAME``) or the
    entry point, and what makes another host's plan unusable here."""
    what = name if name else entry_point()[0]
    return (
        f"{what[:MAX_NAME_CHARS]} | jax {jax_version} | {platform} x{devices} | process {process}"
    )


def plan_key(workload_text: str) -> str:
    return KEY_PREFIX + hash_key(workload_text)


# ----------------------------------------------------------------------------- encoding


def _encode_variant(v: Variant) -> dict[str, Any]:
    options: dict[bytes, int] = {}
    devices: dict[tuple[int, ...], int] = {}
    entries = []
    for e in v.entries:
        oi = options.setdefault(e.options, len(options))
        di = devices.setdefault(e.devices, len(devices))
        entries.append([e.key, oi, di])
    return {
        "args": v.args,
        "written": round(v.written, 3),
        "options": [base64.b64encode(o).decode("ascii") for o in options],
        "devices": [list(d) for d in devices],
        "entries": entries,
    }


def bounded(variant: Variant) -> Variant:
    """``variant`` cut to what a plan may hold: its first entries within every bound (a
    process that read more keeps the plan of its start)."""
    kept: list[Entry] = []
    options: set[bytes] = set()
    devices: set[tuple[int, ...]] = set()
    for e in variant.entries:
        if not valid_key(e.key) or len(e.options) > MAX_OPTION_BYTES:
            continue
        if len(e.devices) > MAX_DEVICES or any(not 0 <= d <= MAX_DEVICE_ID for d in e.devices):
            continue
        if len(kept) == MAX_ENTRIES:
            break
        if e.options not in options and len(options) == MAX_OPTIONS:
            break
        if e.devices not in devices and len(devices) == MAX_DEVICE_LISTS:
            break
        options.add(e.options)
        devices.add(e.devices)
        kept.append(e)
    return dataclasses.replace(variant, entries=tuple(kept))


def encode(plan: Plan) -> bytes:
    """The plan as ``decode`` reads it, within ``MAX_PLAN_BYTES``: the oldest variants are
    dropped first, then the last entries of what is left."""
    variants = sorted(plan.variants, key=lambda v: v.written, reverse=True)[:MAX_VARIANTS]
    variants = [bounded(v) for v in variants]
    while True:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "variants": [_encode_variant(v) for v in variants],
        }
        data = json.dumps(doc, separators=(",", ":")).encode()
        if len(data) <= MAX_PLAN_BYTES:
            return data
        if len(variants) > 1:
            variants.pop()
        else:
            entries = variants[0].entries
            variants[0] = dataclasses.replace(variants[0], entries=entries[: len(entries) // 2])


def merged(plan: Plan | None, variant: Variant) -> Plan:
    """``plan`` with ``variant`` in place of the one of its arguments (or of the oldest, at
    ``MAX_VARIANTS``)."""
    others = [v for v in (plan.variants if plan else ()) if v.args != variant.args]
    others.sort(key=lambda v: v.written, reverse=True)
    return Plan((variant, *others[: MAX_VARIANTS - 1]))


# ----------------------------------------------------------------------------- decoding


def _fail(why: str) -> PlanError:
    return PlanError(why)


def _list(value: object, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(f"{what} is not a list")
    if len(value) > limit:
        raise _fail(f"{what} holds {len(value)} items, more than {limit}")
    return value


def _index(value: object, size: int, what: str) -> int:
    if type(value) is not int or not 0 <= value < size:
        raise _fail(f"{what} is not an index of its table")
    return value


def _variant(raw: object, i: int) -> Variant:
    where = f"variant {i}"
    if not isinstance(raw, dict) or set(raw) != {
        "args",
        "written",
        "options",
        "devices",
        "entries",
    }:
        raise _fail(f"{where} is not an object of the plan's fields")
    args = raw["args"]
    if not isinstance(args, str) or not _ARGS.fullmatch(args):
        raise _fail(f"{where}: args is not a digest")
    written = raw["written"]
    if type(written) not in (int, float) or not math.isfinite(written) or written < 0:
        raise _fail(f"{where}: written is not a time")
    options: list[bytes] = []
    for text in _list(raw["options"], f"{where}: options", MAX_OPTIONS):
        if not isinstance(text, str) or len(text) > (MAX_OPTION_BYTES + 2) // 3 * 4:
            raise _fail(f"{where}: compile options over {MAX_OPTION_BYTES} bytes")
        try:
            options.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise _fail(f"{where}: compile options are not base64") from None
    devices: list[tuple[int, ...]] = []
    for ids in _list(raw["devices"], f"{where}: devices", MAX_DEVICE_LISTS):
        ids = _list(ids, f"{where}: a device list", MAX_DEVICES)
        if any(type(d) is not int or not 0 <= d <= MAX_DEVICE_ID for d in ids):
            raise _fail(f"{where}: a device id is not one")
        devices.append(tuple(ids))
    entries: list[Entry] = []
    seen: set[str] = set()
    for item in _list(raw["entries"], f"{where}: entries", MAX_ENTRIES):
        if not isinstance(item, list) or len(item) != 3:
            raise _fail(f"{where}: an entry is not [key, options, devices]")
        key = item[0]
        if not valid_key(key):
            raise _fail(f"{where}: an entry's key is not a JAX cache key")
        if key in seen:
            raise _fail(f"{where}: a key is listed twice")
        seen.add(key)
        oi = _index(item[1], len(options), f"{where}: an entry's options")
        di = _index(item[2], len(devices), f"{where}: an entry's devices")
        entries.append(Entry(key, options[oi], devices[di]))
    return Variant(args, float(written), tuple(entries))


def decode(data: bytes | memoryview) -> Plan:
    """The plan in ``data``; ``PlanError`` saying why for anything this module would not
    have written."""
    view = memoryview(data)
    if view.nbytes > MAX_PLAN_BYTES:
        raise _fail(f"{view.nbytes} bytes, more than {MAX_PLAN_BYTES}")
    try:
        doc = json.loads(bytes(view).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _fail("not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _fail("not a prefetch plan")
    if set(doc) != {"format", "version", "variants"} or doc["version"] != VERSION:
        raise _fail(f"not version {VERSION} of the plan's format")
    variants = _list(doc["variants"], "variants", MAX_VARIANTS)
    out = tuple(_variant(v, i) for i, v in enumerate(variants))
    if len({v.args for v in out}) != len(out):
        raise _fail("two variants of the same arguments")
    return Plan(out)
