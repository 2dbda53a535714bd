"""What every kind of remote tier shares: the interface the chain asks of a tier (``Tier``),
the one parser of a tier URL's mode options (``?ro=``, ``?trust=``: ``parse_tier_url``, a
``TierURL``), redaction, spooling, and the bookkeeping each kind keeps the same way
(``TierBase``).

The bookkeeping: counters, warnings logged once per kind, the back-off after a failure (the
tier is left alone for ``retry_after`` seconds, so a dead server costs at most one timeout
per interval), the checks every read makes before it asks the server, and the background
writer thread every write goes through. A kind of tier (``redis.py``, ``objstore.py``) adds
how it reads (``get``) and how it writes one entry (``_write``); the chain (``chain.py``) puts
them in order. A tier marked ``?ro=1`` is opened as a ``ReadOnlyTier`` (``read_only.py``),
which has no write.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import re
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from xla_pcache import _core
from xla_pcache._names import EntryName, entry_name_or_none
from xla_pcache._text import package_logger
from xla_pcache._url import REDIS_SCHEMES

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = package_logger("xla_pcache")

# A tier URL's query options that make it read-only.
RO_OPTIONS = ("ro", "read_only")
# The query option that makes a tier serve only signed entries the store trusts
# (``?trust=required``), and its one value.
TRUST_OPTION = "trust"
TRUST_REQUIRED = "required"
# The options that say a tier's mode, parsed here for every kind of tier; they are shown
# unredacted: they are the tier's mode, never a secret.
MODE_OPTIONS = (*RO_OPTIONS, TRUST_OPTION)

# The first read of a remote value: enough for any entry header (64 bytes, a key of up to
# 4 KiB, metadata of up to 64 KiB), so the header is checked before the rest is read.
HEAD_BYTES = 80 << 10


class Spooled:
    """A remote entry file streamed to an unnamed file in the cache's ``tmp/`` instead of
    memory (the store opens it, beneath its root with no link followed: ``Store._spool_fd``;
    nothing is left there if the process dies); the store reads it once, with
    through the fetch's ``accept``, and ``close()`` lets it go."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

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


# What makes the file a large remote entry is streamed to (``Store._spool_fd``).
Spool: TypeAlias = Callable[[], Spooled]
# What a tier's ``get`` answers: one buffer, the pieces of one in order, a ``Spooled`` file,
# the core's verdict on an object it refused by its first bytes (``TierBase.judge_head``),
# or None (a miss, a failure, or a refusal that proves nothing of the object).
Fetched: TypeAlias = "Buffer | list[Buffer] | Spooled | _core.Refusal | None"


class Tier(Protocol):
    """What the chain asks of one tier. Whole entry files travel, keyed by entry name; the
    store verifies what comes back. No method raises: a failure is a miss or a skipped
    write, logged and counted by the tier."""

    url: str

    def get(self, name: str, *, max_bytes: int | None, spool: Spool | None) -> Fetched:
        """The entry file stored under ``name`` (one buffer, its pieces in order, or a file
        it was streamed to, made by ``spool``: ``OSError`` or ``CacheError`` when none can
        be), or None. A value over ``max_bytes`` is refused after its first bytes (None),
        and so is one whose header does not describe an entry filed under ``name`` of the
        value's size: the core's verdict on them is returned (a later release's entry is
        ``newer_format``, never garbage)."""

    def put_async(
        self, name: str, data: Buffer, *, replace: bool = False, own: bool = False
    ) -> None:
        """Write ``data`` under ``name`` in the background: created (the first writer wins)
        unless ``replace``, which overwrites what the name holds but a later release's entry
        (a plain name, shared by every release: ``Store.replace``'s record that changes);
        with ``own`` too, whatever is there: a signer's own name for the key
        (``_core.signed_entry_name``: this format's, where only that signer writes, so its
        write replaces whatever squats the name)."""

    def stats(self) -> dict[str, int | str]:
        """The tier's counters, flat, merged into ``Store.stats()``."""

    def flush(self) -> None:
        """Wait for the writes queued so far."""

    def close(self) -> None:
        """Finish queued writes and let go of connections and threads."""


# What redaction shows of a URL, each part only when it matches here; anything else is
# never shown, whatever it holds.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,15}")
_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]")
_PORT = re.compile(r"[0-9]{1,5}")
_PATH = re.compile(r"(/[A-Za-z0-9._~-]*)*")
_MODE_VALUE = re.compile(r"[A-Za-z0-9_]{0,16}")
UNPARSEABLE_URL = "<unparseable remote URL>"
HIDDEN_DETAILS = "details hidden: they may quote the URL's credentials"


