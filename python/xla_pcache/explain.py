"""Why did it miss: the comparison behind ``xla-pcache explain``, over the miss log.

Adapters record what a key is made of (its components, see ``xla_pcache.jax._keyparts``
for JAX and ``xla_pcache.torch_xla._keyparts`` for torch_xla) in the metadata of every
entry they put, and in the miss log for every miss. ``explain()`` takes recent misses (or
one key), finds the nearest entry of the same program (same module name; the same
computation digest first, then the fewest differing components, then the newest) and lists
the components that differ, with both values where they were recorded. It reads entry
headers only (``Store.entries()``), never a payload. One component is the runtime's build
(``xla_pcache.builds``): a miss whose nearest entry differs only there was compiled by
another jaxlib or torch_xla binary, and is said so in words (``build_sentence``).

Both adapters record each miss here (``record_miss``); the miss log itself
(``<root>/misses.log``, bounded, opened without following links) is ``xla_pcache.misslog``'s.
A read-only process never writes it: it logs the explanation to the ``xla_pcache`` logger
instead (INFO).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.builds import COMPONENT as BUILD
from xla_pcache.misslog import (
    MAX_LOG_BYTES as MAX_LOG_BYTES,
)
from xla_pcache.misslog import (
    MAX_META_CHARS,
    META_COMPONENTS,
    Root,
    append_miss,
    bounded_json,
    miss_record,
    module_name,
    order,
    read_misses,
    valid_components,
    valid_time,
)
from xla_pcache.misslog import (
    MISS_LOG as MISS_LOG,
)
from xla_pcache.misslog import (
    MISS_LOG_OLD as MISS_LOG_OLD,
)

logger = package_logger("xla_pcache.explain")


class NotRecorded(KeyError):
    """``explain(key=...)`` for a key that is neither a recorded miss nor an entry."""


# What explain cannot see of a torch_xla miss.
NOT_EXPLAINED = (
    "the graph hash (traced IR, shapes, sharding) is computed in C++ and never reaches "
    "Python: a miss whose recorded components all match was a different graph"
)


# The computation is recorded by its digest only (its text would be the whole program): when
# it differs, what can be said, and how to see the two programs.
COMPUTATION_CHANGED = (
    "the program's computation changed (a different HLO module); its text is not recorded. "
    "To see the change next time, run the program before and after it with "
    "JAX_DUMP_IR_TO=<dir> (JAX writes each module it compiles there as "
    "jax_ir*_<module>_compile.mlir, on a hit too, and leaves the variable out of the key) "
    "and compare the two files"
)


def _computation_note(result: dict[str, Any]) -> str:
    """What explain says of a changed computation: where its module's diff against the nearest
    record's follows, or why there is none."""
    found = result.get("module_diff") or {}
    if found.get("lines") is not None:
        return (
            "the program's computation changed (a different HLO module): its module against "
            f"the nearest record's ({found.get('against')}), without debug locations, follows"
        )
    if found.get("why"):
        return f"{COMPUTATION_CHANGED} (no diff: {found['why']})"
    return COMPUTATION_CHANGED


def record_miss(
    store: Any,
    key: str,
    parts: dict[str, Any] | None,
    framework: str,
    module_diff: ModuleDiff | None = None,
) -> None:
    """The one way a miss is recorded, called by both adapters: appended to the store's miss
    log, or, read-only (which never writes it), its explanation logged at INFO (computed only
    when INFO is enabled: it reads every entry's header). Never raises: a miss compiles
    whatever happens here."""
    try:
        record = miss_record(key, parts, framework)
        if not store.read_only:
            append_miss(_root(store), record)
        elif logger.isEnabledFor(logging.INFO):
            result = explain_records([record], _recent_entries(store), module_diff)[0]
            logger.info("xla_pcache: read-only cache missed: %s", one_line(result))
    except Exception as exc:
        logger.debug("xla_pcache: recording the miss of %r failed: %s", key, exc)


# A read-only process explains each miss against the entries' headers; reading them all for
# every miss of a large cache would cost more than the compile, so they are read at most once
# per this many seconds.
_ENTRIES_TTL_S = 60.0
_entries_lock = threading.Lock()
_entries_seen: dict[str, tuple[float, list[dict[str, Any]]]] = {}


