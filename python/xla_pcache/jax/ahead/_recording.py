"""Recording: each program JAX puts into the store gets its module record beside it
(``_record``), made of what JAX's own key function hashed for that key.

At JAX's put of a key (on the thread that compiled it, inside ``compile_or_get_cached``) the
key is computed again by JAX's function from that call's arguments (``_keyparts.Capture``, the
same computation that gives the key's components for ``explain``; a miss already made it, and
keeps it for the put); when it gives the key JAX put, the record is what its components fed
the hash: the ``computation`` (the module as JAX canonicalizes it: debug locations stripped,
as MLIR bytecode), the ``compile_options`` (serialized with dump flags and host paths cleared),
the devices' ids, the target the backend is (``_target.describe``) and the readable parts. Not
recorded: a program with host callbacks (bound in the process) or custom partitioning (its
callbacks are pointers of this process), a key JAX's function does not give again (a
PGLE-profiled key), one a custom hook adds to (``cache_key.custom_hook``), a target that cannot
be told, a record over its bounds, anything in a read-only process.

A record is written once (first writer wins, as for entries); one read this run and refused
(its key is not the key it is stored under, or it cannot be decoded) is replaced by this run's,
when this run's differs from it: two checkouts, notebooks and hosts of one program write the
same bytes and never replace each other's.
"""

from __future__ import annotations

from collections.abc import Callable

from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax._keyparts import Capture
from xla_pcache.jax.ahead import _target
from xla_pcache.jax.ahead._record import (
    CUSTOM_PARTITIONING,
    META_KIND,
    META_MODULE,
    MLIR_BYTECODE_MAGIC,
    OWN_FIELDS,
    Record,
    RecordError,
    encode,
    program_name,
    record_key,
)
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")


def record_of(found: Capture) -> Record | str:
    """The record of the program whose key ``found`` computed, or why there is none."""
    if not found.verified:
        return "JAX's key function does not give its key again"
    if found.args.get("host_callbacks"):
        return "it has host callbacks"
    module = found.fed("computation")
    if module is None or len(module) != 1 or not module[0].startswith(MLIR_BYTECODE_MAGIC):
        return "its computation is not one module"
    if CUSTOM_PARTITIONING in module[0]:
        return "it has custom partitioning callbacks"
    options = found.fed("compile_options")
    if options is None or len(options) != 1:
        return "its compile options are not one message"
    target = _target.describe(found.args["backend"])
    if target is None:
        return "its target cannot be told"
    parts: list[tuple[str, str]] = []
    for part in found.parts.get("components", []):
        name = str(part.get("name"))
        if name in OWN_FIELDS:
            continue
        value = part.get("value")
        text = value if isinstance(value, str) else f"sha256:{part.get('digest')}"
        if name == "custom_hook" and text:
            return "a custom hook adds to its key"
        parts.append((name, text))
    try:
        devices = tuple(int(d.id) for d in found.args["devices"].flat)
    except Exception:
        return "its devices cannot be read"
    record = Record(module[0], options[0], devices, target, tuple(sorted(parts)))
    return record if record.within_bounds() else "it is over the record's bounds"


class Recorder:
    """Writes the records of what JAX puts into ``store`` (never a read-only one).
    ``refused(key)``: whether this run refused the record stored under ``key``."""

    def __init__(
        self,
        store: Store,
        meta: dict[str, str],
        refused: Callable[[str], bool],
    ) -> None:
        self._store = store
        self._meta = {k: v for k, v in meta.items() if k in ("framework_version",)}
        self._refused = refused
        self._warn = FirstWarning(logger, "recording {key} failed ({what})")

    def stored(self, key: str, found: Capture | None) -> None:
        """JAX put ``key``: its record written beside it (never raises)."""
        if self._store.read_only or found is None:
            return
        rkey = record_key(key)
        try:
            replace = self._refused(key)
            if not replace and rkey in self._store:
                return
            made = record_of(found)
            if isinstance(made, str):
                logger.debug("xla_pcache: %r is not recorded: %s", key, made)
                return
            data = encode(made)
            meta = {"kind": META_KIND, "framework": "jax", META_MODULE: program_name(key)}
            meta.update(self._meta)
            if not replace:
                self._store.put(rkey, data, meta=meta)
                return
            held = self._store.get(rkey, count=False)
            if held is None or bytes(held) != data:
                self._store.replace(rkey, data, meta=meta)
        except RecordError as exc:
            logger.debug("xla_pcache: %r is not recorded: %s", key, exc)
        except Exception as exc:
            self._warn("writing", key, exc)