class _Split:
    """A URL cut into the parts redaction may show and those it never shows (``hidden``),
    by rules that need no valid URL: a password may hold ``,``, ``?``, ``#``, ``@``, ``%``
    or ``/`` unencoded, and every way it is cut still hides all of it."""

    def __init__(self, url: str) -> None:
        self.shown: str | None = None
        self.hidden: list[str] = []
        text = url.strip()
        scheme, sep, rest = text.partition("://")
        if not sep or not _SCHEME.fullmatch(scheme):
            self._hide(text)
            return
        # Everything up to the last '@' is credentials (a password may hold '@', '/', '?') in
        # the URLs that carry one. Any other URL carries none, so an '@' after its host (in a
        # path, a query or a fragment: a token such as `s3://b/p?tok@en`) may end no
        # credentials and start no host: read either way, nothing after the scheme is shown.
        cred, at, after = rest.rpartition("@")
        if at and scheme.lower() not in REDIS_SCHEMES and re.search(r"[/?#]", cred):
            self._hide(rest)
            self.shown = f"{scheme}://***"
            return
        rest = after
        if at:
            self._hide(cred)
        rest, hash_, fragment = rest.partition("#")
        if hash_:
            self._hide(fragment)
        rest, qmark, query = rest.partition("?")
        slash = rest.find("/")
        authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
        if authority.startswith("["):
            host, close, after = authority.partition("]")
            host += close
            port_sep, port = after[:1], after[1:]
            if after and port_sep != ":":
                host, port_sep, port = authority, "", ""
        else:
            host, port_sep, port = authority.partition(":")
        netloc = "***@" if at else ""
        if port_sep and not _PORT.fullmatch(port):
            # `user:secret` cut from its '@' (a password holding ','): neither half shows.
            netloc += "***"
            self._hide(authority)
        elif host and not _HOST.fullmatch(host):
            netloc += "***"
            self._hide(host)
        else:
            netloc += host + (f":{port}" if port_sep else "")
        if not _PATH.fullmatch(path):
            self._hide(path)
            path = "/***"
        opts = []
        for part in query.split("&") if qmark else ():
            k, eq, v = part.partition("=")
            if k in MODE_OPTIONS and _MODE_VALUE.fullmatch(v):
                opts.append(f"{k}={v}" if eq else k)
            else:
                opts.append("***")
                self._hide(part)
        self.shown = f"{scheme}://{netloc}{path}" + ("?" + "&".join(opts) if opts else "")

    def _hide(self, part: str) -> None:
        # The part, and each run of letters and digits in it: another parser may cut it
        # anywhere else (redis-py ends the host at a '#', and quotes what it took for a port).
        self.hidden.append(part)
        self.hidden += re.split(r"[^A-Za-z0-9]+", part)


def redact(url: object) -> str:
    """``url`` safe for logs, stats and doctor: its scheme, host, port and path where each
    is plainly one, and the tier's mode options (read-only, trust); never a user name, a
    password, another option or a fragment. It cannot fail open: text that does not parse
    shows as ``<unparseable remote URL>``, never in part."""
    try:
        shown = _Split(url).shown if isinstance(url, str) else None
    except Exception:
        shown = None
    return UNPARSEABLE_URL if shown is None else shown


def hide_url_secrets(text: str, url: str) -> str:
    """``text`` (an exception's message about ``url``) without any part of ``url`` that
    ``redact`` would not show, percent-decoded or not: each is replaced by ``***``. A part
    too short to replace without garbling the message (under 4 characters) that the message
    quotes as a word of its own makes the whole message give way to a note that it was
    hidden; so does a ``url`` that cannot be cut. It never fails open."""
    try:
        hidden = _Split(url).hidden
    except Exception:
        return HIDDEN_DETAILS
    pieces = {p for h in hidden for p in (h, urllib.parse.unquote(h)) if p}
    for piece in sorted(pieces, key=len, reverse=True):
        if len(piece) >= 4:
            text = text.replace(piece, "***")
        elif re.search(rf"(?<![A-Za-z0-9]){re.escape(piece)}(?![A-Za-z0-9])", text):
            return HIDDEN_DETAILS
    return text


