"""A cache of many entries: what a fresh process pays to open it, get, put, and what the CLI
and an eviction cost, at 10k, 100k and 1M entries of 1 KiB, next to python-diskcache.

    python bench/scale.py [--sizes 10000,100000,1000000] [--json docs/bench_scale.json]
                          [--docs docs/benchmarks.md] [--png docs/bench_scale.png]

Every figure is taken in a fresh subprocess (medians of `--repeats` processes), so that
nothing one measurement loaded serves the next; peak RSS is that process's
peak resident set (`VmHWM` of `/proc/self/status`; `getrusage(RUSAGE_SELF).ru_maxrss` is
recorded too, but Linux carries it over from the parent across the `vfork` + `exec` that
`subprocess` uses, so it never reads below the benchmark process's own size). The stores are
filled once per size in one process (xla_pcache through `Store.put`; diskcache through
`Cache.set` in transactions of 10,000), then measured in this order: open + first get +
first put, `xla-pcache stats`, `xla-pcache ls --limit 20`, then `evict()` of 10% of the
bytes. Scratch directories are deleted at the end (deleting a million files slows file
creation on this disk for minutes; see the notes in benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VALUE = 1024
SECTION = "scale"

# One fresh process: open, first get of a present key, first put of a new one; prints JSON.
_XP_PROBE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import xla_pcache
t1 = time.perf_counter()
s = xla_pcache.Store(sys.argv[1], max_size=int(sys.argv[2]))
t2 = time.perf_counter()
b = s.get(b"k%d" % int(sys.argv[3]))
t3 = time.perf_counter()
assert b is not None and len(b) == 1024
s.put(sys.argv[4].encode(), b"p" * 1024)
t4 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
s.close()
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "get": t3 - t2, "put": t4 - t3,
                  "rss": int(hwm) * 1024, "ru_maxrss": rss}))
"""

_DC_PROBE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import diskcache
t1 = time.perf_counter()
c = diskcache.Cache(sys.argv[1], size_limit=int(sys.argv[2]),
                    eviction_policy="least-recently-used")
t2 = time.perf_counter()
v = c.get(b"k%d" % int(sys.argv[3]))
t3 = time.perf_counter()
assert v is not None and len(v) == 1024
c.set(sys.argv[4].encode(), b"p" * 1024)
t4 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
c.close()
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "get": t3 - t2, "put": t4 - t3,
                  "rss": int(hwm) * 1024, "ru_maxrss": rss}))
"""

_XP_EVICT = r"""
import json, resource, sys, time
import xla_pcache
s = xla_pcache.Store(sys.argv[1])
before = s.stats()
t0 = time.perf_counter()
r = s.evict(max_size=int(before["bytes"] * 0.9))
t1 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"evict": t1 - t0, "removed": r["removed"], "rss": int(hwm) * 1024,
                  "ru_maxrss": rss,
                  "entries_before": before["entries"], "bytes_before": before["bytes"]}))
"""

_XP_FILL = r"""
import sys, time
import xla_pcache
s = xla_pcache.Store(sys.argv[1])
n = int(sys.argv[2])
v = b"v" * 1024
t0 = time.perf_counter()
for i in range(n):
    s.put(b"k%d" % i, v)
s.close()
print(time.perf_counter() - t0)
"""

_DC_FILL = r"""
import sys, time
import diskcache
c = diskcache.Cache(sys.argv[1], size_limit=2**62, eviction_policy="least-recently-used")
n = int(sys.argv[2])
v = b"v" * 1024
t0 = time.perf_counter()
for start in range(0, n, 10000):
    with c.transact():
        for i in range(start, min(n, start + 10000)):
            c.set(b"k%d" % i, v)
