"""The remote tiers' interface, and the Redis tier: whole verified entry files, shared by
caches without a common disk (object stores: ``xla_pcache.objstore``; chains of tiers:
``xla_pcache.chain``).

What travels is the entry file (header, key, metadata, checksums, payload), so a value damaged
or cut short in Redis fails verification on the way in and is a counted miss, never wrong bytes.
Every remote failure (refused, timeout, server gone mid-transfer, auth) is a miss or a skipped
write, logged once per kind and counted; after a connection failure the remote is left alone
for ``retry_after`` seconds so a dead server costs at most one timeout per interval.
Values larger than ``max_value_bytes`` (Redis' ``proto-max-bulk-len``, 512 MB by default) are
skipped, counted as ``remote_too_large``: not split, because a split value could be evicted
half-way by ``allkeys-lru`` and a 512 MB compiled program is rare enough not to be worth it.

``xla_pcache.store.Store`` reaches the tiers only through the chain (``chain.check_url``,
``chain.open_tier``, ``Chain``); the chain is opened on the first miss or put that needs it, so
a store that is only looked at (``xla-pcache stats``) starts no client, thread or exit hook.
This module imports no other tier module nor the chain: the chain imports the tiers.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from xla_pcache._core import entry_file_len
from xla_pcache._names import EntryName, entry_name_or_none
from xla_pcache._text import package_logger
from xla_pcache.config import DEFAULT_REMOTE_MAX_BYTES, DEFAULT_REMOTE_TIMEOUT_S
from xla_pcache.sizes import parse_duration, parse_size

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = package_logger("xla_pcache")

KEY_PREFIX = "xla_pcache:1:"
# A tier URL's query options that make it read-only.
RO_OPTIONS = ("ro", "read_only")
# The query option that makes a tier serve only signed entries the store trusts
# (``?trust=required``), and its one value.
TRUST_OPTION = "trust"
TRUST_REQUIRED = "required"
# The options shown unredacted: they are the tier's mode, never a secret.
SHOWN_OPTIONS = (*RO_OPTIONS, TRUST_OPTION)


# The first read of a remote value: enough for any entry header (64 bytes, a key of up to
# 4 KiB, metadata of up to 64 KiB), so the header is checked before the rest is read.
HEAD_BYTES = 80 << 10


class Spooled:
    """A remote entry file streamed to an unnamed file in the cache's ``tmp/`` (O_TMPFILE:
    nothing is left there if the process dies) instead of memory; the store reads it once,
    with ``take_entry_fd``, and ``close()`` lets it go."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls, directory: str) -> Spooled:
        flags = os.O_RDWR | os.O_CLOEXEC
        try:
            fd = os.open(directory, flags | os.O_TMPFILE, 0o600)
        except (AttributeError, OSError):
            # No O_TMPFILE here: a named file, unlinked at once (the store sweeps tmp/ of
            # what a crash between the two leaves).
            path = os.path.join(directory, f"remote.{os.urandom(8).hex()}.tmp")
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            os.unlink(path)
        return cls(fd)

    def write_at(self, data: Buffer, offset: int) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        return done

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def reject(tier: Any, kind: str, why: str) -> None:
    """Counts a remote value refused before it was read whole (``remote_rejected``) and
    warns once per kind: another writer of the bucket or server put it there."""
    with tier._lock:
        tier.counters["remote_rejected"] += 1
        first = kind not in tier._warned
        tier._warned.add(kind)
    if first:
        log.warning("xla_pcache: remote cache %s: %s; a miss", tier.url, why)


