"""Get latency: from a loopback Redis remote tier (local miss -> remote -> verify -> publish)
against a local hit, for a 550 KB and a 64 MB entry, in one run.

    PYTHONPATH=python python bench/remote.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

from xla_pcache import Store


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    proc, url = _redis()
    try:
        with tempfile.TemporaryDirectory() as d:
            a = Store(os.path.join(d, "a"), remote=url, hit_interval=0)
            for label, size in (("550 KB", 550_000), ("64 MB", 64 << 20)):
                key = f"bench-{size}"
                assert a.put(key, os.urandom(size))
                assert a.remote is not None
                a.remote.flush()
                local, remote = [], []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    blob = a.get(key)
                    assert blob is not None and len(memoryview(blob)) == size
                    local.append(time.perf_counter() - t)
                    b = Store(tempfile.mkdtemp(dir=d), remote=url)
                    t = time.perf_counter()
                    blob = b.get(key)
                    assert blob is not None and len(memoryview(blob)) == size
                    remote.append(time.perf_counter() - t)
                    b.close()
                print(
                    f"{label}: local hit {statistics.median(local) * 1e3:.2f} ms, "
                    f"remote get (loopback Redis, verify + publish) "
                    f"{statistics.median(remote) * 1e3:.2f} ms  (median of {args.reps})"
                )
            a.close()
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
