"""Zero-code activation of xla_pcache, kept outside the package so that it costs nothing
when the cache variables are unset (importing ``xla_pcache`` itself loads the extension).

JAX calls ``initialize()`` at backend initialisation, before its first compilation, because
this module is advertised as a ``jax_plugins`` entry point. It registers no PJRT backend.

torch_xla has no such extension point: ``xla_pcache_autoload.pth`` calls ``hook_torch_xla()``
at interpreter start-up, which (only when the variables ask for the cache) adds a meta-path
finder that lets ``import torch_xla`` complete and then runs ``xla_pcache.torch_xla``'s
activation, before anything can execute on the XLA device.
"""

from __future__ import annotations

import os
import sys

# Importing typing at start-up would cost ~10 ms in every Python process; type checkers
# read this constant as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def wanted() -> bool:
    """Whether the environment asks for the cache and does not turn activation off."""
    if os.environ.get("XLA_PCACHE_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"):
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
        import logging

        logging.getLogger("xla_pcache").warning(
            "xla_pcache: activation for torch_xla failed, torch_xla runs without it: %s: %s",
            type(exc).__name__,
            exc,
        )


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
                _activate_torch_xla()

        spec.loader = _Loader()
        return spec


def hook_torch_xla() -> None:
    """Run by the ``.pth`` file at start-up: costs a few environment look-ups when unset."""
    try:
        if not wanted() or "torch_xla" in sys.modules:
            return
        if not any(isinstance(f, _TorchXlaFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _TorchXlaFinder())
    except Exception:  # a .pth line must never stop the interpreter from starting
        pass
