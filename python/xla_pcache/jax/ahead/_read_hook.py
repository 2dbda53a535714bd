"""JAX: the hook loading ahead stands in through, ``compilation_cache.get_executable_and_time``,
which ``compiler.py`` calls through the module attribute in every JAX this package supports.

Its arguments changed twice (``FORMS``): ``(cache_key, compile_options, backend)`` up to 0.6,
the executable's devices added in 0.7, host callbacks (with a default) in 0.11. The wrapper is
installed only when the function has one of those signatures and the helpers loading needs
are there (``read_form``); on any other JAX it is not installed, one warning says so, and
reads go as before. At run time it steps aside (calls JAX's function unchanged) whenever
JAX's cache is not this package's own store cache with a session (the verification wrapper
of ``jax_compilation_cache_check_contents`` sits there, or another cache); the session
(``_prefetch.Prefetch.read``) steps aside in turn for a read that passes host callbacks or
names another backend than the one it loads for.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.jax._patch import restore
from xla_pcache.jax.ahead._loads import xla_client
from xla_pcache.jax.ahead._prefetch import Prefetch

logger = package_logger("xla_pcache.jax")

# The forms of get_executable_and_time this wrapper knows, by parameter names.
FORMS: dict[tuple[str, ...], int] = {
    ("cache_key", "compile_options", "backend"): 1,
    ("cache_key", "compile_options", "backend", "executable_devices"): 2,
    ("cache_key", "compile_options", "backend", "executable_devices", "host_callbacks"): 3,
}
_TARGET = "get_executable_and_time"
_WRAPPED = "__xla_pcache_prefetch__"


def read_form(cc: Any) -> int | str:
    """The form (1, 2, 3) of this JAX's ``get_executable_and_time``, or why it is not one
    loading ahead can stand in for."""
    fn = getattr(cc, _TARGET, None)
    fn = getattr(fn, _WRAPPED, fn)
    if not callable(fn):
        return f"jax._src.compilation_cache has no {_TARGET}"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return f"the signature of {_TARGET} cannot be read ({exc})"
    names = tuple(params)
    form = FORMS.get(names)
    if form is None:
        return f"{_TARGET}{names} is not a form this release knows"
    if form == 3 and params["host_callbacks"].default is inspect.Parameter.empty:
        return f"{_TARGET}'s host_callbacks has no default"
    missing = [
        n
        for n in ("decompress_executable", "extract_executable_and_time")
        if not callable(getattr(cc, n, None))
    ]
    try:
        xc = xla_client()
    except (ImportError, AttributeError):
        return "jax._src.lib.xla_client cannot be imported"
    if not callable(getattr(getattr(xc, "CompileOptions", None), "ParseFromString", None)):
        missing.append("xla_client.CompileOptions.ParseFromString")
    if form >= 2 and not callable(getattr(xc, "DeviceList", None)):
        missing.append("xla_client.DeviceList")
    if missing:
        return f"this JAX lacks {', '.join(missing)}"
    return form


def install_hook(cc: Any) -> bool:
    """Wrap ``cc.get_executable_and_time`` (once). False, with one warning, on a JAX whose
    function is not one of ``FORMS``: reads then go as before."""
    current = getattr(cc, _TARGET, None)
    if getattr(current, _WRAPPED, None) is not None:
        return True
    form = read_form(cc)
    if isinstance(form, str):
        logger.warning(
            "xla_pcache: loading ahead is off: %s (reads go JAX's own way; "
            "XLA_PCACHE_PREFETCH=0 silences this)",
            form,
        )
        return False
    assert callable(current)  # read_form found it
    setattr(cc, _TARGET, _wrap(current, form, cc))
    return True


def uninstall_hook(cc: Any) -> None:
    """Put JAX's own function back if ours is in place."""
    restore(cc, _TARGET, _WRAPPED)


def _wrap(original: Callable[..., Any], form: int, cc: Any) -> Callable[..., Any]:
    names = next(n for n, f in FORMS.items() if f == form)

    def get_executable_and_time(*args: Any, **kwargs: Any) -> Any:
        session = getattr(
            _jax_cache(cc, args[2] if len(args) > 2 else kwargs.get("backend")), "prefetch", None
        )
        if not isinstance(session, Prefetch):
            return original(*args, **kwargs)
        return session.read(original, names, args, kwargs)

    get_executable_and_time.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(get_executable_and_time, _WRAPPED, original)
    return get_executable_and_time


def _jax_cache(cc: Any, backend: Any) -> Any:
    """JAX's cache: at the process's first read JAX has not built it yet (its own read
    builds it first thing, ``_get_cache``), so it is built here the same way, once."""
    cache = getattr(cc, "_cache", None)
    if cache is not None or backend is None:
        return cache
    build = getattr(cc, "_get_cache", None)
    unsupported = getattr(cc, "_UNSUPPORTED_RUNTIMES", ())
    if not callable(build) or getattr(backend, "runtime_type", None) in unsupported:
        return None  # JAX's read says why it has no cache, once
    try:
        return build(backend)
    except Exception:
        return None  # JAX's own read meets it again and handles it as it does
