"""A directory-state fuzzer: real operations on a cache directory, with hostile state planted
between them, and the store's promises checked after every step.

Operations are the ones users run, each in a fresh interpreter with an address-space limit
and a deadline: the Store API (put, get, evict, verify, several writers at once so that the
index is compacted), the CLI (stats, ls, prune, verify --repair, explain, doctor, export,
import) and, with a SeaweedFS server, a remote tier's get and a bucket claim. Between them
it plants, with random fields:

- index snapshots of version 1 and 2 with random counts, totals (up to 2**100) and journal
  names (``../`` paths to a sibling tree, absolute paths, terminal escapes, odd bytes);
- journals with random names and records;
- links into the sibling tree, FIFOs, sparse files of terabytes and odd names in every
  directory of the cache, including the miss log;
- miss-log lines and entries a hostile writer would leave (deep nesting, huge numbers,
  escapes), and the doctor's remembered probe entry;
- garbage objects at entries' keys and claim objects in the bucket.

After every step: no file of the sibling tree (the targets of the planted links and ``../``
names) changed; no operation ran past its deadline, died of a signal, panicked or printed a
Python traceback; no raw ESC or C1 CSI reached its output; its peak RSS stayed under the
bound. The peak is the operation's own, as each child reports it when it exits
(``tests/fuzz_children.py`` says why).

The snapshot and journal bytes are written here by a small encoder of the formats that
``rust/core/src/snapshot/`` and ``journal.rs`` define (ARCHITECTURE.md, "On disk", "Index at
scale"): the core's encoders are crate-private and refuse (or will refuse) hostile names, which
is what is planted. Its checksums are xxh3-64, as the core's, so what it writes passes every
check a reader makes and reaches the code behind them. ``rust/core/src/dirstate_fuzz_tests.rs``
drives the same states through the core's own encoders.

Entry points: ``tests/test_dirstate_fuzz.py`` (a short run in the test suite) and
``bench/fuzz_dir.py`` (a long run that prints the figures).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from tests.fuzz_children import (
    CHILD_PRELUDE,
    ESC_MARKERS,
    PEAK_FILE_VAR,
    Failure,
    first_failures,
    pick_weighted,
    wait_children,
)
from tests.fuzz_children import CLI_CHILD as _CLI_CHILD
from tests.fuzz_children import PEAK_PRELUDE as _PEAK

TOP_PEAKS = 5
# The largest version-1 snapshot a reader decodes (MAX_V1_LEN of rust/core/src/snapshot/v1.rs).
MAX_V1_LEN = 16 << 20
N_COUNTERS_GUESS = 40
BLOCK = 4096
PER_BLOCK = (BLOCK - 8) // 40
SNAP_MAGIC = b"XPCS"
DAY = 86400


def _mib(n: int) -> str:
    """A size for the report: bytes, KiB, MiB, GiB or TiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def checksum(b: bytes) -> int:
    return xxhash.xxh3_64_intdigest(b)


# --- encoders of the on-disk formats ----------------------------------------------------------


def journal_record(kind: int, body: bytes) -> bytes:
    head = bytes([0xA5, kind]) + struct.pack("<H", len(body)) + body
    return head + struct.pack("<Q", checksum(head))


def touch_record(name: int, disk_bytes: int, t: int, put: bool = True) -> bytes:
    return journal_record(1 if put else 2, struct.pack("<QQQQ", *_u128(name), disk_bytes, t))


def delete_record(name: int, t: int) -> bytes:
    return journal_record(3, struct.pack("<QQQ", *_u128(name), t))


def clear_record(t: int) -> bytes:
    return journal_record(4, struct.pack("<Q", t))


def stats_record(counters: list[int]) -> bytes:
    return journal_record(5, b"".join(struct.pack("<Q", c) for c in counters))


def _u128(n: int) -> tuple[int, int]:
    n &= (1 << 128) - 1
    return n & ((1 << 64) - 1), n >> 64


def _name_bytes(name: bytes) -> bytes:
    return struct.pack("<H", len(name) & 0xFFFF) + name[:0xFFFF]


def _journal_marks(journals: list[tuple[bytes, int]], n_counters: int, rng: random.Random) -> bytes:
    out = bytearray()
    for name, offset in journals:
        out += _name_bytes(name) + struct.pack("<Q", offset)
        out += b"".join(struct.pack("<Q", rng.getrandbits(64)) for _ in range(n_counters))
    return bytes(out)


