"""Get latency from remote tiers against a local hit, for a 550 KB and a 64 MB entry, in one
run: a loopback Redis (local miss -> GET -> verify -> publish -> read back) and a loopback S3
service (SeaweedFS ``weed mini``; the same path through the object-store tier, with ranged
parallel reads for the large entry), side by side with the client's own plain GET of the
same object (redis-py ``GET``, obstore ``get().bytes()``).

    PYTHONPATH=python python bench/remote.py [--reps 5] [--tiers redis,s3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from xla_pcache import Store, entry_name

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _redis() -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    assert exe, "redis-server is required"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def _run(tier: str, url: str, plain_get: Callable[[str], int], reps: int, d: str) -> None:
    a = Store(os.path.join(d, f"{tier}-a"), remote=url, hit_interval=0)
    for label, size in (("550 KB", 550_000), ("64 MB", 64 << 20)):
        key = f"bench-{tier}-{size}"
        assert a.put(key, os.urandom(size))
        assert a.remote is not None
        a.remote.flush()
        local, remote, plain = [], [], []
        for _ in range(reps):
            t = time.perf_counter()
            blob = a.get(key)
            assert blob is not None and len(memoryview(blob)) == size
            local.append(time.perf_counter() - t)
            # Alternate the two remote measurements so that both see the same conditions.
            t = time.perf_counter()
            n = plain_get(entry_name(key))
            plain.append(time.perf_counter() - t)
            assert n > size
            b = Store(tempfile.mkdtemp(dir=d), remote=url)
            # The tier's client is made before the clock starts, as the plain client was:
            # what is timed is the get (a new connection all the same).
            assert b.remote is not None
            t = time.perf_counter()
            blob = b.get(key)
            assert blob is not None and len(memoryview(blob)) == size
            remote.append(time.perf_counter() - t)
            b.close()
        ratio = statistics.median(remote) / statistics.median(plain)
        print(
            f"{tier:5} {label:>6}: local hit {_median_ms(local):8.2f} ms | tier get (miss, "
            f"fetch, verify, publish, read back) {_median_ms(remote):8.2f} ms | plain client "
            f"GET {_median_ms(plain):8.2f} ms | tier/plain {ratio:.2f}  (median of {reps})",
            flush=True,
        )
    a.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiers", default="redis,s3")
    args = ap.parse_args()
    tiers = args.tiers.split(",")
    with tempfile.TemporaryDirectory() as d:
        if "redis" in tiers:
            import redis

            proc, url = _redis()
            client = redis.Redis.from_url(url)
            try:
                _run(
                    "redis",
                    url,
                    lambda name: len(client.get("xla_pcache:1:" + name) or b""),
                    args.reps,
                    d,
                )
            finally:
                proc.kill()
                proc.wait()
        if "s3" in tiers:
            import obstore
            from obstore.store import S3Store

            from tests.tiers.servers import S3_ACCESS_KEY, S3_BUCKET, S3_SECRET_KEY, start_s3

            server = start_s3(Path(d) / "weed")
            try:
                os.environ.update(server.env())
                client = S3Store(
                    S3_BUCKET,
                    prefix="bench",
                    endpoint=server.endpoint,
                    access_key_id=S3_ACCESS_KEY,
                    secret_access_key=S3_SECRET_KEY,
                    region="us-east-1",
                    client_options={"allow_http": True},
                )
                from xla_pcache.tiers.objstore import ENTRY_DIR

                _run(
                    "s3",
                    server.url("bench"),
                    lambda name: len(
                        memoryview(obstore.get(client, f"{ENTRY_DIR}/{name}").bytes())
                    ),
                    args.reps,
                    d,
                )
            finally:
                server.stop()


if __name__ == "__main__":
    main()