def _recent_entries(store: Any) -> list[dict[str, Any]]:
    now = time.monotonic()
    with _entries_lock:
        seen = _entries_seen.get(store.path)
        if seen is not None and now - seen[0] < _ENTRIES_TTL_S:
            return seen[1]
        entries = _entries(store)
        _entries_seen[store.path] = (now, entries)
        return entries


# --- explaining -------------------------------------------------------------------------------


def entry_components(meta: Any) -> dict[str, Any] | None:
    """The components an entry's metadata recorded, or None."""
    if not isinstance(meta, dict):
        return None
    raw = meta.get(META_COMPONENTS)
    if not isinstance(raw, str) or len(raw) > MAX_META_CHARS:
        return None
    try:
        obj = bounded_json(raw, MAX_META_CHARS)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not valid_components(obj.get("components")):
        return None
    return obj


def _entries(store: Any) -> list[dict[str, Any]]:
    out = []
    for e in store.entries():
        key = e.get("key")
        if not isinstance(key, str):
            continue
        parts = entry_components(e.get("meta"))
        meta = e.get("meta") or {}
        if parts:
            module = parts.get("module")
        elif meta.get("framework") == "torch_xla":
            module = "torch_xla"
        else:
            module = module_name(key)
        out.append(
            {
                "key": key,
                "module": module,
                "created": e.get("created"),
                "components": parts.get("components") if parts else None,
                "meta": e.get("meta") or {},
            }
        )
    return out


def _by_name(parts: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(p["name"]): p for p in parts}


