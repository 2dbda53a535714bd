"""JAX: the backend loading ahead deserializes with, as soon as JAX has it, without ever
starting it.

Activation runs inside JAX's ``xla_bridge.backends()``, in plugin discovery
(``_discover_and_register_pjrt_plugins``), before the backends are made (seconds on a TPU):
the plan can be read and its entries fetched and decompressed then, but deserializing needs
the backend. ``backends()`` then makes them under ``xla_bridge._backend_lock`` and leaves
them in ``_backends`` and the default (the one a jitted program compiles for unless told
otherwise) in ``_default_backend``; both exist under these names from 0.4.36 to 0.12.

``default_backend`` takes that lock for a moment (never while JAX's own thread needs it
long: JAX holds it while making the backends, and a blocking acquire waits out that time
without the GIL) and reads the two, so it sees them whole or not at all. It never calls
``backends()`` or anything that starts a backend: a backend that failed to start, or a JAX
that names these otherwise, is None, and loading ahead then starts from the first cache
read, as it would without this module.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

# How long one look waits for JAX's lock, and how often to look while nothing is there.
_LOCK_WAIT_S = 0.25
_POLL_S = 0.02
_POLL_MAX_S = 0.25
# Looking stops after this long (an install() made long before any JAX computation): the
# first cache read then brings the backend.
_GIVE_UP_S = 600.0


def _bridge() -> Any:
    return importlib.import_module("jax._src.xla_bridge")


def default_backend() -> Any | None:
    """JAX's default backend when its backends are up, else None; never starts one."""
    try:
        xb = _bridge()
        lock = getattr(xb, "_backend_lock", None)
        if lock is None or not callable(getattr(lock, "acquire", None)):
            return None
        if not lock.acquire(timeout=_LOCK_WAIT_S):
            return None
        try:
            made = getattr(xb, "_backends", None)
            backend = getattr(xb, "_default_backend", None)
        finally:
            lock.release()
    except Exception:
        return None
    if not isinstance(made, dict) or not made or backend is None:
        return None
    return backend


def process_index() -> int:
    """This process's index before the backend is up: ``jax.distributed.initialize`` comes
    before the backends start, and the backend's ``process_index()`` then says the same."""
    try:
        state = importlib.import_module("jax._src.distributed").global_state
        return int(getattr(state, "process_id", 0) or 0)
    except Exception:
        return 0


def supported() -> bool:
    """Whether this JAX keeps its backends where ``default_backend`` looks."""
    try:
        xb = _bridge()
    except Exception:
        return False
    return all(hasattr(xb, n) for n in ("_backend_lock", "_backends", "_default_backend"))


def wait(stop: Callable[[float], bool]) -> Any | None:
    """JAX's default backend once it is up, looking every few milliseconds, or None when
    ``stop(seconds)`` (called between looks with how long to pause; it may wait that long
    itself) says to stop, or after ``_GIVE_UP_S``."""
    if not supported():
        return None
    deadline = time.monotonic() + _GIVE_UP_S
    pause = _POLL_S
    while time.monotonic() < deadline:
        backend = default_backend()
        if backend is not None:
            return backend
        if stop(pause):
            return None
        pause = min(pause * 1.5, _POLL_MAX_S)
    return None
