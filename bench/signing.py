"""Signed against unsigned entries, side by side in one run.

    python bench/signing.py [--quick] [--fleet-only]

A fleet of read-only processes first (the figures the read floors are stated for): 40
entries of 100 KB, read once each by each of 5 fresh processes, an unsigned reader and a
trusting one taking turns. Each process times every get; reported are a process's first get
(median over the processes) and each further entry's first get (the median over the
processes of each process's median over entries 2-40). The trusting processes share a
verification record (`verified.rs`) in a fresh `XDG_CACHE_HOME`: the first of them verifies
every signature, the later ones find them recorded; the per-process figures are printed.

Then, for payloads of 100 KB, 10 MB and 100 MB:
- the first get of an entry in a fresh process (a trusting store: BLAKE3 of the payload and
  one Ed25519 verification, which later processes find in the record of a fresh
  `XDG_CACHE_HOME`; an untrusting one: xxh3), timed around the get alone;
- a repeated hit in one process (median; the signature is verified once per process, so
  what remains is BLAKE3 against xxh3);
- a put with and without a signing key (median; signing hashes the payload with BLAKE3
  and signs once).

Prints a table and one JSON line. Stores are opened with explicit arguments (no
environment); the readers' verification record is in a temporary `XDG_CACHE_HOME`, never
the user's own. The machine is shared: compare the columns of one run, not runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from xla_pcache import _core
from xla_pcache.config import Settings
from xla_pcache.store import Store

SIZES = {"100 KB": 100_000, "10 MB": 10_000_000, "100 MB": 100_000_000}

FIRST_GET = """
import sys, time, json
from xla_pcache.store import Store
from xla_pcache.config import Settings
root, key, trusted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tk = None if trusted is None else [(n, bytes.fromhex(p)) for n, p in trusted]
s = Store(root, read_only=True, trusted_keys=tk, settings=Settings())
t = time.perf_counter()
b = s.get(key)
dt = time.perf_counter() - t
assert b is not None
print(dt)
"""


FLEET = """
import sys, time, json
from xla_pcache.store import Store
from xla_pcache.config import Settings
root, n, trusted = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
tk = None if trusted is None else [(n, bytes.fromhex(p)) for n, p in trusted]
s = Store(root, read_only=True, trusted_keys=tk, settings=Settings())
keys = [f"k{i}" for i in range(n)]
out = []
for k in keys:
    t = time.perf_counter()
    b = s.get(k)
    out.append(time.perf_counter() - t)
    assert b is not None
    del b
