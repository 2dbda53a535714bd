"""Zero-code activation of xla_pcache, kept outside the package so that it costs nothing
when the cache variables are unset (importing ``xla_pcache`` itself loads the extension).

JAX calls ``initialize()`` at backend initialisation, before its first compilation, because
this module is advertised as a ``jax_plugins`` entry point. It registers no PJRT backend.
"""

from __future__ import annotations

import os


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
