"""An HTTP relay in front of a test bucket server (``tests.tiers.relay``), for what a real S3,
GCS or Azure bucket can hold and SeaweedFS cannot: keys with ``//`` or a ``.``/``..``
segment, which SeaweedFS collapses when they are written and a real S3 keeps, and floods of
keys that would take long to write one PUT at a time. It serves both protocols of the
tests, S3 (SeaweedFS) and GCS (``tests/gcs_server.py``, whose XML listing is S3's
ListObjectsV2 with GCS's own fields, which the client ignores).

``Relay(server)`` forwards every request unchanged (headers included, so the client's
signature still holds) and the answer back, counting requests by kind (``take()``; an
answer of 5xx, which the client may retry once, is counted under ``5xx`` as well). Keys
``plant``-ed on it (``plant_many`` for thousands) are listed where the service would list
them: while any is planted below a listing's prefix, the relay answers that listing itself,
as S3's ListObjectsV2 does, from what the server holds (listed by the relay's own client)
and what was planted, merged in key order: at most ``max-keys`` (1,000) a page, objects and
common prefixes counted alike, a continuation token of its own that resumes after the
page's last key (after everything below a common prefix), planted keys rolled into a common
prefix under a delimiter. Nothing else about a planted key exists: a GET or HEAD of it
reaches the server, which has no such object (and a client that cannot parse the key never
asks); a DELETE of it, or a batch that names it, removes it from the listings as the
service would (and reaches the server, whose 404 for it is answered 204, as the service
answers the delete of an object it holds: GCS answers 404 for one it does not hold).
``unplant`` stands for removing one with the cloud's own tool. A key is written into the
XML as ElementTree writes it (a control character raw, which XML 1.0 does not allow).
``Relay(server, planted_from=other)`` lists what ``other`` has planted (one set for both)
and counts its own requests: the bucket-state fuzzer gives each process its own relay, so
that each one's requests are its own. The tests of hostile buckets and the bucket-state
fuzzer use it."""

from __future__ import annotations

import bisect
import contextlib
import datetime
import http.client
import http.server
import itertools
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from tests.tiers.servers import BucketServer

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
# Hop-by-hop headers: the relay answers with a whole body and its length.
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
# How long the relay waits for the server's answer to one request.
UPSTREAM_TIMEOUT_S = 120.0
# What a listing page holds at most unless the request asks for fewer (S3's default).
MAX_KEYS = 1000
# After every key that starts with a common prefix (start-after semantics).
_AFTER_ALL = "\U0010ffff"
# When a planted key was written unless the planter says.
PLANTED_AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class Planted:
    key: str
    size: int
    last_modified: str
    e_tag: str


class _PlantedKeys(dict[str, Planted]):
    """The planted keys by name, and (``ordered``) in key order, sorted again only after a
    change."""

    def __init__(self) -> None:
        super().__init__()
        self._version = 0
        self._sorted: tuple[int, list[str]] = (-1, [])

    def __setitem__(self, key: str, value: Planted) -> None:
        self._version += 1
        super().__setitem__(key, value)

    def pop(self, key: str, *default: Any) -> Any:
        self._version += 1
        return super().pop(key, *default)

    def clear(self) -> None:
        self._version += 1
        super().clear()

    def ordered(self) -> list[str]:
        if self._sorted[0] != self._version:
            self._sorted = (self._version, sorted(self))
        return self._sorted[1]


def answer(h: http.server.BaseHTTPRequestHandler, status: int, xml: bytes) -> None:
    """Answers the request ``h`` with ``status`` and the XML body ``xml`` itself, as the
    service would (nothing reaches the server)."""
    h.send_response(status)
    h.send_header("Content-Type", "application/xml")
    h.send_header("Content-Length", str(len(xml)))
    h.end_headers()
    h.wfile.write(xml)


def request_kind(method: str, target: str) -> str:
    """``list``, ``delete`` (a batch), or the method in lower case."""
    path, _, query = target.partition("?")
    if method == "GET" and ("list-type" in query or path.count("/") <= 1):
        return "list"
    if method == "POST" and "delete" in query:
        return "delete"
    return method.lower()