print(json.dumps(out))
"""

FLEET_ENTRIES = 40
FLEET_PROCESSES = 5
FLEET_SIZE = 100_000


def fleet(trusted: list[tuple[str, str]], seed: bytes) -> dict[str, object]:
    """The read-only fleet: unsigned and trusting processes taking turns."""
    cfg = Settings()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        plain, signed = os.path.join(d, "plain"), os.path.join(d, "signed")
        xdg = os.path.join(d, "xdg")
        os.mkdir(xdg, 0o700)
        sp = Store(plain, settings=cfg)
        ss = Store(signed, settings=cfg, signing_key=("bench-1", seed))
        for i in range(FLEET_ENTRIES):
            payload = os.urandom(FLEET_SIZE)
            assert sp.put(f"k{i}", payload) and ss.put(f"k{i}", payload)
        sp.close()
        ss.close()
        env = {**os.environ, "XDG_CACHE_HOME": xdg}
        runs: dict[str, list[list[float]]] = {"unsigned": [], "trusting": []}
        for _ in range(FLEET_PROCESSES):
            for label, root, tk in (("unsigned", plain, None), ("trusting", signed, trusted)):
                proc = subprocess.run(
                    [sys.executable, "-c", FLEET, root, str(FLEET_ENTRIES), json.dumps(tk)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                )
                runs[label].append(json.loads(proc.stdout))
    out: dict[str, object] = {}
    for label, per_proc in runs.items():
        firsts = [t[0] for t in per_proc]
        further = [statistics.median(t[1:]) for t in per_proc]
        out[label] = {
            "first_s": statistics.median(firsts),
            "further_s": statistics.median(further),
            "per_process_first_s": firsts,
            "per_process_further_s": further,
        }
    return out


def print_fleet(f: dict[str, object]) -> None:
    def us(v: float) -> str:
        return f"{v * 1e6:,.0f} us"

    u, t = f["unsigned"], f["trusting"]
    assert isinstance(u, dict) and isinstance(t, dict)
    print(
        f"fleet: {FLEET_ENTRIES} entries of {FLEET_SIZE // 1000} KB, {FLEET_PROCESSES} fresh "
        "read-only processes per reader"
    )
    print(f"{'reader':>9} | {'first get':>10} | {'each further entry':>18} | per process (further)")
    for label, r in (("unsigned", u), ("trusting", t)):
        per = " ".join(us(v) for v in r["per_process_further_s"])
        print(f"{label:>9} | {us(r['first_s']):>10} | {us(r['further_s']):>18} | {per}")
    print(
        f"{'ratio':>9} | {t['first_s'] / u['first_s']:>9.2f}x | "
        f"{t['further_s'] / u['further_s']:>17.2f}x | floors: 1.5x, 2x"
    )


def first_get(root: str, key: str, trusted: list[tuple[str, str]] | None, runs: int) -> float:
    out = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", FIRST_GET, root, key, json.dumps(trusted)],
            capture_output=True,
            text=True,
            check=True,
        )
        out.append(float(proc.stdout.strip()))
    return statistics.median(out)


def repeated_get(store: Store, key: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        b = store.get(key)
        times.append(time.perf_counter() - t)
        assert b is not None
        del b
    return statistics.median(times)


def puts(store_factory: object, payload: bytes, rounds: int) -> float:
    times = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
            s = store_factory(d)  # type: ignore[operator]
            t = time.perf_counter()
            assert s.put(f"k{i}", payload)
            times.append(time.perf_counter() - t)
            s.close()
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as xdg:
        os.environ["XDG_CACHE_HOME"] = xdg
        run()


def run() -> None:
    quick = "--quick" in sys.argv
    seed = _core.generate_signing_key()
    pub = _core.signing_public_key(seed)
    trusted = [("bench-1", pub.hex())]
    cfg = Settings()
    f = fleet(trusted, seed)
    print_fleet(f)
    if "--fleet-only" in sys.argv:
        print(json.dumps({"cpus": os.cpu_count(), "fleet": f}))
        return
    rows = {}
    for label, size in SIZES.items():
        payload = os.urandom(size)
        runs = 5 if quick else (15 if size < 50_000_000 else 7)
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
            plain, signed = os.path.join(d, "plain"), os.path.join(d, "signed")
            Store(plain, settings=cfg).put("k", payload)
            Store(signed, settings=cfg, signing_key=("bench-1", seed)).put("k", payload)
            row = {
                "first_unsigned_s": first_get(plain, "k", None, runs),
                "first_signed_s": first_get(signed, "k", trusted, runs),
            }
            s_plain = Store(plain, read_only=True, settings=cfg)
            s_signed = Store(signed, read_only=True, settings=cfg, trusted_keys=[("bench-1", pub)])
            row["hit_unsigned_s"] = repeated_get(s_plain, "k", runs * 4)
            row["hit_signed_s"] = repeated_get(s_signed, "k", runs * 4)
            row["put_unsigned_s"] = puts(lambda p: Store(p, settings=cfg), payload, runs)
            row["put_signed_s"] = puts(
                lambda p: Store(p, settings=cfg, signing_key=("bench-1", seed)), payload, runs
            )
        rows[label] = row

    def us(v: float) -> str:
        return f"{v * 1e6:,.0f} us" if v < 0.01 else f"{v * 1e3:,.1f} ms"

    print(
        f"{'size':>7} | {'first get unsigned':>18} {'signed':>10} | "
        f"{'hit unsigned':>12} {'signed':>10} {'ratio':>6} | {'put unsigned':>12} {'signed':>10}"
    )
    for label, r in rows.items():
        print(
            f"{label:>7} | {us(r['first_unsigned_s']):>18} {us(r['first_signed_s']):>10} | "
            f"{us(r['hit_unsigned_s']):>12} {us(r['hit_signed_s']):>10} "
            f"{r['hit_signed_s'] / r['hit_unsigned_s']:>5.2f}x | "
            f"{us(r['put_unsigned_s']):>12} {us(r['put_signed_s']):>10}"
        )
    print(json.dumps({"cpus": os.cpu_count(), "fleet": f, "rows": rows}))


if __name__ == "__main__":
    main()
