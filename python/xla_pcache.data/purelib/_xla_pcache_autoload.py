"""Zero-code activation of xla_pcache, kept outside the package so that it costs nothing
when the cache variables are unset (importing ``xla_pcache`` itself loads the extension).

JAX calls ``initialize()`` at backend initialisation, before its first compilation, because
this module is advertised as a ``jax_plugins`` entry point. It registers no PJRT backend.

torch_xla has no such extension point: ``xla_pcache_autoload.pth`` calls ``hook_torch_xla()``
at interpreter start-up, which (unless ``XLA_PCACHE_DISABLE`` is set) adds a meta-path finder
that lets ``import torch_xla`` complete and then routes ``torch_xla.runtime.initialize_cache``
through xla_pcache and, when the variables ask for the cache, runs ``xla_pcache.torch_xla``'s
activation, before anything can execute on the XLA device. In a process that never imports
torch_xla the finder only compares one module name per import.
"""

from __future__ import annotations

import os
import sys

# Importing typing at start-up would slow every Python process down (docs/benchmarks.md);
# type checkers read this constant as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# Settings' words (xla_pcache.config._TRUE/_FALSE, held equal by tests/test_config.py): this
# module runs at start-up, where importing the package would load the extension.
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def disabled() -> bool:
    """``XLA_PCACHE_DISABLE`` as Settings reads it. A value Settings refuses (``maybe``)
    leaves activation off, with one warning saying why, as Settings' error would."""
    word = os.environ.get("XLA_PCACHE_DISABLE", "").strip().lower()
    if not word or word in _FALSE:
        return False
    if word not in _TRUE:
        import logging

        logging.getLogger("xla_pcache").warning(
            "xla_pcache: invalid XLA_PCACHE_DISABLE %r: expected 1/0, true/false, yes/no or "
            "on/off; the cache is not activated",
            os.environ.get("XLA_PCACHE_DISABLE", ""),
        )
    return True


def wanted() -> bool:
    """Whether the environment asks for the cache and does not turn activation off."""
    if disabled():
        return False
    return any(
        os.environ.get(name, "").strip()
        for name in (
            "XLA_PERSISTENT_CACHE_PATH",
            "XLA_PCACHE_TORCH_XLA_SHARED_PATH",
            "JAX_COMPILATION_CACHE_DIR",
        )
    )


def initialize() -> None:
    """JAX's plugin hook: never raises (JAX would print a traceback)."""
    if not wanted():
        return
    try:
        from xla_pcache import _activate

        _activate.activate_jax(via="jax_plugins entry point")
    except Exception as exc:  # never break the user's program
        import logging

        logging.getLogger("xla_pcache").warning(
            "xla_pcache: activation for JAX failed, JAX runs without it: %s: %s",
            type(exc).__name__,
            exc,
        )


def _activate_torch_xla() -> None:
    try:
        from xla_pcache import _activate

        _activate.activate_torch_xla(via="xla_pcache_autoload.pth import hook")
    except Exception as exc:  # never break the user's program
        # torch_xla must not find the store's path: it would write in place into it.
        path = os.environ.pop("XLA_PERSISTENT_CACHE_PATH", "").strip()
        if path:
            os.environ["XLA_PCACHE_TORCH_XLA_SHARED_PATH"] = path
        import logging

        logging.getLogger("xla_pcache").warning(
            "xla_pcache: activation for torch_xla failed (%s: %s); torch_xla runs with no "
            "persistent cache (XLA_PERSISTENT_CACHE_PATH is unset in this process, so that "
            "torch_xla does not write in place into the store)",
            type(exc).__name__,
            exc,
        )


def _patch_initialize_cache() -> None:
    """``torch_xla.runtime.initialize_cache`` goes through ``xla_pcache.torch_xla`` (imported
    only when it is called)."""
    try:
        runtime: Any = sys.modules.get("torch_xla.runtime")
        if runtime is None:  # torch_xla's __init__ imports it; should a version not
            import importlib

            runtime = importlib.import_module("torch_xla.runtime")
        original: Any = getattr(runtime, "initialize_cache", None)
        if original is None or getattr(original, "_xla_pcache", False):
            return

        def initialize_cache(path: str, readonly: bool = False) -> None:
            try:
                from xla_pcache import torch_xla as xt
            except Exception as exc:  # the package is broken: torch_xla's own call
                import logging

                logging.getLogger("xla_pcache").warning(
                    "xla_pcache: cannot import xla_pcache.torch_xla (%s: %s); "
                    "initialize_cache is left to torch_xla",
                    type(exc).__name__,
                    exc,
                )
                return original(path, readonly)  # type: ignore[no-any-return]
            if xt._original_initialize_cache is None:
                xt._original_initialize_cache = original
            try:
                xt.initialize_cache(path, readonly)
            except AssertionError:
                raise  # torch_xla's own refusal after the first execution
            except Exception as exc:  # never break the user's program
                import logging

                logging.getLogger("xla_pcache").warning(
                    "xla_pcache: torch_xla.runtime.initialize_cache(%r) failed (%s: %s); "
                    "torch_xla's cache stays as it was set up before the call",
                    path,
                    type(exc).__name__,
                    exc,
                )

        initialize_cache._xla_pcache = True  # type: ignore[attr-defined]
        initialize_cache.__doc__ = original.__doc__
        runtime.initialize_cache = initialize_cache
    except Exception:  # never break the user's program
        pass


def _after_torch_xla_import() -> None:
    _patch_initialize_cache()
    if wanted():
        _activate_torch_xla()


class _TorchXlaFinder:
    """Finds nothing itself: wraps the real loader of ``torch_xla`` so that activation runs
    right after the module has executed (a failed import stays the user's error)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch_xla":
            return None
        try:
            sys.meta_path.remove(self)  # once per process; also keeps the lookup below real
        except ValueError:
            return None
        import importlib.util

        spec: Any = importlib.util.find_spec(name)
        loader: Any = getattr(spec, "loader", None)
        exec_module: Any = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec

        class _Loader:
            def __getattr__(self, attr: str) -> Any:
                return getattr(loader, attr)

            def create_module(self, spec: Any) -> Any:
                create = getattr(loader, "create_module", None)
                return None if create is None else create(spec)

            def exec_module(self, module: Any) -> None:
                exec_module(module)
                _after_torch_xla_import()

        spec.loader = _Loader()
        return spec


def hook_torch_xla() -> None:
    """Run by the ``.pth`` file at start-up: one environment look-up and a finder."""
    try:
        if disabled() or "torch_xla" in sys.modules:
            return
        if not any(isinstance(f, _TorchXlaFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _TorchXlaFinder())
    except Exception:  # a .pth line must never stop the interpreter from starting
        pass