@dataclass(frozen=True)
class TierURL:
    """A tier's URL, parsed once (``parse_tier_url``): ``text`` as given (blanks stripped),
    ``bare`` without its mode options, and the mode they set. ``error`` says why its
    options cannot be read (a value ``?ro=`` or ``?trust=`` does not take, a URL that does
    not split): such a tier is dropped with a warning when the chain opens, and nothing of
    it is used before."""

    text: str
    bare: str
    scheme: str = ""
    read_only: bool = False
    trust_required: bool = False
    error: str | None = None

    def checked(self) -> TierURL:
        """Itself, or ``ValueError`` with ``error``."""
        if self.error is not None:
            raise ValueError(self.error)
        return self

    def as_read_only(self) -> TierURL:
        """The same tier marked read-only: ``?ro=1`` in place of any read-only option it
        had (what a read-only process makes of every tier of a bucket path's chain)."""
        if self.error is not None:
            return self
        parts = urllib.parse.urlsplit(self.text)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, v) for k, v in query if k not in RO_OPTIONS] + [("ro", "1")]
        text = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
        return dataclasses.replace(self, text=text, read_only=True)


def parse_tier_url(url: str) -> TierURL:
    """The one parser of a tier URL's mode options, for every kind of tier: ``?ro=`` /
    ``?read_only=`` (a boolean; empty is true) and ``?trust=required``. The other options
    stay in ``bare`` for the kind to take or refuse. Never raises: what cannot be read is
    ``TierURL.error``, naming the option."""
    from xla_pcache.config import parse_bool

    text = url.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        read_only = trust = False
        rest = []
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
            if k in RO_OPTIONS:
                read_only = parse_bool(v or "1", k)
            elif k == TRUST_OPTION:
                if v != TRUST_REQUIRED:
                    raise ValueError(
                        f"invalid option {TRUST_OPTION}={v!r}: the one value is {TRUST_REQUIRED!r}"
                    )
                trust = True
            else:
                rest.append((k, v))
        bare = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(rest)))
    except ValueError as e:
        return TierURL(text, text, error=str(e))
    return TierURL(text, bare, parts.scheme.lower(), read_only, trust)


def split_chain(raw: str) -> list[str]:
    """The URLs of a comma-separated chain, blanks stripped, empty ones left out."""
    return [u.strip() for u in raw.split(",") if u.strip()]


