"""JAX: what changed in a program whose computation differs from its nearest entry's: its
module against the nearest module record's, as text without debug locations (JAX's key hashes
the module with them stripped), in a unified diff (``xla_pcache.explain`` asks a ``Differ``
when the computation differs; ``XLA_PCACHE_ON_MISS``'s explanation and ``xla-pcache explain``
show it).

The nearest record is the record of the nearest entry's program, else the newest record of a
program of the same name. The missed program's own module is JAX's, from the miss (a
process explaining its own miss), or its record (``xla-pcache explain``, once it has been
compiled and stored since). A record is read through the store (its one gate: checksums,
signatures, trust: a trusting store serves only a signed one), decoded strictly
(``ahead._record.decode``) and parsed by JAX's own MLIR bytecode reader, the reader a
record compiled ahead already goes through; whatever fails to be read, decoded or parsed,
or is over the bounds, is no diff, said in a word, never an exception.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from xla_pcache import build_key
from xla_pcache._text import package_logger
from xla_pcache.jax.ahead._record import (
    KEY_PREFIX,
    META_KIND,
    META_MODULE,
    RecordError,
    decode,
    program_name,
    record_key,
)

logger = package_logger("xla_pcache.explain")

# Bounds: a module's bytecode read for a diff, its text, the part matched line by line, and
# the diff shown.
MAX_MODULE_BYTES = 8 << 20
MAX_TEXT_LINES = 400_000
MAX_MATCHED_LINES = 2_000
MAX_DIFF_LINES = 80


def module_text(module: Any) -> str:
    """``module`` (an MLIR module, or its bytecode) as text without debug locations."""
    if isinstance(module, bytes | bytearray):
        if len(module) > MAX_MODULE_BYTES:
            raise ValueError(f"a module of {len(module)} bytes (diffed up to {MAX_MODULE_BYTES})")
        from jax._src.interpreters import mlir

        context = mlir.make_ir_context()
        module = mlir.ir.Module.parse(bytes(module), context=context)  # type: ignore[attr-defined]
    return str(module.operation.get_asm(enable_debug_info=False))


def diff_lines(this: str, there: str, there_name: str) -> list[str]:
    """A unified diff of two modules' texts (``there`` first), at most ``MAX_DIFF_LINES``.
    The lines the two share at their start and end are set aside first (linear); only what
    is left between is matched line by line, and only while it is at most
    ``MAX_MATCHED_LINES`` long (difflib's matching grows faster than its input on text a
    writer can choose); beyond, that part is shown as removed then added."""
    a, b = there.splitlines(), this.splitlines()
    if max(len(a), len(b)) > MAX_TEXT_LINES:
        raise ValueError(f"modules of more than {MAX_TEXT_LINES} lines are not diffed")
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    tail = 0
    while tail < min(len(a), len(b)) - same and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    # One line of context on each side of what differs.
    lo = max(0, same - 1)
    a_part, b_part = a[lo : len(a) - max(0, tail - 1)], b[lo : len(b) - max(0, tail - 1)]
    if a_part == b_part:
        return []
    out = [f"--- {there_name}", "+++ this"]
    if max(len(a_part), len(b_part)) <= MAX_MATCHED_LINES:
        for line in difflib.unified_diff(a_part, b_part, n=1, lineterm=""):
            if line.startswith(("---", "+++")):
                continue
            out.append(_shift_hunk(line, lo) if line.startswith("@@") else line)
    else:
        out.append(f"@@ -{lo + 1},{len(a_part)} +{lo + 1},{len(b_part)} @@")
        out += [f"-{line}" for line in a_part[:MAX_DIFF_LINES]]
        out += [f"+{line}" for line in b_part[:MAX_DIFF_LINES]]
    if len(out) > MAX_DIFF_LINES:
        out = [*out[:MAX_DIFF_LINES], "... (the rest of the diff is left out)"]
    return out


def _shift_hunk(header: str, by: int) -> str:
    """A hunk header of a diff of two slices, numbered as in the whole texts."""

    def shift(match: re.Match[str]) -> str:
        return f"{match.group(1)}{int(match.group(2)) + by}"

    return re.sub(r"([-+])(\d+)", shift, header, count=2)


class Differ:
    """For one store: the diff of a missed program's module against the nearest record's.
    ``this``: the missed program's module (an MLIR module) where the process that missed
    has it; else the record of the missed key is read."""

    def __init__(self, store: Any, this: Any = None) -> None:
        self._store = store
        self._this = this
        # (created, record key, program) of every record, newest first, read once.
        self._records: list[tuple[float, str, str]] | None = None

    def _module(self, rkey: str) -> bytes | None:
        """The module of the record under ``rkey``; None when the store serves none."""
        blob = self._store.get(rkey, count=False)
        if blob is None:
            return None
        try:
            return decode(memoryview(blob)).module
        finally:
            del blob

    def _of_program(self, program: str) -> list[str]:
        """The record keys of ``program`` (by their metadata), newest first."""
        if self._records is None:
            found = []
            for e in self._store.entries():
                key, meta, created = e.get("key"), e.get("meta"), e.get("created")
                if not (isinstance(key, str) and key.startswith(KEY_PREFIX)):
                    continue
                if not isinstance(meta, dict) or meta.get("kind") != META_KIND:
                    continue
                when = float(created) if isinstance(created, int | float) else 0.0
                found.append((when, key, str(meta.get(META_MODULE))))
            found.sort(reverse=True)
            self._records = found
        return [key for _, key, name in self._records if name == program]

    def __call__(self, result: dict[str, Any]) -> dict[str, Any]:
        """``{"against": <record key>, "lines": [...]}``, or ``{"why": ...}`` when there is
        no diff to show. Never raises."""
        try:
            return self._diff(result)
        except (RecordError, ValueError) as exc:
            return {"why": str(exc)}
        except Exception as exc:
            logger.debug("xla_pcache: no module diff for %r: %s", result.get("key"), exc)
            return {"why": f"{type(exc).__name__}: {exc}"}

    def _diff(self, result: dict[str, Any]) -> dict[str, Any]:
        this_key = build_key.strip(str(result["key"]))
        mine = record_key(this_key)
        this: Any = self._this
        if this is None:
            this = self._module(mine)
            if this is None:
                return {
                    "why": "the missed program's module is not recorded (it is once the "
                    "program is compiled and stored)"
                }
        candidates = []
        nearest = result.get("nearest")
        if isinstance(nearest, str):
            candidates.append(record_key(build_key.strip(nearest)))
        candidates += self._of_program(program_name(this_key))
        refused = []
        for rkey in dict.fromkeys(candidates):
            if rkey == mine:
                continue
            try:
                there = self._module(rkey)
            except RecordError as exc:
                refused.append(f"{rkey}: {exc}")
                continue
            if there is None:
                continue
            lines = diff_lines(module_text(this), module_text(there), rkey)
            if not lines:
                # Their keys' computations differ: what a record holds is its writer's word.
                return {
                    "why": f"the modules recorded for it and for {rkey} are the same without "
                    "debug locations, though their keys' computations differ: one record is "
                    "not its program's"
                }
            return {"against": rkey, "lines": lines}
        why = f"no module record of {program_name(this_key)} is in the store"
        return {"why": why + (f" (refused: {refused[0]})" if refused else "")}
