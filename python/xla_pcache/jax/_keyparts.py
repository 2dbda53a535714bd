"""What a JAX cache key is made of, read from JAX's own key function.

JAX builds a persistent-cache key in ``jax._src.cache_key.get`` by feeding named
components (``computation``, ``jax_lib version``, ``backend version``, ``XLA flags``,
``compile_options``, ``accelerator_config``, ``compression``, ``custom_hook``; the list
differs between JAX versions) into one SHA-256, and calls ``_log_cache_key_hash`` after
each one. ``components()`` computes the key again with that function replaced, for this
thread only, by one that keeps each component's name and the function that hashed it; each
function is then run once more against a recorder that hashes what it is fed (the
component's digest, as JAX's own debug log computes it) and keeps it when small (the
readable value: flags, versions, platform). The recomputed key must equal the key JAX
used, so the components are JAX's, never a guess.

This runs on misses and puts only, never on a hit. The arguments of the key are found in
the frame of ``jax._src.compiler.compile_or_get_cached`` on the calling thread's stack (a
miss and the put after it are always inside that call), so the hit path carries no hook.
Everything here is feature-detected and best effort: when JAX's internals are not as
expected the components are left out, and the entry or the miss is recorded without them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.jax import _cache_dir, _compile_context
from xla_pcache.misslog import META_COMPILE_TIME, META_COMPONENTS, encode
from xla_pcache.misslog import module_name as module_name

logger = package_logger(__name__)

_KEEP_BYTES = 4096  # a component fed more than this has a digest and no readable value
_VALUE_CHARS = 2048  # longest readable value kept
_MAX_FRAMES = 24
_KEEP_OPTIONS = 256 * 1024  # serialized compile options are kept (not stored) up to this

_capture_lock = threading.Lock()


class _Recorder:
    """Stands in for the hashlib object JAX's component functions update."""

    def __init__(self, keep: int = _KEEP_BYTES) -> None:
        self._hash = hashlib.sha256()
        self.chunks: list[bytes] = []
        self.size = 0
        self._keep = keep

    def update(self, data: Any) -> None:
        chunk = bytes(data)
        self._hash.update(chunk)
        self.size += len(chunk)
        if self.size <= self._keep:
            self.chunks.append(chunk)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def digest(self) -> bytes:
        return self._hash.digest()

    def text(self) -> str | None:
        """The chunks as text, space separated, when all were kept and decode."""
        if self.size > min(self._keep, _KEEP_BYTES):
            return None
        try:
            return _clip(" ".join(c.decode("utf-8") for c in self.chunks))
        except UnicodeDecodeError:
            return None


def _clip(text: str) -> str:
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "\u2026"


def _find_frame(names: tuple[str, ...], module: str) -> Any:
    frame: Any = sys._getframe(2)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name in names and frame.f_globals.get("__name__") == module:
            return frame
        frame = frame.f_back
    return None


def compile_time(value: Any) -> float | None:
    """The compile time JAX measured for the executable being put, in seconds.

    ``compiler._cache_write`` has it as a float (JAX 0.5-0.12); ``put_executable_and_time``
    only as whole seconds, also written into the value's first 4 bytes (big endian) before
    compression: each is tried in turn."""
    try:
        frame = _find_frame(("_cache_write",), "jax._src.compiler")
        if frame is not None:
            secs = frame.f_locals.get("compile_time_secs")
            if isinstance(secs, int | float) and secs >= 0:
                return float(secs)
        frame = _find_frame(("put_executable_and_time",), "jax._src.compilation_cache")
        if frame is not None:
            secs = frame.f_locals.get("compile_time")
            if isinstance(secs, int | float) and secs >= 0:
                return float(secs)
    except Exception as exc:  # introspection must never break a put
        logger.debug("xla_pcache: no compile time from JAX's frames: %s", exc)
    return _time_from_value(value)


def _time_from_value(value: Any) -> float | None:
    secs = _cache_dir.value_seconds(value)
    return None if secs is None else float(secs)


def _key_args() -> dict[str, Any] | None:
    """The arguments ``compile_or_get_cached`` computes its key from, from its frame, and
    the host callbacks it compiles with."""
    frame = _find_frame(("compile_or_get_cached",), "jax._src.compiler")
    if frame is None:
        return None
    local = frame.f_locals
    args = {name: local.get(name) for name in ("computation", "devices", "compile_options")}
    args["backend"] = local.get("backend")
    if any(v is None for v in args.values()):
        return None
    args["host_callbacks"] = local.get("host_callbacks")
    return args


def computation() -> Any:
    """The module ``compile_or_get_cached`` on this thread's stack is looking up (for a
    miss's module diff), or None."""
    try:
        frame = _find_frame(("compile_or_get_cached",), "jax._src.compiler")
        return None if frame is None else frame.f_locals.get("computation")
    except Exception:
        return None


