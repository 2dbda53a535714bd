"""Peak memory of reading one large (1 GiB) entry, per peer, each in a fresh process.

A writer process stores the entry; then a reader process opens the peer, ``get``s the
entry, takes a ``memoryview`` of it and runs ``zlib.crc32`` over every byte, and reports
from ``/proc/self/status``: the peak resident set (VmHWM) above its resident set just before
the ``get``, and the split of resident memory, while it holds the value, into anonymous
(private heap: a copy) and file-backed (page cache mapped in: shared with other processes,
reclaimable, not a copy). ``xla_pcache (bytes(blob))`` is the store read with an explicit
copy, to show what a second copy looks like.

Run as ``python -m bench.workloads_memory write|read ...`` from the repository root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from .common import Scratch, drop_page_cache_hint

KEY = "big0000000000000000000001"
READERS = [
    ("xla_pcache", "xla_pcache", "view"),
    ("xla_pcache (bytes(blob))", "xla_pcache", "copy"),
    ("JAX LRUCache", "jax_lru_unbounded", "view"),
    ("diskcache", "diskcache", "view"),
    ("torch_xla-style file", "torch_xla_dir", "view"),
]


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[k] = int(v.split()[0]) * 1024
    return out


def _write(peer_name: str, path: str, size: int) -> None:
    from .peers import BY_NAME

    peer = BY_NAME[peer_name](Path(path), None)
    value = os.urandom(1 << 20) * (size >> 20)
    peer.put(KEY, value)
    peer.close()


def _read(peer_name: str, path: str, mode: str) -> dict[str, Any]:
    from .peers import BY_NAME

    peer = BY_NAME[peer_name](Path(path), None)
    before = _status()
    t0 = time.perf_counter()
    v = peer.get(KEY)
    mv = memoryview(v)
    if mode == "copy":
        data = bytes(mv)
        mv.release()
        mv = memoryview(data)
    crc = zlib.crc32(mv)
    elapsed = time.perf_counter() - t0
    holding = _status()
    out = {
        "bytes": mv.nbytes,
        "crc": crc,
        "seconds": elapsed,
        "rss_before": before["VmRSS"],
        "hwm_before": before["VmHWM"],
        "peak_delta": holding["VmHWM"] - before["VmRSS"],
        "anon_delta": holding["RssAnon"] - before["RssAnon"],
        "file_delta": holding["RssFile"] - before["RssFile"],
        "mapped": bool(getattr(v, "mapped", False)),
    }
    mv.release()
    return out


def run(scratch: Scratch, size: int, log: Any = print) -> dict:
    root = Path(__file__).resolve().parent.parent
    res: dict[str, Any] = {"bytes": size, "readers": {}}
    written: dict[str, Path] = {}
    try:
        for label, peer, mode in READERS:
            if peer not in written:
                for p in list(written.values()):  # one big entry on disk at a time
                    scratch_rm(p)
                written.clear()
                d = scratch.new(f"mem-{peer}")
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.workloads_memory",
                        "write",
                        peer,
                        str(d),
                        str(size),
                    ],
                    cwd=root,
                    check=True,
                )
                written[peer] = d
            d = written[peer]
            for f in d.rglob("*"):
                if f.is_file():
                    drop_page_cache_hint(f)  # each reader starts from disk, not page cache
            out = subprocess.run(
                [sys.executable, "-m", "bench.workloads_memory", "read", peer, str(d), mode],
                cwd=root,
                check=True,
                capture_output=True,
                text=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            res["readers"][label] = r
            log(
                f"  memory {label:<26} peak +{r['peak_delta'] / 2**20:7.0f} MiB "
                f"(anon +{r['anon_delta'] / 2**20:.0f}, file +{r['file_delta'] / 2**20:.0f})"
            )
    finally:
        for p in written.values():
            scratch_rm(p)
    return res


def scratch_rm(p: Path) -> None:
    from .common import rmtree

    rmtree(p)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "write":
        _write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "read":
        print(json.dumps(_read(sys.argv[2], sys.argv[3], sys.argv[4])))
    else:
        raise SystemExit(f"unknown command {cmd!r}")
