"""JAX: the function JAX calls to compile a program, wrapped so that compiling ahead
(``_compile_ahead``) sees each compile: to record what it compiled, and to hand it what was
compiled ahead from a byte-identical module and options instead of compiling again.

The function is ``jax._src.compiler``'s, called through the module attribute by
``_compile_and_write_cache`` (a miss of the persistent cache) and the other paths that
compile, in every JAX this package supports. It has had two forms (``FORMS``), by parameter
names:

- ``backend_compile(backend, module, options, host_callbacks)``: 0.4.36 to 0.6.0; the devices
  are in the options' device assignment;
- ``backend_compile_and_load(backend, module, executable_devices, options, host_callbacks)``:
  0.6.2 to 0.12 (from 0.6.2 ``backend_compile`` compiles without loading, and is left alone).

The wrapper is installed only on one of those; on any other JAX it is not installed, one
warning says so, and JAX compiles as before. At run time it steps aside (calls JAX's function
unchanged) whenever JAX's cache is not this package's store cache with compiling ahead, or
the call is not one it knows.

This module imports nothing from JAX at import time; ``xla_pcache.jax`` hands it JAX's
modules.
"""

from __future__ import annotations

import importlib
import inspect
import io
import sys
import time
from collections.abc import Callable
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.jax._module_record import Record
from xla_pcache.jax._patch import restore

logger = package_logger("xla_pcache.jax")

# (function name, its parameters) -> form: 1 without devices, 2 with.
FORMS: dict[tuple[str, tuple[str, ...]], int] = {
    ("backend_compile", ("backend", "module", "options", "host_callbacks")): 1,
    (
        "backend_compile_and_load",
        ("backend", "module", "executable_devices", "options", "host_callbacks"),
    ): 2,
}
_WRAPPED = "__xla_pcache_compile_ahead__"
# JAX's compile-then-put on a miss, in every JAX of ``FORMS``: its parameters are the compile's
# arguments, under these names, with the key it puts under (``cache_key``).
_WRITER = ("jax._src.compiler", "_compile_and_write_cache")
_WRITER_ARGUMENTS = {
    "backend": "backend",
    "module": "computation",
    "executable_devices": "executable_devices",
    "options": "compile_options",
    "host_callbacks": "host_callbacks",
}
_MAX_FRAMES = 24


def read_form(compiler: Any) -> tuple[str, int] | str:
    """The function this JAX compiles through and its form, or why there is none compiling
    ahead can stand beside."""
    name = "backend_compile_and_load"
    fn = getattr(compiler, name, None)
    if fn is None:
        name = "backend_compile"
        fn = getattr(compiler, name, None)
    fn = getattr(fn, _WRAPPED, fn)
    if not callable(fn):
        return "jax._src.compiler has neither backend_compile_and_load nor backend_compile"
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        return f"the signature of {name} cannot be read ({exc})"
    form = FORMS.get((name, params))
    if form is None:
        return f"{name}{params} is not a form this release knows"
    return name, form


def install_hook(compiler: Any, cc: Any) -> int | None:
    """Wrap JAX's compile function (once); its form, or None, with one warning, on a JAX whose
    function is not one of ``FORMS``: JAX then compiles as before."""
    found = read_form(compiler)
    if isinstance(found, str):
        logger.warning(
            "xla_pcache: compiling ahead is off: %s (JAX compiles as before; "
            "XLA_PCACHE_COMPILE_AHEAD=0 silences this)",
            found,
        )
        return None
    name, form = found
    current = getattr(compiler, name)
    if getattr(current, _WRAPPED, None) is None:
        setattr(compiler, name, _wrap(current, form, cc))
    return form


def uninstall_hook(compiler: Any) -> None:
    """Put JAX's own function back if ours is in place."""
    for name, _ in FORMS:
        restore(compiler, name, _WRAPPED)


def _wrap(original: Callable[..., Any], form: int, cc: Any) -> Callable[..., Any]:
    def compile_hooked(*args: Any, **kwargs: Any) -> Any:
        cache = getattr(cc, "_cache", None)
        ahead = getattr(cache, "ahead", None)
        if ahead is None:
            return original(*args, **kwargs)
        return ahead.compiling(original, form, args, kwargs)

    compile_hooked.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(compile_hooked, _WRAPPED, original)
    return compile_hooked


