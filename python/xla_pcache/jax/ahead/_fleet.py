"""What a fleet's keys are made of besides the program, and the TPU topology a precompile is
for: the settings ``xla-pcache precompile`` compiles records with, so that each executable is
stored under the key the fleet's hosts compute.

JAX's key holds the XLA flags (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS`` and ``--xla`` arguments,
sorted, those that change no executable left out) and the compression JAX will use (zstd
when ``zstandard`` imports, else zlib). A record keeps both as its key had them (its key
parts). A compiler process that precompiles (``_compiler``) runs with exactly the fleet's
flags in ``LIBTPU_INIT_ARGS`` (and nothing of this host's own: no ``XLA_FLAGS``, no TPU
VM set-up) and JAX's compression set to the fleet's, so JAX's own key function gives the
fleet's key there; and it compiles a record only when the key JAX computes of it with the
settings its own parts name is the key it is stored under (``key_with_parts``).

This module imports nothing from JAX at import time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

from xla_pcache.jax.ahead._record import OWN_FIELDS

# The compressions JAX names in its key.
ZLIB = "zlib"
ZSTANDARD = "zstandard"
COMPRESSIONS = frozenset({ZLIB, ZSTANDARD})
# What the command takes for each.
COMPRESSION_NAMES = {"zlib": ZLIB, "zstd": ZSTANDARD, "zstandard": ZSTANDARD}

# The key parts a record keeps as text, and how each was fed to JAX's hash: a part's text is
# its chunks joined by one space (``_keyparts._Recorder.text``).
FLAGS_PART = "XLA flags"
COMPRESSION_PART = "compression"
JAXLIB_PART = "jax_lib version"
BACKEND_PART = "backend version"

# What JAX's set-up on a Cloud TPU VM adds to LIBTPU_INIT_ARGS (``cloud_tpu_init``) unless
# it is there: every key of a TPU VM holds it.
TPU_VM_FLAG = "--xla_tpu_use_enhanced_launch_barrier=true"
_FLAG = re.compile(r"[^\s\x00]{1,1024}")
MAX_FLAGS = 256

# TPU generations as a topology names them: JAX's device kind, the dimensions of a name,
# devices per chip (one per chip where JAX joins the two cores of a chip: megacore).
_GENERATIONS = {
    "v2": ("TPU v2", 2, 2),
    "v3": ("TPU v3", 2, 2),
    "v4": ("TPU v4", 3, 1),
    "v5e": ("TPU v5 lite", 2, 1),
    "v5p": ("TPU v5", 3, 1),
    "v6e": ("TPU v6 lite", 2, 1),
}
_TOPOLOGY = re.compile(r"(v[0-9][a-z]?):([0-9]{1,3})x([0-9]{1,3})(?:x([0-9]{1,3}))?")
# The chips one named topology may have (the largest pods have some thousands).
MAX_CHIPS = 8192
# A topology of at most this many chips is one host's unless told otherwise.
MAX_ONE_HOST_CHIPS = 8


class FleetError(ValueError):
    """A setting the command cannot precompile with."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A named TPU topology: ``name`` (``v5e:2x2``), its generation's device kind, its chips'
    extent (three counts), the chips of one host, and its devices."""

    name: str
    generation: str
    device_kind: str
    extent: tuple[int, int, int]
    chips_per_host: tuple[int, int, int]
    device_count: int


def parse_topology(text: str, chips_per_host: str | None = None) -> Topology:
    """``v5e:1x1`` (``chips_per_host`` as ``2,2,1``, else the whole topology when it is
    one host's); ``FleetError`` saying what is known for anything else."""
    m = _TOPOLOGY.fullmatch(text.strip())
    known = ", ".join(sorted(_GENERATIONS))
    if m is None:
        raise FleetError(
            f"topology {text!r} is not GENERATION:AxB (or AxBxC), as v5e:2x2 ({known})"
        )
    generation = m.group(1)
    if generation not in _GENERATIONS:
        raise FleetError(f"topology {text!r}: {generation} is not a TPU generation known ({known})")
    kind, dims, per_chip = _GENERATIONS[generation]
    given = [int(g) for g in m.groups()[1:] if g is not None]
    if len(given) != dims:
        raise FleetError(f"topology {text!r}: a {generation} topology has {dims} dimensions")
    if any(n < 1 for n in given):
        raise FleetError(f"topology {text!r}: every dimension is at least 1")
    extent = (given[0], given[1], given[2] if dims == 3 else 1)
    chips = extent[0] * extent[1] * extent[2]
    if chips > MAX_CHIPS:
        raise FleetError(f"topology {text!r}: {chips} chips, more than {MAX_CHIPS}")
    if chips_per_host is None:
        if chips > MAX_ONE_HOST_CHIPS:
            raise FleetError(
                f"topology {text!r} spans hosts: say the chips of one host (--chips-per-host)"
            )
        per_host = extent
    else:
        try:
            counts = tuple(int(n) for n in chips_per_host.split(","))
        except ValueError:
            counts = ()
        if len(counts) != 3 or any(not 1 <= n <= e for n, e in zip(counts, extent, strict=True)):
            raise FleetError(
                f"chips per host {chips_per_host!r} are not three counts within {text}"
            )
        per_host = (counts[0], counts[1], counts[2])
    name = f"{generation}:{'x'.join(map(str, given))}"
    return Topology(name, generation, kind, extent, per_host, chips * per_chip)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The fleet's key-relevant settings a compiler process precompiles with: the flags
    its keys hold (as JAX sorts and filters them) and the compression; ``source`` says
    where they came from, for the report."""

    flags: tuple[str, ...]
    compression: str
    source: str

    def environment(self) -> dict[str, str | None]:
        """What the compiler process's environment holds of them (None: removed)."""
        return {
            "LIBTPU_INIT_ARGS": " ".join(self.flags) if self.flags else None,
            "XLA_FLAGS": None,
            # JAX's TPU VM set-up (it adds to LIBTPU_INIT_ARGS) is not this process's to run.
            "JAX_FORCE_TPU_INIT": None,
        }


def split_flags(text: str, what: str) -> tuple[str, ...]:
    """Flags as JAX splits an environment variable of them; ``FleetError`` for what is
    none."""
    flags = tuple(text.split())
    if len(flags) > MAX_FLAGS or not all(_FLAG.fullmatch(f) for f in flags):
        raise FleetError(f"{what} is not a list of at most {MAX_FLAGS} flags")
    return flags


def keyed(flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` as JAX's key holds them: sorted, without those it leaves out."""
    try:
        from jax._src import cache_key as ck

        excluded = set(getattr(ck, "xla_flags_to_exclude_from_cache_key", ()))
    except Exception:
        excluded = set()
    return tuple(f for f in sorted(flags) if f.split("=")[0] not in excluded)


def with_tpu_vm_flag(flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` as JAX's set-up on a TPU VM leaves them (its flag added unless given)."""
    if any(f.startswith("--xla_tpu_use_enhanced_launch_barrier") for f in flags):
        return flags
    return (*flags, TPU_VM_FLAG)


def record_flags(parts: dict[str, str]) -> tuple[str, ...] | str:
    """The flags a record's key held, or why they cannot be read."""
    text = parts.get(FLAGS_PART)
    if text is None:
        return "its key parts name no XLA flags"
    if text.startswith("sha256:") or text.endswith("\u2026"):
        return "its key's XLA flags are not kept readable"
    try:
        return split_flags(text, "its key's XLA flags")
    except FleetError as exc:
        return str(exc)


def record_compression(parts: dict[str, str]) -> str | None:
    value = parts.get(COMPRESSION_PART)
    return value if value in COMPRESSIONS else None


# --------------------------------------------------------------- in a compiler process


def use_compression(cc: Any, compression: str) -> None:
    """JAX's compilation cache module made to name ``compression`` in its keys (a
    compiler process's, never the program's)."""
    if compression == ZLIB:
        cc.zstandard = None
        if getattr(cc, "zstd", None) is not None:
            cc.zstd = None
        return
    if getattr(cc, "zstandard", None) is None:
        raise FleetError("zstandard is not installed here: keys naming zstd cannot be made")


def keyed_flags() -> str | None:
    """The XLA flags JAX's key holds in this process, as a record's part shows them."""
    try:
        from jax._src import cache_key as ck

        from xla_pcache.jax import _keyparts

        rec = _keyparts._Recorder()
        ck._hash_xla_flags(rec, ck.get_flag_prefixes())
        return " ".join(c.decode("utf-8") for c in rec.chunks)
    except Exception:
        return None


def _fed(name: str, text: str) -> bytes:
    """What a part of ``text`` fed JAX's hash (its chunks without the spaces joining them)."""
    if name == FLAGS_PART:
        return "".join(text.split(" ")).encode("utf-8")
    if name == BACKEND_PART:
        return "".join(text.split(" ", 1)).encode("utf-8")
    return text.encode("utf-8")


def key_with_parts(fleet_key: str, sink: list[Any], parts: dict[str, str]) -> str | None:
    """The key JAX's function gives a program with the settings ``parts`` (a record's key
    parts) in place of this process's: its components (``sink``, as ``_keyparts`` captured
    them computing ``fleet_key``) hashed in JAX's order, the module, options and devices by
    JAX's own functions; None when a part is not kept readable."""
    h = hashlib.sha256()
    for name, hashfn, _ in sink:
        name = str(name)
        if name in OWN_FIELDS:
            hashfn(h)
            continue
        text = parts.get(name)
        if text is None or text.startswith("sha256:") or text.endswith("\u2026"):
            return None
        h.update(_fed(name, text))
    return f"{fleet_key.rpartition('-')[0]}-{h.hexdigest()}"


def applied(env: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
    """``env`` with ``changes`` applied (None removes a variable)."""
    out = dict(env)
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out