def snapshot_v1(
    entries: list[tuple[int, int, int]],
    journals: list[tuple[bytes, int]],
    n_counters: int,
    rng: random.Random,
    hits: list[tuple[int, int]] | None = None,
    n_entries: int | None = None,
    raw_entries: bytes = b"",
) -> bytes:
    """Version 1: one checksummed body (entries in no order, journals, counters, HITS).
    `raw_entries`: more entry records, 32 bytes each, appended as they are."""
    b = bytearray(SNAP_MAGIC + struct.pack("<I", 1))
    count = len(entries) + len(raw_entries) // 32
    b += struct.pack("<QII", count if n_entries is None else n_entries, len(journals), n_counters)
    for name, disk, last_use in entries:
        b += struct.pack("<QQQQ", *_u128(name), disk, last_use)
    b += raw_entries[: len(raw_entries) // 32 * 32]
    b += _journal_marks(journals, n_counters, rng)
    b += b"".join(struct.pack("<Q", rng.getrandbits(64)) for _ in range(n_counters))
    if hits is not None:
        b += b"HITS" + struct.pack("<Q", len(hits))
        for name, n in hits:
            b += struct.pack("<QQI", *_u128(name), n & 0xFFFFFFFF)
    return bytes(b + struct.pack("<Q", checksum(bytes(b))))


def snapshot_v2(
    entries: list[tuple[int, int, int, int]],
    journals: list[tuple[bytes, int]],
    n_counters: int,
    rng: random.Random,
    total: int | None = None,
    filter_words: int = 1,
) -> bytes:
    """Version 2: header block, sorted entry blocks, meta, fence, filter (all ones: it may
    hold every name, which a reader must cope with)."""
    entries = sorted({e[0]: e for e in entries}.values())
    blocks = []
    fence = []
    for i in range(0, len(entries), PER_BLOCK):
        chunk = entries[i : i + PER_BLOCK]
        fence.append(chunk[0][0])
        blk = bytearray()
        for name, disk, last_use, hits in chunk:
            blk += struct.pack("<QQQQII", *_u128(name), disk, last_use, hits & 0xFFFFFFFF, 0)
        blk += bytes(BLOCK - 8 - len(blk))
        blocks.append(bytes(blk) + struct.pack("<Q", checksum(bytes(blk))))
    meta = bytearray(struct.pack("<II", len(journals), n_counters))
    meta += _journal_marks(journals, n_counters, rng)
    meta += b"".join(struct.pack("<Q", rng.getrandbits(64)) for _ in range(n_counters))
    meta += struct.pack("<Q", checksum(bytes(meta)))
    fence_b = b"".join(struct.pack("<QQ", *_u128(n)) for n in fence)
    fence_b += struct.pack("<Q", checksum(fence_b))
    filt = b"\xff" * (8 * filter_words)
    filt += struct.pack("<Q", checksum(filt))
    n_blocks = len(blocks)
    meta_at = (n_blocks + 1) * BLOCK
    fence_at = meta_at + len(meta)
    if total is None:
        total = sum(e[1] for e in entries)
    h = SNAP_MAGIC + struct.pack("<I", 2) + struct.pack("<Q", len(entries))
    h += struct.pack("<QQ", *_u128(total))
    h += struct.pack("<QQQQQ", n_blocks, meta_at, len(meta), fence_at, 8 * filter_words)
    h += struct.pack("<Q", checksum(h))
    header = h + bytes(BLOCK - len(h))
    return header + b"".join(blocks) + bytes(meta) + fence_b + filt


# --- the sibling tree -----------------------------------------------------------------------


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under root (links not followed) with its type, mode, size, mtime and, for
    files, a hash of the content."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            h = ""
            if stat.S_ISREG(st.st_mode):
                h = hashlib.blake2b(p.read_bytes(), digest_size=16).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                h = os.readlink(p)
            out[str(p.relative_to(root))] = f"{st.st_mode:o}:{st.st_size}:{st.st_mtime_ns}:{h}"
    return out


def make_outside(root: Path) -> None:
    """Files a hostile name or link may reach: old *.log files (compaction removes a dead
    process's journal over a day old), a snapshot-looking file, a directory of victims."""
    old = time.time() - 3 * DAY
    (root / "victim").mkdir(parents=True)
    (root / "victim" / "sub").mkdir()
    for rel, data in [
        ("precious.log", b"precious\n" * 10),
        ("old.log", b"old\n"),
        ("abs.log", b"absolute\n"),
        ("victim/precious.log", b"victim's data\n"),
        ("victim/sub/deep.log", b"deep\n"),
        ("victim/snapshot", b"XPCS not a snapshot"),
        ("victim/data.bin", os.urandom(4096)),
        ("victim/claim.lease", b"lease"),
    ]:
        p = root / rel
        p.write_bytes(data)
        os.utime(p, (old, old))
    os.utime(root / "victim" / "sub", (old, old))
    os.utime(root / "victim", (old, old))


# --- results ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Figures:
    steps: int = 0
    ops: int = 0
    processes: int = 0
    plants: int = 0
    outside_changes: int = 0
    hangs: int = 0
    aborts: int = 0
    panics: int = 0
    tracebacks: int = 0
    escapes: int = 0
    rss_over: int = 0
    errors: int = 0
    refused: int = 0
    peak_rss_kib: int = 0
    peak_rss_op: str = ""
    # The operations of largest peak, largest first: (KiB, operation, step, what was planted).
    top_peaks: list[tuple[int, str, int, str]] = dataclasses.field(default_factory=list)
    peak_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    ops_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    plants_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)


# --- child processes --------------------------------------------------------------------------

_API_CHILD = (
    CHILD_PRELUDE
    + r"""
import os, random
from xla_pcache import CacheError, Store
rng = random.Random(args["seed"])
root = args["root"]
op = args["op"]
out = {}
kw = {}
if args.get("max_size"):
    kw["max_size"] = args["max_size"]
if args.get("remote"):
    kw["remote"] = args["remote"]
try:
    s = Store(root, **kw)
except CacheError as exc:
    # Refused at open (a layout component that is not a directory): a clear error, no crash.
    print(json.dumps({"refused": type(exc).__name__}))
    sys.exit(3)
with s:
    if op == "put":
        n = 0
        for key, size, meta in args["puts"]:
            data = rng.randbytes(size)
            n += bool(s.put(key, data, meta=meta))
            if rng.random() < 0.3:
                s.get(key)
        out["stored"] = n
    elif op == "get":
        out["hits"] = sum(s.get(k) is not None for k in args["keys"])
        out["n"] = len(s)
    elif op == "evict":
        r = s.evict(max_size=args["target"])
        out["removed"] = r["removed"]
    elif op == "verify":
        r = s.verify(repair=args["repair"])
        out["checked"] = r.checked if hasattr(r, "checked") else str(r)[:40]
    elif op == "stats":
        st = s.stats()
        out["n"] = len(s)
    elif op == "tier_get":
        out["hits"] = sum(s.get(k) is not None for k in args["keys"])
    elif op == "tier_claim":
        claims = s.remote.claims() if s.remote is not None else None
        if claims is not None:
            for name in args["names"]:
                c = claims.claim(name, wait=args["wait"], lease=args["wait"])
                out.setdefault("states", []).append(c.state)
                c.release()
    elif op == "probe":
        from xla_pcache.cli import _doctor as doctor
        for fw in doctor.FRAMEWORKS.values():
            versions = {d: doctor._dist_version(d) for d in fw.versions}
            key = doctor.probe_key(fw, versions, fw.backend_hint())
            s.delete(key)
            s.put(key, args["value"].encode(), meta={"framework": fw.name, "kind": "doctor-probe"})
print(json.dumps(out, default=str))
"""
)


@dataclasses.dataclass
class Proc:
    op: str
    popen: subprocess.Popen[bytes]
    out: Any
    err: Any
    deadline: float
    argv: list[str]
    peak_file: Path
    # What was planted when it ran (for the report of the largest peaks).
    planted: str = ""


# --- the harness ------------------------------------------------------------------------------