def _diff(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> list[str]:
    names = set(a) | set(b)
    return order({n for n in names if a.get(n, {}).get("digest") != b.get(n, {}).get("digest")})


# An adapter's diff of a missed program's module against the nearest record's, asked when
# the computation differs: ``{"against": <record key>, "lines": [...]}``, or ``{"why": ...}``
# (the JAX adapter's ``_module_diff.Differ``).
ModuleDiff = Callable[[dict[str, Any]], dict[str, Any]]


def explain_records(
    targets: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    module_diff: ModuleDiff | None = None,
) -> list[dict[str, Any]]:
    """One explanation per target (a miss record or an entry): its nearest entry of the same
    program and the components that differ; where the computation differs, the module's
    diff against the nearest record's (``module_diff``)."""
    by_module: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_module.setdefault(str(e["module"]), []).append(e)
    stored = {e["key"] for e in entries}
    results = []
    for target in targets:
        key = str(target["key"])
        module = str(target.get("module") or module_name(key))
        result: dict[str, Any] = {
            "key": key,
            "module": module,
            "time": target.get("t"),
            "nearest": None,
            "differs": [],
            "values": {},
            "cached_now": key in stored,
        }
        for extra in ("framework", "host", "pid", "verified"):
            if extra in target:
                result[extra] = target[extra]
        mine = target.get("components")
        same = [e for e in by_module.get(module, []) if e["key"] != key]
        if not same:
            result["answer"] = "No entry of this program yet"
            results.append(result)
            continue
        if mine is None:
            result["answer"] = "its key components were not recorded"
            results.append(result)
            continue
        recorded = [e for e in same if e["components"] is not None]
        if not recorded:
            result["answer"] = (
                f"{len(same)} entr{'y' if len(same) == 1 else 'ies'} of this program, "
                "written without key components"
            )
            results.append(result)
            continue
        mine_by = _by_name(mine)
        if target.get("verified") is False:
            result.setdefault("notes", []).append(
                "these components, computed again, did not give the key JAX used: they may "
                "not be the ones behind it"
            )

        nearest = min(recorded, key=functools.partial(_rank, mine_by))
        theirs = _by_name(nearest["components"])
        differs = _diff(mine_by, theirs)
        if _options_follow_flags(differs, mine_by, theirs):
            differs.remove("compile_options")
            result["notes"] = [_FOLLOWS_FLAGS]
        result["nearest"] = nearest["key"]
        result["nearest_created"] = nearest.get("created")
        result["differs"] = differs
        result["values"] = {
            name: {
                "this": mine_by.get(name, {}).get("value"),
                "nearest": theirs.get(name, {}).get("value"),
                "this_digest": mine_by.get(name, {}).get("digest"),
                "nearest_digest": theirs.get(name, {}).get("digest"),
            }
            for name in differs
        }
        if module == "torch_xla":
            result.setdefault("notes", []).append(NOT_EXPLAINED)
        if "computation" in differs and module_diff is not None:
            found = module_diff(result)
            if found.get("lines") is not None:
                result["module_diff"] = found
            elif found.get("why"):
                result["module_diff"] = {"why": str(found["why"])}
        if "computation" in differs and _unrecorded(result["values"]["computation"]):
            result.setdefault("notes", []).append(_computation_note(result))
        if BUILD in differs:
            # Another build's entry is never loaded here: say whose, in words.
            result["build"] = build_sentence(result["values"][BUILD])
        settings = {
            name: said
            for name in differs
            if (said := setting_sentence(name, result["values"][name])) is not None
        }
        if settings:
            result["settings"] = settings
        if not differs:
            result["answer"] = "same components as the nearest entry"
        elif differs == [BUILD]:
            result["answer"] = result["build"]
        else:
            result["answer"] = "differs in " + ", ".join(differs)
        results.append(result)
    return results


# The nearest entry was written before entries recorded the runtime's build.
NO_BUILD_THERE = (
    "the nearest entry names no runtime build (written by a release of xla_pcache that did "
    "not record one): no build loads it; it ages out under the LRU"
)


def _short(ident: Any) -> str:
    """``blake3 <64 hex>`` -> ``blake3 <16 hex>``."""
    kind, _, hexid = str(ident).partition(" ")
    return f"{kind} {hexid[:16]}" if hexid else kind


def build_sentence(v: dict[str, Any]) -> str:
    """What differs between two recorded runtime builds (``builds.Build.roles``), e.g.
    ``built by another jaxlib binary (libjax_common.so: blake3 26e9... here, blake3 aa01...
    there)``."""
    this, there = v.get("this"), v.get("nearest")
    if not isinstance(there, dict):
        return NO_BUILD_THERE
    if not isinstance(this, dict):
        return "this miss recorded no runtime build; the nearest entry's is " + ", ".join(
            sorted(map(str, there))
        )
    said = []
    for role in sorted(set(this) | set(there)):
        a, b = this.get(role), there.get(role)
        if a == b:
            continue
        if not isinstance(a, dict) or not isinstance(b, dict):
            where = "here only" if isinstance(a, dict) else "there only"
            said.append(f"{role} {where}")
        elif a.get("id") != b.get("id"):
            file = a.get("file") if a.get("file") == b.get("file") else None
            said.append(
                f"built by another {role} binary ({f'{file}: ' if file else ''}"
                f"{_short(a.get('id'))} here, {_short(b.get('id'))} there)"
            )
        else:
            said.append(
                f"built by another {role} build ({a.get('files')} files, digest "
                f"{a.get('digest')} here; {b.get('files')}, {b.get('digest')} there)"
            )
    return "; ".join(said) or "another runtime build"


# The components that are a host's settings rather than its program: where a cache is filled
# on one host (ahead of time, on a CPU host for a TPU fleet) and read on another, what they
# differ in is said in words, with what to change.
FLAGS_WHY = (
    "XLA_FLAGS, LIBTPU_INIT_ARGS and --xla arguments enter JAX's key; on a TPU VM, JAX's "
    "set-up adds --xla_tpu_use_enhanced_launch_barrier=true to LIBTPU_INIT_ARGS, and "
    "JAX_FORCE_TPU_INIT=1 makes it do so on a host without TPU chips"
)
COMPRESSION_WHY = (
    "JAX compresses with zstd where the zstandard package imports, with zlib where it does "
    "not, and names its choice in the key: hosts that share entries need zstandard alike, "
    "installed on all of them or on none"
)


def _one_line_text(value: Any) -> str:
    return " / ".join(str(value).split("\n")) if value is not None else "(not recorded)"


def _flag_set(value: Any) -> list[str] | None:
    return value.split() if isinstance(value, str) else None


def setting_sentence(name: str, v: dict[str, Any]) -> str | None:
    """What differs in one of a host's settings that enter JAX's key, in words; None for a
    component that is the program's (or one whose values were not recorded)."""
    this, there = v.get("this"), v.get("nearest")
    if name == "compression" and isinstance(this, str) and isinstance(there, str):
        return f"compressed with {this} here, {there} there: {COMPRESSION_WHY}"
    if name == "XLA flags":
        mine, theirs = _flag_set(this), _flag_set(there)
        if mine is None or theirs is None:
            return None
        here_only = [f for f in mine if f not in theirs]
        there_only = [f for f in theirs if f not in mine]
        return (
            f"flags here only: {' '.join(here_only) or 'none'}; there only: "
            f"{' '.join(there_only) or 'none'} ({FLAGS_WHY})"
        )
    if name == "jax_lib version" and this is not None and there is not None:
        return f"another jaxlib ({this} here, {there} there)"
    if name == "backend version" and this is not None and there is not None:
        return (
            f"another version of the platform's runtime (the PJRT plugin: libtpu on a TPU): "
            f"{_one_line_text(this)} here, {_one_line_text(there)} there"
        )
    if name == "accelerator_config" and isinstance(this, dict) and isinstance(there, dict):
        return f"other devices: {_devices_text(this)} here, {_devices_text(there)} there"
    return None


def _devices_text(value: dict[str, Any]) -> str:
    return f"{value.get('count')} x {value.get('device_kind')} ({value.get('platform')})"


_FOLLOWS_FLAGS = (
    "compile_options differs only in its debug options, which XLA reads from XLA_FLAGS: "
    "a consequence of the XLA flags"
)


def _rank(mine: dict[str, dict[str, Any]], entry: dict[str, Any]) -> tuple[bool, int, float]:
    """Nearest first: the same computation, then the fewest differences, then the newest."""
    theirs = _by_name(entry["components"])
    diff = _diff(mine, theirs)
    if _options_follow_flags(diff, mine, theirs):
        diff.remove("compile_options")
    return ("computation" in diff, len(diff), -float(entry.get("created") or 0))


def _options_follow_flags(
    differs: list[str], mine: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]
) -> bool:
    if "XLA flags" not in differs or "compile_options" not in differs:
        return False
    a = mine.get("compile_options", {}).get("parts")
    b = theirs.get("compile_options", {}).get("parts")
    return isinstance(a, dict) and isinstance(b, dict) and a.get("rest") == b.get("rest")