class TierBase:
    """The bookkeeping every kind of tier keeps: counters, one warning per kind of failure,
    back-off after a failure, the checks before a read, and one background writer thread.

    A subclass sets ``url`` (redacted) and ``max_value_bytes``, implements ``get`` (starting
    with ``_checked``) and ``_write`` (one entry, on the writer thread, counting its own
    outcome), and may override ``_describe`` (an exception's text, for the log) and
    ``_before_use`` (a check at every call, such as a fork)."""

    url: str
    max_value_bytes: int

    def __init__(self, *, retry_after: float, thread_name: str) -> None:
        self.retry_after = retry_after
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._down_until = 0.0
        self._thread_name = thread_name
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        atexit.register(self.close)

    # ---------------------------------------------------------------- counting
    def count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.counters[counter] += n

    def first_warning(self, kind: str) -> bool:
        """Whether this is the first warning of ``kind`` (each is logged once)."""
        with self._lock:
            first = kind not in self._warned
            self._warned.add(kind)
        return first

    def stats(self) -> dict[str, int | str]:
        with self._lock:
            out: dict[str, int | str] = dict(self.counters)
        out["remote"] = self.url
        return out

    # ---------------------------------------------------------------- failures
    def available(self) -> bool:
        """Whether the tier is asked at all: not within ``retry_after`` of a failure."""
        return time.monotonic() >= self._down_until

    def _describe(self, e: BaseException) -> str:
        return str(e)

    def fail(self, what: str, e: BaseException) -> None:
        """Counts a failure of ``what`` (``remote_<what>_errors``), leaves the tier alone for
        ``retry_after`` seconds, and warns once per ``what``."""
        with self._lock:
            self.counters[f"remote_{what}_errors"] += 1
            self._down_until = time.monotonic() + self.retry_after
            first = what not in self._warned
            self._warned.add(what)
        if first:
            log.warning(
                "xla_pcache: remote cache %s: %s failed (%s: %s); local cache only, "
                "retried in %.0f s",
                self.url,
                what,
                type(e).__name__,
                self._describe(e),
                self.retry_after,
            )

    def judge_head(
        self, name: str, head: Buffer, size: int, *, whole: bool
    ) -> tuple[bool, _core.Refusal | None]:
        """Whether the value of ``size`` bytes under entry ``name`` is refused by its first
        bytes ``head`` (the core's ``entry_head_check``), and the verdict to answer with:
        the core's, or None when the head was cut short (not ``whole``: the first bytes as
        the server holds them) and so proves nothing of the value. A later release's entry
        is counted ``remote_newer_format`` and warned of once, naming its version; anything
        else refused is ``remote_rejected``."""
        verdict = _core.entry_head_check(head, name, size)
        if verdict is None:
            return False, None
        if verdict.kind == "newer_format":
            self.count("remote_newer_format")
            if self.first_warning("newer_format"):
                log.warning(
                    "xla_pcache: remote cache %s: the value for %s is %s; a miss, left as "
                    "it is for the release that wrote it",
                    self.url,
                    name,
                    verdict.why,
                )
            return True, verdict
        self.reject("rejected", f"the value for {name} is not a whole entry file")
        return True, verdict if whole else None

    def reject(self, kind: str, why: str) -> None:
        """Counts a remote value refused before it was read whole (``remote_rejected``) and
        warns once per kind: another writer of the bucket or server put it there."""
        self.count("remote_rejected")
        if self.first_warning(kind):
            log.warning("xla_pcache: remote cache %s: %s; a miss", self.url, why)

    # ---------------------------------------------------------------- reads
    def _before_use(self) -> None:
        """Called first by every read and write."""

    def _checked(self, name: str, max_bytes: int | None) -> tuple[EntryName, int] | None:
        """The checks before a read asks anything: the tier is available (else counted
        ``remote_skipped``), ``name`` is an entry name (else a rejection); with the largest
        value the read may take (the tier's, within the caller's ``max_bytes``)."""
        self._before_use()
        if not self.available():
            self.count("remote_skipped")
            return None
        checked = entry_name_or_none(name)
        if checked is None:
            self.reject("name", "an entry name that is not 32 hex digits was asked for")
            return None
        limit = self.max_value_bytes if max_bytes is None else min(max_bytes, self.max_value_bytes)
        return checked, limit

    # ---------------------------------------------------------------- writes
    def _payload(self, data: Buffer) -> Any:
        """What ``_write`` is handed for ``data`` (a kind whose client takes bytes only
        copies here, on the caller's thread, while the buffer is known alive)."""
        return data

    def _write(self, name: EntryName, data: Any, mode: str) -> None:
        """Writes one entry file: ``mode`` is ``create``, ``update`` (over anything but a
        later release's entry) or ``own`` (over anything: ``Tier.put_async``)."""
        raise NotImplementedError

    def put_async(
        self, name: str, data: Buffer, *, replace: bool = False, own: bool = False
    ) -> None:
        """Writes ``data`` under ``name`` in the background (``replace``, ``own``: see
        ``Tier``); a value over ``max_value_bytes`` is skipped, counted
        ``remote_too_large`` and warned of once, a name that is not an entry name counted
        ``remote_put_skipped``."""
        self._before_use()
        size = memoryview(data).nbytes
        if size > self.max_value_bytes:
            self.count("remote_too_large")
            if self.first_warning("too_large"):
                log.warning(
                    "xla_pcache: not writing a %d-byte entry to the remote cache %s "
                    "(limit %d bytes)",
                    size,
                    self.url,
                    self.max_value_bytes,
                )
            return
        checked = entry_name_or_none(name)
        if checked is None:
            self.count("remote_put_skipped")
            return
        payload = self._payload(data)
        mode = ("own" if own else "update") if replace else "create"
        try:
            self._writer.submit(self._write_now, checked, payload, mode)
        except RuntimeError:
            # At interpreter exit the writer threads are gone (torch_xla's last publish runs
            # then): written here, bounded by the timeout, rather than lost.
            self._write_now(checked, payload, mode)

    def _write_now(self, name: EntryName, data: Any, mode: str) -> None:
        if not self.available():
            self.count("remote_put_skipped")
            return
        self._write(name, data, mode)

    def submit(self, fn: Callable[[], Any]) -> None:
        """Runs ``fn`` on the writer thread, after the writes queued before it."""
        self._before_use()
        try:
            self._writer.submit(fn)
        except RuntimeError:  # at interpreter exit: run here, after the writes above
            fn()

    def flush(self) -> None:
        """Waits for the writes queued so far (each bounded by its timeout)."""
        self._before_use()
        with contextlib.suppress(RuntimeError):  # closed: nothing is queued
            self._writer.submit(lambda: None).result()

    def close(self) -> None:
        atexit.unregister(self.close)
        self._writer.shutdown(wait=True)
