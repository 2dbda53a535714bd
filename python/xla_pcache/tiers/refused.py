"""Values a fetch refused, told to whoever watches this thread's fetches: what lets a
writing host of a bucket remove the garbage it proved to be garbage
(``bucket/torch_xla_garbage.py``).

Two places tell: a tier that read an object's first bytes and found no entry file of the
name asked for there (``ObjectTier.get``: no header that decodes, a header filed under
another name, a length the object does not have, no bytes at all), with no value; and the
chain, whose ``accept`` (the core's gate) refused a value read whole, with the value (why
it was refused, corrupt or merely untrusted, is the watcher's to ask the core). Neither
tells of a value over a size limit, a read that failed or timed out, or a name asked for
that is no entry name: those prove nothing of the object. No one watches but a torch_xla
host start; every other fetch tells no one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from xla_pcache._text import package_logger

log = package_logger("xla_pcache")

# (tier, entry name, the value refused whole or None for one the tier refused by its first
# bytes): called in the thread that fetched, before the value is let go.
Watcher = Callable[[Any, str, Any], None]

_watch = threading.local()


@contextlib.contextmanager
def watching(watcher: Watcher) -> Iterator[None]:
    """Tells ``watcher`` of each value this thread's fetches refuse within the block."""
    before = getattr(_watch, "fn", None)
    _watch.fn = watcher
    try:
        yield
    finally:
        _watch.fn = before


def seen(tier: Any, name: str, value: Any = None) -> None:
    """A value of ``tier`` under entry name ``name`` was refused (``value``: what was read
    whole, or None when the tier refused it by its first bytes). A watcher that fails is
    logged and forgotten: the fetch goes on."""
    fn = getattr(_watch, "fn", None)
    if fn is None:
        return
    try:
        fn(tier, name, value)
    except Exception as e:  # never the fetch's: it is a miss either way
        log.debug("xla_pcache: a refused value's watcher failed (%s: %s)", type(e).__name__, e)
