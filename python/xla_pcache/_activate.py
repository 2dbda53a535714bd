"""Activation from the environment alone (see ``_xla_pcache_autoload``, shipped in the wheel).

Every failure here is one logged warning: activation must never break the user's program.
"""

from __future__ import annotations

from xla_pcache._text import package_logger
from xla_pcache.config import Settings

logger = package_logger("xla_pcache")


def disabled() -> bool:
    """``XLA_PCACHE_DISABLE``; a malformed value (neither true nor false) counts as not
    disabled, and the warning comes from the adapter that then reads the settings."""
    try:
        return Settings.from_env().disabled
    except ValueError:
        return False


def activate_jax(via: str) -> None:
    """Install the JAX adapter unless disabled or an explicit ``install()`` came first."""
    if disabled():
        return
    try:
        from xla_pcache import jax as xj

        xj._auto_install(via)
    except Exception as exc:
        logger.warning(
            "xla_pcache: activation for JAX failed, JAX runs without it: %s: %s",
            type(exc).__name__,
            " ".join(str(exc).split()),
        )


def activate_torch_xla(via: str) -> None:
    """Install the torch_xla adapter right after ``import torch_xla`` unless disabled or an
    explicit ``install()`` is the caller (it then proceeds with its own arguments)."""
    if disabled():
        return
    try:
        from xla_pcache import torch_xla as xt

        xt._auto_install(via)
    except Exception as exc:
        # _auto_install has taken the store's path out of torch_xla's sight.
        logger.warning(
            "xla_pcache: activation for torch_xla failed (%s: %s); torch_xla runs with no "
            "persistent cache (XLA_PERSISTENT_CACHE_PATH is unset in this process, so that "
            "torch_xla does not write in place into the store)",
            type(exc).__name__,
            " ".join(str(exc).split()),
        )
