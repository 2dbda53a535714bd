"""What objects a key-less writer plants in a bucket cost its hosts: a prune's peak memory
against a planted ``usage`` and planted records, a prune's reach past one key the client
refuses after every entry (with and without planted records), a torch_xla host start's
requests against planted markers, and `stats`' requests with keys the client cannot parse.

    python bench/bucket_planted.py                     # this checkout
    python bench/bucket_planted.py --tree ../other     # another checkout's package, same server

SeaweedFS (``weed mini``) on loopback, as the tests start it; requests are counted on the wire
by the relay of the tests (``tests/tiers/relay.py``), which also lists keys SeaweedFS cannot
hold. Each prune runs in a fresh process and reports how far its peak RSS (VmHWM, its own)
grew while it ran. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_PRUNE = r"""
import json, sys, time
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
from xla_pcache.bucket.upkeep import Bucket
b = Bucket(sys.argv[1])
b.read_stored_budget()  # the client and its runtime, before the baseline
base = hwm()
t = time.perf_counter()
r = b.prune(max_size=int(sys.argv[2]) if len(sys.argv) > 2 else 10**12)
print(json.dumps({"base_kib": base, "peak_kib": hwm(), "s": time.perf_counter() - t,
                  "seen": r.entries_before, "removed": r.removed,
                  "asked": getattr(r, "asked", 0), "reached": getattr(r, "reached", 0)}))
"""

_START = r"""
import json, sys, time
from xla_pcache import open_store
from xla_pcache.config import Settings
from xla_pcache.torch_xla import _bucket_start
s = open_store(sys.argv[1], Settings.from_env().replace(xdg_cache_home=sys.argv[2]))
t = time.perf_counter()
n = _bucket_start.pull(s, lambda g: f"torch_xla/{g}")
print(json.dumps({"fetched": n, "s": time.perf_counter() - t}))
s.close()
"""

_STATS = r"""
import json, sys
from xla_pcache.bucket.upkeep import Bucket
try:
    print(json.dumps({"entries": Bucket(sys.argv[1]).stats()["entries"]}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__}))
"""


def _gz(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def _run(code: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", default=str(ROOT), help="the checkout whose package runs")
    parser.add_argument("--records", type=int, default=4, help="planted records")
    parser.add_argument("--names", type=int, default=400_000, help="names per planted record")
    parser.add_argument("--markers", type=int, default=2000, help="planted torch_xla markers")
    args = parser.parse_args()

    from xla_pcache._core import entry_name

    from tests.tiers.relay import Relay
    from tests.tiers.servers import bucket_client, put_objects, start_s3

    tree = Path(args.tree).resolve() / "python"
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as d:
        server = start_s3(Path(d) / "weed")
        relay = Relay(server)
        try:
            env = {**os.environ, **server.env(), "PYTHONPATH": str(tree)}
            env["AWS_ENDPOINT_URL"] = relay.endpoint
            entries = {
                f"xla_pcache-1/entries/{secrets.token_hex(16)}": b"x" * 100 for _ in range(1000)
            }

            def bucket_with(items: dict[str, bytes], n: int = len(entries)) -> str:
                prefix = f"p-{secrets.token_hex(4)}"
                some = {k: entries[k] for k in sorted(entries)[:n]}
                put_objects(bucket_client(server, prefix), {**some, **items})
                return server.url(prefix)

            def prune(what: str, items: dict[str, bytes]) -> None:
                r = _run(_PRUNE, env, bucket_with(items))
                rows.append(
                    (
                        f"prune, 1,000 entries, {what}",
                        f"{r['base_kib'] / 1024:.0f} -> {r['peak_kib'] / 1024:.0f} MiB peak, "
                        f"{r['s']:.1f} s",
                    )
                )

            prune("nothing planted", {})
            usage = _gz(b"ab\n" * ((64 << 20) // 3))
            prune(
                f"a `usage` of {len(usage):,} B (64 MiB of 2-byte lines)",
                {"xla_pcache-1/usage": usage},
            )
            records = {}
            for _ in range(args.records):
                body = "".join(secrets.token_hex(16) + "\n" for _ in range(args.names)).encode()
                name = f"r-{int(time.time() * 1000)}-{secrets.token_hex(8)}-0-0"
                records[f"xla_pcache-1/records/{name}"] = _gz(body)
            prune(f"{args.records} records of {args.names:,} names of no entry", records)

            # One key refused as a name of its own right after the last of 999 entries: the
            # listing sees none of them. The hosts' record names them (a put is a use).
            hidden = 999
            ours = "".join(sorted(k.rpartition("/")[2] + "\n" for k in entries)[:hidden])
            named = {
                f"xla_pcache-1/records/r-{int(time.time() * 1000)}-{'1' * 16}-0-0": _gz(
                    ours.encode()
                )
            }

            def cut_short(what: str, items: dict[str, bytes]) -> None:
                url = bucket_with({**named, **items}, hidden)
                prefix = url.rpartition("/")[2]
                relay.plant(f"{prefix}/xla_pcache-1/entries/{'f' * 32}\x01")
                relay.take()
                r = _run(_PRUNE, env, url, str(hidden * 50))  # half of the entries' bytes
                wire = relay.take()
                rows.append(
                    (
                        f"prune to half, {hidden} entries, a key after the last, {what}",
                        f"saw {r['seen']:,} (reached {r['reached']:,} of {r['asked']:,} "
                        f"asked), removed {r['removed']:,}; "
                        + ", ".join(f"{n} {k.upper()}" for k, n in sorted(wire.items()))
                        + f"; {r['base_kib'] / 1024:.0f} -> {r['peak_kib'] / 1024:.0f} MiB "
                        f"peak, {r['s']:.1f} s",
                    )
                )

            cut_short("named in a record", {})
            cut_short(f"and {args.records} records of {args.names:,} made-up names", records)

            graphs = [str(10**20 + i) for i in range(args.markers)]
            url = bucket_with(
                {f"xla_pcache-1/torch_xla/{entry_name(f'torch_xla/{g}')}-{g}": b"" for g in graphs}
            )
            relay.take()
            r = _run(_START, env, url, str(Path(d) / "home"))
            wire = relay.take()
            rows.append(
                (
                    f"torch_xla host start, {args.markers:,} planted markers",
                    f"{wire.get('list', 0)} LIST, {wire.get('get', 0)} GET, {r['s']:.1f} s",
                )
            )

            prefix = f"q-{secrets.token_hex(4)}"
            names = sorted(entry_name(f"k{i}") for i in range(1100))
            put_objects(
                bucket_client(server, prefix), {f"xla_pcache-1/entries/{n}": b"x" for n in names}
            )
            for key in (
                f"{prefix}/xla_pcache-1/entries//first",
                f"{prefix}/xla_pcache-1/entries/{names[1050]}/../x",
                f"{prefix}/xla_pcache-1/records/./r",
                f"{prefix}/xla_pcache-1/claims/..",
            ):
                relay.plant(key, 5)
            relay.take()
            r = _run(_STATS, env, server.url(prefix))
            wire = relay.take()
            got = r.get("error") or f"{r['entries']:,} entries seen"
            rows.append(
                (
                    "`stats`, 1,100 entries, 4 keys the client cannot parse",
                    f"{got}; " + ", ".join(f"{n} {k.upper()}" for k, n in sorted(wire.items())),
                )
            )
        finally:
            relay.close()
            server.stop()
    print(f"# bench/bucket_planted.py: {tree}\n\nload average {load}\n")
    print("| planted | cost |\n|---|---|")
    for what, cost in rows:
        print(f"| {what} | {cost} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
