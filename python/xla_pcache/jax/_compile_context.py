"""JAX: what one compile keeps on its thread between the cache's read and its put.

JAX compiles a program in ``jax._src.compiler.compile_or_get_cached``: it computes the key,
reads the cache (``get``), compiles on a miss and puts, all on the calling thread. What the
adapter learns at the read and needs at the put lives in that call's ``CompileContext``: the
compile claims single flight took (``_single_flight``: released when the call ends, whatever
it did), the key's capture the miss made (``_keyparts``: its components for ``explain``, what
the put's record is made of) and, while the key is computed again, where JAX's component
functions are collected. The function is wrapped once at installation (``install_hook``);
each call enters a context of its own (calls nest: a compile inside a compile is another
context), and a thread outside any call has one of its own (``here``), so nothing of one
call leaks into another's put.

This module imports nothing from JAX; ``xla_pcache.jax`` hands it the module to wrap.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from xla_pcache._text import package_logger
from xla_pcache.jax._patch import restore

logger = package_logger("xla_pcache.jax")

_WRAPPED = "__xla_pcache_wrapped__"
_TARGET = "compile_or_get_cached"
# Captures a context keeps (a call reads a few keys; a thread outside any call, more).
MAX_CAPTURES = 64


class Releasable(Protocol):
    def release(self) -> None: ...


class CompileContext:
    """One compile's state on its thread."""

    __slots__ = ("captures", "claims", "sink")

    def __init__(self) -> None:
        # Compile claims single flight took in this call, by store key.
        self.claims: dict[str, Releasable] = {}
        # Keys this call computed again (``_keyparts.Capture``, or None where it failed),
        # kept from the miss for the put.
        self.captures: dict[str, Any] = {}
        # JAX's component functions, collected while a key is computed again; None outside.
        self.sink: list[Any] | None = None

    def keep(self, key: str, capture: Any) -> None:
        if key not in self.captures and len(self.captures) >= MAX_CAPTURES:
            self.captures.pop(next(iter(self.captures)))
        self.captures[key] = capture

    def release(self) -> None:
        """The call ended: every claim it took and its put did not release is released."""
        for key, claim in self.claims.items():
            try:
                claim.release()
            except Exception as exc:  # a cache failure must not replace the compile's outcome
                logger.debug("xla_pcache: releasing the compile claim on %r failed: %s", key, exc)
        self.claims.clear()


_local = threading.local()


def current() -> CompileContext | None:
    """The context of the innermost ``compile_or_get_cached`` call on this thread, or None
    outside any."""
    stack: list[CompileContext] | None = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def here() -> CompileContext:
    """The innermost call's context, else this thread's own."""
    found = current()
    if found is not None:
        return found
    own: CompileContext | None = getattr(_local, "own", None)
    if own is None:
        own = _local.own = CompileContext()
    return own


@contextmanager
def entered() -> Iterator[CompileContext]:
    """A call's context: current inside, released and gone after."""
    stack: list[CompileContext] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    context = CompileContext()
    stack.append(context)
    try:
        yield context
    finally:
        stack.pop()
        context.release()


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile_or_get_cached(*args: Any, **kwargs: Any) -> Any:
        with entered():
            return original(*args, **kwargs)

    setattr(compile_or_get_cached, _WRAPPED, original)
    return compile_or_get_cached


def install_hook(compiler: Any) -> bool:
    """Wrap ``compiler.compile_or_get_cached`` (once). False when it is not there: then no
    read or put has a call's context (single flight neither claims nor waits)."""
    current_fn = getattr(compiler, _TARGET, None)
    if not callable(current_fn):
        logger.info(
            "xla_pcache: this JAX has no %s.%s; single flight is off (every process that "
            "misses compiles)",
            getattr(compiler, "__name__", "compiler"),
            _TARGET,
        )
        return False
    if getattr(current_fn, _WRAPPED, None) is None:
        setattr(compiler, _TARGET, _wrap(current_fn))
    return True


def uninstall_hook(compiler: Any) -> None:
    """Put the original ``compile_or_get_cached`` back if ours is in place."""
    restore(compiler, _TARGET, _WRAPPED)
