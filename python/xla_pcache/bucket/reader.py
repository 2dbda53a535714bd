"""Everything xla_pcache reads from a bucket's upkeep, read as untrusted: whoever can write
the bucket wrote it, with no key (``upkeep.py`` says what lives there).

One reader, ``BucketReader``, with bounds that hold whatever was planted:

- **an object** is read only when its size, from the first response, is within the cap its
  kind has; JSON objects are small and parsed whole (nesting and numbers bounded); gzip
  objects of lines (records, usage) are streamed: ``STREAM_CHUNK`` bytes of the object at a
  time, inflated ``STREAM_CHUNK`` at a time up to a few times the object's size, cut into blocks
  of whole lines that the regex engine matches line by line (a line that does not match
  makes no object; one longer than ``MAX_LINE`` across two blocks is dropped), so the memory
  a read takes does not depend on the object's shape;
- **numbers** pass ``checked_size``, ``checked_age``, ``checked_count`` or ``checked_time``,
  the directory's own bounds (``sizes.MAX_SIZE``, ``sizes.MAX_DURATION_S``), and a time
  at most ``CLOCKS_APART_S`` ahead;
- **a listing** survives keys the client cannot parse and floods of them
  (``listing.Walk``: where it resumes, what it asks for by name, how it gallops past
  a flood and when it lists with a delimiter), and says when it did not see everything
  (``Listing.cut_short``);
- what does not pass is skipped, counted by kind in ``skipped`` (the ``stats`` and
  ``prune`` reports show it) with one warning per kind, never an error for the whole
  listing, prune or start.

Such a key cannot be read, written or removed through ``object_store`` either (every path
it takes is parsed the same way): ``unlistable`` names the first ``REPORTED`` of them, and
``delete_hint`` says how to remove one with the cloud's own tool.
"""

from __future__ import annotations

import builtins
import json
import math
import re
import threading
import time
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from xla_pcache import _core
from xla_pcache._text import package_logger
from xla_pcache.bucket.listing import (
    HEADS_PER_REFUSED,
    LIST_PAGE,
    LISTS_PER_REFUSED,
    MAX_RECOVERIES,
    MAX_UNLISTABLE,
    RECOVERY_LISTS,
    REPORTED,
    Listing,
    Meta,
    Names,
    Walk,
    list_requests_bound,
    parseable,
    refused_key,
    resume_after,
)
from xla_pcache.bucket.pages import delimited
from xla_pcache.sizes import MAX_SIZE

log = package_logger("xla_pcache")

# Objects whose whole content is read: the budget, the last prune's totals, a lease.
MAX_SMALL = 4096
# The gzip objects, streamed (the bound is on time, not memory): a use record holds one
# host's uses of an interval (33 bytes an entry name), usage every entry with a use (about
# 50 bytes each, gzip halves it: 2.5 MB at 100k entries).
MAX_USE_RECORD = 8 << 20
MAX_USAGE = 64 << 20
# What xla_pcache writes there inflates to about twice its size: a record or usage is read
# no further than this many times its own size (a gzip bomb costs what its bytes cost).
MAX_INFLATE = 4
# JSON of a small object: at most this deep (json's own recursion would raise past ~1000).
MAX_JSON_DEPTH = 8
# Streamed reads: the piece of the object and of its inflated text handled at a time.
STREAM_CHUNK = 64 << 10
# A line of a record (an entry name) or of usage (name, time, uses) is far shorter.
MAX_LINE = 128
# How far a host's own time in a record may be from the service's Last-Modified of it.
CLOCK_SLACK_S = 300.0
# How far apart two hosts' clocks may be (the prune lease assumes as much): a time read from
# the bucket may be this far ahead of this host's clock, and no further.
CLOCKS_APART_S = 600.0