def _root(store: Any) -> Root:
    """Where the store's miss log is: beneath the directory it works in."""
    root_fd = getattr(store, "root_fd", None)
    return root_fd if callable(root_fd) else str(store.path)


def explain(
    store: Any, key: str | None = None, last: int = 10, module_diff: ModuleDiff | None = None
) -> list[dict[str, Any]]:
    """Explain the ``last`` most recent distinct misses of the store, or ``key`` (a missed
    key, or the key of an entry, compared with the other entries of its program), with
    ``module_diff`` where the computation differs. Raises ``NotRecorded`` (a KeyError) when
    ``key`` is neither."""
    entries = _entries(store)
    misses = read_misses(_root(store))
    if key is not None:
        found = [m for m in misses if m["key"] == key]
        if found:
            targets = found[-1:]
        else:
            entry = next((e for e in entries if e["key"] == key), None)
            if entry is None:
                raise NotRecorded(key)
            targets = [
                {
                    "key": key,
                    "module": entry["module"],
                    "t": entry.get("created") if valid_time(entry.get("created")) else None,
                    "components": entry["components"],
                }
            ]
        return _note_untrusted(store, explain_records(targets, entries, module_diff))
    latest: dict[str, dict[str, Any]] = {}
    for m in misses:
        latest.pop(m["key"], None)
        latest[m["key"]] = m
    targets = list(latest.values())[-last:] if last > 0 else []
    return _note_untrusted(store, list(reversed(explain_records(targets, entries, module_diff))))


