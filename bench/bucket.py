"""A bucket as the cache path: what its upkeep costs, in requests and time, and warm starts.

    python bench/bucket.py                      # 100,000 objects, 100 hosts' records, 3 runs
    python bench/bucket.py --objects 10000 --warm-runs 1

SeaweedFS (``weed mini``) on loopback, as the tests start it. Requests are counted twice: by
the client (``bucket.upkeep.Bucket.requests``, a listing counted as one request per page of
1000) and by a relay between client and server that reads each HTTP request line, so the
two can be compared. Prints a markdown report.

- **populate**: ``--objects`` entry objects (100 bytes each: what pruning costs does not
  depend on their size) and ``--hosts`` use records of ``--uses`` entry names each, written
  straight to the bucket (not measured);
- **a hit**: what recording a hit adds to a local hit (``BucketStore.get`` against the
  plain ``Store.get``, same entries), and one host's upload of its record;
- **a writer's budget check** (a GET of the budget, one of the last prune's totals, a
  listing of the records), **stats**, **prune** with the records to fold and a tenth of the
  entries over the budget, and **prune** again with nothing to do;
- **warm start**: the demo's model (``xla-pcache demo``) in fresh JAX processes with only
  ``JAX_COMPILATION_CACHE_DIR=s3://...`` set: a cold host (compiles, uploads), a new host
  with an empty local store (fetches from the bucket), the same host again (local hit).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class CountingRelay:
    """A TCP relay to the S3 server that counts the HTTP requests passing through it, by
    kind: the request line and headers are parsed, the body forwarded by Content-Length."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    @staticmethod
    def kind(method: str, target: str) -> str:
        path, _, query = target.partition("?")
        if method == "GET" and ("list-type" in query or path.count("/") <= 1):
            return "list"
        if method == "POST" and "delete" in query:
            return "delete"
        return method.lower()

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = src.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                with self._lock:
                    self.counts[self.kind(method, target)] += 1
                dst.sendall(head + b"\r\n\r\n")
                while len(buf) < length:
                    data = src.recv(65536)
                    if not data:
                        return
                    buf += data
                dst.sendall(buf[:length])
                buf = buf[length:]
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def take(self) -> dict[str, int]:
        with self._lock:
            out, self.counts = dict(self.counts), Counter()
        return out


def populate(server: Any, prefix: str, objects: int, hosts: int, uses: int) -> list[str]:
    """Entry objects and hosts' records, straight to the bucket, concurrently."""
    import obstore
    from xla_pcache.bucket import upkeep

    from tests.tiers.servers import bucket_client

    client = bucket_client(server, prefix)
    names = [secrets.token_hex(16) for _ in range(objects)]

    async def put_all(items: list[tuple[str, bytes]]) -> None:
        gate = asyncio.Semaphore(64)

        async def one(path: str, body: bytes) -> None:
            async with gate:
                await obstore.put_async(client, path, body)

        await asyncio.gather(*(one(p, b) for p, b in items))

    asyncio.run(put_all([(f"xla_pcache-1/entries/{n}", os.urandom(100)) for n in names]))
    records = []
    for h in range(hosts):
        used = names[h * uses % objects :][:uses]
        records.append((upkeep.new_use_record_name(0, 0), upkeep.use_record_body(used)))
    asyncio.run(put_all(records))
    return names


def measure(relay: CountingRelay, what: str, fn: Any) -> dict[str, Any]:
    relay.take()
    t = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t
    return {"what": what, "seconds": seconds, "wire": relay.take(), "result": result}


def hit_cost(url: str, tmp: Path, keys: int = 2000, rounds: int = 9) -> dict[str, float]:
    """Per-hit time of local hits (the fastest of interleaved rounds): a plain store, and a
    bucket store that records (each key's first hit noted, the rest within the interval)."""
    from xla_pcache import Store, bucket, open_store
    from xla_pcache.config import Settings

    settings = Settings.from_env().replace(xdg_cache_home=str(tmp))
    plain = Store(tmp / "plain")
    local = Store(bucket.local_path(url, settings))  # filled without the bucket behind it
    for store in (plain, local):
        for i in range(keys):
            store.put(f"jit_step-{i:060d}", b"x" * 1000)
    local.close()
    rec = open_store(url, settings)
    times: dict[str, list[float]] = {"plain": [], "recording": []}
    names = [f"jit_step-{i:060d}" for i in range(keys)]
    for _ in range(rounds):  # interleaved, the fastest round of each: a shared machine
        for name, store in (("plain", plain), ("recording", rec)):
            t = time.perf_counter()
            for key in names:
                store.get(key)
            times[name].append((time.perf_counter() - t) / keys)
    out = {name: min(values) for name, values in times.items()}
    # The first hit of each key (noted): a fresh recorder over the same local store.
    assert rec._recorder is not None
    rec._recorder._noted.clear()
    rec._recorder._pending.clear()
    t = time.perf_counter()
    for i in range(keys):
        rec.get(f"jit_step-{i:060d}")
    out["recording_first"] = (time.perf_counter() - t) / keys
    rec._recorder._pending.clear()
    rec._recorder._used = False  # nothing to upload at close: the bench's writes are apart
    plain.close()
    rec.close()
    return out