# ------------------------------------------------------------------------------ numbers
def checked_size(value: object, *, zero: bool = False) -> int | None:
    """``value`` as a byte size when it is an int from 1 to ``sizes.MAX_SIZE`` (the core's
    rule of a budget, ``_core.check_size``), or with ``zero`` a count of bytes from 0; else
    None."""
    if zero:
        return checked_count(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    try:
        return _core.check_size("size", value)
    except (ValueError, OverflowError):
        return None


def checked_count(value: object) -> int | None:
    """A count of objects, bytes or uses: an int from 0 to ``sizes.MAX_SIZE``, else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_SIZE else None


def listed_size(meta: Meta) -> int | None:
    """A listed (or fetched) object's size as the service gives it, checked: a count of bytes,
    else None."""
    return checked_count(meta.get("size"))


def checked_age(value: object) -> float | None:
    """A max age in seconds: a number the core takes as one (``_core.check_max_age``: from
    1 to ``sizes.MAX_DURATION_S``), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return _core.check_max_age("max_age", float(value))
    except (ValueError, OverflowError):
        return None


def checked_time(value: object, now: float | None = None) -> float | None:
    """A time (seconds since the epoch) not before 1970 nor more than ``CLOCKS_APART_S``
    ahead of this host's clock, else None: a time in the future would keep an entry for
    ever."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        t = float(value)
    except OverflowError:
        return None
    limit = (time.time() if now is None else now) + CLOCKS_APART_S
    return t if math.isfinite(t) and 0 <= t <= limit else None


def _depth(text: bytes) -> int:
    """How deeply ``text`` nests JSON arrays and objects (brackets in strings counted too:
    an upper bound, enough to refuse before parsing)."""
    depth = deepest = 0
    for c in text:
        if c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
    return deepest


# ------------------------------------------------------------------------------ keys
def delete_hint(url_scheme: str, bucket: str, key: str) -> str:
    """How to remove the object ``key`` with the cloud's own command line."""
    quoted = "'" + key.replace("'", "'\\''") + "'"
    if url_scheme == "s3":
        return f"aws s3api delete-object --bucket {bucket} --key {quoted}"
    if url_scheme == "gs":
        # Not ``gcloud storage rm``: it expands wildcards (``*``, ``?``, ``[``) in the name,
        # which a planted key may hold, and would remove objects that are not this one.
        # One request naming the object exactly (every byte but letters and digits
        # percent-encoded, so that no ``/../`` is collapsed on the way).
        exact = urllib.parse.quote(key, safe="").replace(".", "%2E").replace("-", "%2D")
        exact = exact.replace("_", "%5F").replace("~", "%7E")
        return (
            'curl -X DELETE -H "Authorization: Bearer $(gcloud auth print-access-token)" '
            f"'https://storage.googleapis.com/{bucket}/{exact}'"
        )
    return f"az storage blob delete --container-name {bucket} --name {quoted}"


# What callers name through this module, from the walk's.
__all__ = [
    "HEADS_PER_REFUSED",
    "LISTS_PER_REFUSED",
    "LIST_PAGE",
    "MAX_RECOVERIES",
    "MAX_UNLISTABLE",
    "RECOVERY_LISTS",
    "REPORTED",
    "BucketReader",
    "Listing",
    "Meta",
    "Names",
    "list_requests_bound",
    "parseable",
    "refused_key",
    "resume_after",
]


# ------------------------------------------------------------------------------ the reader
class BucketReader:
    """Reads of one bucket prefix's upkeep objects through obstore ``store`` (made with the
    prefix ``store_prefix``), every request counted by kind through ``count``. ``url`` is
    the bucket's URL as shown (redacted)."""

    def __init__(
        self,
        store: Any,
        *,
        url: str,
        scheme: str,
        bucket: str,
        store_prefix: str,
        count: Callable[[str, int], None],
        page_wait_s: float = 150.0,
    ) -> None:
        self.store = store
        # How long one chunk of a listing may take (``pages``): a request and its retry.
        self.page_wait_s = page_wait_s
        self.url = url
        self.scheme = scheme
        self.bucket = bucket
        self.store_prefix = store_prefix.strip("/")
        self._count = count
        self.skipped: Counter[str] = Counter()
        self.unlistable: list[str] = []
        self._unlistable_seen: set[str] = set()
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- skipping
    def warn_once(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        log.warning("xla_pcache: bucket %s: %s", self.url, message)

    def skip(self, kind: str, message: str, n: int = 1) -> None:
        """``n`` objects (or lines) skipped for ``kind``: counted, one warning per kind."""
        with self._lock:
            self.skipped[kind] += n
        self.warn_once(kind, message)

    def relative(self, key: str) -> str | None:
        """``key`` (a whole key in the bucket) below the store's prefix; None when outside."""
        if not self.store_prefix:
            return key
        head = self.store_prefix + "/"
        return key[len(head) :] if key.startswith(head) else None

    def count(self, kind: str, n: int) -> None:
        self._count(kind, n)

    # ---------------------------------------------------------------- listings
    def listing(
        self, prefix: str, *, limit: int | None = None, names: Names | None = None
    ) -> Iterator[Meta]:
        """Every object below ``prefix`` (a directory of the bucket's upkeep), at most
        ``limit`` of them, in key order unless a flood of refused keys made the walk
        gallop (``listing``); see ``listing_of`` for how it went."""
        return iter(Walk(self, Listing(prefix, limit, names)))

    def listing_of(self, listing: Listing) -> Iterator[Meta]:
        """``listing``'s objects; ``listing`` tells after the iteration how it went."""
        return iter(Walk(self, listing))

    def note_unlistable(self, key: str, state: Listing) -> None:
        """A key the client refused in ``state``'s listing: counted, named (the first
        ``REPORTED``), one warning with how to remove it."""
        state.unlistable.append(key)
        with self._lock:
            if key not in self._unlistable_seen:
                self._unlistable_seen.add(key)
                if len(self.unlistable) < REPORTED:
                    self.unlistable.append(key)
        self.skip(
            "unlistable",
            f"an object the client cannot list or remove ({key!r}: an empty, '.' or "
            "'..' segment or a control character) was skipped; remove it with "
            f"{delete_hint(self.scheme, self.bucket, key)}",
        )

    def directories(self, prefix: str) -> list[str]:
        """The "directories" directly below ``prefix`` that a listing with a delimiter
        names (a request a page). On a service with directories (SeaweedFS, MinIO,
        hierarchical namespaces) these include empty ones, which no listing of objects
        shows: what objects planted below one of our names leave once they are gone. A
        listing the client refuses names none (the refused key is counted as unlistable)."""
        n = 0
        try:
            got = delimited(self.store, prefix, wait_s=self.page_wait_s)
            n = len(got["common_prefixes"]) + len(got["objects"])
            return [str(p).rstrip("/") for p in got["common_prefixes"]]
        except Exception as e:
            bad = refused_key(e)
            if bad is None:
                raise
            self.note_unlistable(bad, Listing(prefix))
            return []
        finally:
            self._count("list", max(1, math.ceil(n / LIST_PAGE)))

    def head(self, path: str) -> Meta | None:
        """The HEAD of ``path`` (counted); None when there is no such object."""
        import obstore

        from xla_pcache.tiers import objstore

        self._count("head", 1)
        try:
            meta = obstore.head(self.store, path)
        except Exception as e:
            if objstore.classify(e) == "missing":
                return None
            raise
        return meta

    # ---------------------------------------------------------------- objects
    def _open(self, path: str, limit: int, kind: str) -> Any | None:
        """The GET of ``path`` (its body not read yet), or None when it is missing or (one
        warning, counted) larger than ``limit``."""
        import obstore

        from xla_pcache.tiers import objstore

        self._count("get", 1)
        try:
            got = obstore.get(self.store, path, options={"range": (0, limit + 1)})
        except Exception as e:
            kind = objstore.classify(e)
            if kind == "missing":
                return None
            if kind == "empty":  # no bytes (a ranged read of it is refused)
                return _Empty()
            raise
        size = listed_size(got.meta)
        if size is None or size > limit:
            self.skip(
                f"{kind}-oversized",
                f"{path} is {got.meta.get('size')} bytes, over the {limit} its kind may be: "
                "ignored",
            )
            return None
        return got

    def first_bytes(self, path: str, n: int) -> bytes | None:
        """The first ``n`` bytes of ``path`` (all of it when shorter), in one ranged GET
        (counted), whatever its size; None when it is missing or empty. The answer is read
        no further than ``n`` bytes, whatever length it declares (the client refuses a
        whole object sent for a range, not a range longer than asked)."""
        import obstore

        from xla_pcache.tiers import objstore

        self._count("get", 1)
        out = bytearray()
        try:
            got = obstore.get(self.store, path, options={"range": (0, n)})
            for chunk in got.stream(min_chunk_size=max(1, n)):
                out += memoryview(chunk)[: n - len(out)]
                if len(out) >= n:
                    break
        except Exception as e:
            if objstore.classify(e) in ("missing", "empty"):
                return None
            raise
        return bytes(out)

    def small(self, path: str, limit: int = MAX_SMALL, kind: str = "object") -> bytes | None:
        """The whole of ``path`` when it is at most ``limit`` bytes; None when it is missing
        or larger (skipped)."""
        got = self._open(path, limit, kind)
        return None if got is None else bytes(got.bytes())

    def json_object(self, path: str, kind: str) -> dict[str, Any] | None:
        """``path`` as a JSON object of at most ``MAX_SMALL`` bytes, nested at most
        ``MAX_JSON_DEPTH`` deep; None when missing, and (skipped) when it is not one."""
        raw = self.small(path, MAX_SMALL, kind)
        if raw is None:
            return None
        try:
            if _depth(raw) > MAX_JSON_DEPTH:
                raise ValueError("nested too deeply")
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError, UnicodeDecodeError) as e:
            self.skip(f"{kind}-malformed", f"{path} is malformed ({e}): ignored")
            return None
        return data

    def gzip_lines(
        self, path: str, limit: int, kind: str, line: re.Pattern[bytes]
    ) -> Iterator[re.Match[bytes]]:
        """The lines of the gzip object ``path`` (at most ``limit`` bytes, inflating to at
        most ``MAX_INFLATE`` times its size) that match ``line`` whole, streamed: the object is
        inflated ``STREAM_CHUNK`` at a time and each block of whole lines is searched (by
        the regex engine: a line that does not match costs no object). Lines that do not
        match are counted (one warning per kind); one over ``MAX_LINE`` bytes that spans
        two blocks is dropped whole. What is not gzip, or inflates past the cap, ends the
        lines there (skipped, counted): the cap is on the object's own size, so that what
        reading one costs is in proportion to the bytes read, whatever they inflate to."""
        got = self._open(path, limit, kind)
        if got is None:
            return
        inflated = max(STREAM_CHUNK, MAX_INFLATE * int(got.meta["size"]))
        d = zlib.decompressobj(wbits=31)
        total = 0
        bad = 0
        blocks = _Blocks()
        whole = re.compile(rb"^(?:" + line.pattern + rb")\r?$", re.MULTILINE)

        def search(block: bytes) -> Iterator[re.Match[bytes]]:
            nonlocal bad
            n = 0
            for m in whole.finditer(block):
                n += 1
                yield m
            bad += block.count(b"\n") - n

        try:
            for piece in got.stream(min_chunk_size=STREAM_CHUNK):
                data = bytes(piece)
                # A piece of input at a time, its output STREAM_CHUNK at a time (what a
                # full output left inside the inflater comes with the next call).
                while not d.eof:
                    out = d.decompress(data, STREAM_CHUNK)
                    data = d.unconsumed_tail
                    total += len(out)
                    if total > inflated:
                        self.skip(
                            f"{kind}-malformed",
                            f"{path} inflates past {MAX_INFLATE} times its size: read that far",
                        )
                        return
                    block = blocks.feed(out)
                    if block:
                        yield from search(block)
                    if not data and len(out) < STREAM_CHUNK:
                        break
                if d.eof:
                    break
            if not d.eof:
                self.skip(f"{kind}-malformed", f"{path} is cut short: read that far")
            last = blocks.finish()
            if last:
                yield from search(last)
        except zlib.error:
            self.skip(f"{kind}-malformed", f"{path} is not gzip: read that far")
        finally:
            bad += blocks.dropped
            if bad:
                self.skip(f"{kind}-lines", f"{path} has lines xla_pcache does not write", bad)


class _Empty:
    """What ``_open`` gives for an object of no bytes, as obstore's result would be."""

    def __init__(self) -> None:
        self.meta: Meta = {"size": 0}

    def bytes(self) -> builtins.bytes:
        return b""

    def stream(self, min_chunk_size: int = 0) -> Iterator[builtins.bytes]:
        return iter(())


class _Blocks:
    """Cuts a stream of bytes into blocks of whole lines: what follows the last newline is
    kept for the next block when at most ``MAX_LINE`` bytes long, else dropped up to the
    next newline (``dropped`` counts such lines)."""

    def __init__(self) -> None:
        self.pending = b""
        self.overlong = False
        self.dropped = 0

    def feed(self, data: bytes) -> bytes:
        if self.overlong:
            nl = data.find(b"\n")
            if nl < 0:
                return b""
            data = data[nl + 1 :]
            self.overlong = False
        else:
            data = self.pending + data
        cut = data.rfind(b"\n") + 1
        block, rest = data[:cut], data[cut:]
        if len(rest) > MAX_LINE:
            self.pending, self.overlong = b"", True
            self.dropped += 1
        else:
            self.pending = rest
        return block

    def finish(self) -> bytes:
        """The last line, when it had no newline (with one)."""
        return b"" if self.overlong or not self.pending else self.pending + b"\n"
