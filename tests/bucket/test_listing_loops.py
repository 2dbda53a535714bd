"""A service that pages a listing round and round: pages holding no key, or the same keys,
each with a continuation token again. object_store follows such a token for ever inside one
call of obstore's iterator (no request times out, no chunk comes back to count, Ctrl-C
waits), so each chunk of a listing has a bound (``bucket.pages``) and its keys must come in
order: the listing fails there, counted as any failed listing, and the call returns. A loopback
server speaks just enough of GCS's XML API (the listing, a 404 for anything else); nothing is
timed: the server never ends a listing, so only the bound ends the call."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from xla_pcache.bucket import pages, upkeep

EMPTY = "empty"
SAME = "same"


class _Looping(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = EMPTY

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if "list-type=2" not in self.path:
            self._send(404, b"")
            return
        listed = ""
        if self.mode == SAME:
            listed = (
                "<Contents><Key>p/entries/0123456789abcdef0123456789abcdef</Key><Size>99"
                "</Size><LastModified>2024-01-01T00:00:00.000Z</LastModified>"
                '<ETag>"x"</ETag></Contents>'
            )
        body = (
            "<?xml version='1.0' encoding='UTF-8'?>"
            "<ListBucketResult xmlns='http://doc.s3.amazonaws.com/2006-03-01'>"
            "<Name>b</Name><Prefix>p/</Prefix><MaxKeys>1000</MaxKeys>"
            f"<IsTruncated>true</IsTruncated>{listed}"
            "<NextContinuationToken>again</NextContinuationToken></ListBucketResult>"
        ).encode()
        self._send(200, body, "application/xml")

    def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(params=[EMPTY, SAME])
def looping(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The environment of a GCS client pointed at a server that pages round and round."""
    handler = type("Handler", (_Looping,), {"mode": request.param})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    account = tmp_path / "account.json"
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    doc = {"gcs_base_url": endpoint, "disable_oauth": True}
    blank = {"client_email": "", "private_key": "", "private_key_id": ""}
    account.write_text(json.dumps({**doc, **blank}))
    env = {"GOOGLE_SERVICE_ACCOUNT": str(account), "GOOGLE_BEARER_TOKEN": "t"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # where the client reads them
    try:
        yield env
    finally:
        server.shutdown()
        server.server_close()


def _bucket(env: dict[str, str]) -> upkeep.Bucket:
    b = upkeep.Bucket("gs://b/p", timeout=5.0, environ=env)
    # The bound a chunk has (a request and its retry: minutes by default); the server
    # never ends the listing, so any bound shows the call returns.
    b.reader.page_wait_s = 1.0
    return b


def test_a_listing_that_pages_round_fails_and_returns(looping: dict[str, str]) -> None:
    b = _bucket(looping)
    with pytest.raises(pages.ListingStalled):
        b.listed_entries()
    with pytest.raises(pages.ListingStalled):
        b.markers(limit=10_000)
    with pytest.raises(pages.ListingStalled):
        b.reader.directories("entries")
    assert b.requests["list"] >= 3
