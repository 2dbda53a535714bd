"""JAX: the private objects of JAX the adapter relies on, found by feature detection
(``find``: one ``CacheError`` naming what is missing), the options it sets, and what it asks
JAX about its process (the producer's metadata, the backend's platform, whether it writes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from xla_pcache._core import CacheError
from xla_pcache.jax import _adopt

# What CI runs the adapter tests against; the range install() accepts.
MIN_JAX = (0, 4, 36)
SUPPORTED_JAX = "jax >= 0.4.36 (CI tests 0.4.36, 0.7.2, 0.10.2 and 0.12.1)"

# JAX's default for this option asks XLA to keep GPU autotune results in a sub-directory
# of the cache directory. On jax 0.10.x that sub-directory's absolute path is part of every
# cache key (fixed in 0.11), so the same program misses when the cache is mounted
# elsewhere; and it would put loose files inside the store's root. Executables in the
# store already contain the autotuned code, so install() turns these side caches off.
XLA_CACHES_OPTION = "jax_persistent_cache_enable_xla_caches"
CACHE_DIR_OPTION = "jax_compilation_cache_dir"
RAISE_ERRORS_OPTION = "jax_raise_persistent_cache_errors"


@dataclasses.dataclass(frozen=True)
class Hooks:
    """The private JAX objects this adapter relies on, found by feature detection."""

    jax: Any
    cc: Any  # jax._src.compilation_cache
    cache_interface: type
    verification_cache: Any  # class or None on JAX versions without the wrapper
    has_xla_caches_option: bool
    needs_path_workaround: bool = True
    compiler: Any = None  # jax._src.compiler, whose compile_or_get_cached single flight wraps


def find() -> Hooks:
    """Import jax and check for every hook; one CacheError naming what is missing."""
    try:
        import jax
        from jax._src import compilation_cache as cc
        from jax._src import compilation_cache_interface as cci
    except ImportError as exc:
        raise CacheError(
            f"xla_pcache.jax needs {SUPPORTED_JAX}; importing it failed: {exc}. "
            'Install it with `pip install "xla-pcache[jax]"`.'
        ) from exc
    version = _adopt.version_tuple(str(getattr(jax, "__version__", "0")))
    if version < MIN_JAX:
        raise CacheError(
            f"xla_pcache.jax supports {SUPPORTED_JAX}; this is jax {jax.__version__}. "
            'Upgrade it (`pip install -U "jax[cpu]"`) or set XLA_PCACHE_DISABLE=1.'
        )
    missing = [
        name
        for name, ok in (
            ("compilation_cache.get_file_cache", callable(getattr(cc, "get_file_cache", None))),
            ("compilation_cache.reset_cache", callable(getattr(cc, "reset_cache", None))),
            ("compilation_cache._cache", hasattr(cc, "_cache")),
            ("compilation_cache_interface.CacheInterface", hasattr(cci, "CacheInterface")),
            (CACHE_DIR_OPTION, CACHE_DIR_OPTION in jax.config.values),
        )
        if not ok
    ]
    if missing:
        raise CacheError(
            f"xla_pcache.jax supports {SUPPORTED_JAX}; jax {jax.__version__} lacks "
            f"{', '.join(missing)}"
        )
    return Hooks(
        jax=jax,
        cc=cc,
        cache_interface=cci.CacheInterface,
        verification_cache=getattr(cc, "VerificationCache", None),
        has_xla_caches_option=XLA_CACHES_OPTION in jax.config.values,
        needs_path_workaround=_adopt.keys_hold_the_path(str(jax.__version__)),
        compiler=compiler_module(),
    )


def compiler_module() -> Any:
    try:
        from jax._src import compiler
    except ImportError:
        return None
    return compiler


def writes_cache() -> bool:
    """Whether JAX would put what this process compiles: it writes from process 0 only."""
    try:
        from jax._src import distributed

        return int(getattr(distributed.global_state, "process_id", 0) or 0) == 0
    except Exception:
        return True


def producer_meta(hooks: Hooks) -> dict[str, str]:
    meta = {"framework": "jax", "framework_version": str(hooks.jax.__version__)}
    try:
        import jaxlib

        meta["jaxlib_version"] = str(getattr(jaxlib, "__version__", "unknown"))
    except Exception:
        pass
    return meta


def backend_platform(hooks: Hooks) -> str | None:
    """The default backend's platform, when backends are already up (they are by the time
    JAX first builds its cache, during a compilation); never initialize them here."""
    try:
        from jax._src import xla_bridge

        if not getattr(xla_bridge, "_backends", None):
            return None
        return str(xla_bridge.get_backend().platform)
    except Exception:
        return None
