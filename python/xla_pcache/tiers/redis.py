"""The Redis tier: whole verified entry files in one Redis server, shared by caches without a
common disk.

What travels is the entry file (header, key, metadata, checksums, payload), so a value damaged
or cut short in Redis fails verification on the way in and is a counted miss, never wrong bytes.
Every remote failure (refused, timeout, server gone mid-transfer, auth) is a miss or a skipped
write, logged once per kind and counted, with the back-off every tier keeps (``base.TierBase``).
Values larger than ``max_value_bytes`` (Redis' ``proto-max-bulk-len``, 512 MB by default) are
skipped, counted as ``remote_too_large``: not split, because a split value could be evicted
half-way by ``allkeys-lru`` and a 512 MB compiled program is rare enough not to be worth it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from xla_pcache import _core
from xla_pcache._names import EntryName
from xla_pcache.config import DEFAULT_REMOTE_MAX_BYTES, DEFAULT_REMOTE_TIMEOUT_S
from xla_pcache.sizes import parse_duration, parse_size
from xla_pcache.tiers.base import HEAD_BYTES, TierBase, hide_url_secrets, redact

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from xla_pcache.tiers.base import Spool

KEY_PREFIX = "xla_pcache:1:"


class RedisTier(TierBase):
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
        value_cap = parse_size(max_value_bytes, name="max_value_bytes") or 0
        try:
            value_cap = _core.check_size("max_value_bytes", value_cap)
        except ValueError:
            raise ValueError(
                f"invalid max_value_bytes {max_value_bytes!r}: must be positive"
            ) from None
        retry = parse_duration(retry_after, name="retry_after")
        self.url = redact(url)
        self.max_value_bytes = value_cap
        # Kept to hide its secrets from every message about this tier (never shown).
        self._raw_url = url
        # from_url parses redis://, rediss:// (TLS) and user:password@ itself. Its errors
        # may quote a part of the URL it could not parse (a port cut out of a password):
        # hidden. The URL shown is redacted.
        try:
            self._client: Any = redis.Redis.from_url(
                url,
                socket_timeout=seconds,
                socket_connect_timeout=seconds,
                retry_on_timeout=False,
            )
        except Exception:
            # Its text is not kept: it may quote a piece of a password.
            raise ValueError(
                "not a URL the Redis client can parse; percent-encode ',', '?', '#', '@', "
                "'/' and '%' in credentials"
            ) from None
        super().__init__(retry_after=retry, thread_name="xla_pcache-remote")

    def get(
        self, name: str, *, max_bytes: int | None, spool: Spool | None
    ) -> bytes | list[Buffer] | _core.Refusal | None:
        """The raw value stored for entry ``name``, or None (miss or failure, both counted).
        Its length and header come first, in one round trip; the rest is read only for a
        value within ``max_bytes`` whose header describes it."""
        del spool  # values are at most proto-max-bulk-len; held in memory
        checks = self._checked(name, max_bytes)
        if checks is None:
            return None
        checked, limit = checks
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
                self.reject("too_large", f"a value of {size} bytes is over the limit of {limit}")
                return None
            refused, verdict = self.judge_head(
                checked, head, size, whole=len(head) == min(size, HEAD_BYTES)
            )
            if refused:
                return verdict
            if size <= len(head):
                return head
            # GETRANGE, never GET: a value replaced meanwhile by a larger one is still read
            # only up to the size checked above.
            rest = bytes(self._client.getrange(key, len(head), size - 1))
        except Exception as e:  # any client or socket error is a miss, never the caller's
            if "WRONGTYPE" in str(e):
                # Another writer put a list, set or hash at the name: a value refused, as
                # garbage is, not a failure of the server (which would leave the tier
                # alone, and every other name with it, for retry_after).
                self.reject("wrongtype", f"the value for {name} is not a string")
            else:
                self.fail("get", e)
            return None
        if len(head) + len(rest) != size:
            self.reject("rejected", f"the value for {name} changed while it was read")
            return None
        return [head, rest]

    def _describe(self, e: BaseException) -> str:
        return hide_url_secrets(str(e), self._raw_url)

    def _payload(self, data: Buffer) -> bytes:
        # The Redis client takes bytes only.
        return data if isinstance(data, bytes) else bytes(data)

    def _write(self, name: EntryName, data: bytes, mode: str) -> None:
        # Redis overwrites (``SET``) whatever the name holds, whatever the mode: the last
        # writer wins (docs/remote.md), a later release's value too.
        try:
            self._client.set(KEY_PREFIX + name, data)
        except Exception as e:
            self.fail("put", e)
            return
        self.count("remote_puts")
        self.count("remote_written_bytes", len(data))

    def close(self) -> None:
        super().close()
        with contextlib.suppress(Exception):
            self._client.close()
