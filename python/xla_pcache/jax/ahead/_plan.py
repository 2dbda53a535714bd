"""JAX: the warm-start plan, what the programs of one workload read from the cache and what
loading each entry ahead of its read takes, kept as an entry of the store.

A plan is named by its workload (``_plan_name.workload``: the program as the same wherever
it lives, or ``XLA_PCACHE_PREFETCH_NAME``; the JAX version and the process index), hashed
into the key ``plan_key``, without the runtime build every executable's key ends with: one
plan per workload, whatever the build (a new build of the runtime finds the plan its
predecessor wrote, reads each entry under its own build's key, and compiles ahead what it
lacks; builds whose JAX keys differ keep a variant each). All of it is known before JAX's
backend starts, so the plan can be read (and, on a bucket path, fetched) while the backend
comes up. Its body holds up to ``MAX_VARIANTS`` variants, one per program
that ran under that name: each the ordered list of what a run of it read, with the platform
and device count it ran on. Which variant a run is, is told by what it reads
(``_recognition``), never by its command line: programs sharing a script and its arguments,
notebooks of one directory, test suites of one runner each keep their own. Each entry is
JAX's cache key (an entry's store key is it joined with the build, ``build_key.join``), the
serialized compile options the read passed and the device ids (the devices' place in the
options on JAX before 0.7), with options and device lists kept once each per variant and
entries pointing at them; and what the run measured of it, for ordering the loads
(``_schedule``) and counting the time they save: when it was read (the main thread's own
work before the read, from the run's first read, reads and compiles left out), the entry's
stored bytes, and what the read cost the main thread when that run read it there (a miss,
or a read served from loading ahead, measures none).

A plan is written when a run read what no variant of its platform holds (``covers``), or,
at a run's whole end, when what the variants holding its reads all hold (what recognition
loads for it) is mostly what it never asked for (``wants_own``: a program whose reads are a
subset of another's); then its variant joins the others (``merged``), replacing those it
holds whole, the oldest dropped past ``MAX_VARIANTS``: so known programs that alternate, and
a program run with loading ahead on and off, write nothing.

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
import re
from typing import Any

from xla_pcache._core import hash_key

# The key a plan lives under: never a JAX key (those are ``<module>-<64 hex>``). Version 1
# (variants per command line, the platform in the name) lived under ``...-plan-1:``,
# version 2 (named by the script's absolute path; a variant another holds whole never
# kept) under ``...-plan-2:``, version 3 (no timings) under ``...-plan-3:``: a release
# never reads another version's, so two releases on one cache neither refuse nor rewrite
# each other's plans (nor drop the variants one keeps and the other would not); an old
# plan ages out as any entry.
KEY_PREFIX = "xla_pcache-prefetch-plan-4:"
# What every version's plan key starts with (to tell plans from executables).
ANY_PREFIX = "xla_pcache-prefetch-plan-"
FORMAT = "xla_pcache-prefetch-plan"
VERSION = 4
# The entry's metadata: what it is, for people (``xla-pcache ls``).
META_KIND = "prefetch-plan"
# An executable's metadata, written by the process that compiled it: the digest of the
# compile options (as JAX's cache key sees them) and devices it was compiled for
# (``load_digest``). A plan's options and devices for that key must match it to be used (the
# entry, checked and perhaps signed with it, vouches for them; the plan does not).
META_LOAD_DIGEST = "load_digest"

# Bounds, each above what a real workload writes: a variant of 1,024 executables of one
# device assignment is about 120 KB (most of it keys); a test suite of 793 programs read
# 1,586. Sixteen programs per entry point (notebooks of one kernel, configurations of one
# script) settle; more alternate out, the oldest written first.
MAX_PLAN_BYTES = 4 << 20
MAX_VARIANTS = 16
MAX_ENTRIES = 4096
MAX_OPTIONS = 256
MAX_OPTION_BYTES = 256 << 10
MAX_DEVICE_LISTS = 256
MAX_DEVICES = 65536
MAX_DEVICE_ID = (1 << 31) - 1
MAX_KEY_CHARS = 1024
MAX_PLATFORM_CHARS = 64
# An entry's timings, in microseconds (a read's time from the run's first read: a day; a
# read's cost: an hour) and its stored bytes (the store's own bound on an entry).
MAX_AT_US = 86_400_000_000
MAX_READ_US = 3_600_000_000
MAX_SIZE = 1 << 40

# JAX's cache key: the module's name, a dash, a SHA-256 in hex (jax._src.cache_key.get).
_JAX_KEY = re.compile(rf"[^\x00-\x20\x7f]{{1,{MAX_KEY_CHARS - 65}}}-[0-9a-f]{{64}}")
_PLATFORM = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_PLATFORM_CHARS}}}")


class PlanError(ValueError):
    """A plan that is not one this module writes: refused whole."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One read: the key, the compile options it passed (serialized), the devices' ids; and
    what the run measured of it (None: not measured): ``at_us``, when it was read (the main
    thread's own work from the run's first read), ``size``, the entry's stored bytes, and
    ``read_us``, what reading it cost the main thread."""

    key: str
    options: bytes
    devices: tuple[int, ...]
    at_us: int | None = None
    size: int | None = None
    read_us: int | None = None


@dataclasses.dataclass(frozen=True)
class Variant:
    """What one run of a program of the workload read, in order, on ``platform`` with
    ``device_count`` devices (the backend's: a variant of another is no candidate)."""

    written: float
    platform: str
    device_count: int
    entries: tuple[Entry, ...]

    def keys(self) -> frozenset[str]:
        return frozenset(e.key for e in self.entries)

    def runs_on(self, platform: str, device_count: int) -> bool:
        return self.platform == platform and self.device_count == device_count


@dataclasses.dataclass(frozen=True)
class Plan:
    variants: tuple[Variant, ...]

    def on(self, platform: str, device_count: int) -> tuple[Variant, ...]:
        """The variants of runs on this platform and device count."""
        return tuple(v for v in self.variants if v.runs_on(platform, device_count))


def covers(plan: Plan | None, variant: Variant) -> bool:
    """Whether ``plan`` already holds ``variant``: one of its variants of the same platform
    and device count names every key ``variant`` does. A run that read no more than that
    (the same program again, with loading ahead on or off, or stopped early) has nothing to
    write, unless at its whole end it ``wants_own``."""
    return bool(holding(plan, variant))


# A run that read only what a stored variant holds keeps a variant of its own when what the
# variants holding its reads all hold (what recognition loads for it) and it never asked for
# is at least this share of that, and at least this many executables: a program whose
# reads are a subset of another's (evaluation switched off, ``pytest -k``), or a victim of a
# planted variant that holds its keys among many others.
SUBSET_SHARE = 0.25
SUBSET_MIN = 2


def wants_own(holding: list[frozenset[str]], keys: frozenset[str]) -> bool:
    """Whether a run that read ``keys``, each of ``holding`` (key sets of variants of its
    platform and device count) holding them all, keeps a variant of its own: what they all
    hold and it never asked for is ``SUBSET_SHARE`` of it, and ``SUBSET_MIN`` at least.
    Nothing held, or nothing read: no."""
    if not holding or not keys:
        return False
    held = frozenset.intersection(*holding)
    unasked = len(held - keys)
    return unasked >= SUBSET_MIN and unasked >= SUBSET_SHARE * len(held)


def holding(plan: Plan | None, variant: Variant) -> list[frozenset[str]]:
    """The key sets of ``plan``'s variants of ``variant``'s platform and device count that
    hold every key it names."""
    if plan is None:
        return []
    keys = variant.keys()
    on = plan.on(variant.platform, variant.device_count)
    return [k for k in (v.keys() for v in on) if keys <= k]


def without(plan: Plan, keys: frozenset[str], platform: str, device_count: int) -> Plan:
    """``plan`` with ``keys`` left out of its variants of this platform and device count
    (a variant left empty goes)."""
    variants = []
    for v in plan.variants:
        if v.runs_on(platform, device_count) and keys & v.keys():
            v = dataclasses.replace(v, entries=tuple(e for e in v.entries if e.key not in keys))
        if v.entries:
            variants.append(v)
    return Plan(tuple(variants))


def load_digest(options: bytes, devices: tuple[int, ...]) -> str:
    """What an executable's ``META_LOAD_DIGEST`` holds: ``options`` is the digest of the
    compile options as JAX's key sees them (``_prefetch``), ``devices`` their ids."""
    return hash_key(options, " ".join(map(str, devices)))


def valid_platform(platform: object, device_count: object) -> bool:
    """Whether a variant of this platform and device count can be written (and read back)."""
    return (
        isinstance(platform, str)
        and bool(_PLATFORM.fullmatch(platform))
        and type(device_count) is int
        and 1 <= device_count <= MAX_DEVICES
    )


def valid_key(key: object) -> bool:
    """Whether ``key`` has the form of a JAX cache key."""
    return isinstance(key, str) and len(key) <= MAX_KEY_CHARS and bool(_JAX_KEY.fullmatch(key))


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
        entries.append([e.key, oi, di, e.at_us, e.size, e.read_us])
    return {
        "written": round(v.written, 3),
        "platform": v.platform,
        "device_count": v.device_count,
        "options": [base64.b64encode(o).decode("ascii") for o in options],
        "devices": [list(d) for d in devices],
        "entries": entries,
    }


def carried(entries: tuple[Entry, ...], plan: Plan | None) -> tuple[Entry, ...]:
    """``entries`` with what ``plan`` measured of each where this run measured nothing (a
    run served from loading ahead measures no read on the main thread, a miss no size)."""
    if plan is None:
        return entries
    before: dict[str, Entry] = {}
    for v in plan.variants:
        for e in v.entries:
            before.setdefault(e.key, e)

    def fill(e: Entry) -> Entry:
        old = before.get(e.key)
        if old is None:
            return e
        return dataclasses.replace(
            e,
            size=e.size if e.size is not None else old.size,
            read_us=e.read_us if e.read_us is not None else old.read_us,
        )

    return tuple(fill(e) for e in entries)


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
        kept.append(_measured(e))
    return dataclasses.replace(variant, entries=tuple(kept))


def _measured(e: Entry) -> Entry:
    """``e`` with each timing out of its bound left unmeasured."""

    def within(value: int | None, bound: int) -> int | None:
        return value if value is not None and 0 <= value <= bound else None

    return dataclasses.replace(
        e,
        at_us=within(e.at_us, MAX_AT_US),
        size=within(e.size, MAX_SIZE),
        read_us=within(e.read_us, MAX_READ_US),
    )


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
    """``plan`` with ``variant`` added: the variants of its platform whose keys it names
    all (an earlier, shorter run of the same program) leave, and past ``MAX_VARIANTS`` the
    oldest written. No other variant stays newer than ``variant``: a time after this write
    is a clock that is wrong or a date whoever wrote the plan chose, and left as it was, it
    would never be the one dropped."""
    keys = variant.keys()
    others = [
        dataclasses.replace(v, written=min(v.written, variant.written))
        for v in (plan.variants if plan else ())
        if not (v.runs_on(variant.platform, variant.device_count) and v.keys() <= keys)
    ]
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


def _measure(value: object, bound: int, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= bound:
        raise _fail(f"{what} is not a count within {bound}")
    return value


def _variant(raw: object, i: int) -> Variant:
    where = f"variant {i}"
    if not isinstance(raw, dict) or set(raw) != {
        "written",
        "platform",
        "device_count",
        "options",
        "devices",
        "entries",
    }:
        raise _fail(f"{where} is not an object of the plan's fields")
    written = raw["written"]
    if type(written) not in (int, float) or not math.isfinite(written) or written < 0:
        raise _fail(f"{where}: written is not a time")
    platform = raw["platform"]
    if not isinstance(platform, str) or not _PLATFORM.fullmatch(platform):
        raise _fail(f"{where}: platform is not a platform's name")
    count = raw["device_count"]
    if type(count) is not int or not 1 <= count <= MAX_DEVICES:
        raise _fail(f"{where}: device_count is not a count of devices")
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
        if not isinstance(item, list) or len(item) != 6:
            raise _fail(f"{where}: an entry is not [key, options, devices, at, size, read]")
        key = item[0]
        if not valid_key(key):
            raise _fail(f"{where}: an entry's key is not a JAX cache key")
        if key in seen:
            raise _fail(f"{where}: a key is listed twice")
        seen.add(key)
        oi = _index(item[1], len(options), f"{where}: an entry's options")
        di = _index(item[2], len(devices), f"{where}: an entry's devices")
        at = _measure(item[3], MAX_AT_US, f"{where}: an entry's time")
        size = _measure(item[4], MAX_SIZE, f"{where}: an entry's size")
        read = _measure(item[5], MAX_READ_US, f"{where}: an entry's read cost")
        entries.append(Entry(key, options[oi], devices[di], at, size, read))
    return Variant(float(written), platform, count, tuple(entries))


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
    return Plan(tuple(_variant(v, i) for i, v in enumerate(variants)))