def warm_worker(spec: dict[str, Any]) -> dict[str, Any]:
    t_start = time.perf_counter()
    import jax
    from xla_pcache.cli._demo import build_model

    hits: list[str] = []
    jax.monitoring.register_event_listener(
        lambda event, **_: (
            hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
        )
    )
    step, args = build_model("bench_bucket")
    lowered = step.lower(*args)
    t = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
    compiled(*args)
    return {"compile_s": compile_s, "hit": bool(hits), "process_s": time.perf_counter() - t_start}


def warm_run(server: Any, url: str, home: Path) -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_", "XLA_PERSISTENT", "XLA_PCACHE"))
    }
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=url,
        XDG_CACHE_HOME=str(home),
        PYTHONPATH=str(ROOT / "python"),
        **server.env(),
    )
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--warm-worker", "{}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


def fmt(sec: float) -> str:
    if sec < 1e-3:
        return f"{sec * 1e6:.1f} µs"
    if sec < 1:
        return f"{sec * 1e3:.1f} ms"
    return f"{sec:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=100, help="use records to fold")
    parser.add_argument("--uses", type=int, default=1000, help="entry names per record")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--warm-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm_worker is not None:
        print(json.dumps(warm_worker(json.loads(args.warm_worker))))
        return 0

    from xla_pcache.bucket import upkeep

    from tests.tiers.servers import start_s3

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = start_s3(tmp / "weed")
        relay = CountingRelay(server.port)
        try:
            for k, v in server.env().items():
                os.environ[k] = v
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{relay.port}"
            prefix = f"bench-{secrets.token_hex(4)}"
            url = server.url(prefix)
            t = time.perf_counter()
            names = populate(server, prefix, args.objects, args.hosts, args.uses)
            populate_s = time.perf_counter() - t
            relay.take()
            bucket = upkeep.Bucket(url)
            rows = []
            # One host's record of `uses` entries: one PUT.
            body = upkeep.use_record_body(names[: args.uses])
            rows.append(
                measure(
                    relay,
                    f"one host's record upload ({args.uses} entries, {len(body):,} B gzip)",
                    lambda: bucket.put(upkeep.new_use_record_name(1, 1000), body),
                )
            )
            # The stored budget: a tenth of the entries over it.
            size = sum(100 for _ in names)
            bucket.write_stored_budget(
                upkeep.BucketStoredBudget(max_size=int(size * 0.9 / upkeep.LOW_WATERMARK))
            )
            rows.append(
                measure(
                    relay,
                    "writer's budget check (no prune yet: estimate unknown)",
                    lambda: (bucket.read_stored_budget(), bucket.estimate()),
                )
            )
            rows.append(measure(relay, "stats", bucket.stats))
            rows.append(measure(relay, "prune: fold records, remove 10 %", bucket.prune))
            rows.append(
                measure(
                    relay,
                    "writer's budget check (after a prune)",
                    lambda: (bucket.read_stored_budget(), bucket.estimate()),
                )
            )
            rows.append(measure(relay, "prune again: nothing to remove", bucket.prune))
            hit = hit_cost(url, tmp / "hits")
            warm: dict[str, list[dict[str, Any]]] = {"cold": [], "bucket": [], "local": []}
            for i in range(args.warm_runs):
                wurl = server.url(f"{prefix}-warm-{i}")
                warm["cold"].append(warm_run(server, wurl, tmp / f"w{i}-a"))
                warm["bucket"].append(warm_run(server, wurl, tmp / f"w{i}-b"))
                warm["local"].append(warm_run(server, wurl, tmp / f"w{i}-b"))
        finally:
            server.stop()

    print(f"# bench/bucket.py: {args.objects:,} objects, {args.hosts} records of {args.uses}")
    print(f"\nload average {load}; populated in {populate_s:.1f} s (not measured)\n")
    print("| operation | time | requests (client count) | requests (on the wire) |")
    print("|---|---|---|---|")
    for row in rows:
        result = row["result"]
        client = ""
        if isinstance(result, upkeep.PruneReport):
            client = ", ".join(f"{n} {k}" for k, n in sorted(result.requests.items()))
            row["what"] += f" ({result.removed:,} removed, {result.records_folded} folded)"
        elif isinstance(result, dict) and "requests" in result:
            client = ", ".join(f"{n} {k}" for k, n in sorted(result["requests"].items()))
        wire = ", ".join(f"{n} {k}" for k, n in sorted(row["wire"].items()))
        print(f"| {row['what']} | {fmt(row['seconds'])} | {client} | {wire} |")
    print("\n| local hit | per hit |\n|---|---|")
    print(f"| plain `Store.get` | {fmt(hit['plain'])} |")
    print(f"| bucket store, entry noted within the interval | {fmt(hit['recording'])} |")
    print(f"| bucket store, first hit of the entry (noted) | {fmt(hit['recording_first'])} |")
    print("\n| demo model, fresh process | compile (median) | hit | process (median) |")
    print("|---|---|---|---|")
    for case, label in (
        ("cold", "cold host: compiles, uploads"),
        ("bucket", "new host, empty local store: from the bucket"),
        ("local", "same host again: local hit"),
    ):
        runs = warm[case]
        print(
            f"| {label} | {fmt(statistics.median(r['compile_s'] for r in runs))} | "
            f"{sum(r['hit'] for r in runs)}/{len(runs)} | "
            f"{fmt(statistics.median(r['wall_s'] for r in runs))} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