def bind(form: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments by name, or None for a call of another shape."""
    names = next(params for (_, params), f in FORMS.items() if f == form)
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    call = dict(zip(names, args, strict=False))
    for k, v in kwargs.items():
        if k in call:
            return None
        call[k] = v
    return call if len(call) == len(names) else None


def unseen_call(form: int, key: str) -> dict[str, Any] | None:
    """The arguments of the compile JAX has just made of ``key``'s program on this thread,
    by name as ``bind`` gives them, read from the frame of JAX's compile-then-put (whose
    parameters are that compile's arguments): for a compile the wrapper did not see. The
    first compile of a process can be one: JAX brings its backends up, and so activates this
    package, from inside its compile function when the program is for a compile-only
    topology (``_get_cross_compile_backend``), after the call was made. None when the put is
    not inside that frame, or the frame's key is another."""
    frame: Any = sys._getframe(1)
    try:
        for _ in range(_MAX_FRAMES):
            if frame is None:
                return None
            if (frame.f_globals.get("__name__"), frame.f_code.co_name) == _WRITER:
                break
            frame = frame.f_back
        else:
            return None
        local = frame.f_locals
        if local.get("cache_key") != key:
            return None
        names = next(params for (_, params), f in FORMS.items() if f == form)
        if any(_WRITER_ARGUMENTS[name] not in local for name in names):
            return None
        return {name: local[_WRITER_ARGUMENTS[name]] for name in names}
    finally:
        del frame


def module_bytecode(module: Any) -> bytes:
    """The module as MLIR bytecode, as JAX's ``module_to_bytecode`` writes it (bytes given
    stay as they are)."""
    if isinstance(module, bytes | bytearray):
        return bytes(module)
    out = io.BytesIO()
    module.operation.write_bytecode(file=out)
    return out.getvalue()


def module_name(module: Any) -> str | None:
    """The module's ``sym_name`` (the program's name in its JAX key), or None."""
    try:
        attr = module.operation.attributes["sym_name"]
        return str(getattr(attr, "value", None) or str(attr).strip('"'))
    except Exception:
        return None


class _Captured:
    """Stands in for the hash JAX's options function feeds: keeps what it is given."""

    def __init__(self) -> None:
        self.data: list[bytes] = []

    def update(self, data: bytes) -> None:
        self.data.append(bytes(data))


def options_normalizer() -> Callable[[Any], bytes]:
    """A function from compile options to their serialization as JAX's cache key sees them:
    JAX's own ``cache_key._hash_serialized_compile_options`` (0.4.36 to 0.12 alike), which
    clears what does not change what is compiled (the dump flags, the CUDA directory, the
    autotune cache's mode and, from 0.11, its path, which follows the cache's path) and keeps
    the device assignment, and hands its hash the options it serialized. On a JAX without it,
    or one whose function hands over anything but one serialized options, the options'
    own serialization."""

    def plain(options: Any) -> bytes:
        return bytes(options.SerializeAsString())

    try:
        fn = importlib.import_module("jax._src.cache_key")._hash_serialized_compile_options
    except (ImportError, AttributeError):
        return plain
    if not callable(fn):
        return plain
    xc = xla_client()

    def normalized(options: Any) -> bytes:
        captured = _Captured()
        fn(captured, options)
        if len(captured.data) != 1:
            return plain(options)
        data = captured.data[0]
        # What compiling ahead parses back: it must be options, not a digest of them.
        xc.CompileOptions.ParseFromString(data)
        return data

    return normalized


def xla_client() -> Any:
    """JAX's handle on jaxlib's client module (CompileOptions, DeviceList)."""
    return importlib.import_module("jax._src.lib").xla_client


def device_ids(devices: Any) -> tuple[int, ...]:
    return tuple(int(d.id) for d in devices) if devices is not None else ()


def compile_record(backend: Any, form: int, record: Record, xc: Any) -> tuple[Any, float]:
    """Compile ``record`` (its options as ``options_normalizer`` gives them) on ``backend`` as
    JAX's function would have compiled its module (the client's own call, with the module as
    bytecode, as JAX passes it to a client that asks for a string); the executable and the
    seconds it took."""
    options = xc.CompileOptions.ParseFromString(record.options)
    start = time.perf_counter()
    if form == 1:
        executable = backend.compile(record.module, compile_options=options)
    else:
        by_id = {int(d.id): d for d in backend.devices()}
        unknown = [d for d in record.devices if d not in by_id]
        if unknown:
            raise ValueError(f"no device of id {unknown[0]} here")
        devices = xc.DeviceList(tuple(by_id[d] for d in record.devices))
        # jaxlib before compile_and_load loaded what compile returned (JAX's own choice).
        compile_fn = getattr(backend, "compile_and_load", None) or backend.compile
        executable = compile_fn(record.module, executable_devices=devices, compile_options=options)
    return executable, time.perf_counter() - start