def _when(meta_time: Any) -> str:
    t = meta_time.astimezone(datetime.UTC) if meta_time is not None else PLANTED_AT
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _parseable_floor(key: str) -> str:
    """The longest run of whole leading segments of ``key`` that the client can name (a
    start for the relay's own listing of the server, at or before ``key``)."""
    out: list[str] = []
    for seg in key.split("/"):
        if seg in ("", ".", "..") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in seg):
            break
        out.append(seg)
    return "/".join(out)


class Relay:
    """Requests to ``server`` through ``self.port``; see the module's text."""

    def __init__(self, server: BucketServer, *, planted_from: Relay | None = None) -> None:
        self.server = server
        self.upstream = server.port
        self.counts: Counter[str] = Counter()
        self.planted: _PlantedKeys = (
            _PlantedKeys() if planted_from is None else planted_from.planted
        )
        self._lock: threading.Lock = (
            threading.Lock() if planted_from is None else planted_from._lock
        )
        # The latest requests (method, target, status), for a report of what was asked, and
        # when the last one came (time.monotonic()).
        self.trace: deque[tuple[str, str, int]] = deque(maxlen=4000)
        self.last_request = 0.0
        # Requests passed on and not yet answered by the server: one a client gave up on
        # (its timeout, or its process ended) still reaches the server and may change the
        # bucket after its process is gone.
        self.in_flight = 0
        # Where each continuation token resumes: the server's (the page's last key), and
        # the relay's own (``relay-<n>``).
        self._resume: dict[str, str] = {}
        self._tokens = itertools.count()
        self._clients: dict[str, Any] = {}
        self._local = threading.local()
        # Every connection to the server, closed with the relay.
        self._conns: list[http.client.HTTPConnection] = []
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as two writes: without this a client's delayed ACK
            # holds the body back some 40 ms an answer.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                relay._forward(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def plant(self, key: str, size: int = 0, when: datetime.datetime | None = None) -> None:
        """Lists ``key`` (the whole key in the bucket, the URL's prefix included) from now
        on, ``size`` bytes, written ``when`` (else ``PLANTED_AT``)."""
        self.plant_many([key], size, when)

    def plant_many(
        self, keys: Iterable[str], size: int = 0, when: datetime.datetime | None = None
    ) -> None:
        stamp = _when(when)
        with self._lock:
            for key in keys:
                self.planted[key] = Planted(key, size, stamp, f'"{abs(hash(key)):032x}"')

    def unplant(self, key: str) -> None:
        with self._lock:
            self.planted.pop(key, None)

    def take(self) -> dict[str, int]:
        """The requests since the last call, by kind."""
        with self._lock:
            out, self.counts = dict(self.counts), Counter()
        return out

    def settle(self, timeout: float = UPSTREAM_TIMEOUT_S + 10) -> bool:
        """Waits until every request passed on has been answered by the server (or
        ``timeout``); whether none is left."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self.in_flight == 0:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    # ------------------------------------------------------------------ relaying
    def _forward(self, h: http.server.BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        kind = request_kind(h.command, h.path)
        with self._lock:
            self.counts[kind] += 1
            self.last_request = time.monotonic()
            self.in_flight += 1
        if h.command == "GET" and kind == "list":
            try:
                own = self._own_listing(h.path)
            except Exception:
                own = None
                with self._lock:
                    self.in_flight -= 1
                h.close_connection = True
                with contextlib.suppress(OSError):
                    h.send_error(502)
                return
            if own is not None:
                with self._lock:
                    self.in_flight -= 1
                    self.trace.append((h.command, h.path, 200))
                answer(h, 200, own)
                return
        if kind == "delete" and h.command == "POST":
            self._forget_deleted(body)
        planted_delete = h.command == "DELETE" and self._forget(self._key_of(h.path))
        conn = self._upstream()
        try:
            try:
                resp = self._send_upstream(conn, h, body)
            except (ConnectionError, http.client.RemoteDisconnected):
                # A kept connection the server closed meanwhile: once more on a new one.
                self._local.conn = None
                conn.close()
                conn = self._upstream()
                resp = self._send_upstream(conn, h, body)
            data = resp.read()
            if resp.will_close:
                self._local.conn = None
            # A HEAD's length is the object's, not that of the (empty) body.
            keep = ("content-length",) if h.command == "HEAD" else ()
            headers = [
                (k, v) for k, v in resp.getheaders() if k.lower() not in _HOP or k.lower() in keep
            ]
            status, reason = resp.status, resp.reason
            if planted_delete and status == 404:
                # The object the listing showed, removed: answered as the service answers
                # the delete of an object it holds (GCS answers 404 for one it does not
                # hold; S3 204 either way).
                status, reason, data, headers = 204, "No Content", b"", []
            with self._lock:
                self.trace.append((h.command, h.path, status))
                if status >= 500:
                    self.counts["5xx"] += 1
        except (OSError, http.client.HTTPException):
            self._local.conn = None
            conn.close()
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.send_error(502)
            return
        finally:
            with self._lock:
                self.in_flight -= 1
        if h.command == "GET" and status == 200 and kind == "list":
            self._note_token(data)
        h.send_response(status, reason)
        for k, v in headers:
            h.send_header(k, v)
        if h.command != "HEAD":
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    @staticmethod
    def _send_upstream(
        conn: http.client.HTTPConnection, h: http.server.BaseHTTPRequestHandler, body: bytes
    ) -> http.client.HTTPResponse:
        conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
        for name, value in h.headers.items():
            if name.lower() not in ("connection", "keep-alive"):
                conn.putheader(name, value)
        conn.endheaders(body or None)
        return conn.getresponse()

    def _upstream(self) -> http.client.HTTPConnection:
        """This serving thread's connection to the server, kept open between requests (a
        client's connection to the relay is served by one thread), as a client keeps its
        own: a connection a request costs the server a thread and a handshake each."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(
                "127.0.0.1", self.upstream, timeout=UPSTREAM_TIMEOUT_S
            )
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    # ------------------------------------------------------------------ deletes
    @staticmethod
    def _key_of(target: str) -> str:
        """The whole key a path-style request names (its bucket left out)."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
        return path.lstrip("/").partition("/")[2]

    def _forget(self, key: str) -> bool:
        """Forgets ``key`` if planted; whether it was."""
        with self._lock:
            if key in self.planted:
                self.planted.pop(key)
                return True
        return False

    def _forget_deleted(self, body: bytes) -> None:
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return
        for e in root.iter():
            if e.tag.rpartition("}")[2] == "Key" and e.text is not None:
                self._forget(e.text)

    # ------------------------------------------------------------------ listings
    def _note_token(self, data: bytes) -> None:
        """Where the server's continuation token in ``data`` resumes (its page's last key),
        for a later page the relay answers itself."""
        with contextlib.suppress(ET.ParseError):
            root = ET.fromstring(data)
            # S3's namespace or GCS's: by the elements' local names.
            ns = {"s3": root.tag[1:].partition("}")[0]} if root.tag.startswith("{") else {}
            q = "s3:" if ns else ""
            token = root.findtext(f"{q}NextContinuationToken", None, ns)
            keys = [c.findtext(f"{q}Key", "", ns) for c in root.findall(f"{q}Contents", ns)]
            keys += [
                p.findtext(f"{q}Prefix", "", ns) for p in root.findall(f"{q}CommonPrefixes", ns)
            ]
            if token is not None and keys:
                with self._lock:
                    self._resume[token] = max(keys)

    def _client(self, bucket: str) -> Any:
        with self._lock:
            made = self._clients.get(bucket)
            if made is None:
                made = self._clients[bucket] = self.server.client(bucket=bucket)
        return made

    def _served(self, bucket: str, prefix: str, after: str) -> Iterator[tuple[str, str, int, str]]:
        """What the server holds below ``prefix`` after ``after``, in key order: (key,
        last modified, size, ETag)."""
        import obstore

        below = prefix.rstrip("/") if prefix.endswith("/") else None
        floor = _parseable_floor(after) if after else ""
        stream = obstore.list(
            self._client(bucket),
            below or None,
            offset=floor if floor > (below or "") else None,
            chunk_size=MAX_KEYS,
        )
        for chunk in stream:
            for meta in chunk:
                key = str(meta["path"])
                if key > after and key.startswith(prefix):
                    yield (
                        key,
                        _when(meta.get("last_modified")),
                        int(meta["size"]),
                        str(meta.get("e_tag") or '""'),
                    )

    def _own_listing(self, target: str) -> bytes | None:
        """The relay's own answer to a listing with keys planted below its prefix (or with
        a token of the relay's); None to pass it on."""
        split = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(split.query, keep_blank_values=True))
        bucket = urllib.parse.unquote(split.path).strip("/").partition("/")[0]
        prefix = query.get("prefix", "")
        token = query.get("continuation-token")
        with self._lock:
            ordered = self.planted.ordered()
            first = bisect.bisect_left(ordered, prefix)
            here = first < len(ordered) and ordered[first].startswith(prefix)
            if not here and not (token or "").startswith("relay-"):
                return None
            after = query.get("start-after", "")
            if token is not None:
                after = max(after, self._resume.get(token, ""))
        delimiter = query.get("delimiter") or None
        max_keys = max(1, min(MAX_KEYS, int(query.get("max-keys") or MAX_KEYS)))
        begin = max(bisect.bisect_right(ordered, after), first)

        def mine() -> Iterator[tuple[str, str, int, str]]:
            # ``ordered`` is a snapshot (replaced, never changed, when keys are planted).
            for k in itertools.takewhile(lambda k: k.startswith(prefix), ordered[begin:]):
                p = self.planted.get(k)
                if p is not None:
                    yield k, p.last_modified, p.size, p.e_tag

        merged = _merge(self._served(bucket, prefix, after), mine())
        objects: list[tuple[str, str, int, str]] = []
        commons: list[str] = []
        last = ""
        truncated = False
        for key, when, size, tag in merged:
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0] + delimiter
                if commons and commons[-1] == common:
                    continue
                if len(objects) + len(commons) >= max_keys:
                    truncated = True
                    break
                commons.append(common)
                last = common + _AFTER_ALL
                continue
            if len(objects) + len(commons) >= max_keys:
                truncated = True
                break
            objects.append((key, when, size, tag))
            last = key
        return _page(bucket, prefix, delimiter, max_keys, objects, commons, truncated, self, last)

    def _token_for(self, resume: str) -> str:
        token = f"relay-{next(self._tokens)}"
        with self._lock:
            self._resume[token] = resume
        return token