class Harness:
    def __init__(
        self,
        base: Path,
        seed: int,
        *,
        s3: Any | None = None,
        op_timeout: float = 30.0,
        rlimit_as: int = 2 << 30,
        rss_bound_kib: int = 512 << 10,
        scale: float = 1.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.base = base
        self.root = base / "cache"
        self.outside = base / "outside"
        self.work = base / "work"
        self.rng = random.Random(seed)
        self.seed = seed
        self.s3: Any = s3
        self.op_timeout = op_timeout
        self.rlimit_as = rlimit_as
        self.rss_bound_kib = rss_bound_kib
        self.scale = scale
        self.log = log or (lambda _m: None)
        self.figures = Figures()
        self.failures: list[Failure] = []
        self.keys: list[str] = []
        self.bucket_keys: list[str] = []
        self.step = 0
        self.host = socket.gethostname()
        self.prefix = f"fz-{seed}-{os.getpid()}"
        make_outside(self.outside)
        self.work.mkdir()
        self.peaks_dir = base / "peaks"
        self.peaks_dir.mkdir()
        # The latest plants, each with its size, for the report of the largest peaks.
        self.recent_plants: collections.deque[str] = collections.deque(maxlen=4)
        self._planted = ""
        from xla_pcache import Store

        with Store(self.root) as s:  # lays out the directory
            s.put("seed-entry", b"x" * 100)
        self.keys.append("seed-entry")
        self.before = tree_digest(self.outside)
        self.env = self._env()

    def _env(self) -> dict[str, str]:
        from xla_pcache.config import VARIABLE_NAMES

        env = {k: v for k, v in os.environ.items() if k not in VARIABLE_NAMES}
        env.pop("JAX_PLATFORMS", None)
        env["PYTHONUNBUFFERED"] = "1"
        env["NO_COLOR"] = "1"
        env["COLUMNS"] = "200"
        if self.s3 is not None:
            env.update(self.s3.env())
            env["XLA_PCACHE_REMOTE_TIMEOUT"] = "5"
        return env

    # ---- random fields -----------------------------------------------------------------

    def dead_pid(self) -> int:
        while True:
            pid = self.rng.randint(3_000_000, 4_000_000)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return pid
            except PermissionError:
                continue

    def odd_name(self) -> str:
        r = self.rng
        choices = [
            "\x1b]0;pwned\x07",
            "\x1b[2J\x1b[H",
            "\x1b]52;c;cHduZWQ=\x1b\\",
            "\u202egol.",
            "\x9b31m",
            "a\nb",
            "\r",
            " ",
            "-rf",
            "...",
            "x" * r.randint(1, 255),
            "é" * r.randint(1, 100),
            "".join(chr(r.randint(1, 0x7F)) for _ in range(r.randint(1, 30))).replace("/", "_"),
        ]
        name = r.choice(choices)
        if r.random() < 0.5:
            name += r.choice([".log", ".lease", ".tmp", "", f"-{self.dead_pid()}-1.log"])
        name = name.replace("/", "_").replace("\x00", "_")
        if name in (".", ".."):
            name = "dots"
        return name.encode("utf-8", "surrogateescape")[:255].decode("utf-8", "ignore") or "q"

    def hostile_journal_name(self) -> tuple[bytes, str | None, Path | None]:
        """A journal name for a snapshot's meta, a directory to plant in journal/ so that a
        path through it resolves (or None), and the file outside it reaches (or None)."""
        r = self.rng
        pid = self.dead_pid()
        stem = f"{self.host}-{pid}-x"
        t = r.choice(
            [
                "precious.log",
                "old.log",
                "victim/precious.log",
                "victim/sub/deep.log",
                "victim/snapshot",
                "victim",
            ]
        )
        target = self.outside / t
        kind = r.randrange(8)
        if kind == 0:
            return f"{stem}/../../../outside/{t}".encode(), stem, target
        if kind == 1:
            return f"../../outside/{t}".encode(), None, target
        if kind == 2:
            return str(target).encode(), None, target
        if kind == 3:
            return f"{self.host}-{pid}-{r.getrandbits(40):x}.log".encode(), None, None
        if kind == 4:
            return (self.odd_name() + f"-{pid}-1.log").encode(), None, None
        if kind == 5 and r.random() < 0.2:
            # Not UTF-8: the reader refuses the whole snapshot (so, rarely).
            return bytes(r.getrandbits(8) for _ in range(r.randint(0, 64))), None, None
        if kind == 6:
            return f"{stem}/../{self.host}-{pid}-y.log".encode(), stem, None
        return (b".." if r.random() < 0.5 else b"."), None, None

    def _meta_journals(self, n: int) -> list[tuple[bytes, int]]:
        r = self.rng
        journals = []
        for _ in range(n):
            name, stem, target = self.hostile_journal_name()
            if target is not None and target.exists() and r.random() < 0.7:
                # The offset a compaction compares with the file's length: equal, so the
                # journal looks fully read.
                offset = target.lstat().st_size
            else:
                offset = r.choice([0, 1, 100, (1 << 64) - 1, r.getrandbits(64)])
            journals.append((name, offset))
            if stem is not None and self._inside(self.root / "journal"):
                with contextlib.suppress(OSError):
                    (self.root / "journal" / stem).mkdir(parents=True, exist_ok=True)
        if r.random() < 0.5:
            # Past the count of journals at which a writer compacts.
            pid = self.dead_pid()
            journals += [(f"{self.host}-{pid}-{i:x}.log".encode(), 0) for i in range(65)]
        return journals

    def entry_name(self, key: str) -> int:
        from xla_pcache import entry_name

        return int(entry_name(key), 16)

    def random_entries(self, n: int) -> list[tuple[int, int, int, int]]:
        r = self.rng
        names = [self.entry_name(k) for k in self.keys if r.random() < 0.5]
        names += [r.getrandbits(128) for _ in range(n)]
        big = [0, 1, 4096, 1 << 30, (1 << 63) - 1, (1 << 64) - 1]
        return [
            (
                n,
                r.choice(big) if r.random() < 0.2 else r.randint(0, 1 << 20),
                r.choice([0, int(time.time() * 1e9), (1 << 64) - 1, r.getrandbits(64)]),
                r.getrandbits(32),
            )
            for n in names
        ]

    def count(self, hi: int) -> int:
        """A random count, skewed small, scaled for long runs."""
        hi = max(1, int(hi * self.scale))
        return min(hi, int(self.rng.paretovariate(0.7)) - 1)

    # ---- planting ----------------------------------------------------------------------

    def _dirs(self) -> list[Path]:
        ent = self.root / "entries"
        shards = (
            [p for p in ent.iterdir() if p.is_dir() and not p.is_symlink()] if ent.is_dir() else []
        )
        return [
            self.root,
            ent,
            *(self.rng.sample(shards, min(2, len(shards))) if shards else []),
            self.root / "journal",
            self.root / "index",
            self.root / "locks",
            self.root / "locks" / "claims",
            self.root / "tmp",
            self.root / "trash",
        ]

    def _inside(self, d: Path) -> bool:
        """Whether `d` is reached from the cache's root through real directories only: the
        harness never plants through a link it planted (that would change the sibling tree
        itself)."""
        p = self.root
        for part in d.relative_to(self.root).parts:
            p = p / part
            if p.is_symlink() or (p.exists() and not p.is_dir()):
                return False
        return True

    def _place(self, d: Path, name: str, make: Callable[[Path], object]) -> None:
        if not self._inside(d):
            return
        try:
            d.mkdir(parents=True, exist_ok=True)
            p = d / name
            if p.is_symlink() or p.is_file() or p.is_fifo():
                p.unlink()
            elif p.is_dir():
                return
            make(p)
        except OSError:
            pass

    def _legit_name(self, d: Path) -> str:
        """A name the cache itself would use in `d`."""
        r = self.rng
        rel = d.relative_to(self.root).as_posix() if d != self.root else ""
        key = r.choice(self.keys)
        h = f"{self.entry_name(key):032x}"
        if rel == "":
            return r.choice(["misses.log", "misses.log.1", "FORMAT-x", ".probe"])
        if rel == "entries":
            return h[:2]
        if rel.startswith("entries/"):
            return rel.split("/")[1] + h[2:] if r.random() < 0.5 else h
        if rel == "journal":
            return f"{self.host}-{self.dead_pid()}-{r.getrandbits(40):x}.log"
        if rel == "index":
            return "snapshot"
        if rel == "locks":
            return r.choice(["evict.lease", "evict.lock"])
        if rel == "locks/claims":
            return f"{h}.lease"
        return r.choice([f".{h}.tmp", h, f"{h}.{r.getrandbits(32):x}"])

    def plant(self) -> str:
        r = self.rng
        kinds: list[tuple[str, Callable[[], None], float]] = [
            ("snapshot_v2", self.plant_snapshot_v2, 3),
            ("snapshot_v1", self.plant_snapshot_v1, 1.5),
            ("journal", self.plant_journal, 3),
            ("link", self.plant_link, 2),
            ("fifo", self.plant_fifo, 1),
            ("sparse", self.plant_sparse, 1),
            ("odd_name", self.plant_odd_name, 2),
            ("odd_journal", self.plant_odd_journal, 1),
            ("misses", self.plant_misses, 1.5),
            ("dir_link", self.plant_dir_link, 0.3),
            ("heal", self.heal, 0.5),
        ]
        if self.s3 is not None:
            kinds.append(("bucket", self.plant_bucket, 1.5))
        kind, planter = pick_weighted(r, kinds)
        self._planted = ""
        planter()
        self.recent_plants.append(f"{kind} ({self._planted})" if self._planted else kind)
        self.figures.plants += 1
        self.figures.plants_by_kind[kind] = self.figures.plants_by_kind.get(kind, 0) + 1
        return kind

    def planted_now(self) -> str:
        """What an operation starts on: the index snapshot in place and the latest plants."""
        snap = self.root / "index" / "snapshot"
        try:
            st = snap.lstat()
            if stat.S_ISREG(st.st_mode):
                with open(snap, "rb") as f:
                    head = f.read(8)
                version = struct.unpack("<I", head[4:8])[0] if len(head) == 8 else "?"
                there = f"snapshot v{version} of {_mib(st.st_size)}"
            else:
                there = "snapshot not a file"
        except (OSError, struct.error):
            there = "no snapshot"
        return f"{there}; latest plants: {', '.join(self.recent_plants) or 'none'}"

    def _write(self, p: Path, data: bytes) -> None:
        if not self._inside(p.parent):
            return
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.is_symlink() or p.is_fifo():
                p.unlink()
            tmp = p.with_name(f".fz-{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, p)
        except OSError:
            pass

    def plant_snapshot_v2(self) -> None:
        r = self.rng
        journals = self._meta_journals(self.count(20000) if r.random() < 0.3 else r.randint(0, 6))
        total = r.choice(
            [None, None, 1 << 100, (1 << 128) - 1, (1 << 64) - 1, 0, r.getrandbits(100)]
        )
        entries = self.random_entries(self.count(5000))
        self._planted = f"{len(entries)} entries, {len(journals)} journals"
        data = snapshot_v2(
            entries,
            journals,
            r.choice([0, 3, N_COUNTERS_GUESS, r.randint(0, 100)]),
            r,
            total=total,
            filter_words=1 << r.randint(0, 6),
        )
        self._write(self.root / "index" / "snapshot", data)

    def plant_snapshot_v1(self) -> None:
        r = self.rng
        journals = self._meta_journals(r.randint(0, 8))
        n = self.count(200_000)
        entries = [(e[0], e[1], e[2]) for e in self.random_entries(n)]
        # A count that lies (larger than what follows) as often as one that does not.
        lie = r.choice([None, None, (1 << 64) - 1, len(entries) + 1, 1 << 40])
        hits = [(e[0], r.getrandbits(32)) for e in entries[: r.randint(0, len(entries))]]
        raw = b""
        if r.random() < 0.15:
            # Millions of random records: half the time a legitimate file just under the
            # readers' cap (decoded whole, the costliest read there is), else one past it.
            if r.random() < 0.5:
                size = MAX_V1_LEN - 4096
                entries, journals, hits, lie = [], [], [], None
            else:
                size = min(int((64 << 20) * self.scale), 255 << 20)
            size = size // 32 * 32
            raw = b"".join(r.randbytes(min(16 << 20, size - at)) for at in range(0, size, 16 << 20))
            self.figures.plants_by_kind["snapshot_v1_giant"] = (
                self.figures.plants_by_kind.get("snapshot_v1_giant", 0) + 1
            )
        data = snapshot_v1(
            entries, journals, r.randint(0, 60), r, hits if r.random() < 0.5 else None, lie, raw
        )
        self._planted = f"{_mib(len(data))}, {len(entries) + len(raw) // 32} entries" + (
            f", count {lie}" if lie is not None else ""
        )
        self._write(self.root / "index" / "snapshot", data)

    def plant_journal(self) -> None:
        r = self.rng
        d = self.root / "journal"
        name = self._legit_name(d) if r.random() < 0.6 else self.odd_name()
        recs = bytearray()
        now = int(time.time() * 1e9)
        for _ in range(self.count(20000) if r.random() < 0.2 else r.randint(0, 40)):
            kind = r.randrange(7)
            nm = self.entry_name(r.choice(self.keys)) if r.random() < 0.5 else r.getrandbits(128)
            t = r.choice([now, 0, (1 << 64) - 1, r.getrandbits(64)])
            if kind == 0:
                size = r.choice([100, 4096, (1 << 64) - 1, 1 << 62, r.getrandbits(64)])
                recs += touch_record(nm, size, t, put=r.random() < 0.8)
            elif kind == 1:
                recs += delete_record(nm, t)
            elif kind == 2 and r.random() < 0.1:
                recs += clear_record(t)
            elif kind == 3:
                recs += stats_record([r.getrandbits(64) for _ in range(r.randint(0, 128))])
            elif kind == 4:
                recs += journal_record(r.randrange(256), r.randbytes(r.randint(0, 64)))
            elif kind == 5 and r.random() < 0.2:
                recs += r.randbytes(r.randint(1, 2000))
            else:
                recs += touch_record(nm, r.randint(1, 1 << 16), now)
        self._place(d, name, lambda p: p.write_bytes(bytes(recs)))
        self._planted = _mib(len(recs))
        if r.random() < 0.5 and self._inside(d):
            old = time.time() - r.choice([0, 2 * DAY, 400 * DAY])
            with contextlib.suppress(OSError):
                os.utime(d / name, (old, old), follow_symlinks=False)

    def _outside_target(self) -> Path:
        return self.outside / self.rng.choice(
            [
                "precious.log",
                "old.log",
                "victim/precious.log",
                "victim/snapshot",
                "victim/data.bin",
                "victim",
                "victim/sub",
                "victim/claim.lease",
                "nonexistent",
            ]
        )

    def plant_link(self) -> None:
        d = self.rng.choice(self._dirs())
        name = self._legit_name(d) if self.rng.random() < 0.7 else self.odd_name()
        target = self._outside_target()
        self._place(d, name, lambda p: p.symlink_to(target))

    def plant_dir_link(self) -> None:
        """A whole sub-directory replaced by a link into the sibling tree (moved aside first;
        `heal` puts it back)."""
        sub = self.rng.choice(["journal", "index", "tmp", "trash", "locks/claims", "locks"])
        p = self.root / sub
        aside = self.root / f".fz-aside-{sub.replace('/', '_')}"
        if p.is_symlink() or aside.exists():
            return
        try:
            if p.exists():
                p.rename(aside)
            p.symlink_to(self.outside / "victim")
        except OSError:
            pass

    def heal(self) -> None:
        for aside in list(self.root.glob(".fz-aside-*")):
            sub = aside.name[len(".fz-aside-") :].replace("_", "/")
            p = self.root / sub
            try:
                if p.is_symlink():
                    p.unlink()
                if not p.exists():
                    aside.rename(p)
            except OSError:
                pass

    def plant_fifo(self) -> None:
        d = self.rng.choice(self._dirs())
        name = self._legit_name(d) if self.rng.random() < 0.8 else self.odd_name()
        self._place(d, name, lambda p: os.mkfifo(p))

    def plant_sparse(self) -> None:
        d = self.rng.choice(self._dirs())
        name = self._legit_name(d) if self.rng.random() < 0.8 else self.odd_name()
        size = self.rng.choice([1 << 30, 1 << 40, 4 << 40, (1 << 63) - 1 >> 20, 65 << 20])
        self._planted = f"{_mib(size)} in {d.relative_to(self.root).as_posix() or '.'}"

        def make(p: Path) -> None:
            with open(p, "wb") as f:
                if self.rng.random() < 0.5:
                    f.write(self.rng.choice([SNAP_MAGIC + struct.pack("<I", 2), b"XPCE", b"\xa5"]))
                f.truncate(size)

        self._place(d, name, make)

    def plant_odd_name(self) -> None:
        d = self.rng.choice(self._dirs())
        name = self.odd_name()
        kind = self.rng.randrange(3)
        if kind == 0:
            self._place(
                d, name, lambda p: p.write_bytes(self.rng.randbytes(self.rng.randint(0, 300)))
            )
        elif kind == 1:
            self._place(d, name, lambda p: p.mkdir())
        else:
            self._place(d, name, lambda p: p.symlink_to(self._outside_target()))

    def plant_odd_journal(self) -> None:
        """A journal named with terminal escapes that no reader can read (a FIFO, a link, a
        directory): its name goes into the warnings."""
        r = self.rng
        name = (
            r.choice(["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "\x9b1m", "\u202e"])
            + f"{self.host}-1-1.log"
        )
        make = r.choice(
            [
                lambda p: os.mkfifo(p),
                lambda p: p.symlink_to(self.outside / "precious.log"),
                lambda p: p.mkdir(),
            ]
        )
        self._place(self.root / "journal", name, make)

    def plant_misses(self) -> None:
        r = self.rng
        lines = []
        for _ in range(r.randint(1, 6)):
            key = r.choice([*self.keys, "\x1b]0;t\x07k", "k" * 5000, ""])
            kind = r.randrange(7)
            if kind == 0:
                depth = r.choice([100, 1000, 5000, 100000])
                lines.append('{"key":"k","x":' + "[" * depth + "]" * depth + "}")
            elif kind == 1:
                lines.append(json.dumps({"key": key, "t": 0}).replace("0}", "9" * 400 + "}"))
            elif kind == 2:
                lines.append(
                    json.dumps(
                        {
                            "key": key,
                            "t": time.time(),
                            "components": [
                                {"name": "jax", "digest": "\x1b[2Jd", "value": "\x1b]52;c;eA==\x07"}
                            ],
                        }
                    )
                )
            elif kind == 3:
                deep: Any = "v"
                for _ in range(r.choice([50, 2000])):
                    deep = {"a": deep}
                lines.append(
                    json.dumps(
                        {
                            "key": key,
                            "t": time.time(),
                            "components": [
                                {"name": "compile_options", "digest": "d", "value": "x"}
                            ],
                        }
                    )
                )
                lines.append(
                    '{"key":'
                    + json.dumps(key)
                    + ',"t":1,"components":[{"name":"n","digest":"d","value":'
                    + "[" * 3000
                    + "]" * 3000
                    + "}]}"
                )
            elif kind == 4:
                lines.append(json.dumps({"key": key, "t": time.time(), "components": []}))
            elif kind == 5:
                lines.append(r.randbytes(r.randint(0, 200)).decode("latin-1"))
            else:
                lines.append(
                    json.dumps({"key": key, "t": float("1e308") * 10 if r.random() < 0.3 else -1})
                )
        name = r.choice(["misses.log", "misses.log.1"])
        self._place(
            self.root,
            name,
            lambda p: p.write_text("\n".join(lines) + "\n", errors="surrogateescape"),
        )

    def plant_bucket(self) -> None:
        """Garbage at an entry's key (one the local directory does not hold, so that a get
        asks the bucket), a claim object under a claim's name, odd object names."""
        import obstore
        from xla_pcache import entry_name

        r = self.rng
        client = self._client()
        key = f"remote-{r.randrange(16)}"
        if key not in self.bucket_keys:
            self.bucket_keys.append(key)
        name = entry_name(key)
        kind = r.randrange(4)
        try:
            if kind == 0:
                # Over half the bound on a process's RSS: a reader that holds the object in
                # memory and copies it goes past the bound.
                size = r.choice([0, 10, 4096, 1 << 20, int((32 << 20) * self.scale), 320 << 20])
                size = min(size, 512 << 20)
                self._planted = f"object of {_mib(size + 64)}"
                obstore.put(client, f"xla_pcache-1/entries/{name}", r.randbytes(64) + bytes(size))
            elif kind == 1:
                obstore.put(client, f"xla_pcache-1/claims/{name}/x", b"{}")
            elif kind == 2:
                obstore.put(client, f"xla_pcache-1/claims/{name}", r.randbytes(r.randint(0, 100)))
            else:
                odd = self.odd_name().replace("\n", "_")
                obstore.put(client, f"xla_pcache-1/entries/{odd}", b"x")
        except Exception as exc:  # a name the client refuses is not a state we can plant
            self.log(f"bucket plant skipped: {type(exc).__name__}")

    def _client(self) -> Any:
        from obstore.store import S3Store

        env = self.s3.env()
        return S3Store(
            "xla-pcache-test",
            prefix=self.prefix,
            endpoint=self.s3.endpoint,
            access_key_id=env["AWS_ACCESS_KEY_ID"],
            secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region="us-east-1",
            client_options={"allow_http": True},
        )

    # ---- operations --------------------------------------------------------------------

    def _spawn(
        self,
        op: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float | None = None,
    ) -> Proc:
        if env is not None and "XLA_PCACHE_EVICT_TRACE" in env:
            trace = Path(env["XLA_PCACHE_EVICT_TRACE"])
            kind = "fifo" if trace.is_fifo() else "link" if trace.is_symlink() else "file"
            op = f"{op}[evict trace: {kind}]"
        # Files, not pipes: a child that prints much never blocks on a full pipe. Closed in
        # _judge once it has exited.
        out = tempfile.TemporaryFile()  # noqa: SIM115
        err = tempfile.TemporaryFile()  # noqa: SIM115
        self.figures.processes += 1
        peak_file = self.peaks_dir / f"{self.figures.processes}"
        peak_file.unlink(missing_ok=True)
        run = list(argv)
        if len(run) > 2 and run[1] == "-c":
            run[2] = _PEAK + run[2]
        popen = subprocess.Popen(
            run,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env={**(env or self.env), PEAK_FILE_VAR: str(peak_file)},
            cwd=cwd or self.work,
            start_new_session=True,
        )
        return Proc(
            op,
            popen,
            out,
            err,
            time.monotonic() + (timeout or self.op_timeout),
            argv,
            peak_file,
            self.planted_now(),
        )

    def _wait(self, procs: list[Proc]) -> None:
        wait_children(list(procs), self._judge, lambda p: time.monotonic() > p.deadline, poll=0.005)

    def _note_peak(self, p: Proc, maxrss: int) -> None:
        f = self.figures
        if maxrss > f.peak_rss_kib:
            f.peak_rss_kib, f.peak_rss_op = maxrss, p.op
        kind = p.op.split("[")[0]
        f.peak_by_kind[kind] = max(f.peak_by_kind.get(kind, 0), maxrss)
        f.top_peaks.append((maxrss, p.op, self.step, p.planted))
        f.top_peaks.sort(key=lambda t: -t[0])
        del f.top_peaks[TOP_PEAKS:]

    def _judge(self, p: Proc, maxrss: int | None, hung: bool) -> None:
        p.out.seek(0)
        p.err.seek(0)
        out, err = p.out.read(), p.err.read()
        p.out.close()
        p.err.close()
        both = out + err
        tail = both.decode("utf-8", "backslashreplace")[-1500:]
        rc = p.popen.returncode
        if rc == 3 and b'"refused"' in out:
            self.figures.refused += 1
        if maxrss is not None:
            self._note_peak(p, maxrss)
        rc = p.popen.returncode
        if hung:
            cmd = " ".join(p.argv[3:] if p.argv[1] == "-c" else p.argv)[:300]
            self._fail(
                "hang", p.op, f"no exit within {self.op_timeout:.0f}s; args {cmd}; {tail[-400:]}"
            )
        elif rc < 0 or rc in (134, 137, 139):
            cmd = " ".join(p.argv[3:] if p.argv[1] == "-c" else p.argv)[:600]
            self._fail("abort", p.op, f"exit {rc}; args {cmd}; {tail[-600:]}")
        if b"panicked" in both or b"PanicException" in both:
            self._fail("panic", p.op, tail)
        elif b"Traceback (most recent call last)" in both:
            self._fail("traceback", p.op, tail)
        elif not hung and rc not in (0, 1, 2, 3) and rc >= 0:
            self._fail("error", p.op, f"exit {rc}; {tail}")
        if any(m in both for m in ESC_MARKERS):
            i = min(both.find(m) for m in ESC_MARKERS if m in both)
            line_start = both.rfind(b"\n", 0, i) + 1
            line = both[line_start : both.find(b"\n", i) if b"\n" in both[i:] else None]
            self._fail("escape", p.op, repr(line[:300]))
        if maxrss is not None and maxrss > self.rss_bound_kib:
            self._fail("rss", p.op, f"peak RSS {maxrss >> 10} MiB > {self.rss_bound_kib >> 10} MiB")
        elif maxrss is None and not hung and rc >= 0:
            # Exited on its own without a report: its peak is unknown, which the bound does
            # not let pass.
            self._fail("rss", p.op, f"exit {rc} without reporting its peak RSS")

    def _fail(self, kind: str, op: str, detail: str) -> None:
        attr = {
            "outside": "outside_changes",
            "hang": "hangs",
            "abort": "aborts",
            "panic": "panics",
            "traceback": "tracebacks",
            "escape": "escapes",
            "rss": "rss_over",
            "error": "errors",
        }[kind]
        setattr(self.figures, attr, getattr(self.figures, attr) + 1)
        self.failures.append(Failure(self.step, kind, op, detail))
        self.log(f"step {self.step}: {kind} in {op}: {detail[-300:]}")

    def _api(
        self,
        op: str,
        args: dict[str, Any],
        env: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Proc:
        args = {
            "root": str(self.root),
            "op": op,
            "seed": self.rng.getrandbits(32),
            "rlimit_as": self.rlimit_as,
            **args,
        }
        return self._spawn(
            op, [sys.executable, "-c", _API_CHILD, json.dumps(args)], env, timeout=timeout
        )

    def _cli(self, op: str, *args: str, env: dict[str, str] | None = None) -> Proc:
        return self._spawn(op, [sys.executable, "-c", _CLI_CHILD, str(self.rlimit_as), *args], env)

    def _puts(self, n: int) -> list[tuple[str, int, dict[str, str] | None]]:
        r = self.rng
        out = []
        for _ in range(n):
            if r.random() < 0.5 and self.keys:
                key = r.choice(self.keys)
            else:
                key = r.choice(
                    [
                        f"k{r.getrandbits(32):x}",
                        f"jit_f-{r.getrandbits(64):x}",
                        f"\x1b]0;key{r.randrange(9)}\x07",
                        f"\u202ek{r.randrange(9)}",
                    ]
                )
                if len(self.keys) < 500:
                    self.keys.append(key)
            meta: dict[str, str] | None = None
            if r.random() < 0.3:
                deep = "[" * 5000 + "]" * 5000
                meta = {
                    "framework": r.choice(["jax", "torch_xla", "\x1b[31mred"]),
                    "key_components": r.choice(
                        [
                            json.dumps(
                                {"module": "m", "components": [{"name": "a", "digest": "\x1b[2J"}]}
                            ),
                            '{"module":"m","components":[{"name":"a","digest":"d","value":'
                            + deep
                            + "}]}",
                            "not json",
                        ]
                    ),
                    "compile_time_s": r.choice(["1.5", "nan", "1e400", "-1"]),
                }
            out.append((key, r.choice([10, 1000, 50_000, 300_000]), meta))
        return out

    def _trace_env(self) -> dict[str, str] | None:
        """Sometimes an eviction trace inside the cache, where a FIFO or link may be planted."""
        if self.rng.random() < 0.15:
            p = self.root / self.rng.choice(["evict-trace.log", "tmp/trace", "journal/trace"])
            kind = self.rng.randrange(3)
            if kind == 0:
                self._place(p.parent, p.name, lambda q: os.mkfifo(q))
            elif kind == 1:
                self._place(p.parent, p.name, lambda q: q.symlink_to(self.outside / "precious.log"))
            return {**self.env, "XLA_PCACHE_EVICT_TRACE": str(p)}
        return None

    def operate(self) -> str:
        r = self.rng
        ops: list[tuple[str, float]] = [
            ("put", 4),
            ("get", 2),
            ("evict", 1.5),
            ("verify", 1.5),
            ("compact", 1.5),
            ("cli_stats", 1),
            ("cli_ls", 1),
            ("cli_prune", 1),
            ("cli_verify", 1),
            ("cli_explain", 1),
            ("cli_doctor", 0.6),
            ("cli_export_import", 0.6),
        ]
        if self.s3 is not None:
            ops += [("tier_get", 1.2), ("tier_claim", 0.8)]
        op = r.choices([o[0] for o in ops], weights=[o[1] for o in ops])[0]
        budget = r.choice([None, 200_000, 1 << 20, 10 << 20])
        procs: list[Proc] = []
        if op == "put":
            procs.append(
                self._api(
                    "put",
                    {"puts": self._puts(r.randint(1, 12)), "max_size": budget},
                    env=self._trace_env(),
                )
            )
        elif op == "get":
            procs.append(self._api("get", {"keys": r.sample(self.keys, min(8, len(self.keys)))}))
        elif op == "evict":
            procs.append(
                self._api(
                    "evict", {"target": r.choice([0, 100_000, 1 << 20])}, env=self._trace_env()
                )
            )
        elif op == "verify":
            procs.append(self._api("verify", {"repair": r.random() < 0.6}))
        elif op == "compact":
            # Several writers at once, enough puts to fold and remove journals.
            for _ in range(r.randint(2, 4)):
                procs.append(
                    self._api("put", {"puts": self._puts(r.randint(10, 40)), "max_size": budget})
                )
        elif op == "cli_stats":
            procs.append(
                self._cli(
                    op, "stats", "-p", str(self.root), *(["--json"] if r.random() < 0.3 else [])
                )
            )
        elif op == "cli_ls":
            procs.append(
                self._cli(
                    op,
                    "ls",
                    "-p",
                    str(self.root),
                    "--limit",
                    "0",
                    *r.choice([[], ["--json"], ["--sort", "size"]]),
                )
            )
        elif op == "cli_prune":
            procs.append(
                self._cli(
                    op,
                    "prune",
                    "-p",
                    str(self.root),
                    "--max-size",
                    r.choice(["0", "100K", "1M"]),
                    *(["--json"] if r.random() < 0.3 else []),
                    env=self._trace_env(),
                )
            )
        elif op == "cli_verify":
            procs.append(
                self._cli(
                    op, "verify", "-p", str(self.root), *(["--repair"] if r.random() < 0.6 else [])
                )
            )
        elif op == "cli_explain":
            key = r.choice([None, None, r.choice(self.keys)])
            procs.append(
                self._cli(
                    op,
                    "explain",
                    *([key] if key else []),
                    "-p",
                    str(self.root),
                    *(["--json"] if r.random() < 0.3 else []),
                )
            )
        elif op == "cli_doctor":
            self.plant_probe()
            procs.append(
                self._cli(
                    op, "doctor", "-p", str(self.root), *(["--json"] if r.random() < 0.3 else [])
                )
            )
        elif op == "cli_export_import":
            bundle = self.work / "b.tar.gz"
            bundle.unlink(missing_ok=True)
            p = self._cli("cli_export", "export", "-p", str(self.root), "-o", str(bundle))
            self._wait([p])
            self._count(p.op)
            if bundle.exists():
                procs.append(self._cli("cli_import", "import", str(bundle), "-p", str(self.root)))
            op = "cli_export"
        elif op == "tier_get":
            url = self.s3.url(self.prefix)
            pool = self.bucket_keys or self.keys
            procs.append(
                self._api(
                    "tier_get",
                    {"keys": r.sample(pool, min(4, len(pool))), "remote": url},
                    timeout=self.op_timeout + 30,
                )
            )
        elif op == "tier_claim":
            from xla_pcache import entry_name

            url = self.s3.url(self.prefix)
            pool = self.bucket_keys or self.keys
            names = [entry_name(k) for k in r.sample(pool, min(2, len(pool)))]
            procs.append(self._api("tier_claim", {"names": names, "wait": 1.0, "remote": url}))
        self._wait(procs)
        for p in procs:
            self._count(p.op)
        # What ran, with the eviction trace each had (an outside change names it).
        return ",".join(sorted({p.op for p in procs})) or op

    def _count(self, op: str) -> None:
        self.figures.ops += 1
        op = op.split("[")[0]
        self.figures.ops_by_kind[op] = self.figures.ops_by_kind.get(op, 0) + 1

    def plant_probe(self) -> None:
        """The doctor's remembered probe entries, written by a child through the real Store:
        benign (so that doctor does not start a framework), or what a hostile writer leaves."""
        values = [
            json.dumps({"jit": True, "serialize": True, "load": True}),
            json.dumps([1, 2, 3]),
            json.dumps("\x1b]52;c;cHduZWQ=\x1b\\"),
            json.dumps({"detail": "\x1b]52;c;cHduZWQ=\x1b\\", "load": "\x1b[2J"}),
            "[" * 100000,
            "null",
        ]
        p = self._api("probe", {"value": self.rng.choice(values)})
        self._wait([p])
        self._count(p.op)

    # ---- the loop ----------------------------------------------------------------------

    def check_outside(self, what: str) -> None:
        now = tree_digest(self.outside)
        if now != self.before:
            changed = sorted(
                k for k in set(now) | set(self.before) if now.get(k) != self.before.get(k)
            )
            how = []
            for k in changed[:4]:
                tail = b""
                with contextlib.suppress(OSError):
                    p = self.outside / k
                    if p.is_file() and not p.is_symlink():
                        tail = p.read_bytes()[-160:]
                was, is_ = self.before.get(k, "absent"), now.get(k, "absent")
                how.append(f"{k}: {was} -> {is_} {tail!r}")
            self._fail("outside", what, f"changed outside the cache: {how}")
            self.before = now

    def run(self, steps: int) -> Figures:
        for _ in range(steps):
            self.step += 1
            if self.rng.random() < 0.45:
                what = "plant:" + self.plant()
            else:
                what = self.operate()
                if self.rng.random() < 0.3:
                    self.heal()
            self.check_outside(what)
            self.figures.steps += 1
        return self.figures


def start_s3(base: Path) -> Any:
    """The test suite's SeaweedFS server (``weed mini`` on loopback)."""
    repo = Path(__file__).resolve().parent.parent
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from tests.tiers.servers import start_s3 as start

    return start(base)


def summary(f: Figures, seed: int, failures: list[Failure]) -> str:
    lines = [
        f"seed {seed}: {f.steps} steps, {f.ops} operations ({f.processes} processes), "
        f"{f.plants} states planted",
        f"outside changes {f.outside_changes}, hangs {f.hangs}, aborts {f.aborts}, "
        f"panics {f.panics}, tracebacks {f.tracebacks}, raw escapes {f.escapes}, "
        f"RSS over bound {f.rss_over}, other errors {f.errors}",
        f"stores refused at open (layout component not a directory, a clear error) {f.refused}",
        f"peak RSS {f.peak_rss_kib / 1024:.0f} MiB ({f.peak_rss_op})",
        "operations: " + ", ".join(f"{k} {v}" for k, v in sorted(f.ops_by_kind.items())),
        "planted: " + ", ".join(f"{k} {v}" for k, v in sorted(f.plants_by_kind.items())),
        "peak RSS by operation (MiB): "
        + ", ".join(f"{k} {v / 1024:.0f}" for k, v in sorted(f.peak_by_kind.items())),
        "largest peaks:",
        *(
            f"  {kib / 1024:.0f} MiB {op} at step {step}: {planted}"
            for kib, op, step, planted in f.top_peaks[:3]
        ),
    ]
    lines += first_failures(failures, 400)
    return "\n".join(lines)


def run(steps: int, seed: int, base: Path, *, with_s3: bool = True, **kw: Any) -> Harness:
    s3 = start_s3(base / "weed") if with_s3 else None
    try:
        h = Harness(base / f"run-{seed}", seed, s3=s3, **kw)
        h.run(steps)
        return h
    finally:
        if s3 is not None:
            s3.stop()


def cleanup(base: Path) -> None:
    """Removes a run's tree (FIFOs and links included, never followed)."""
    shutil.rmtree(base, ignore_errors=True)
