"""An HTTP relay in front of the test S3 server (``tests.tiers.relay``), for what a real S3,
GCS or Azure bucket can hold and SeaweedFS cannot: keys with ``//`` or a ``.``/``..``
segment, which SeaweedFS collapses when they are written and a real S3 keeps.

``S3Relay(port)`` forwards every request unchanged (headers included, so the client's
signature still holds) and the answer back, counting requests by kind (``take()``; an
answer of 5xx, which the client may retry once, is counted under ``5xx`` as well); keys
``plant``-ed on it are added to the listings that pass through it, where the service would
list them: in key order, in the page whose range holds them (the page's ``start-after`` or
continuation point up to its last key, or to the end on the last page), rolled into a
common prefix under a delimiter. Nothing else about them exists: a GET, HEAD or DELETE of
such a key reaches the server, which has no such object (and a client that cannot parse
the key never asks), and ``unplant`` stands for removing one with the cloud's own tool. A
key is written into the XML as ElementTree writes it (a control character raw, which XML
1.0 does not allow). ``S3Relay(port, planted_from=other)`` lists what ``other`` has planted
(one set for both) and counts its own requests: the bucket-state fuzzer gives each process
its own relay, so that each one's requests are its own. The tests of hostile buckets and the
bucket-state fuzzer use it."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
# Hop-by-hop headers: the relay answers with a whole body and its length.
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
# How long the relay waits for the server's answer to one request.
UPSTREAM_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Planted:
    key: str
    size: int
    last_modified: str
    e_tag: str


def request_kind(method: str, target: str) -> str:
    """``list``, ``delete`` (a batch), or the method in lower case."""
    path, _, query = target.partition("?")
    if method == "GET" and ("list-type" in query or path.count("/") <= 1):
        return "list"
    if method == "POST" and "delete" in query:
        return "delete"
    return method.lower()


class S3Relay:
    """Requests to ``port`` (the server's) through ``self.port``; see the module's text."""

    def __init__(self, upstream: int, *, planted_from: S3Relay | None = None) -> None:
        self.upstream = upstream
        self.counts: Counter[str] = Counter()
        self.planted: dict[str, Planted] = {} if planted_from is None else planted_from.planted
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
        # Where each continuation token the relay passed on resumes (the page's last key).
        self._resume: dict[str, str] = {}
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

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

    def plant(self, key: str, size: int = 0) -> None:
        """Lists ``key`` (the whole key in the bucket, the URL's prefix included) from now
        on, ``size`` bytes, written now."""
        with self._lock:
            self.planted[key] = Planted(
                key, size, "2026-01-01T00:00:00.000Z", f'"{abs(hash(key)):032x}"'
            )

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

    # ------------------------------------------------------------------ relaying
    def _forward(self, h: http.server.BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        with self._lock:
            self.counts[request_kind(h.command, h.path)] += 1
            self.last_request = time.monotonic()
            self.in_flight += 1
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for name, value in h.headers.items():
                if name.lower() not in ("connection", "keep-alive"):
                    conn.putheader(name, value)
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            # A HEAD's length is the object's, not that of the (empty) body.
            keep = ("content-length",) if h.command == "HEAD" else ()
            headers = [
                (k, v) for k, v in resp.getheaders() if k.lower() not in _HOP or k.lower() in keep
            ]
            status, reason = resp.status, resp.reason
            with self._lock:
                self.trace.append((h.command, h.path, status))
                if status >= 500:
                    self.counts["5xx"] += 1
        except OSError:
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.send_error(502)
            return
        finally:
            conn.close()
            with self._lock:
                self.in_flight -= 1
        if h.command == "GET" and status == 200 and request_kind("GET", h.path) == "list":
            data = self._listing(h.path, data)
        h.send_response(status, reason)
        for k, v in headers:
            h.send_header(k, v)
        if h.command != "HEAD":
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _listing(self, target: str, data: bytes) -> bytes:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(target).query))
        with self._lock:
            planted = list(self.planted.values())
            start = query.get("start-after", "")
            token = query.get("continuation-token")
            if token is not None:
                start = max(start, self._resume.get(token, ""))
        if not planted:
            return data
        ET.register_namespace("", _NS)
        root = ET.fromstring(data)
        ns = {"s3": _NS}
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter")
        contents = root.findall("s3:Contents", ns)
        prefixes = root.findall("s3:CommonPrefixes", ns)
        keys = [c.findtext("s3:Key", "", ns) for c in contents]
        rolled = [p.findtext("s3:Prefix", "", ns) for p in prefixes]
        truncated = root.findtext("s3:IsTruncated", "false", ns) == "true"
        end = max(keys + rolled) if truncated and (keys or rolled) else None
        next_token = root.findtext("s3:NextContinuationToken", None, ns)
        if next_token is not None and end is not None:
            with self._lock:
                self._resume[next_token] = end
        added: list[ET.Element] = []
        for p in planted:
            if not p.key.startswith(prefix) or p.key <= start or (end is not None and p.key > end):
                continue
            rest = p.key[len(prefix) :]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0] + delimiter
                if common not in rolled:
                    rolled.append(common)
                    e = ET.Element(f"{{{_NS}}}CommonPrefixes")
                    ET.SubElement(e, f"{{{_NS}}}Prefix").text = common
                    added.append(e)
                continue
            if p.key in keys:
                continue
            keys.append(p.key)
            e = ET.Element(f"{{{_NS}}}Contents")
            ET.SubElement(e, f"{{{_NS}}}Key").text = p.key
            ET.SubElement(e, f"{{{_NS}}}LastModified").text = p.last_modified
            ET.SubElement(e, f"{{{_NS}}}ETag").text = p.e_tag
            ET.SubElement(e, f"{{{_NS}}}Size").text = str(p.size)
            ET.SubElement(e, f"{{{_NS}}}StorageClass").text = "STANDARD"
            added.append(e)
        if not added:
            return data
        # The listed elements in key order, where the answer had them: objects, then common
        # prefixes, each group together (as the service answers).
        children = list(root)
        lists = [e for e in children if e in contents or e in prefixes]
        at = children.index(lists[0]) if lists else _after_scalars(children)
        for e in lists:
            root.remove(e)

        def key_of(e: ET.Element) -> str:
            return e.findtext("s3:Key", "", ns) or e.findtext("s3:Prefix", "", ns)

        objects = sorted((e for e in contents + added if e.tag.endswith("Contents")), key=key_of)
        common = sorted(
            (e for e in prefixes + added if e.tag.endswith("CommonPrefixes")), key=key_of
        )
        for i, e in enumerate(objects + common):
            root.insert(at + i, e)
        count = root.find("s3:KeyCount", ns)
        if count is not None:
            count.text = str(len(objects) + len(common))
        return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))


def _after_scalars(children: list[ET.Element]) -> int:
    """Where a listing's first object goes when it has none: after its leading fields."""
    for i, e in enumerate(children):
        if e.tag.rpartition("}")[2] in ("NextContinuationToken", "EncodingType"):
            return i
    return len(children)