def ignore_arg(cc: Any) -> list[Any]:
    """The last argument of ``get_cache_key`` as JAX's compiler passes it: the custom
    partitioning option, an enum (0.5-0.11) or a bool (later)."""
    try:
        import jax

        flag = bool(jax.config.values.get("jax_remove_custom_partitioning_ptr_from_cache_key"))
    except Exception:
        flag = False
    if not flag:
        return []
    params = list(inspect.signature(inspect.unwrap(cc.get_cache_key)).parameters)
    if "ignore_callbacks" in params:
        from jax._src import cache_key

        return [cache_key.IgnoreCallbacks.CUSTOM_PARTITIONING]
    return [True]


def _capturing_log(original: Callable[..., Any]) -> Callable[..., Any]:
    def log_cache_key_hash(hash_obj: Any, name: str, hashfn: Any) -> Any:
        sink = _compile_context.here().sink
        if sink is None:  # another thread computing its key meanwhile
            return original(hash_obj, name, hashfn)
        # After the first component the running hash is that component's own digest.
        sink.append((name, hashfn, hash_obj.hexdigest() if not sink else None))
        return None

    return log_cache_key_hash


def _run_key(cc: Any, ck: Any, args: dict[str, Any]) -> tuple[str, list[Any]]:
    sink: list[Any] = []
    context = _compile_context.here()
    with _capture_lock:
        original = ck._log_cache_key_hash
        ck._log_cache_key_hash = _capturing_log(original)
        context.sink = sink
        try:
            # Unwrapped: the adoption of JAX's own cache may wrap it to compute more keys.
            key = inspect.unwrap(cc.get_cache_key)(
                args["computation"],
                args["devices"],
                args["compile_options"],
                args["backend"],
                *ignore_arg(cc),
            )
        finally:
            context.sink = None
            ck._log_cache_key_hash = original
    return str(key), sink


@dataclasses.dataclass(eq=False)
class Capture:
    """One computation of a key by JAX's own function, taken apart: its ``parts`` (the
    components, as the miss log and entries keep them), whether it gave the key JAX used
    (``verified``), each component's function by name (``fns``) and the arguments it was
    computed from (``args``, from ``compile_or_get_cached``'s frame)."""

    key: str
    verified: bool
    parts: dict[str, Any]
    fns: dict[str, Callable[[Any], Any]]
    args: dict[str, Any]

    def fed(self, name: str) -> list[bytes] | None:
        """What component ``name``'s function feeds JAX's hash, chunk by chunk (computed
        again: the module's canonical form is JAX's ``computation``), or None."""
        fn = self.fns.get(name)
        if fn is None:
            return None
        rec = _Recorder(keep=1 << 62)
        fn(rec)
        return rec.chunks


def capture(key: str) -> Capture | None:
    """``key`` computed again from the JAX call on this thread's stack that is looking it
    up or putting it; None when there is none (or JAX is not as expected)."""
    try:
        from jax._src import cache_key as ck
        from jax._src import compilation_cache as cc

        if not callable(getattr(ck, "_log_cache_key_hash", None)):
            return None
        args = _key_args()
        if args is None:
            return None
        recomputed, captured = _run_key(cc, ck, args)
        parts: list[dict[str, Any]] = []
        fns: dict[str, Callable[[Any], Any]] = {}
        for name, hashfn, first_digest in captured:
            fns[str(name)] = hashfn
            rec = _Recorder(_KEEP_OPTIONS if name == "compile_options" else _KEEP_BYTES)
            if first_digest is not None and name == "computation":
                digest, text = first_digest, None  # the module itself: large, not re-hashed
            else:
                hashfn(rec)
                digest, text = rec.hexdigest(), rec.text()
            part: dict[str, Any] = {"name": str(name), "digest": digest}
            if name == "compile_options" and rec.size <= _KEEP_OPTIONS:
                split = _split_debug_options(b"".join(rec.chunks))
                if split is not None:
                    part["parts"] = split
            value = _readable(str(name), text, args)
            if value is not None:
                part["value"] = value
            parts.append(part)
        return Capture(
            key,
            recomputed == key,
            {"module": module_name(key), "verified": recomputed == key, "components": parts},
            fns,
            args,
        )
    except Exception as exc:
        logger.debug("xla_pcache: key components of %r unavailable: %s", key, exc)
        return None


def components(key: str) -> dict[str, Any] | None:
    """The components of ``key``, computed from the JAX call on this thread's stack that is
    looking it up or putting it; None when there is none (or JAX is not as expected)."""
    found = capture(key)
    return None if found is None else found.parts


def _readable(name: str, text: str | None, args: dict[str, Any]) -> Any:
    if name == "computation":
        return None
    if name == "compile_options":
        return _compile_options(args["compile_options"])
    if name == "accelerator_config":
        return _devices(args["devices"])
    return text


def _devices(devices: Any) -> dict[str, Any] | None:
    try:
        flat = list(devices.flat)
        kinds = sorted({str(d.device_kind) for d in flat})
        return {
            "platform": str(flat[0].platform) if flat else None,
            "device_kind": _clip(", ".join(kinds)),
            "count": len(flat),
        }
    except Exception:
        return None


