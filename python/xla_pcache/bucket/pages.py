"""A listing's requests, each answered within a bound of time and in key order, whatever
the service (or whatever answers for it) sends.

object_store follows a listing's continuation token for as long as a page gives one. A
service that answers pages holding no key and the same token again keeps one call of
obstore's iterator requesting for ever: no request times out (each is answered at once),
the caller never gets a chunk to count, and Ctrl-C waits for the call to return, so a host
start or a prune never ended (measured: 18,400 requests in ten minutes, SIGINT ignored). One
that answers the same keys again yields them for ever. So each chunk, and each listing with
a delimiter (object_store gathers every page of it before returning), is awaited on a loop
of this module's own thread (a caller's running loop, a notebook's, is never in the way)
within ``wait_s``; a wait that ends cancels the client's request loop. And a chunk's keys
must come after every key before them, as S3 and GCS list them. Either failure is a
``ListingStalled``, a listing that failed: the caller stops there and says so.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


class ListingStalled(Exception):
    """A listing the service did not answer within the bound, or answered with a key that
    does not come after the one before it (a continuation that goes round)."""


def _runner() -> asyncio.AbstractEventLoop:
    """The loop of this module's thread (made again in a forked child, where it is gone)."""
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="xla_pcache-listing", daemon=True
            ).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def _within(make: Callable[[], Awaitable[T]], wait_s: float, what: str) -> T:
    """What ``make()`` (called on the loop's thread, where obstore's awaitables must be
    made) gives, within ``wait_s`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(make(), wait_s)

    try:
        return asyncio.run_coroutine_threadsafe(bounded(), _runner()).result()
    except TimeoutError:
        raise ListingStalled(f"{what}: no answer within {wait_s:.0f} s") from None


def chunks(
    store: Any, prefix: str, *, offset: str | None, chunk_size: int, wait_s: float
) -> Iterator[Sequence[Any]]:
    """``obstore.list(store, prefix, offset=, chunk_size=)``'s chunks, each within
    ``wait_s`` seconds, every key after the one before it (after ``offset``)."""
    import obstore

    stream = obstore.list(store, prefix, offset=offset, chunk_size=chunk_size)
    ahead = stream.__aiter__()
    last = offset
    while True:
        try:
            chunk = _within(ahead.__anext__, wait_s, f"listing {prefix}/")
        except StopAsyncIteration:
            return
        for meta in chunk:
            path = str(meta["path"])
            if last is not None and path <= last:
                raise ListingStalled(
                    f"listing {prefix}/: {path!r} came after {last!r} (the service went round)"
                )
            last = path
        yield chunk


def delimited(store: Any, prefix: str, *, wait_s: float) -> Any:
    """``obstore.list_with_delimiter(store, prefix)`` within ``wait_s`` seconds."""
    import obstore

    return _within(
        lambda: obstore.list_with_delimiter_async(store, prefix),
        wait_s,
        f"listing {prefix}/ with a delimiter",
    )