def _merge(
    a: Iterator[tuple[str, str, int, str]], b: Iterator[tuple[str, str, int, str]]
) -> Iterator[tuple[str, str, int, str]]:
    """Two listings in key order as one (a key in both given once)."""
    x, y = next(a, None), next(b, None)
    while x is not None or y is not None:
        if y is None or (x is not None and x[0] < y[0]):
            assert x is not None
            yield x
            x = next(a, None)
        elif x is None or y[0] < x[0]:
            yield y
            y = next(b, None)
        else:
            yield x
            x, y = next(a, None), next(b, None)


def _page(
    bucket: str,
    prefix: str,
    delimiter: str | None,
    max_keys: int,
    objects: list[tuple[str, str, int, str]],
    commons: list[str],
    truncated: bool,
    relay: Relay,
    last: str,
) -> bytes:
    """A ListObjectsV2 answer (text escaped as ElementTree escapes it: a control character
    stays raw)."""
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<ListBucketResult xmlns="{_NS}">',
        f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
        f"<KeyCount>{len(objects) + len(commons)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
    ]
    if delimiter:
        out.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
    out.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
    out += [
        f"<Contents><Key>{escape(key)}</Key><LastModified>{when}</LastModified>"
        f"<ETag>{escape(tag)}</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass>"
        "</Contents>"
        for key, when, size, tag in objects
    ]
    out += [f"<CommonPrefixes><Prefix>{escape(c)}</Prefix></CommonPrefixes>" for c in commons]
    if truncated:
        out.append(f"<NextContinuationToken>{relay._token_for(last)}</NextContinuationToken>")
    out.append("</ListBucketResult>")
    return "".join(out).encode("utf-8", "surrogatepass")