class Tier(Protocol):
    """What a store asks of the tier behind its directory. Whole entry files travel, keyed by
    entry name; the store verifies what comes back. No method raises: a failure is a miss or
    a skipped write, logged and counted by the tier."""

    url: str

    def get(
        self, name: str, *, max_bytes: int | None = None, spool_dir: str | None = None
    ) -> Buffer | list[Buffer] | Spooled | None:
        """The entry file stored under ``name`` (one buffer, its pieces in order, or a file
        it was spooled to in ``spool_dir``), or None. A value over ``max_bytes``, or whose
        header does not describe an entry filed under ``name`` of the value's size, is
        refused after its first bytes."""

    def put_async(self, name: str, data: Buffer, *, own: bool = False) -> None:
        """Write ``data`` under ``name`` in the background. ``own``: ``name`` is a signer's
        own name for the key (``_core.signed_entry_name``), which only that signer writes:
        its write replaces whatever is there (an object squatting that name)."""

    def count(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to one of the tier's counters (the store counts hits and rejects)."""

    def stats(self) -> dict[str, int | str]:
        """The tier's counters, flat, merged into ``Store.stats()``."""

    def flush(self) -> None:
        """Wait for the writes queued so far."""

    def close(self) -> None:
        """Finish queued writes and let go of connections and threads."""


def redact(url: str) -> str:
    """``url`` safe for logs, stats and doctor: no user name, password or query value but
    the tier's mode (read-only, trust)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return "<unparseable remote URL>"
    netloc = parts.hostname or ""
    if port is not None:
        netloc = f"{netloc}:{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"***@{netloc}"
    query = urllib.parse.urlencode(
        [
            (k, v if k in SHOWN_OPTIONS else "***")
            for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="*",
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


class RemoteTier:
    """One Redis server, reached with short timeouts; writes go through a background thread."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float | str = DEFAULT_REMOTE_TIMEOUT_S,
        max_value_bytes: int | str = DEFAULT_REMOTE_MAX_BYTES,
        retry_after: float | str = 5.0,
    ) -> None:
        try:
            import redis
        except ImportError as e:
            raise ImportError(
                'the remote tier needs the redis client: pip install "xla-pcache[redis]"'
            ) from e
        seconds = parse_duration(timeout, name="timeout")
        if seconds <= 0:
            raise ValueError(f"invalid timeout {timeout!r}: must be positive")
        value_cap = parse_size(max_value_bytes, name="max_value_bytes")
        if not value_cap:
            raise ValueError(f"invalid max_value_bytes {max_value_bytes!r}: must be positive")
        self.url = redact(url)
        self.max_value_bytes = value_cap
        self.retry_after = parse_duration(retry_after, name="retry_after")
        # from_url parses redis://, rediss:// (TLS) and user:password@ itself.
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=seconds, socket_connect_timeout=seconds, retry_on_timeout=False
        )
        self._down_until = 0.0
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xla_pcache-remote")
        atexit.register(self.close)

    def _fail(self, what: str, e: BaseException) -> None:
        with self._lock:
            self.counters[f"remote_{what}_errors"] += 1
            self._down_until = time.monotonic() + self.retry_after
            first = what not in self._warned
            self._warned.add(what)
        if first:
            # The exception text of redis-py never includes the password; the URL is redacted.
            log.warning(
                "xla_pcache: remote cache %s failed (%s: %s); local cache only, retried in %.0f s",
                self.url,
                type(e).__name__,
                e,
                self.retry_after,
            )

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.counters[counter] += n

    def get(
        self, name: str, *, max_bytes: int | None = None, spool_dir: str | None = None
    ) -> bytes | list[Buffer] | None:
        """The raw value stored for entry ``name``, or None (miss or failure, both counted).
        Its length and header come first, in one round trip; the rest is read only for a
        value within ``max_bytes`` whose header describes it."""
        del spool_dir  # values are at most proto-max-bulk-len; held in memory
        if not self._available():
            self.count("remote_skipped")
            return None
        checked = entry_name_or_none(name)
        if checked is None:
            reject(self, "name", "an entry name that is not 32 hex digits was asked for")
            return None
        limit = self.max_value_bytes if max_bytes is None else min(max_bytes, self.max_value_bytes)
        key = KEY_PREFIX + checked
        try:
            pipe = self._client.pipeline(transaction=False)
            pipe.strlen(key)
            pipe.getrange(key, 0, HEAD_BYTES - 1)
            size, head = pipe.execute()
            size, head = int(size), bytes(head)
            if not size:
                self.count("remote_misses")
                return None
            if size > limit:
                reject(self, "too_large", f"a value of {size} bytes is over the limit of {limit}")
                return None
            if entry_file_len(head, name) != size:
                reject(self, "rejected", f"the value for {name} is not a whole entry file")
                return None
            if size <= len(head):
                return head
            # GETRANGE, never GET: a value replaced meanwhile by a larger one is still read
            # only up to the size checked above.
            rest = bytes(self._client.getrange(key, len(head), size - 1))
        except Exception as e:  # any client or socket error is a miss, never the caller's
            self._fail("get", e)
            return None
        if len(head) + len(rest) != size:
            reject(self, "rejected", f"the value for {name} changed while it was read")
            return None
        return [head, rest]

    def put_async(self, name: str, data: Buffer, *, own: bool = False) -> None:
        """Writes ``data`` in the background; too-large values are skipped and counted.
        Redis overwrites (``SET``) whatever the name holds, ``own`` or not."""
        del own
        size = memoryview(data).nbytes
        if size > self.max_value_bytes:
            self.count("remote_too_large")
            if "too_large" not in self._warned:
                self._warned.add("too_large")
                log.warning(
                    "xla_pcache: not writing a %d-byte entry to the remote cache (limit %d bytes)",
                    size,
                    self.max_value_bytes,
                )
            return
        checked = entry_name_or_none(name)
        if checked is None:
            self.count("remote_put_skipped")
            return
        # The Redis client takes bytes only.
        value = data if isinstance(data, bytes) else bytes(data)
        try:
            self._writer.submit(self._put, checked, value)
        except RuntimeError:  # shut down at exit
            self.count("remote_put_skipped")

    def _put(self, name: EntryName, data: bytes) -> None:
        if not self._available():
            self.count("remote_put_skipped")
            return
        try:
            self._client.set(KEY_PREFIX + name, data)
        except Exception as e:
            self._fail("put", e)
            return
        self.count("remote_puts")
        self.count("remote_written_bytes", len(data))

    def flush(self) -> None:
        """Waits for the writes queued so far (each bounded by the timeout)."""
        with contextlib.suppress(RuntimeError):  # closed: nothing is queued
            self._writer.submit(lambda: None).result()

    def close(self) -> None:
        atexit.unregister(self.close)
        self._writer.shutdown(wait=True)
        with contextlib.suppress(Exception):
            self._client.close()

    def stats(self) -> dict[str, int | str]:
        with self._lock:
            out: dict[str, int | str] = dict(self.counters)
        out["remote"] = self.url
        return out