def _note_untrusted(store: Any, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """With trusted keys: a key whose entries are all untrusted is a miss for this store
    ("signed by mallory-1, not trusted", "unsigned"), not an entry cached since."""
    if getattr(store, "trusted_key_names", None) is None:
        return results
    why_by_key: dict[str, str] = {}
    for _path, key, why in store.untrusted_entries():
        if isinstance(key, str):
            why_by_key.setdefault(key, why)
    for result in results:
        key = result["key"]
        if key in why_by_key and store.get_entry_file(key) is None:
            why = why_by_key[key]
            result["untrusted"] = why
            result["cached_now"] = False
    return results


def _show(value: Any) -> str:
    if value is None:
        return "(not recorded)"
    if isinstance(value, str):
        return repr(value) if value == "" else value
    return json.dumps(value, sort_keys=True)


def _unrecorded(v: dict[str, Any]) -> bool:
    """Neither side recorded the component's value (only its digest)."""
    return v.get("this") is None and v.get("nearest") is None


def _digests(v: dict[str, Any]) -> str:
    return (
        f"digest {_show(v.get('this_digest'))} here, {_show(v.get('nearest_digest'))} there "
        "(its value is not recorded)"
    )


def one_line(result: dict[str, Any]) -> str:
    text = f"{result['key']}: {result.get('answer', '')}"
    if result.get("untrusted"):
        text += f" (the entry there is {result['untrusted']}: not loaded)"
    if result.get("nearest"):
        text += f" (nearest entry {result['nearest']})"
    for name in result.get("differs", []):
        v = result["values"].get(name, {})
        if name == "computation" and _unrecorded(v):
            text += f"; {_computation_note(result)}"
            lines_ = (result.get("module_diff") or {}).get("lines")
            if lines_:
                text += ":\n" + "\n".join(lines_)
        elif name == BUILD:
            if result.get("answer") != result.get("build"):
                text += f"; {result.get('build')}"
        elif _unrecorded(v):
            text += f"; {name}: {_digests(v)}"
        else:
            text += f"; {name}: {_show(v.get('this'))} here, {_show(v.get('nearest'))} there"
        said = result.get("settings", {}).get(name)
        if said:
            text += f" ({said})"
    return text


def lines(result: dict[str, Any], now: float | None = None) -> list[str]:
    """The human-readable form of one explanation."""
    now = time.time() if now is None else now
    when = result.get("time")
    ago = f" ({_ago(now - float(when))})" if isinstance(when, int | float) else ""
    out = [f"{result['key']}{ago}"]
    if result.get("cached_now"):
        out.append("  compiled and cached since")
    if result.get("untrusted"):
        out.append(f"  the entry there is {result['untrusted']}: not loaded")
    nearest = result.get("nearest")
    if nearest is None:
        out.append(f"  {result.get('answer', '')}")
        return out
    created = result.get("nearest_created")
    made = f" (written {_ago(now - float(created))})" if isinstance(created, int | float) else ""
    out.append(f"  nearest entry: {nearest}{made}")
    differs = result.get("differs") or []
    if not differs:
        out.append("  no recorded component differs")
    for note in result.get("notes", []):
        out.append(f"  note: {note}")
    for name in differs:
        v = result["values"].get(name, {})
        if name == BUILD:
            out.append(f"  differs: {name}: {result.get('build')}")
            continue
        if _unrecorded(v):
            # The computation's case is the note above, and its module's diff here.
            out.append(f"  differs: {name}" + ("" if name == "computation" else f": {_digests(v)}"))
            if name == "computation":
                out += [
                    f"    {line}" for line in (result.get("module_diff") or {}).get("lines", [])
                ]
            continue
        this, there = _narrow(v.get("this"), v.get("nearest"))
        out.append(f"  differs: {name}")
        out.append(f"    this:    {_show(this)}")
        out.append(f"    nearest: {_show(there)}")
        said = result.get("settings", {}).get(name)
        if said:
            out.append(f"    why:     {said}")
    return out


_UNSET = "(not set)"


def _narrow(a: Any, b: Any) -> tuple[Any, Any]:
    """Of two dict values, only the keys whose values differ (nested once)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a, b
    keys = sorted(k for k in set(a) | set(b) if a.get(k, _UNSET) != b.get(k, _UNSET))
    if not keys:
        return a, b
    pairs = [_narrow(a.get(k, _UNSET), b.get(k, _UNSET)) for k in keys]
    return (
        {k: p[0] for k, p in zip(keys, pairs, strict=True)},
        {k: p[1] for k, p in zip(keys, pairs, strict=True)},
    )


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit} ago"
    return f"{seconds:.0f} s ago"