# Fields of xla_client.ExecutableBuildOptions / CompileOptions worth showing; any that a JAX
# version lacks is skipped.
_BUILD_FIELDS = (
    "num_replicas",
    "num_partitions",
    "use_spmd_partitioning",
    "use_auto_spmd_partitioning",
    "use_shardy_partitioner",
    "allow_spmd_sharding_propagation_to_output",
    "exec_time_optimization_effort",
    "memory_fitting_effort",
    "optimization_level",
    "memory_fitting_level",
)


def _compile_options(options: Any) -> dict[str, Any] | None:
    """The compile options that change an executable: the per-call overrides
    (``jax.jit(..., compiler_options=...)``, less those JAX leaves out of its key) and the
    partitioning and effort settings."""
    try:
        out: dict[str, Any] = {}
        try:
            from jax._src import cache_key as ck

            excluded = set(getattr(ck, "env_override_flags_to_exclude_from_cache_key", ()))
        except Exception:
            excluded = set()
        overrides = getattr(options, "env_option_overrides", None) or []
        out["env_option_overrides"] = {
            str(k): _clip(str(v)) for k, v in overrides if str(k) not in excluded
        }
        build = getattr(options, "executable_build_options", None)
        for field in _BUILD_FIELDS:
            try:
                value = getattr(build, field)
            except Exception:
                continue
            if isinstance(value, bool | int | float | str):
                out[field] = value
            elif value is not None:
                out[field] = _clip(str(value))
        return out
    except Exception:
        return None


# CompileOptionsProto.executable_build_options and ExecutableBuildOptionsProto.debug_options
# (xla/pjrt/proto/compile_options.proto): XLA fills the debug options from XLA_FLAGS, so a
# change of flags also changes the compile options' digest; their own digest tells the two
# causes apart.
_BUILD_OPTIONS_FIELD = 3
_DEBUG_OPTIONS_FIELD = 3


def _fields(data: bytes) -> list[tuple[int, int, int]]:
    """(field number, start, end) of each field of a serialized protobuf message."""

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, at

    out = []
    at = 0
    while at < len(data):
        start = at
        tag, at = varint(at)
        wire = tag & 7
        if wire == 0:
            _, at = varint(at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length, at = varint(at)
            at += length
        else:
            raise ValueError(f"wire type {wire}")
        if at > len(data):
            raise ValueError("truncated")
        out.append((tag >> 3, start, at))
    return out


def _split_debug_options(serialized: bytes) -> dict[str, str] | None:
    """Digests of the compile options' debug options and of everything else."""
    try:
        debug = hashlib.sha256()
        rest = hashlib.sha256()
        for number, start, end in _fields(serialized):
            field = serialized[start:end]
            if number != _BUILD_OPTIONS_FIELD:
                rest.update(field)
                continue
            # The length-delimited body follows the tag and length varints.
            inner = _body(field)
            for inner_number, s, e in _fields(inner):
                (debug if inner_number == _DEBUG_OPTIONS_FIELD else rest).update(inner[s:e])
        return {"debug_options": debug.hexdigest(), "rest": rest.hexdigest()}
    except (ValueError, IndexError):
        return None


def _body(field: bytes) -> bytes:
    at = 0
    for _ in range(2):  # skip the tag, then the length
        while field[at] & 0x80:
            at += 1
        at += 1
    return field[at:]


# --- what the JAX adapter asks on a miss and on a put --------------------------------------


def missed(key: str) -> tuple[bool, dict[str, Any] | None]:
    """After a miss of ``key`` on this thread: whether to record it (not when JAX's
    verification wrapper reads the key again inside the put that follows: one miss, recorded
    once), and its components, kept for that put (in the compile's context). Never
    raises."""
    try:
        context = _compile_context.here()
        if key in context.captures:
            found = context.captures[key]
            return False, None if found is None else found.parts
        found = capture(key)
        context.keep(key, found)
        return True, None if found is None else found.parts
    except Exception as exc:
        logger.debug("xla_pcache: recording the miss of %r failed: %s", key, exc)
        return False, None


def put_capture(key: str) -> Capture | None:
    """For JAX's put of ``key``: what its miss on this thread captured, else the key
    computed now (never raises)."""
    try:
        captures = _compile_context.here().captures
        return captures.pop(key) if key in captures else capture(key)
    except Exception as exc:
        logger.debug("xla_pcache: key components of %r unavailable: %s", key, exc)
        return None


def put_meta(
    meta: dict[str, str], key: str, value: Any, found: Capture | None = None
) -> dict[str, str]:
    """``meta`` plus the key's components (of ``found``, else ``put_capture``'s) and the
    compile time JAX measured (never raises; without them when they cannot be had)."""
    out = dict(meta)
    try:
        if found is None:
            found = put_capture(key)
        if found is not None:
            out[META_COMPONENTS] = encode(found.parts)
        secs = compile_time(value)
        if secs is not None:
            out[META_COMPILE_TIME] = f"{secs:.6f}"
    except Exception as exc:
        logger.debug("xla_pcache: key components of %r not recorded: %s", key, exc)
    return out
