"""A Cloud Storage server for the tests (``python -m tests.gcs_server --port PORT --root DIR``):
the part of Google's XML API that ``object_store``'s GCS client (behind obstore) sends,
written from Google's documentation of that API:

- objects: PUT, GET, HEAD, DELETE
  <https://cloud.google.com/storage/docs/xml-api/put-object-upload>,
  <https://cloud.google.com/storage/docs/xml-api/get-object-download>,
  <https://cloud.google.com/storage/docs/xml-api/head-object>,
  <https://cloud.google.com/storage/docs/xml-api/delete-object>;
- copies: PUT with ``x-goog-copy-source``
  <https://cloud.google.com/storage/docs/xml-api/put-object-copy>;
- listings: ``GET /{bucket}?list-type=2`` with ``prefix``, ``delimiter``,
  ``continuation-token``, ``start-after`` and ``max-keys``
  <https://cloud.google.com/storage/docs/xml-api/get-bucket-list>;
- multipart uploads: ``POST ?uploads``, ``PUT ?partNumber&uploadId``, ``POST ?uploadId``,
  ``DELETE ?uploadId``
  <https://cloud.google.com/storage/docs/xml-api/post-object-multipart>,
  <https://cloud.google.com/storage/docs/xml-api/put-object-multipart>,
  <https://cloud.google.com/storage/docs/xml-api/post-object-complete>,
  <https://cloud.google.com/storage/docs/xml-api/delete-multipart>;
- preconditions by generation (``x-goog-if-generation-match``, 0 for "no live object",
  ``x-goog-if-metageneration-match``, and the ``x-goog-copy-source-if-*`` forms), and
  ``If-Match`` / ``If-None-Match`` / ``If-(Un)Modified-Since`` on reads
  <https://cloud.google.com/storage/docs/xml-api/reference-headers>,
  <https://cloud.google.com/storage/docs/request-preconditions>;
- errors as the XML API sends them (``<Error><Code>...``): 404 ``NoSuchKey`` /
  ``NoSuchBucket`` / ``NoSuchUpload``, 412 ``PreconditionFailed``, 304, 416 ``InvalidRange``,
  400 for a name GCS refuses, 401 for a wrong token
  <https://cloud.google.com/storage/docs/xml-api/reference-status>.

Objects are what GCS keeps: a name is any UTF-8 string of 1 to 1,024 bytes, stored verbatim
(``//``, ``.`` and ``..`` segments, control characters other than CR and LF; a percent
-encoding that is no UTF-8 is refused)
<https://cloud.google.com/storage/docs/objects#naming>; each write makes a new generation
(a number that only grows) with metageneration 1; the ETag is the quoted MD5 of the bytes
(of a multipart upload's: the MD5 of its parts' MD5s and ``-N``); ``Last-Modified`` has
whole seconds on a GET or HEAD, milliseconds in a listing. Listings are in the byte order of
the names' UTF-8, objects and common prefixes counted alike against ``max-keys`` (at most
1,000); the continuation token is opaque (here, the name the next page starts after).

The state lives under ``--root`` (an SQLite file and one file per object's bytes), so a
server started again on the same root serves the same objects; requests are served on
threads, every change to an object inside one transaction, so concurrent conditional
writes have one winner. ``--token T`` makes it require ``Authorization: Bearer T`` (401
otherwise), for the tests of wrong credentials. It prints ``listening on 127.0.0.1:PORT``
once it listens.

Paths starting ``/_test/`` are this fixture's own (no GCS bucket name starts with ``_``):
``POST /_test/plant`` (a JSON list of ``{"key", "size", "when"}``: objects of ``size`` zero
bytes written at ``when``, seconds since the epoch; what a test plants by the thousand),
``GET /_test/take`` (the requests since the last take, by kind, and how many are being
served)."""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import email.utils
import hashlib
import http.server
import json
import os
import sqlite3
import sys
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

