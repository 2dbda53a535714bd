"""A Redis remote tier: whole verified entry files, shared by caches without a common disk.

What travels is the entry file (header, key, metadata, checksums, payload), so a value damaged
or cut short in Redis fails verification on the way in and is a counted miss, never wrong bytes.
Every remote failure (refused, timeout, server gone mid-transfer, auth) is a miss or a skipped
write, logged once per kind and counted; after a connection failure the remote is left alone
for ``retry_after`` seconds so a dead server costs at most one timeout per interval.
Values larger than ``max_value_bytes`` (Redis' ``proto-max-bulk-len``, 512 MB by default) are
skipped, counted as ``remote_too_large``: not split, because a split value could be evicted
half-way by ``allkeys-lru`` and a 512 MB compiled program is rare enough not to be worth it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from xla_pcache.sizes import parse_duration, parse_size

if TYPE_CHECKING:
    from xla_pcache.chain import Chain

log = logging.getLogger("xla_pcache")

REMOTE_VAR = "XLA_PCACHE_REMOTE"
TIMEOUT_VAR = "XLA_PCACHE_REMOTE_TIMEOUT"
MAX_VALUE_VAR = "XLA_PCACHE_REMOTE_MAX_BYTES"
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_VALUE = 512 << 20
KEY_PREFIX = "xla_pcache:1:"


def redact(url: str) -> str:
    """The URL without its password (and user name), safe for logs, stats and doctor."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable remote URL>"
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, f"***@{host}", parts.path, "", ""))


def _env(name: str) -> str | None:
    # An empty variable means unset, as for every other variable (config.py).
    value = os.environ.get(name, "")
    return value if value.strip() else None


def open_tier(url: str, settings: Any = None, *, read_only: bool | None = None) -> Chain:
    """The remote tiers named by ``url`` (a comma-separated chain, see ``xla_pcache.chain``)
    behind the one-tier interface the store uses. Never raises for a URL it cannot use
    (that tier is dropped with a warning); a malformed timeout or size setting is a
    ``ValueError`` naming it."""
    from xla_pcache.chain import open_chain

    return open_chain(url, settings, read_only=read_only)


def remote_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    raw = environ.get(REMOTE_VAR, "").strip()
    return raw or None


class RemoteTier:
    """One Redis server, reached with short timeouts; writes go through a background thread."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float | str | None = None,
        max_value_bytes: int | str | None = None,
        retry_after: float | str = 5.0,
    ) -> None:
        try:
            import redis
        except ImportError as e:
            raise ImportError(
                'the remote tier needs the redis client: pip install "xla-pcache[redis]"'
            ) from e
        if timeout is None:
            raw_timeout: float | str = _env(TIMEOUT_VAR) or DEFAULT_TIMEOUT
            timeout_name = TIMEOUT_VAR
        else:
            raw_timeout, timeout_name = timeout, "timeout"
        seconds = parse_duration(raw_timeout, name=timeout_name)
        if seconds <= 0:
            raise ValueError(f"invalid {timeout_name} {raw_timeout!r}: must be positive")
        if max_value_bytes is None:
            raw_cap: int | str = _env(MAX_VALUE_VAR) or DEFAULT_MAX_VALUE
            value_cap = parse_size(raw_cap, name=MAX_VALUE_VAR)
        else:
            value_cap = parse_size(max_value_bytes, name="max_value_bytes")
        assert value_cap is not None
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

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def get(self, name: str) -> bytes | None:
        """The raw value stored for entry ``name``, or None (miss or failure, both counted)."""
        if not self._available():
            self.count("remote_skipped")
            return None
        try:
            value = self._client.get(KEY_PREFIX + name)
        except Exception as e:  # any client or socket error is a miss, never the caller's
            self._fail("get", e)
            return None
        if value is None:
            self.count("remote_misses")
            return None
        return bytes(value)

    def put_async(self, name: str, data: bytes) -> None:
        """Writes ``data`` in the background; too-large values are skipped and counted."""
        if len(data) > self.max_value_bytes:
            self.count("remote_too_large")
            if "too_large" not in self._warned:
                self._warned.add("too_large")
                log.warning(
                    "xla_pcache: not writing a %d-byte entry to the remote cache (limit %d bytes)",
                    len(data),
                    self.max_value_bytes,
                )
            return
        try:
            self._writer.submit(self._put, name, data)
        except RuntimeError:  # shut down at exit
            self.count("remote_put_skipped")

    def _put(self, name: str, data: bytes) -> None:
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
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        with contextlib.suppress(Exception):
            self._client.close()

    def stats(self) -> dict[str, int | str]:
        with self._lock:
            out: dict[str, int | str] = dict(self.counters)
        out["remote"] = self.url
        return out