c.close()
print(time.perf_counter() - t0)
"""


def _py(code: str, *args: object, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return out.stdout


def _cli(*args: str) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "xla_pcache", *args], capture_output=True, text=True, check=False
    )
    return time.perf_counter() - t0, p.returncode, p.stdout


def _median_runs(code: str, args: list[object], repeats: int) -> dict[str, float]:
    runs = [json.loads(_py(code, *args, f"new-{time.monotonic_ns()}-{i}")) for i in range(repeats)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def run_size(n: int, scratch: Path, repeats: int, with_diskcache: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"entries": n}
    xp = scratch / f"xp-{n}"
    row["xp_fill_s"] = float(_py(_XP_FILL, xp, n))
    os.sync()
    budget = 4 * n * 8192
    row["xp"] = _median_runs(_XP_PROBE, [xp, budget, n // 2], repeats)
    stats_t = []
    for _ in range(repeats):
        t, rc, out = _cli("stats", "--path", str(xp), "--json")
        assert rc == 0, out
        stats_t.append(t)
    row["stats_s"] = statistics.median(stats_t)
    row["stats_entries"] = json.loads(out)["entries"]
    ls_t = []
    for _ in range(repeats):
        t, rc, out = _cli("ls", "--path", str(xp), "--limit", "20")
        ls_t.append(t)
        row["ls_rc"] = rc
    row["ls_s"] = statistics.median(ls_t)
    row["ls_lines"] = len(out.splitlines())
    t, rc, out = _cli("--version")
    row["cli_startup_s"] = t
    row["evict"] = json.loads(_py(_XP_EVICT, xp))
    if with_diskcache:
        dc = scratch / f"dc-{n}"
        row["dc_fill_s"] = float(_py(_DC_FILL, dc, n))
        os.sync()
        row["dc"] = _median_runs(_DC_PROBE, [dc, 2**62, n // 2], repeats)
    return row


_CHURN = r"""
import json, os, sys, time
import xla_pcache
root, n = sys.argv[1], int(sys.argv[2])
store = xla_pcache.Store(root)
counts = []
t0 = time.perf_counter()
for i in range(n):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if store.put(b"churn%d" % i, b"c" * 1024) else 1
            store.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    if (i + 1) % (n // 10) == 0:
        counts.append([i + 1, len(os.listdir(os.path.join(root, "journal")))])
store.close()
print(json.dumps({"seconds": time.perf_counter() - t0, "journals": counts}))
"""


def run_churn(n: int, scratch: Path, repeats: int) -> dict[str, Any]:
    """``n`` short-lived processes (forked: an exec'd interpreter each would take most of
    an hour on this machine; each child has its own pid, so its own journal, exactly as a
    new process does) put one entry each into a cache of 10,000 entries."""
    root = scratch / "churn"
    _py(_XP_FILL, root, 10_000)
    out: dict[str, Any] = {"processes": n}
    out["before"] = _median_runs(_XP_PROBE, [root, 1 << 40, 5000], repeats)
    out.update(json.loads(_py(_CHURN, root, n)))
    out["after"] = _median_runs(_XP_PROBE, [root, 1 << 40, 5000], repeats)
    out["journal_files"] = len(os.listdir(root / "journal"))
    return out


def run(
    sizes: list[int], scratch_parent: Path | None, repeats: int, diskcache: bool, churn: int
) -> dict:
    import platform

    import xla_pcache

    out: dict[str, Any] = {
        "command": "python bench/scale.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "xla_pcache": getattr(xla_pcache, "__version__", "?"),
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rows": [],
    }
    if diskcache:
        import diskcache as dc

        out["diskcache"] = dc.__version__
    scratch = Path(tempfile.mkdtemp(prefix="xla-pcache-scale-", dir=scratch_parent))
    try:
        if churn:
            out["churn"] = run_churn(churn, scratch, repeats)
            print(json.dumps(out["churn"]), file=sys.stderr, flush=True)
        for n in sizes:
            row = run_size(n, scratch, repeats, diskcache)
            out["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return out


def _ms(s: float) -> str:
    return f"{s * 1000:,.1f}"


def _mb(b: float) -> str:
    return f"{b / 1e6:,.0f}"


def _projection(rows: list[dict]) -> list[str]:
    """10M entries on paper, from the 1M row and what grows with the number of entries."""
    big = [r for r in rows if r["entries"] >= 1_000_000]
    if not big:
        return []
    r = big[-1]
    k = 10_000_000 / r["entries"]

    def opened(n: float) -> float:
        # What a fresh process reads of the snapshot: the fence (16 bytes per 102 entries)
        # and the name filter (10 bits per entry, rounded up to a power of two).
        bits = 1 << math.ceil(math.log2(max(64.0, n * 10)))
        return n / 102 * 16 + bits / 8

    extra = opened(10_000_000) - opened(r["entries"])
    # Reading and checksumming from the page cache at about 2 GB/s on this machine.
    put = r["xp"]["put"] + extra / 2e9
    return [
        f"Projected to 10,000,000 entries, on paper from the {r['entries']:,} row: what grows "
        "with the entries is what a fresh process reads of the snapshot (the fence and the "
        f"name filter: {opened(r['entries']) / 1e6:.1f} MB at {r['entries']:,}, "
        f"{opened(10_000_000) / 1e6:.1f} MB at 10M), while the journal tail it folds stays "
        "under 2 MiB. So the first put is about "
        f"{_ms(put)} ms and its process about {_mb(r['xp']['rss'] + extra)} MB; `stats` "
        f"about {r['stats_s'] + extra / 2e9:.2f} s (most of it the CLI's start); `ls --limit "
        "20` lists one shard of 39,000 files instead of 3,900 (tens of ms more); `evict()` of "
        f"10% about {r['evict']['evict'] * k:.0f} s, holding the listing of every file it "
        "reconciles with first (40 bytes per file: 400 MB). The snapshot is then 400 MB on "
        "disk and each compaction (every 2 MiB of journal, about 40,000 puts) rewrites it: "
        "some 10 KB written per put, a cost that matters for 1 KiB entries, not for "
        "compiled programs of megabytes; a cache of 10M entries would want the threshold to "
        "grow with the snapshot, trading a larger tail for the first put of each process.",
    ]


def section(out: dict) -> list[str]:
    rows = out["rows"]
    has_dc = all("dc" in r for r in rows)
    dc_head = " diskcache open (ms) | first get (ms) | first set (ms) | peak RSS (MB) |"
    lines = [
        "## A million entries: first put, memory and the CLI at scale",
        "",
        f"```\n{out['command']}   # {out['date']}, git {out['git']}\n```",
        "",
        f"{out['cpus']} CPUs, kernel {out['kernel']}, load average {out['load_start']} at "
        f"start, {out['load_end']} at end"
        + (f"; diskcache {out['diskcache']}" if has_dc else "")
        + ". Entries of 1 KiB (4 KiB on disk each). Every figure is a fresh process "
        "(median of several): open is `Store(path, max_size=...)` after `import xla_pcache`, "
        "then the first `get` of a present key and the first `put` of a new one, which "
        "reads the index; peak RSS is that whole Python process's `VmHWM` (the "
        "interpreter alone is about 10 MB; `ru_maxrss` is inherited from the parent across "
        "`subprocess`'s vfork + exec on Linux, so it is not used). `stats` and "
        "`ls --limit 20` are the whole "
        f"command, Python start included (`xla-pcache --version` alone: "
        f"{_ms(rows[0]['cli_startup_s'])} ms). `evict()` removes 10% of the bytes in a "
        "fresh process (it first reconciles the index with a listing of every shard).",
        "",
        "| entries | open (ms) | first get (ms) | first put (ms) | peak RSS (MB) | `stats` (s) "
        "| `ls --limit 20` (s, exit) | `evict()` 10% (s) | evictor RSS (MB) |"
        + (dc_head if has_dc else ""),
        "|---:" * 9 + "|" + ("---:|" * 4 if has_dc else ""),
    ]
    for r in rows:
        x = r["xp"]
        cells = [
            f"{r['entries']:,}",
            _ms(x["open"]),
            _ms(x["get"]),
            _ms(x["put"]),
            _mb(x["rss"]),
            f"{r['stats_s']:.2f}",
            f"{r['ls_s']:.2f} ({r['ls_rc']})",
            f"{r['evict']['evict']:.2f}",
            _mb(r["evict"]["rss"]),
        ]
        if has_dc:
            d = r["dc"]
            cells += [_ms(d["open"]), _ms(d["get"]), _ms(d["put"]), _mb(d["rss"])]
        lines.append("| " + " | ".join(cells) + " |")
    fills = ", ".join(
        f"{r['entries']:,}: {r['xp_fill_s']:.0f} s"
        + (f" (diskcache {r['dc_fill_s']:.0f} s)" if "dc_fill_s" in r else "")
        for r in rows
    )
    lines += [
        "",
        f"Filling (one process, not timed above): {fills}.",
        "",
        *out.get("notes", []),
        *_projection(rows),
        "",
        "![scale](bench_scale.png)",
    ]
    base = out.get("baseline")
    if base:
        lines += [
            "",
            f"Before and after at the smaller sizes, same script, same machine "
            f"(before: git {base['git']} with the index loaded whole, run {base['date']}; "
            "its `ls` has no `--limit`, so that column is absent):",
            "",
            "| entries | fill, µs per put (before / after) | first put (ms) | peak RSS (MB) "
            "| `stats` (s) | `evict()` 10% (s) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        after = {r["entries"]: r for r in rows}
        for b in base["rows"]:
            a = after.get(b["entries"])
            if a is None:
                continue
            n = b["entries"]
            lines.append(
                f"| {n:,} | {b['xp_fill_s'] / n * 1e6:.0f} / {a['xp_fill_s'] / n * 1e6:.0f} "
                f"| {_ms(b['xp']['put'])} / {_ms(a['xp']['put'])} "
                f"| {_mb(b['xp']['rss'])} / {_mb(a['xp']['rss'])} "
                f"| {b['stats_s']:.2f} / {a['stats_s']:.2f} "
                f"| {b['evict']['evict']:.2f} / {a['evict']['evict']:.2f} |"
            )
    churn = out.get("churn")
    if churn:
        counts = ", ".join(f"{n:,}: {j}" for n, j in churn["journals"])
        lines += [
            "",
            f"Process churn: {churn['processes']:,} short-lived processes (forked, each its "
            "own pid and so its own journal, as a new process has) each put one entry into a "
            f"cache of 10,000 entries, in {churn['seconds']:.0f} s. Journal files after "
            f"so many processes: {counts}; {churn['journal_files']} at the end (compaction "
            "folds the journals of processes that are gone once there are more than 64). The "
            "next fresh process: first put "
            f"{_ms(churn['before']['put'])} ms before the churn, {_ms(churn['after']['put'])} ms "
            f"after; peak RSS {_mb(churn['before']['rss'])} MB before, "
            f"{_mb(churn['after']['rss'])} MB after.",
        ]
    return lines


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["rows"]
    ns = [r["entries"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    a1.plot(ns, [r["xp"]["put"] * 1000 for r in rows], "o-", label="xla_pcache first put")
    a1.plot(ns, [r["xp"]["open"] * 1000 for r in rows], "s-", label="xla_pcache open")
    a1.plot(ns, [r["stats_s"] * 1000 for r in rows], "^-", label="xla-pcache stats (command)")
    a1.plot(ns, [r["ls_s"] * 1000 for r in rows], "v-", label="xla-pcache ls --limit 20")
    if all("dc" in r for r in rows):
        a1.plot(ns, [r["dc"]["put"] * 1000 for r in rows], "o--", label="diskcache first set")
        a1.plot(ns, [r["dc"]["open"] * 1000 for r in rows], "s--", label="diskcache open")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("entries")
    a1.set_ylabel("ms (fresh process)")
    a1.set_title("time")
    a1.legend(fontsize=8)
    a2.plot(ns, [r["xp"]["rss"] / 1e6 for r in rows], "o-", label="xla_pcache get+put process")
    a2.plot(ns, [r["evict"]["rss"] / 1e6 for r in rows], "x-", label="xla_pcache evictor")
    if all("dc" in r for r in rows):
        a2.plot(ns, [r["dc"]["rss"] / 1e6 for r in rows], "o--", label="diskcache get+set process")
    a2.set_xscale("log")
    a2.set_xlabel("entries")
    a2.set_ylabel("peak RSS (MB)")
    a2.set_title("memory")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-diskcache", action="store_true")
    parser.add_argument(
        "--churn", type=int, default=10_000, help="short-lived processes to run first (0: none)"
    )
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--from-json", type=Path, default=None)
    parser.add_argument(
        "--baseline", type=Path, default=None, help="results of an earlier build to compare"
    )
    parser.add_argument("--docs", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    if args.from_json:
        out = json.loads(args.from_json.read_text())
    else:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        out = run(sizes, args.scratch, args.repeats, not args.no_diskcache, args.churn)
    if args.baseline:
        out["baseline"] = json.loads(args.baseline.read_text())
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    lines = section(out)
    print("\n".join(lines))
    if args.png:
        plot(out, args.png)
    if args.docs:
        block = f"<!-- kept:{SECTION} -->\n" + "\n".join(lines) + f"\n<!-- /kept:{SECTION} -->"
        text = args.docs.read_text() if args.docs.exists() else ""
        pattern = re.compile(rf"<!-- kept:{SECTION} -->.*?<!-- /kept:{SECTION} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: block, text)
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        args.docs.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