# The XML API's namespace for listings and multipart results.
_NS = "http://doc.s3.amazonaws.com/2006-03-01"
MAX_KEYS = 1000
MAX_NAME_BYTES = 1024
_HOP = {"connection", "keep-alive", "transfer-encoding"}

_SCHEMA = """
create table if not exists objects (
    bucket text not null, name text not null, generation integer not null,
    metageneration integer not null, size integer not null, etag text not null,
    md5 text not null, updated_us integer not null, blob text,
    content_type text not null,
    primary key (bucket, name)
) without rowid;
create table if not exists uploads (
    id text primary key, bucket text not null, name text not null,
    content_type text not null, if_generation integer
);
create table if not exists parts (
    upload text not null, number integer not null, blob text not null, size integer not null,
    md5 text not null, primary key (upload, number)
);
create table if not exists buckets (name text primary key);
create table if not exists counter (id integer primary key, generation integer not null);
"""


class GcsError(Exception):
    def __init__(self, status: int, code: str, message: str, details: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details


def _no_such_key(bucket: str, name: str) -> GcsError:
    return GcsError(
        404, "NoSuchKey", "The specified key does not exist.", f"No such object: {bucket}/{name}"
    )


def _precondition() -> GcsError:
    return GcsError(
        412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold."
    )


def _http_date(us: int) -> str:
    return email.utils.formatdate(us // 1_000_000, usegmt=True)


def _iso_ms(us: int) -> str:
    t = datetime.datetime.fromtimestamp(us / 1_000_000, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{(us // 1000) % 1000:03d}Z"


def _name_of(raw: str) -> str:
    """The object name a request path segment names: percent-decoded, UTF-8, as GCS takes it."""
    try:
        name = urllib.parse.unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise GcsError(400, "InvalidArgument", "Invalid object name: not UTF-8.") from None
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        raise GcsError(400, "InvalidArgument", "Object name length must be 1 to 1024 bytes.")
    if "\r" in name or "\n" in name:
        raise GcsError(400, "InvalidArgument", "Object names cannot contain CR or LF.")
    return name


class Store:
    """The buckets' objects under ``root``: SQLite for the names and metadata, a file per
    object's bytes (``blobs/``), parts of uploads in progress beside them."""

    def __init__(self, root: Path, buckets: list[str]) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            root / "gcs.sqlite3", check_same_thread=False, isolation_level=None
        )
        self._db.execute("pragma journal_mode=wal")
        # Written through at each checkpoint, not each request: a test server killed
        # keeps what it had committed before its last checkpoint (the WAL is replayed).
        self._db.execute("pragma synchronous=normal")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        with self._lock:
            for b in buckets:
                self._db.execute("insert or ignore into buckets values (?)", (b,))
            row = self._db.execute("select generation from counter where id = 0").fetchone()
            if row is None:
                self._db.execute("insert into counter values (0, 0)")

    # ------------------------------------------------------------------ helpers
    def _next_generation(self) -> int:
        # GCS's generations are microsecond timestamps that only grow.
        (last,) = self._db.execute("select generation from counter where id = 0").fetchone()
        gen = max(last + 1, time.time_ns() // 1000)
        self._db.execute("update counter set generation = ? where id = 0", (gen,))
        return int(gen)

    def has_bucket(self, bucket: str) -> bool:
        with self._lock:
            return (
                self._db.execute("select 1 from buckets where name = ?", (bucket,)).fetchone()
                is not None
            )

    def _check_bucket(self, bucket: str) -> None:
        if self._db.execute("select 1 from buckets where name = ?", (bucket,)).fetchone() is None:
            raise GcsError(404, "NoSuchBucket", "The specified bucket does not exist.")

    def _blob_path(self, blob: str) -> Path:
        return self.root / "blobs" / blob

    def spool(self, data: bytes) -> tuple[str, str]:
        """Writes ``data`` to a new blob file outside any transaction: (blob, md5 hex)."""
        blob = uuid.uuid4().hex
        path = self._blob_path(blob)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return blob, hashlib.md5(data).hexdigest()

    def _drop_blob(self, blob: str | None) -> None:
        if blob:
            with contextlib.suppress(FileNotFoundError):
                self._blob_path(blob).unlink()

    @staticmethod
    def _check(row: Any, headers: dict[str, str], prefix: str = "x-goog-") -> None:
        """GCS's preconditions by generation (``prefix`` ``x-goog-copy-source-`` for the
        source of a copy): 412 when one does not hold."""
        want = headers.get(f"{prefix}if-generation-match")
        if want is not None:
            try:
                wanted = int(want)
            except ValueError:
                raise GcsError(400, "InvalidArgument", "Invalid generation.") from None
            current = 0 if row is None else row["generation"]
            if wanted != current:
                raise _precondition()
        meta = headers.get(f"{prefix}if-metageneration-match")
        if meta is not None and (row is None or str(row["metageneration"]) != meta.strip()):
            raise _precondition()
        not_gen = headers.get(f"{prefix}if-generation-not-match")
        if not_gen is not None and row is not None and str(row["generation"]) == not_gen.strip():
            raise _precondition()

    def _row(self, bucket: str, name: str) -> Any:
        cur = self._db.execute(
            "select * from objects where bucket = ? and name = ?", (bucket, name)
        )
        cur.row_factory = sqlite3.Row
        return cur.fetchone()

    # ------------------------------------------------------------------ objects
    def put(
        self,
        bucket: str,
        name: str,
        blob: str,
        md5: str,
        size: int,
        content_type: str,
        headers: dict[str, str],
        etag: str | None = None,
    ) -> dict[str, Any]:
        old_blob = None
        try:
            with self._lock:
                self._check_bucket(bucket)
                self._db.execute("begin immediate")
                try:
                    row = self._row(bucket, name)
                    self._check(row, headers)
                    gen = self._next_generation()
                    tag = etag or f'"{md5}"'
                    old_blob = row["blob"] if row is not None else None
                    self._db.execute(
                        "insert or replace into objects values (?,?,?,?,?,?,?,?,?,?)",
                        (bucket, name, gen, 1, size, tag, md5, gen, blob, content_type),
                    )
                    self._db.execute("commit")
                except BaseException:
                    self._db.execute("rollback")
                    raise
        except BaseException:
            self._drop_blob(blob)
            raise
        self._drop_blob(old_blob)
        return {"generation": gen, "metageneration": 1, "etag": tag, "updated_us": gen}

    def head(self, bucket: str, name: str, generation: str | None = None) -> Any:
        with self._lock:
            self._check_bucket(bucket)
            row = self._row(bucket, name)
        if row is None or (generation is not None and str(row["generation"]) != generation):
            raise _no_such_key(bucket, name)
        return row

    def read(self, row: Any, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of the object ``row`` describes."""
        if row["blob"] is None:
            return b"\0" * (end - start)
        try:
            with open(self._blob_path(row["blob"]), "rb") as f:
                f.seek(start)
                return f.read(end - start)
        except FileNotFoundError:
            # Replaced or deleted since its row was read: as GCS, the object is gone.
            raise _no_such_key(row["bucket"], row["name"]) from None

    def delete(self, bucket: str, name: str, headers: dict[str, str]) -> None:
        with self._lock:
            self._check_bucket(bucket)
            self._db.execute("begin immediate")
            try:
                row = self._row(bucket, name)
                if row is None:
                    raise _no_such_key(bucket, name)
                self._check(row, headers)
                self._db.execute(
                    "delete from objects where bucket = ? and name = ?", (bucket, name)
                )
                self._db.execute("commit")
            except BaseException:
                self._db.execute("rollback")
                raise
        self._drop_blob(row["blob"])

    def copy(
        self, bucket: str, name: str, src_bucket: str, src: str, headers: dict[str, str]
    ) -> dict[str, Any]:
        """A copy as one transaction: the source's bytes as they are when it commits."""
        with self._lock:
            self._check_bucket(bucket)
            self._check_bucket(src_bucket)
            source = self._row(src_bucket, src)
            if source is None:
                raise _no_such_key(src_bucket, src)
            self._check(source, headers, "x-goog-copy-source-")
            if_match = headers.get("x-goog-copy-source-if-match")
            if if_match is not None and if_match.strip() != source["etag"]:
                raise _precondition()
            data = self.read(source, 0, source["size"])
        blob, md5 = self.spool(data)
        return self.put(
            bucket, name, blob, md5, len(data), source["content_type"], headers, source["etag"]
        )

    def list(
        self, bucket: str, prefix: str, delimiter: str, after: str, max_keys: int
    ) -> tuple[list[Any], list[str], str | None]:
        """(objects, common prefixes, the name the next page starts after or None)."""
        objects: list[Any] = []
        prefixes: list[str] = []
        last = after
        with self._lock:
            self._check_bucket(bucket)
            while True:
                cur = self._db.execute(
                    "select * from objects where bucket = ? and name > ? and name >= ? "
                    "order by name limit 256",
                    (bucket, last, prefix),
                )
                cur.row_factory = sqlite3.Row
                rows = cur.fetchall()
                if not rows:
                    return objects, prefixes, None
                for row in rows:
                    name = row["name"]
                    if not name.startswith(prefix):
                        return objects, prefixes, None
                    if len(objects) + len(prefixes) == max_keys:
                        # One more is there: the page is full and the listing goes on.
                        return objects, prefixes, last
                    rest = name[len(prefix) :]
                    cut = rest.find(delimiter) if delimiter else -1
                    if cut >= 0:
                        common = prefix + rest[: cut + len(delimiter)]
                        prefixes.append(common)
                        # Past every name below this common prefix.
                        last = common + "\U0010ffff"
                        break
                    objects.append(row)
                    last = name

    # ------------------------------------------------------------------ multipart
    def initiate(self, bucket: str, name: str, content_type: str, headers: dict[str, str]) -> str:
        upload = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        gen = headers.get("x-goog-if-generation-match")
        with self._lock:
            self._check_bucket(bucket)
            self._db.execute(
                "insert into uploads values (?,?,?,?,?)",
                (upload, bucket, name, content_type, None if gen is None else int(gen)),
            )
        return upload

    def _upload(self, upload: str, bucket: str, name: str) -> Any:
        cur = self._db.execute("select * from uploads where id = ?", (upload,))
        cur.row_factory = sqlite3.Row
        row = cur.fetchone()
        if row is None or row["bucket"] != bucket or row["name"] != name:
            raise GcsError(
                404,
                "NoSuchUpload",
                "The specified multipart upload does not exist. The upload ID might be "
                "invalid, or the multipart upload might have been aborted or completed.",
            )
        return row

    def put_part(self, upload: str, bucket: str, name: str, number: int, data: bytes) -> str:
        blob, md5 = self.spool(data)
        old = None
        with self._lock:
            try:
                self._upload(upload, bucket, name)
            except GcsError:
                self._drop_blob(blob)
                raise
            prev = self._db.execute(
                "select blob from parts where upload = ? and number = ?", (upload, number)
            ).fetchone()
            old = prev[0] if prev else None
            self._db.execute(
                "insert or replace into parts values (?,?,?,?,?)",
                (upload, number, blob, len(data), md5),
            )
        self._drop_blob(old)
        return f'"{md5}"'

    def complete(
        self, upload: str, bucket: str, name: str, listed: list[tuple[int, str]]
    ) -> dict[str, Any]:
        with self._lock:
            up = self._upload(upload, bucket, name)
            parts = {
                n: (blob, size, md5)
                for n, blob, size, md5 in self._db.execute(
                    "select number, blob, size, md5 from parts where upload = ?", (upload,)
                )
            }
        numbers = [n for n, _ in listed]
        if not listed or numbers != sorted(set(numbers)):
            raise GcsError(400, "InvalidPartOrder", "The list of parts was not in ascending order.")
        for n, etag in listed:
            if n not in parts or etag.strip() != f'"{parts[n][2]}"':
                raise GcsError(
                    400, "InvalidPart", "One or more of the specified parts could not be found."
                )
        data = b"".join(self._blob_path(parts[n][0]).read_bytes() for n in numbers)
        blob, md5 = self.spool(data)
        joined = hashlib.md5(b"".join(bytes.fromhex(parts[n][2]) for n in numbers)).hexdigest()
        headers = {}
        if up["if_generation"] is not None:
            headers["x-goog-if-generation-match"] = str(up["if_generation"])
        result = self.put(
            bucket,
            name,
            blob,
            md5,
            len(data),
            up["content_type"],
            headers,
            f'"{joined}-{len(numbers)}"',
        )
        self.abort(upload, bucket, name)
        return result

    def abort(self, upload: str, bucket: str, name: str) -> None:
        with self._lock:
            self._upload(upload, bucket, name)
            blobs = [
                b for (b,) in self._db.execute("select blob from parts where upload = ?", (upload,))
            ]
            self._db.execute("delete from parts where upload = ?", (upload,))
            self._db.execute("delete from uploads where id = ?", (upload,))
        for b in blobs:
            self._drop_blob(b)

    # ------------------------------------------------------------------ planting
    def plant(self, bucket: str, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._check_bucket(bucket)
            self._db.execute("begin immediate")
            try:
                for item in items:
                    name = str(item["key"])
                    size = int(item.get("size", 0))
                    gen = self._next_generation()
                    when = item.get("when")
                    updated = gen if when is None else int(float(when) * 1_000_000)
                    md5 = hashlib.md5(b"\0" * size).hexdigest()
                    old = self._row(bucket, name)
                    self._db.execute(
                        "insert or replace into objects values (?,?,?,?,?,?,?,?,?,?)",
                        (
                            bucket,
                            name,
                            gen,
                            1,
                            size,
                            f'"{md5}"',
                            md5,
                            updated,
                            None,
                            "application/octet-stream",
                        ),
                    )
                    if old is not None:
                        self._drop_blob(old["blob"])
                self._db.execute("commit")
            except BaseException:
                self._db.execute("rollback")
                raise


def _error_xml(e: GcsError) -> bytes:
    details = f"<Details>{escape(e.details)}</Details>" if e.details else ""
    return (
        "<?xml version='1.0' encoding='UTF-8'?>"
        f"<Error><Code>{e.code}</Code><Message>{escape(e.message)}</Message>{details}</Error>"
    ).encode()


def _object_headers(row: Any) -> list[tuple[str, str]]:
    md5 = base64.b64encode(bytes.fromhex(row["md5"])).decode()
    return [
        ("ETag", row["etag"]),
        ("Last-Modified", _http_date(row["updated_us"])),
        ("x-goog-generation", str(row["generation"])),
        ("x-goog-metageneration", str(row["metageneration"])),
        ("x-goog-stored-content-length", str(row["size"])),
        ("x-goog-stored-content-encoding", "identity"),
        ("x-goog-hash", f"md5={md5}"),
        ("x-goog-storage-class", "STANDARD"),
        ("Content-Type", row["content_type"]),
        ("Accept-Ranges", "bytes"),
    ]


def _parse_range(spec: str, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) of a ``bytes=`` range over an object of ``size`` bytes; None
    when it cannot be satisfied (416). A malformed one is ignored (the whole object), as HTTP
    says."""
    unit, _, ranges = spec.partition("=")
    if unit.strip() != "bytes" or "," in ranges:
        return (0, size)
    first, _, last = ranges.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            return None if n == 0 or size == 0 else (max(0, size - n), size)
        start = int(first)
        end = size - 1 if last == "" else min(int(last), size - 1)
    except ValueError:
        return (0, size)
    if start >= size or end < start:
        return None
    return (start, end + 1)


def _kind(method: str, path: str, query: dict[str, str]) -> str:
    """What a request is, for the counts a test takes: ``list`` or the method, lower-case."""
    if method == "GET" and path.count("/") <= 1:
        return "list"
    return method.lower()


class Server:
    def __init__(self, root: Path, port: int, buckets: list[str], token: str | None) -> None:
        self.store = Store(root, buckets)
        self.token = token
        self.counts: Counter[str] = Counter()
        self.in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                server.serve(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.http.daemon_threads = True
        self.port = int(self.http.server_address[1])

    # ------------------------------------------------------------------ answers
    @staticmethod
    def _send(
        h: http.server.BaseHTTPRequestHandler,
        status: int,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
        *,
        length: int | None = None,
    ) -> None:
        h.send_response(status)
        for k, v in headers or []:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _xml(self, h: http.server.BaseHTTPRequestHandler, status: int, xml: str) -> None:
        body = ("<?xml version='1.0' encoding='UTF-8'?>" + xml).encode()
        self._send(h, status, body, [("Content-Type", "application/xml; charset=UTF-8")])

    def serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        split = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(split.query, keep_blank_values=True))
        raw_path = split.path
        if raw_path.startswith("/_test/"):
            self._admin(h, raw_path, query, body)
            return
        with self._lock:
            self.counts[_kind(h.command, raw_path, query)] += 1
            self.in_flight += 1
        try:
            headers = {k.lower(): v for k, v in h.headers.items()}
            if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
                raise GcsError(401, "AuthenticationRequired", "Invalid Credentials")
            self._route(h, raw_path, query, headers, body)
        except GcsError as e:
            body = b"" if h.command == "HEAD" else _error_xml(e)
            self._send(h, e.status, body, [("Content-Type", "application/xml; charset=UTF-8")])
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        finally:
            with self._lock:
                self.in_flight -= 1

    def _route(
        self,
        h: http.server.BaseHTTPRequestHandler,
        raw_path: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes,
    ) -> None:
        bucket_raw, slash, name_raw = raw_path.lstrip("/").partition("/")
        bucket = urllib.parse.unquote(bucket_raw)
        if not slash or name_raw == "":
            if h.command == "GET":
                self._list(h, bucket, query)
                return
            raise GcsError(405, "MethodNotAllowed", "The specified method is not allowed.")
        name = _name_of(name_raw)
        store = self.store
        if h.command in ("GET", "HEAD"):
            self._get(h, bucket, name, query, headers)
        elif h.command == "PUT" and "uploadId" in query:
            try:
                number = int(query.get("partNumber", ""))
            except ValueError:
                raise GcsError(400, "InvalidArgument", "Invalid partNumber.") from None
            etag = store.put_part(query["uploadId"], bucket, name, number, body)
            self._send(h, 200, b"", [("ETag", etag)])
        elif h.command == "PUT" and "x-goog-copy-source" in headers:
            src_bucket, _, src = headers["x-goog-copy-source"].lstrip("/").partition("/")
            done = store.copy(
                bucket, name, urllib.parse.unquote(src_bucket), _name_of(src), headers
            )
            self._xml(
                h,
                200,
                f"<CopyObjectResult><LastModified>{_iso_ms(done['updated_us'])}</LastModified>"
                f"<ETag>{escape(done['etag'])}</ETag></CopyObjectResult>",
            )
        elif h.command == "PUT":
            blob, md5 = store.spool(body)
            ctype = headers.get("content-type", "application/octet-stream")
            done = store.put(bucket, name, blob, md5, len(body), ctype, headers)
            self._send(h, 200, b"", self._written(done))
        elif h.command == "POST" and "uploads" in query:
            ctype = headers.get("content-type", "application/octet-stream")
            upload = store.initiate(bucket, name, ctype, headers)
            self._xml(
                h,
                200,
                f'<InitiateMultipartUploadResult xmlns="{_NS}"><Bucket>{escape(bucket)}</Bucket>'
                f"<Key>{escape(name)}</Key><UploadId>{upload}</UploadId>"
                "</InitiateMultipartUploadResult>",
            )
        elif h.command == "POST" and "uploadId" in query:
            listed = self._parts_of(body)
            done = store.complete(query["uploadId"], bucket, name, listed)
            xml = (
                f'<CompleteMultipartUploadResult xmlns="{_NS}">'
                f"<Location>/{escape(bucket)}/{escape(name)}</Location>"
                f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(name)}</Key>"
                f"<ETag>{escape(done['etag'])}</ETag></CompleteMultipartUploadResult>"
            )
            payload = ("<?xml version='1.0' encoding='UTF-8'?>" + xml).encode()
            self._send(h, 200, payload, [("Content-Type", "application/xml"), *self._written(done)])
        elif h.command == "DELETE" and "uploadId" in query:
            store.abort(query["uploadId"], bucket, name)
            self._send(h, 204)
        elif h.command == "DELETE":
            store.delete(bucket, name, headers)
            self._send(h, 204)
        else:
            raise GcsError(405, "MethodNotAllowed", "The specified method is not allowed.")

    @staticmethod
    def _written(done: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            ("ETag", done["etag"]),
            ("x-goog-generation", str(done["generation"])),
            ("x-goog-metageneration", str(done["metageneration"])),
        ]

    @staticmethod
    def _parts_of(body: bytes) -> list[tuple[int, str]]:
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            raise GcsError(
                400, "MalformedXML", "The XML you provided was not well-formed."
            ) from None
        out = []
        for part in root.iter():
            if part.tag.rsplit("}", 1)[-1] != "Part":
                continue
            fields = {c.tag.rsplit("}", 1)[-1]: (c.text or "") for c in part}
            try:
                out.append((int(fields["PartNumber"]), fields["ETag"]))
            except (KeyError, ValueError):
                raise GcsError(
                    400, "MalformedXML", "The XML you provided was not well-formed."
                ) from None
        return out

    def _get(
        self,
        h: http.server.BaseHTTPRequestHandler,
        bucket: str,
        name: str,
        query: dict[str, str],
        headers: dict[str, str],
    ) -> None:
        row = self.store.head(bucket, name, query.get("generation"))
        Store._check(row, headers)
        etag = row["etag"]
        modified = row["updated_us"] // 1_000_000
        if_match = headers.get("if-match")
        if if_match is not None and if_match.strip() not in (etag, "*"):
            raise _precondition()
        since = headers.get("if-unmodified-since")
        if since is not None and _epoch(since) is not None and modified > _epoch(since):  # type: ignore[operator]
            raise _precondition()
        if_none = headers.get("if-none-match")
        if if_none is not None and if_none.strip() in (etag, "*"):
            self._send(h, 304, b"", [("ETag", etag)])
            return
        since = headers.get("if-modified-since")
        if since is not None and _epoch(since) is not None and modified <= _epoch(since):  # type: ignore[operator]
            self._send(h, 304, b"", [("ETag", etag)])
            return
        size = row["size"]
        out = _object_headers(row)
        spec = headers.get("range")
        if spec is None:
            data = b"" if h.command == "HEAD" else self.store.read(row, 0, size)
            self._send(h, 200, data, out, length=size)
            return
        span = _parse_range(spec, size)
        if span is None:
            raise GcsError(416, "InvalidRange", "The requested range cannot be satisfied.")
        start, end = span
        data = b"" if h.command == "HEAD" else self.store.read(row, start, end)
        out.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
        self._send(h, 206, data, out, length=end - start)

    def _list(
        self, h: http.server.BaseHTTPRequestHandler, bucket: str, query: dict[str, str]
    ) -> None:
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        v2 = query.get("list-type") == "2"
        try:
            max_keys = min(MAX_KEYS, int(query.get("max-keys", MAX_KEYS)))
        except ValueError:
            raise GcsError(400, "InvalidArgument", "Invalid max-keys.") from None
        if max_keys <= 0:
            max_keys = MAX_KEYS
        token = query.get("continuation-token")
        if v2 and token:
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except (ValueError, UnicodeDecodeError):
                raise GcsError(400, "InvalidArgument", "Invalid continuation token.") from None
        else:
            after = query.get("start-after" if v2 else "marker", "")
        objects, prefixes, resume = self.store.list(bucket, prefix, delimiter, after, max_keys)
        parts = [f'<ListBucketResult xmlns="{_NS}"><Name>{escape(bucket)}</Name>']
        parts.append(f"<Prefix>{escape(prefix)}</Prefix>" if prefix else "<Prefix/>")
        if v2 and query.get("start-after"):
            parts.append(f"<StartAfter>{escape(query['start-after'])}</StartAfter>")
        if not v2:
            parts.append(f"<Marker>{escape(after)}</Marker>")
        if delimiter:
            parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
        parts.append(f"<MaxKeys>{max_keys}</MaxKeys>")
        parts.append(f"<IsTruncated>{'true' if resume is not None else 'false'}</IsTruncated>")
        # Objects and common prefixes, merged in name order, as GCS writes them.
        entries: list[tuple[str, str]] = [(r["name"], self._contents(r)) for r in objects]
        entries += [
            (p, f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>") for p in prefixes
        ]
        parts.extend(xml for _, xml in sorted(entries))
        if resume is not None:
            if v2:
                tok = base64.urlsafe_b64encode(resume.encode()).decode()
                parts.append(f"<NextContinuationToken>{tok}</NextContinuationToken>")
            else:
                parts.append(f"<NextMarker>{escape(resume)}</NextMarker>")
        if v2:
            parts.append(f"<KeyCount>{len(entries)}</KeyCount>")
        parts.append("</ListBucketResult>")
        self._xml(h, 200, "".join(parts))

    @staticmethod
    def _contents(row: Any) -> str:
        return (
            f"<Contents><Key>{escape(row['name'])}</Key>"
            f"<Generation>{row['generation']}</Generation>"
            f"<MetaGeneration>{row['metageneration']}</MetaGeneration>"
            f"<LastModified>{_iso_ms(row['updated_us'])}</LastModified>"
            f"<ETag>{escape(row['etag'])}</ETag><Size>{row['size']}</Size></Contents>"
        )

    # ------------------------------------------------------------------ the fixture's own
    def _admin(
        self, h: http.server.BaseHTTPRequestHandler, path: str, query: dict[str, str], body: bytes
    ) -> None:
        if path == "/_test/take":
            with self._lock:
                out = {"counts": dict(self.counts), "in_flight": self.in_flight}
                self.counts = Counter()
            self._send(h, 200, json.dumps(out).encode(), [("Content-Type", "application/json")])
        elif path == "/_test/plant" and h.command == "POST":
            try:
                self.store.plant(query.get("bucket", ""), json.loads(body))
            except GcsError as e:
                self._send(h, e.status, _error_xml(e))
                return
            self._send(h, 204)
        else:
            self._send(h, 404)


def _epoch(text: str) -> int | None:
    try:
        return int(email.utils.parsedate_to_datetime(text).timestamp())
    except (TypeError, ValueError):
        return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m tests.gcs_server", description=__doc__.split("\n")[0]
    )
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    p.add_argument("--root", type=Path, required=True, help="where the objects are kept")
    p.add_argument("--bucket", action="append", default=[], help="a bucket to serve (repeat)")
    p.add_argument("--token", help="the bearer token every request must carry")
    args = p.parse_args(argv)
    server = Server(args.root, args.port, args.bucket or ["xla-pcache-test"], args.token)
    print(f"listening on 127.0.0.1:{server.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.http.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
