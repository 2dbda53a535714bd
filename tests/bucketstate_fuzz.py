"""A bucket-state fuzzer: hosts' real operations on a cache whose path is a bucket, with
hostile objects planted between them, and the bucket's promises checked after every step.

The bucket is a real S3 service (SeaweedFS ``weed mini`` on loopback, ``tests/tiers/servers.py``)
behind the relay of the tests (``tests/tiers/relay.py``), one relay per process so that each
process's requests are counted on the wire as its own. What the relay plants is listed as S3
lists it: keys a real S3 accepts and SeaweedFS collapses or refuses (a ``//``, a ``.`` or
``..`` segment, a control character, a trailing ``/``, a segment over 255 bytes).

Operations are the hosts', each a fresh process with the environment the tests use (the S3
variables, ``XDG_CACHE_HOME`` of its host, an empty working directory of its own):

- through ``xla_pcache.open_store("s3://...")``: puts (a writer's exit record, and its
  prune when the bucket looks past its budget), gets, torch_xla entries and their markers,
  a torch_xla host start (``torch_xla._bucket_start.pull``, driven directly);
- the command: ``xla-pcache stats``, ``prune`` (with and without ``--untrusted``) and
  ``config`` with ``--path s3://...``;
- the same as read-only hosts (``?ro=1`` on the URL, ``XLA_PERSISTENT_CACHE_READ_ONLY=1``,
  ``--read-only``);
- several of them at once, on different hosts.

Between them it plants, below the cache's prefix: random legal keys (unicode, spaces, quotes,
escapes, up to 1,024 bytes) everywhere, keys below our fixed names (``prune.lease/x``,
``config/x``, ``entries/<name>/x/y``) and the empty directories they leave behind on a
service that has directories; a ``usage``, records, ``config``, ``state`` and the lease that
are huge, garbled, gzip bombs or hold numbers out of range; thousands of markers, records,
junk entries; garbage at entries' names; floods of keys the client refuses. Some plants are
taken back later.

After every step: no object outside the prefix changed (objects planted at the bucket's root
and in sibling prefixes, compared byte for byte); no operation hung (no request and no exit
for ``op_timeout`` seconds, or past ``op_limit`` in all), died of a signal, panicked, printed
a traceback or a raw escape, or exited with a status (and reason) its command does not give
for a planted object; no host's tier counted a failure while the server answered; each
operation's peak RSS (VmHWM, its own) and its requests (by kind, on the wire) stayed within
bounds derived from the code's constants (``prune_bound`` and the functions beside it,
docs/reliability.md lists them); a read-only host made no write request and changed no
object; every host's working directory is empty.
At the end the attacker stops: what was planted is removed; a writer fills the bucket, half
its bytes are stored as the budget, and one ``xla-pcache prune`` must bring the entries within
``upkeep.LOW_WATERMARK`` of it (docs/remote.md), after which ``stats`` sees nothing
untrusted, and a new host must be served every entry of the writer's that was kept.

Entry points: ``tests/bucket/test_bucketstate_fuzz.py`` (a short run in the test suite) and
``bench/fuzz_bucket.py`` (the long run, which prints the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xla_pcache import entry_name
from xla_pcache.bucket import marker_listing, prune_markers, prune_reach, upkeep
from xla_pcache.bucket import reader as br
from xla_pcache.bucket.objects import SQUAT_REMOVALS
from xla_pcache.tiers import objstore
from xla_pcache.torch_xla import _bucket_garbage, _bucket_start

from tests.floods import FLOODS, Scene, when
from tests.fuzz_children import (
    CHILD_PRELUDE,
    CLI_CHILD,
    ESC_MARKERS,
    PEAK_FILE_VAR,
    PEAK_PRELUDE,
    Failure,
    first_failures,
    pick_weighted,
    reported_peak,
    wait_children,
)
from tests.tiers.relay import Relay, request_kind
from tests.tiers.servers import BucketServer

ROOT = upkeep.ROOT
DIRS = ("entries", "claims", "records", "torch_xla")
FIXED = ("config", "usage", "state", "prune.lease")
WRITES = ("put", "delete", "post")
MIB = 1 << 20

# --- the bounds ---------------------------------------------------------------------------
# What a process may cost beyond what a Python process with the package and the client costs
# doing nothing (measured once a run, ``Harness.base_kib``): the reader's buffers (64 KiB
# pieces, inflated 64 KiB at a time), the first ranged read of an entry (8 MiB, and the
# store's copy of it), the client's runtime and connection pools, allocator slack.
RSS_SLACK_KIB = 96 << 10
# A prune holds one ``upkeep.Entry`` a listed entry (about 320 bytes measured, listing and
# dict included: docs/remote.md); bounded here at four times that.
RSS_PER_ENTRY_KIB = 1.25
# A prune rewrites its lease this often while it runs.
BEAT_S = upkeep.LEASE_S / 3


def client_refuses(key: str) -> bool:
    """Whether ``object_store`` refuses ``key`` as a path (its documented rule, written here
    apart from the package's: one ``/`` at either end ignored, then no empty, ``.`` or
    ``..`` segment and no ASCII control character)."""
    core = key[1:] if key.startswith("/") else key
    core = core[:-1] if core.endswith("/") else core
    if core == "":
        return False
    return any(
        s in ("", ".", "..") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in s)
        for s in core.split("/")
    )


@dataclasses.dataclass
class Census:
    """What is below the prefix, as a listing sees it: objects by top directory (those a
    listing of it gives, the relay's included), keys the client refuses by directory, the
    records of a record's shape, objects below one of our names (a squat), the largest
    object under ``entries/``, and every real object's size and ETag."""

    listed: Counter[str] = dataclasses.field(default_factory=Counter)
    refused: Counter[str] = dataclasses.field(default_factory=Counter)
    records: int = 0
    squats: int = 0
    # Directories below each fixed name (a listing with a delimiter shows them, empty ones
    # included, on a service that has directories).
    dirs: Counter[str] = dataclasses.field(default_factory=Counter)
    biggest: int = 0
    objects: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    # The service's names are flat (GCS): no directory below a name to remove, and no batch
    # delete (a DELETE an object, each once more when a batch met one already gone).
    flat: bool = False

    def deletes(self, n: int) -> int:
        """The most DELETE requests that removing ``n`` objects a batch at a time makes."""
        return 2 * n if self.flat else math.ceil(n / upkeep.DELETE_BATCH)

    def lists(self, d: str, extra: int = 0, limit: int | None = None) -> int:
        """The most listing requests one listing of ``d`` makes (br.list_requests_bound)."""
        n = self.listed[d] + extra
        if limit is not None:
            n = min(n, limit + 1)
        return br.list_requests_bound(n, self.refused[d])


def _top(rel: str) -> str | None:
    """The directory of ``ROOT`` that ``rel`` (below the prefix) lies in, ``fixed`` for one
    of the fixed names or below one, None outside ``ROOT``."""
    parts = rel.split("/")
    if parts[0] != ROOT or len(parts) < 2:
        return None
    if parts[1] in DIRS and len(parts) > 2:
        return parts[1]
    if parts[1] in FIXED and len(parts) > 2:
        return parts[1]  # below a fixed name: what a squat check of it lists
    return "fixed"


def fetches(c: Census) -> int:
    """Requests one fetch of an entry makes at most: the first ranged read, and the rest of
    an object larger than objstore.RANGE_CHUNK in pieces of objstore.RANGE_PIECE."""
    rest = max(0, c.biggest - objstore.RANGE_CHUNK)
    return 1 + math.ceil(rest / objstore.RANGE_PIECE)


def prune_bound(c: Census, extra: int, limits: upkeep.Limits) -> Counter[str]:
    """What one ``Bucket.prune`` may request, from ``upkeep.py``:

    - the budget (1 GET);
    - the lease: 2 conditional PUTs, a HEAD after each, a squat check of its name, a
      takeover (a GET of the holder and a PUT), a HEAD and a DELETE to give it back, and a
      PUT every ``BEAT_S`` of the time it ran (which ``Harness._judge`` adds);
    - the listings of records, entries, claims and markers, with their refused keys' HEADs;
    - a GET per folded record (at most ``limits.records``) and of ``usage``; ``usage`` and
      ``state`` written;
    - when its listing of ``entries/`` may be cut short (keys the client refuses there, or
      more than ``limits.entries``): a listing of ``torch_xla/`` for the names it gives, a
      HEAD per name asked (at most ``limits.asks``), a second GET of each record and of
      ``usage``, and a GET of a record read again for the names its found ones earned it
      (each such read yields a name asked, or ends that record: at most one per name asked
      and one per record; ``prune_reach._Turns``);
    - deletes in batches of ``upkeep.DELETE_BATCH`` per kind removed (entries, junk, folded
      records, stale claims, orphan markers), and per object below one of our names a
      HEAD and a DELETE for each directory it made (at most ``upkeep.SQUAT_DEPTH``).

    ``extra``: what other processes may add meanwhile to each directory (entries, markers,
    their records)."""
    out: Counter[str] = Counter()
    # A squat check of the lease's name: a listing of the objects below it, and of each
    # directory below it (at most upkeep.SQUAT_DIRS), each removed, then the name.
    lease_dirs = min(c.dirs["prune.lease"], upkeep.SQUAT_DIRS)
    out["list"] = (
        c.lists("records", extra)
        + c.lists("entries", extra)
        + c.lists("claims")
        + c.lists("torch_xla", extra)
        + c.lists("prune.lease")
        + 1
        + lease_dirs
    )
    folded = min(c.records + extra, limits.records)
    # ... and the headers of entries with more than one marker (``prune_markers``).
    out["get"] = 1 + 1 + folded + 1 + prune_markers.MARKER_READS
    refused = sum(c.refused[d] for d in (*DIRS, "prune.lease"))
    squat_dirs = squat_removals(c)
    out["head"] = br.HEADS_PER_REFUSED * refused + 2 + 1 + squat_dirs + 2
    capped = limits.entries is not None and c.listed["entries"] + extra > limits.entries
    if c.refused["entries"] or capped:
        out["list"] += c.lists("torch_xla", extra, limit=prune_reach.MARKERS_LISTED)
        out["head"] += limits.asks
        out["get"] += folded + 1 + limits.asks + folded
    out["put"] = 2 + 1 + 2
    batches = sum(2 + 2 * c.deletes(c.listed[d] + extra) for d in (*DIRS, "prune.lease"))
    batches += c.deletes(folded)
    out["delete"] = batches + squat_dirs + lease_dirs + 1 + 1
    return out


def untrusted_bound(c: Census) -> Counter[str]:
    """``Bucket.remove_untrusted``: one listing of all below ``ROOT``, deletes in batches of
    ``upkeep.DELETE_BATCH``, a HEAD and a DELETE per directory an object below one of our
    names made (at most ``upkeep.SQUAT_DEPTH`` each); then for each fixed name a HEAD and,
    when it is no object, the directories below it (a listing and a DELETE each, at most
    ``upkeep.SQUAT_DIRS``) and the name."""
    out: Counter[str] = Counter()
    n = sum(c.listed[d] for d in (*DIRS, *FIXED, "fixed"))
    refused = sum(c.refused.values())
    dirs = sum(min(c.dirs[f], upkeep.SQUAT_DIRS) for f in FIXED)
    squat_dirs = squat_removals(c)
    out["list"] = br.list_requests_bound(n, refused) + len(FIXED) + dirs
    out["head"] = br.HEADS_PER_REFUSED * refused + squat_dirs + 2 * len(FIXED)
    out["delete"] = 1 + c.deletes(n) + squat_dirs + len(FIXED) + dirs
    return out


def squat_removals(c: Census) -> int:
    """The directories objects planted below our names made that one prune removes at
    most: ``upkeep.SQUAT_DEPTH`` an object, ``SQUAT_REMOVALS`` in all (none where names
    are flat)."""
    return 0 if c.flat else min(upkeep.SQUAT_DEPTH * c.squats, SQUAT_REMOVALS)


def stats_bound(c: Census) -> Counter[str]:
    """``Bucket.stats``: the budget and ``state`` (2 GETs), listings of entries, records
    and claims, a HEAD per refused key in them."""
    return Counter(
        get=2,
        list=c.lists("entries") + c.lists("records") + c.lists("claims"),
        head=br.HEADS_PER_REFUSED * sum(c.refused[d] for d in ("entries", "records", "claims")),
    )


def writer_bound(c: Census, puts: int, marks: int, gets: int, extra: int) -> Counter[str]:
    """A host's process through ``BucketStore``: a GET per local miss (``fetches``), a PUT
    per entry and per marker, its record at exit (1 PUT), and when it wrote, the budget
    check (the budget and ``state``: 2 GETs, a listing of at most
    ``upkeep.ESTIMATE_RECORDS`` records) and then a prune within ``upkeep.WRITER_LIMITS``."""
    out: Counter[str] = Counter(get=gets * fetches(c), put=puts + marks + 1)
    if puts:
        # The budget and ``state`` (and ``state`` again with a max age, before exit).
        out["get"] += 3
        out["list"] += c.lists("records", extra, limit=upkeep.ESTIMATE_RECORDS)
        out["head"] += br.HEADS_PER_REFUSED * c.refused["records"]
        out.update(prune_bound(c, extra, upkeep.WRITER_LIMITS))
    return out


def start_bound(c: Census, extra: int = 0, *, read_only: bool = False) -> Counter[str]:
    """A torch_xla host start (``torch_xla._bucket_start.pull``): one listing of at most
    ``_bucket_start.PULL_MARKERS`` objects under ``torch_xla/``; when it cannot follow them blindly,
    a listing of at most ``_bucket_start.PULL_ENTRIES`` objects under ``entries/`` and at most
    ``marker_listing.MARKER_PAGES`` pages of the markers of those entries (with the refused
    keys and recoveries of one listing among them); at most ``_bucket_start.PULL_FETCHES``
    fetches, of the markers' entries and of entries asked for by name (their markers
    crowded out or hidden: a ranged read of each one's first bytes before its fetch); a
    writing host's start removes at most ``_bucket_garbage.PULL_REMOVALS`` objects it
    proved garbage (a request each), a read-only one none. ``extra``: the markers and
    entries writers beside it may add meanwhile."""
    marked = c.listed["torch_xla"] + extra
    by_name = min(c.listed["entries"] + extra, _bucket_start.PULL_FETCHES)
    refused = c.refused["torch_xla"]
    zigzag = (
        marker_listing.MARKER_PAGES
        + min(refused, br.MAX_UNLISTABLE + 1) * br.LISTS_PER_REFUSED
        + (br.MAX_RECOVERIES * br.RECOVERY_LISTS if refused else 0)
    )
    return Counter(
        list=c.lists("torch_xla", extra, limit=_bucket_start.PULL_MARKERS)
        + c.lists("entries", extra, limit=_bucket_start.PULL_ENTRIES)
        + zigzag,
        head=br.HEADS_PER_REFUSED * (2 * refused + c.refused["entries"]),
        get=min(marked + by_name, _bucket_start.PULL_FETCHES) * fetches(c) + by_name,
        delete=0 if read_only else min(marked + by_name, _bucket_garbage.PULL_REMOVALS),
    )


# --- results --------------------------------------------------------------------------------


KINDS = {
    "outside": "outside changes",
    "local": "host files outside the store",
    "hang": "hangs",
    "abort": "aborts",
    "panic": "panics",
    "traceback": "tracebacks",
    "escape": "raw escapes",
    "error": "unexpected exits",
    "rss": "RSS over bound",
    "requests": "requests over bound",
    "read_only": "read-only writes",
    "tier": "tier failures",
    "final": "final phase",
    "server": "server exits",
}


@dataclasses.dataclass
class OpFigures:
    n: int = 0
    peak_kib: int = 0
    bound_kib: int = 0
    requests: int = 0  # the most one process made
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)  # of that process
    bound: int = 0  # its bound, in all
    failures: int = 0
    exits: Counter[int] = dataclasses.field(default_factory=Counter)
    seconds: float = 0.0  # the longest run

    def add(
        self,
        rc: int,
        peak: int | None,
        bound_kib: int,
        wire: dict[str, int],
        bound: int,
        seconds: float,
    ) -> None:
        self.n += 1
        self.exits[rc] += 1
        self.seconds = max(self.seconds, seconds)
        if peak is not None and peak >= self.peak_kib:
            self.peak_kib, self.bound_kib = peak, bound_kib
        total = sum(v for k, v in wire.items() if k != "5xx")
        if total >= self.requests:
            self.requests, self.by_kind, self.bound = total, dict(wire), bound


@dataclasses.dataclass
class Figures:
    steps: int = 0
    ops: int = 0
    processes: int = 0
    plants: int = 0
    failures: Counter[str] = dataclasses.field(default_factory=Counter)
    by_op: dict[str, OpFigures] = dataclasses.field(default_factory=dict)
    plants_by_kind: Counter[str] = dataclasses.field(default_factory=Counter)
    base_kib: int = 0
    # Prunes writers made on their own (the bucket past its budget), as they reported.
    writer_prunes: int = 0
    # Processes that ended (or were killed) with a request still on its way to the server,
    # which the step then waited for.
    late: int = 0
    final: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The flood round (``Harness.floods``): per kind of flood, its keys and, per operation
    # run with it, (exit status, requests, their bound, seconds, peak KiB, bound KiB,
    # failures).
    floods: dict[str, tuple[int, dict[str, tuple[int, int, int, float, int, int, int]]]] = (
        dataclasses.field(default_factory=dict)
    )

    def merge(self, other: Figures) -> None:
        self.steps += other.steps
        self.ops += other.ops
        self.processes += other.processes
        self.plants += other.plants
        self.writer_prunes += other.writer_prunes
        self.late += other.late
        self.failures.update(other.failures)
        self.plants_by_kind.update(other.plants_by_kind)
        self.base_kib = max(self.base_kib, other.base_kib)
        for kind, (keys, ops) in other.floods.items():
            _, mine_ops = self.floods.setdefault(kind, (keys, {}))
            for op, row in ops.items():
                old = mine_ops.get(op)
                # The costliest run of each, failures summed.
                if old is None or row[1] > old[1]:
                    mine_ops[op] = (*row[:6], row[6] + (old[6] if old else 0))
                else:
                    mine_ops[op] = (*old[:6], old[6] + row[6])
        for op, f in other.by_op.items():
            mine = self.by_op.setdefault(op, OpFigures())
            mine.n += f.n
            mine.failures += f.failures
            mine.exits.update(f.exits)
            mine.seconds = max(mine.seconds, f.seconds)
            if f.peak_kib >= mine.peak_kib:
                mine.peak_kib, mine.bound_kib = f.peak_kib, f.bound_kib
            if f.requests >= mine.requests:
                mine.requests, mine.by_kind, mine.bound = f.requests, f.by_kind, f.bound


# --- child processes ------------------------------------------------------------------------

# A host's process: the bucket path opened as the adapters open it (the environment's
# settings), its operation, its counters on stdout.
_HOST_CHILD = (
    CHILD_PRELUDE
    + r"""
import random
from xla_pcache import open_store
from xla_pcache.config import Settings
from xla_pcache.torch_xla import _bucket_start
rng = random.Random(args["seed"])
s = open_store(args["url"], Settings.from_env())
op = args["op"]
out = {"stored": 0, "hits": 0}
if op in ("put", "put_torch_xla"):
    for key, size, graph in args["puts"]:
        out["stored"] += bool(s.put(key, rng.randbytes(size)))
        if graph is not None:
            s.mark(key, graph)
        if rng.random() < 0.3:
            out["hits"] += s.get(rng.choice(args["keys"])) is not None
elif op == "get":
    out["hits"] = sum(s.get(k) is not None for k in args["keys"])
elif op == "torch_xla_start":
    out["fetched"] = _bucket_start.pull(s, lambda g: f"torch_xla/{g}")
tier = s._bucket_tier(open_it=False)
recorder = s._recorder
s.close()
if tier is not None:
    out["tier"] = {k: v for k, v in tier.stats().items() if isinstance(v, int)}
if recorder is not None:
    out["prunes"] = recorder.prunes
print(json.dumps(out))
"""
)

# Nothing but what every operation pays: the package, the client, one request.
_BASE_CHILD = r"""
import sys
from xla_pcache.bucket.upkeep import Bucket
Bucket(sys.argv[1]).read_stored_budget()
"""


@dataclasses.dataclass
class Proc:
    op: str
    popen: subprocess.Popen[bytes]
    out: Any
    err: Any
    # Hung: no request for this long (its relay's last), or past ``Harness.op_limit``.
    idle_limit: float
    argv: list[str]
    peak_file: Path
    relay: Relay
    bound: Counter[str]
    bound_kib: int
    work: Path
    # The exit statuses it may give, each with what it must say (one of them; none: any).
    exits: dict[int, tuple[bytes, ...]]
    read_only: bool
    prunes: bool
    started: float
    # What it printed (stdout and stderr; stdout alone) and its exit status, once judged.
    output: str = ""
    stdout: str = ""
    rc: int = 0
    # Once judged: its requests (by kind, on the wire), their bound in all, its peak RSS,
    # how long it ran, and the failures found in it.
    wire: dict[str, int] = dataclasses.field(default_factory=dict)
    bound_total: int = 0
    peak: int | None = None
    seconds: float = 0.0
    failed: int = 0


# --- keys and bodies ------------------------------------------------------------------------

_PLAIN = "abcdefghijklmnopqrstuvwxyz0123456789-_."
_ODD = " !\"#$%&'()*+,:;<=>?@[\\]^`{|}~é߀中文😀\u202e\u200b\u00a0\ufeff"


def _gz(data: bytes, level: int = 6) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def _gz_repeat(piece: bytes, total: int) -> bytes:
    """``piece`` repeated to ``total`` bytes, gzip, made a MiB at a time."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = piece * max(1, MIB // len(piece))
    out = []
    done = 0
    while done < total:
        chunk = block[: total - done]
        out.append(c.compress(chunk))
        done += len(chunk)
    out.append(c.flush())
    return b"".join(out)


class Harness:
    def __init__(
        self,
        base: Path,
        seed: int,
        server: BucketServer,
        *,
        op_timeout: float = 120.0,
        op_limit: float = 900.0,
        rlimit_as: int = 4 << 30,
        scale: float = 1.0,
        read_only_hosts: bool = True,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.base = base
        self.seed = seed
        self.rng = random.Random(seed)
        self.s3 = server
        self.op_timeout = op_timeout
        self.op_limit = op_limit
        self.rlimit_as = rlimit_as
        self.scale = scale
        self.read_only_hosts = read_only_hosts
        self.log = log or (lambda _m: None)
        self.figures = Figures()
        self.failures: list[Failure] = []
        self.step = 0
        self.prefix = f"fz-{seed}-{os.getpid()}-{random.Random().getrandbits(24):06x}"
        self.url = server.url(self.prefix)
        base.mkdir(parents=True, exist_ok=True)
        self.peaks = base / "peaks"
        self.peaks.mkdir(exist_ok=True)
        self.hosts = [base / "hosts" / f"h{i}" for i in range(3)]
        self.fresh_hosts = 0
        for h in self.hosts:
            (h / "work").mkdir(parents=True)
        self.root_client = self._client("")
        self.client = self._client(self.prefix)
        self.relays: list[Relay] = [Relay(server)]
        self.planted_keys: set[str] = set()  # real objects planted below the prefix
        self.keys: list[str] = []  # keys hosts put
        self.graphs: list[str] = []
        self.wanted = [f"w-{i}" for i in range(8)]  # asked for, never written by a host
        self._bombs: dict[str, bytes] = {}
        self.outside = self._plant_outside()
        self.env = self._env()
        self.figures.base_kib = self._measure_base()

    # ---- plumbing ----------------------------------------------------------------------

    def _client(self, prefix: str) -> Any:
        return self.s3.client(prefix, client_options={"timeout": "120s"})

    def _env(self) -> dict[str, str]:
        from xla_pcache.config import VARIABLE_NAMES

        env = {k: v for k, v in os.environ.items() if k not in VARIABLE_NAMES}
        for k in list(env):
            if k.startswith(("AWS_", "GOOGLE_", "JAX_", "PJRT_")):
                env.pop(k)
        env.update(self.s3.env())
        env.update(
            PYTHONUNBUFFERED="1",
            NO_COLOR="1",
            COLUMNS="200",
            XLA_PCACHE_REMOTE_TIMEOUT="10",
        )
        return env

    def relay(self, i: int) -> Relay:
        while len(self.relays) <= i:
            self.relays.append(Relay(self.s3, planted_from=self.relays[0]))
        return self.relays[i]

    def close(self) -> None:
        for r in self.relays:
            r.close()

    def _put_many(self, items: dict[str, bytes]) -> None:
        """Puts ``items`` (key below the prefix -> body) straight to the server."""
        import obstore

        async def put_all() -> None:
            gate = asyncio.Semaphore(32)

            async def one(key: str, body: bytes) -> None:
                async with gate:
                    with contextlib.suppress(Exception):
                        await obstore.put_async(self.client, key, body)
                        self.planted_keys.add(key)

            await asyncio.gather(*(one(k, b) for k, b in items.items()))

        asyncio.run(put_all())

    def _put(self, key: str, body: bytes) -> bool:
        """One object below the prefix, straight to the server; False when the client or
        SeaweedFS refuses the key (it is then planted on the relay, as S3 would list it)."""
        import obstore

        if client_refuses(key) or key.endswith("/") or any(len(s) > 255 for s in key.split("/")):
            self.relays[0].plant(f"{self.prefix}/{key}", len(body))
            return False
        try:
            obstore.put(self.client, key, body)
        except Exception as e:
            self.log(f"plant {key[:80]!r} refused by the server ({type(e).__name__}): relayed")
            self.relays[0].plant(f"{self.prefix}/{key}", len(body))
            return False
        self.planted_keys.add(key)
        return True

    def _list(self, client: Any, prefix: str | None = None) -> list[Any]:
        import obstore

        return list(obstore.list(client, prefix).collect())

    def census(self) -> Census:
        c = Census(flat=not self.s3.directories)
        for meta in self._list(self.client, ROOT):
            rel = str(meta["path"])
            size = int(meta["size"])
            c.objects[rel] = (size, str(meta.get("e_tag")))
            self._count(c, rel, size)
        for name in FIXED:
            c.dirs[name] = self._dirs_below(f"{ROOT}/{name}")
        with self.relays[0]._lock:
            planted = list(self.relays[0].planted.values())
        for p in planted:
            if not p.key.startswith(self.prefix + "/"):
                continue
            rel = p.key[len(self.prefix) + 1 :]
            # As the client takes a path: one "/" at its end ignored.
            top = self._count(c, rel.removesuffix("/"), p.size)
            if top is not None and client_refuses(p.key):
                c.refused[top] += 1
                c.listed[top] -= 1
        return c

    def _dirs_below(self, name: str) -> int:
        """The directories below ``name``, empty ones included (listings with a
        delimiter, straight to the server)."""
        import obstore

        n = 0
        stack = [name]
        while stack:
            d = stack.pop()
            subs = [
                str(p).rstrip("/")
                for p in obstore.list_with_delimiter(self.client, d)["common_prefixes"]
            ]
            n += len(subs)
            stack += [p for p in subs if p.startswith(d + "/")]
        return n

    @staticmethod
    def _count(c: Census, rel: str, size: int) -> str | None:
        top = _top(rel)
        if top is None:
            return None
        c.listed[top] += 1
        parts = rel.split("/")
        if top == "entries":
            c.biggest = max(c.biggest, size)
        if top == "records" and len(parts) == 3 and upkeep.USE_RECORD_NAME.fullmatch(parts[2]):
            c.records += 1
        if top in FIXED or (top in ("entries", "claims") and len(parts) > 3):
            c.squats += 1
        return top

    # ---- outside the prefix ------------------------------------------------------------

    def _plant_outside(self) -> dict[str, str]:
        """Objects that look like a cache's, at the bucket's root and in prefixes beside
        ours (a sibling, one that extends ours, a shorter one): none may change."""
        import obstore

        r = self.rng
        name = entry_name("outside")
        sibs = [
            "",
            f"{self.prefix}-sib/",
            f"{self.prefix}x/",
            f"{self.prefix}.old/",
            f"{self.prefix[:-1]}/",
            f"{self.prefix} /",
        ]
        out: dict[str, str] = {}
        for sib in sibs:
            for rel in (
                f"{ROOT}/entries/{name}",
                f"{ROOT}/config",
                f"{ROOT}/usage",
                f"{ROOT}/prune.lease",
                f"{ROOT}/records/r-1-0000000000000000-1-1",
                f"{ROOT}/torch_xla/{name}-1",
                f"{ROOT}/claims/{name}",
            ):
                body = r.randbytes(r.randint(0, 300))
                obstore.put(self.root_client, sib + rel, body)
                out[sib + rel] = hashlib.blake2b(body, digest_size=16).hexdigest()
        return out

    def outside_now(self) -> dict[str, str]:
        import obstore

        out: dict[str, str] = {}
        top = obstore.list_with_delimiter(self.root_client, None)
        metas = list(top["objects"])
        for p in top["common_prefixes"]:
            if str(p).rstrip("/") != self.prefix:
                metas += self._list(self.root_client, str(p))
        for meta in metas:
            path = str(meta["path"])
            body = bytes(obstore.get(self.root_client, path).bytes())
            out[path] = hashlib.blake2b(body, digest_size=16).hexdigest()
        return out

    def check_outside(self, what: str) -> None:
        now = self.outside_now()
        if now != self.outside:
            changed = sorted(
                k for k in set(now) | set(self.outside) if now.get(k) != self.outside.get(k)
            )
            self._fail("outside", what, f"changed outside the prefix: {changed[:6]}")
            self.outside = now

    # ---- random fields -----------------------------------------------------------------

    def count(self, hi: int) -> int:
        """A random count, skewed small (a fifth of the time a flood of a quarter of ``hi``
        or more), scaled for long runs."""
        hi = max(1, int(hi * self.scale))
        if self.rng.random() < 0.2:
            return self.rng.randint(max(1, hi // 4), hi)
        return min(hi, int(self.rng.paretovariate(0.7)))

    def segment(self, odd: float = 0.4, longest: int = 300) -> str:
        """A path segment S3 takes: plain, or with odd characters (unicode, quotes, bidi
        and zero-width marks, terminal escapes), at times longer than SeaweedFS's 255."""
        r = self.rng
        n = min(longest, r.choice([1, 2, 5, 12, 32, 60, 120, 255, 300]))
        chars = [r.choice(_ODD if r.random() < odd else _PLAIN) for _ in range(n)]
        if r.random() < 0.1:
            chars.insert(r.randrange(len(chars) + 1), r.choice("\x1b\x9b\x07"))
        seg = "".join(chars).replace("/", "_")
        return seg.encode()[:longest].decode("utf-8", "ignore") or "s"

    def odd_key(self) -> str:
        """A key below the prefix that S3 accepts: in one of our directories or beside
        them, random legal characters, sometimes a shape the client refuses."""
        r = self.rng
        where = r.choice(
            [f"{ROOT}/{d}" for d in DIRS] + [ROOT, f"{ROOT}/{r.choice(FIXED)}", "other", ""]
        )
        segs = [self.segment() for _ in range(r.choice([1, 1, 1, 2, 3]))]
        shape = r.randrange(10)
        if shape == 0:
            segs.insert(r.randrange(len(segs) + 1), "")  # a "//"
        elif shape == 1:
            segs.insert(r.randrange(len(segs) + 1), r.choice([".", ".."]))
        elif shape == 2:
            segs[-1] += "/"  # a directory marker
        elif shape == 3:
            segs[-1] = segs[-1][:5] + chr(r.choice([1, 9, 10, 13, 0x1B, 0x7F])) + "x"
        elif shape == 4:
            # A path that a service resolving dots would take to the sibling prefix.
            segs = ["..", "..", "..", f"{self.prefix}-sib", ROOT, "config"]
        elif shape == 5:
            segs = ["%2e%2e", "%2E%2E", "%2e%2e", f"{self.prefix}-sib", ROOT, "usage"]
        elif shape == 6:
            # As long as S3 takes (1,024 bytes with the prefix), in segments SeaweedFS holds.
            segs = [self.segment(0.2, 200) for _ in range(8)]
        key = "/".join(s for s in [where, *segs] if s is not None)
        key = key.lstrip("/") if r.random() < 0.9 else "/" + key
        while len(key.encode()) > 1024 - len(self.prefix) - 1:
            key = key[:-1]
        return key

    def record_name(self, valid: bool = True) -> str:
        r = self.rng
        ms = (
            int(time.time() * 1000)
            if valid
            else r.choice([0, 10**15 - 1, 1, int(time.time() * 1000) + 10**9])
        )
        puts = r.choice([0, 1, 5]) if valid else r.choice([0, 10**12 - 1, 10**11])
        nbytes = r.choice([0, 100, 10**6]) if valid else r.choice([10**16 - 1, 2**63 - 1, 0])
        return f"{ROOT}/records/r-{ms}-{r.getrandbits(64):016x}-{puts}-{nbytes}"

    def names(self, n: int, real: float = 0.3) -> list[str]:
        r = self.rng
        known = [entry_name(k) for k in self.keys]
        return [
            r.choice(known) if known and r.random() < real else f"{r.getrandbits(128):032x}"
            for _ in range(n)
        ]

    def bomb(self, kind: str) -> bytes:
        """Gzip that inflates past its reader's cap (made once a run): a record's
        (``MAX_USE_RECORD * MAX_INFLATE``) or ``usage``'s; zeros (one endless line) or short
        lines (the costliest to match)."""
        if kind not in self._bombs:
            cap = upkeep.MAX_USE_RECORD if kind.startswith("record") else upkeep.MAX_USAGE
            total = cap * upkeep.MAX_INFLATE + MIB
            self._bombs[kind] = _gz_repeat(b"ab\n" if kind.endswith("lines") else b"\0", total)
        return self._bombs[kind]

    # ---- planting ----------------------------------------------------------------------

    def plant(self) -> str:
        r = self.rng
        kinds: list[tuple[str, Callable[[], str], float]] = [
            ("odd_keys", self.plant_odd_keys, 3),
            ("refused_flood", self.plant_refused_flood, 0.15),
            ("flood", self.plant_flood, 1.2),
            ("squat", self.plant_squat, 2),
            ("usage", self.plant_usage, 1.5),
            ("records", self.plant_records, 2),
            ("config", self.plant_config, 1.5),
            ("state", self.plant_state, 1),
            ("lease", self.plant_lease, 0.5),
            ("claims", self.plant_claims, 0.7),
            ("markers", self.plant_markers, 1.2),
            ("entries", self.plant_entries, 1.5),
            ("unplant", self.unplant, 2),
        ]
        kind, planter = pick_weighted(r, kinds)
        what = planter()
        self.figures.plants += 1
        self.figures.plants_by_kind[kind] += 1
        return f"{kind} ({what})" if what else kind

    def plant_odd_keys(self) -> str:
        n = self.count(20)
        direct = sum(
            self._put(self.odd_key(), self.rng.randbytes(self.rng.randint(0, 64))) for _ in range(n)
        )
        return f"{n} keys, {n - direct} relayed"

    def plant_refused_flood(self) -> str:
        """Keys the client refuses, more than one listing goes past (br.MAX_UNLISTABLE),
        each apart from the next so that each costs its own resumption."""
        r = self.rng
        d = r.choice(DIRS)
        n = br.MAX_UNLISTABLE + r.randint(1, 40)
        base = f"{r.getrandbits(20):05x}"
        for i in range(n):
            self.relays[0].plant(f"{self.prefix}/{ROOT}/{d}/{base}{i:04d}/../x", 1)
        return f"{n} in {d}/"

    def scene(self) -> Scene:
        """What a flood is planted around: the entries hosts wrote, their graphs."""
        return Scene(sorted({entry_name(k) for k in self.keys}), list(self.graphs), self.rng)

    def plant_flood(self, kind: str | None = None, n: int | None = None) -> str:
        """Hundreds to thousands of keys of one kind (``tests/floods.py``), on the relay."""
        r = self.rng
        kind = kind or r.choice(sorted(FLOODS))
        n = n or max(50, int(r.randint(500, 10_000) * self.scale))
        keys = FLOODS[kind](self.scene(), n)
        self.relays[0].plant_many([f"{self.prefix}/{k}" for k in keys], 1, when(kind))
        return f"{kind}: {len(keys)}"

    def plant_squat(self) -> str:
        """An object below one of our names, sometimes taken back at once (leaving the
        directories it made on a service that has them)."""
        import obstore

        r = self.rng
        depth = r.randint(1, 5)
        tail = "/".join(self.segment(0.1, 40) for _ in range(depth))
        target = r.choice(
            [
                upkeep.LEASE,
                upkeep.LEASE,
                upkeep.CONFIG,
                upkeep.USAGE,
                upkeep.STATE,
                f"{objstore.ENTRY_DIR}/{r.choice(self.names(1, 0.8))}",
                f"{objstore.CLAIM_DIR}/{self.names(1)[0]}",
                f"{upkeep.MARKER_DIR}/{self.names(1)[0]}-{r.randint(1, 10**6)}",
                self.record_name(),
            ]
        )
        key = f"{target}/{tail}"
        if not self._put(key, b"squat"):
            return f"{key[:60]} relayed"
        if r.random() < 0.4:
            with contextlib.suppress(Exception):
                obstore.delete(self.client, key)
            return f"{target} squatted and left empty, {depth} deep"
        return f"{target} squatted, {depth} deep"

    def plant_usage(self) -> str:
        r = self.rng
        kind = r.randrange(8)
        names = self.names(self.count(5000), 0.5)
        now = time.time()
        if kind == 0:
            body = self.bomb("usage-lines" if r.random() < 0.5 else "usage-zeros")
            what = "gzip bomb"
        elif kind == 1:
            body = r.randbytes(r.randint(0, 100_000))
            what = "garbage"
        elif kind == 2:
            size = min(int(upkeep.MAX_USAGE * self.scale), upkeep.MAX_USAGE) + r.choice([1, -1000])
            body = _gz(b"".join(f"{n} {now:.3f} 1\n".encode() for n in names))
            body += bytes(max(0, size - len(body)))
            what = f"{len(body) >> 20} MiB"
        elif kind == 3:
            big = ["9" * 30, "1e400", "-1", str(2**64), "nan", f"{now + 10**9:.3f}"]
            body = _gz(b"".join(f"{n} {r.choice(big)} {r.choice(big)}\n".encode() for n in names))
            what = "numbers out of range"
        elif kind == 4:
            # Real entries used "now" or in the future (within the clocks' slack, or not).
            ahead = [0, 500, 700, 10**6]
            body = _gz(
                b"".join(
                    f"{n} {now + r.choice(ahead):.3f} {r.randint(0, 10**9)}\n".encode()
                    for n in names
                )
            )
            what = "future uses"
        elif kind == 5:
            body = _gz(
                b"x" * r.randint(200, 100_000) + b"\n" + b"\r\n".join(n.encode() for n in names)
            )
            what = "long lines"
        elif kind == 6:
            body = _gz(b"".join(f"{n} 1 1\n".encode() for n in names))[: r.randint(10, 200)]
            what = "cut short"
        else:
            body = _gz(b"a\n") * r.randint(2, 2000)
            what = "concatenated members"
        self._put(upkeep.USAGE, body)
        return what

    def plant_records(self) -> str:
        r = self.rng
        n = self.count(3000) if r.random() < 0.5 else r.randint(1, 5)
        items: dict[str, bytes] = {}
        for i in range(n):
            kind = r.randrange(7)
            name = self.record_name(valid=kind != 0)
            if kind == 1:
                body = self.bomb("record-lines" if r.random() < 0.5 else "record-zeros")
            elif kind == 2 and i == 0:
                body = r.randbytes(upkeep.MAX_USE_RECORD + 1)  # over its cap: removed unread
            elif kind == 3:
                body = r.randbytes(r.randint(0, 1000))
            elif kind == 4:
                body = _gz(b"".join(f"{x}\n".encode() for x in self.names(self.count(20000), 0.2)))
            else:
                body = upkeep.use_record_body(self.names(r.randint(0, 30), 0.6))
            items[name] = body
        self._put_many(items)
        return f"{n} records"

    def plant_config(self) -> str:
        r = self.rng
        choices = [
            b'{"max_size": ' + b"9" * 400 + b', "max_age_s": 1e400}',
            b'{"max_size": -1}',
            b'{"max_size": 0, "max_age_s": 0}',
            b'{"max_size": "1G"}',
            b'{"max_size": ' + b"[" * 3000 + b"]" * 3000 + b"}",
            b"not json",
            b"[1, 2]",
            b'{"max_size": 1}',
            f'{{"max_size": {r.randint(1, 10**6)}, "max_age_s": {r.randint(1, 10**5)}}}'.encode(),
            f'{{"max_size": {r.randint(10**6, 10**9)}}}'.encode(),
            b'{"max_size": 100000, "x": "' + b"a" * 5000 + b'"}',
            '{"max_size": 5e5, "\x1b]0;x\x07": "\u202e"}'.encode(),
            b"\xff\xfe\x00",
        ]
        body = r.choice(choices)
        self._put(upkeep.CONFIG, body)
        return body[:40].decode("utf-8", "replace")

    def plant_state(self) -> str:
        r = self.rng
        now = time.time()
        body = r.choice(
            [
                json.dumps({"time": now, "entries": 0, "bytes": 0}).encode(),
                json.dumps({"time": now + 10**6, "entries": 10**30, "bytes": -5}).encode(),
                b'{"time": 1e999, "entries": 1, "bytes": ' + b"9" * 500 + b"}",
                b'{"time": ' + b"[" * 100 + b"]" * 100 + b"}",
                r.randbytes(r.randint(0, 5000)),
                b'{"time": "now"}',
            ]
        )
        self._put(upkeep.STATE, body)
        return body[:40].decode("utf-8", "replace")

    def plant_lease(self) -> str:
        """A lease held now (prunes say they are busy), or one that is garbage, or too large
        to read."""
        r = self.rng
        body = r.choice(
            [
                b'{"owner": "\x1b]0;evil\x07"}',
                b"[" * 5000,
                r.randbytes(5000),
                b'{"owner": ' + b"9" * 300 + b"}",
            ]
        )
        self._put(upkeep.LEASE, body)
        return body[:30].decode("utf-8", "replace")

    def plant_claims(self) -> str:
        n = self.count(500)
        items = {
            f"{objstore.CLAIM_DIR}/{x}": self.rng.randbytes(self.rng.randint(0, 200))
            for x in self.names(n, 0.5)
        }
        items.update(
            {f"{objstore.CLAIM_DIR}/{self.segment()}": b"x" for _ in range(self.rng.randint(0, 5))}
        )
        self._put_many(items)
        return f"{len(items)} claims"

    def plant_markers(self) -> str:
        """Markers by the thousand, each named for its graph's entry (a start follows
        them), and junk under torch_xla/."""
        r = self.rng
        n = self.count(4000)
        graphs = [str(r.randint(1, 10**30)) for _ in range(n)]
        items = {f"{upkeep.MARKER_DIR}/{entry_name(f'torch_xla/{g}')}-{g}": b"" for g in graphs}
        for _ in range(r.randint(0, 5)):
            items[f"{upkeep.MARKER_DIR}/{self.segment()}"] = b"junk"
        if self.graphs and r.random() < 0.5:
            g = r.choice(self.graphs)
            items[f"{upkeep.MARKER_DIR}/{entry_name(f'torch_xla/{g}')}-{g}9"] = b""
        # Garbage at the entries of some: a start fetches them and refuses each.
        for g in graphs[: r.randint(0, 5)]:
            items[f"{objstore.ENTRY_DIR}/{entry_name(f'torch_xla/{g}')}"] = r.randbytes(200)
        self._put_many(items)
        return f"{len(items)} markers"

    def plant_entries(self) -> str:
        """Garbage at entries' names (a host's miss asks the bucket for them), a copy of a
        real entry under another name or cut short, oversized objects, junk names."""
        import obstore

        r = self.rng
        kind = r.randrange(5)
        if kind == 0 and self.keys:
            # Every random draw first: what the bucket holds does not change what follows.
            key = r.choice(self.keys)
            other = f"{objstore.ENTRY_DIR}/{self.names(1, 0)[0]}"
            cut = r.random() < 0.5
            try:
                body = bytes(
                    obstore.get(self.client, f"{objstore.ENTRY_DIR}/{entry_name(key)}").bytes()
                )
            except Exception:
                return "no entry to copy"
            self._put(other, body[: len(body) // 2] if cut else body)
            return "a real entry copied or cut"
        if kind == 1:
            # At the entries of keys hosts ask for and nobody wrote, or of keys written
            # (replaced: a host that has no copy refuses it).
            size = r.choice([0, 100, 4096, objstore.RANGE_CHUNK + 1, int(20 * MIB * self.scale)])
            pool = self.wanted + self.keys
            keys = [r.choice(pool) for _ in range(r.randint(1, 3))]
            for key in keys:
                body = r.randbytes(min(size, 64)) + bytes(max(0, size - 64))
                self._put(f"{objstore.ENTRY_DIR}/{entry_name(key)}", body)
            return f"{len(keys)} garbage of {size} B"
        n = self.count(3000)
        items = {f"{objstore.ENTRY_DIR}/{self.segment(0.2)}": b"" for _ in range(n)}
        items.update(
            {
                f"{objstore.ENTRY_DIR}/{x}": r.randbytes(r.randint(0, 100))
                for x in self.names(r.randint(0, 50), 0.0)
            }
        )
        self._put_many(items)
        return f"{len(items)} junk names"

    def unplant(self) -> str:
        """The attacker takes some of it back: relayed keys, real objects."""
        import obstore

        r = self.rng
        relay = self.relays[0]
        with relay._lock:
            keys = list(relay.planted)
        gone = [k for k in keys if r.random() < 0.5]
        for k in gone:
            relay.unplant(k)
        # A lease planted is mostly taken back soon (held, it only makes prunes wait).
        real = [
            k for k in sorted(self.planted_keys) if r.random() < (0.8 if k == upkeep.LEASE else 0.3)
        ]
        try:
            obstore.delete(self.client, real)
        except Exception:
            for key in real:  # as in ``final``: GCS stops a batch at one already gone
                with contextlib.suppress(Exception):
                    obstore.delete(self.client, key)
        self.planted_keys -= set(real)
        return f"{len(gone)} relayed, {len(real)} objects"

    # ---- operations --------------------------------------------------------------------

    def _host(self, fresh: bool = False) -> Path:
        if fresh:
            self.fresh_hosts += 1
            h = self.base / "hosts" / f"fresh{self.fresh_hosts}"
            (h / "work").mkdir(parents=True)
            return h
        return self.rng.choice(self.hosts)

    def _spawn(
        self,
        op: str,
        argv: list[str],
        host: Path,
        slot: int,
        bound: Counter[str],
        *,
        env: dict[str, str] | None = None,
        exits: dict[int, tuple[bytes, ...]] | None = None,
        read_only: bool = False,
        prunes: bool = False,
        entries: int = 0,
        timeout: float | None = None,
    ) -> Proc:
        relay = self.relay(slot)
        relay.take()
        relay.trace.clear()
        out = tempfile.TemporaryFile()  # noqa: SIM115 - closed once judged
        err = tempfile.TemporaryFile()  # noqa: SIM115
        self.figures.processes += 1
        peak_file = self.peaks / str(self.figures.processes)
        peak_file.unlink(missing_ok=True)
        run = list(argv)
        run[2] = PEAK_PRELUDE + run[2]
        env = {
            **(env or self.env),
            **self.s3.point_at(relay.endpoint),
            "XDG_CACHE_HOME": str(host),
            PEAK_FILE_VAR: str(peak_file),
        }
        popen = subprocess.Popen(
            run,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            cwd=host / "work",
            start_new_session=True,
        )
        bound_kib = self.figures.base_kib + RSS_SLACK_KIB + int(RSS_PER_ENTRY_KIB * entries)
        now = time.monotonic()
        return Proc(
            op,
            popen,
            out,
            err,
            timeout or self.op_timeout,
            argv,
            peak_file,
            relay,
            bound,
            bound_kib,
            host / "work",
            exits or {0: ()},
            read_only,
            prunes,
            now,
        )

    def _api(
        self, op: str, args: dict[str, Any], host: Path, slot: int, bound: Counter[str], **kw: Any
    ) -> Proc:
        args = {
            "op": op.removeprefix("ro_").removeprefix("final_").removeprefix("flood_"),
            "seed": self.rng.getrandbits(32),
            "rlimit_as": self.rlimit_as,
            **args,
        }
        argv = [sys.executable, "-c", _HOST_CHILD, json.dumps(args)]
        return self._spawn(op, argv, host, slot, bound, **kw)

    def _cli(
        self, op: str, args: list[str], host: Path, slot: int, bound: Counter[str], **kw: Any
    ) -> Proc:
        argv = [sys.executable, "-c", CLI_CHILD, str(self.rlimit_as), *args]
        return self._spawn(op, argv, host, slot, bound, **kw)

    def _measure_base(self) -> int:
        """What a process with the package and the client making one request costs here."""
        peaks = []
        for _ in range(2):
            peak_file = self.peaks / "base"
            env = {**self.env, PEAK_FILE_VAR: str(peak_file)}
            subprocess.run(
                [sys.executable, "-c", PEAK_PRELUDE + _BASE_CHILD, self.url],
                env=env,
                cwd=self.hosts[0] / "work",
                check=True,
                capture_output=True,
                timeout=self.op_timeout,
            )
            peaks.append(reported_peak(peak_file) or 0)
        return max(peaks)

    def _ro_url(self) -> tuple[str, dict[str, str], list[str]]:
        """A read-only host's URL, environment and CLI flags: one of the three ways."""
        how = self.rng.randrange(3)
        if how == 0:
            return f"{self.url}?ro=1", self.env, []
        if how == 1:
            return self.url, {**self.env, "XLA_PERSISTENT_CACHE_READ_ONLY": "1"}, []
        return self.url, self.env, ["--read-only"]

    def _puts(self, n: int, torch_xla: bool) -> list[tuple[str, int, str | None]]:
        r = self.rng
        out: list[tuple[str, int, str | None]] = []
        for _ in range(n):
            if torch_xla:
                g = str(r.randint(1, 10**12))
                key, graph = f"torch_xla/{g}", g
                self.graphs.append(g)
            else:
                key, graph = f"k-{r.getrandbits(40):010x}", None
            if len(self.keys) < 2000:
                self.keys.append(key)
            out.append((key, r.choice([10, 1000, 20_000, 200_000]), graph))
        return out

    def _get_keys(self, n: int) -> list[str]:
        """Keys a host asks for: written ones, and ones nobody writes (some with garbage
        planted at their entries)."""
        r = self.rng
        pool = self.keys + self.wanted
        return [r.choice(pool) for _ in range(n)]

    def one(self, op: str, c: Census, slot: int, extra: int = 0) -> Proc:
        """Starts ``op`` on a host (``slot``: its relay); ``extra``: what the processes
        started beside it may add to each directory."""
        r = self.rng
        ro = op.startswith("ro_")
        host = self._host(fresh=r.random() < 0.15)
        base = op.removeprefix("ro_")
        url, env, flags = self._ro_url() if ro else (self.url, self.env, [])
        if flags and base != "cli_prune":
            # Here --read-only stands for prune's: the others take the variable.
            env, flags = {**env, "XLA_PERSISTENT_CACHE_READ_ONLY": "1"}, []
        entries = c.listed["entries"] + extra
        if base in ("put", "put_torch_xla"):
            puts = self._puts(r.randint(1, 8), base == "put_torch_xla")
            marks = sum(g is not None for _, _, g in puts)
            gets = len(puts)  # at most one a put
            bound = writer_bound(c, len(puts), marks, gets, extra + len(puts))
            if ro:
                bound = Counter(get=gets * fetches(c))
            return self._api(
                op,
                {"url": url, "puts": puts, "keys": self._get_keys(4)},
                host,
                slot,
                bound,
                env=env,
                read_only=ro,
                prunes=not ro,
                entries=entries + len(puts),
            )
        if base == "get":
            keys = self._get_keys(r.randint(1, 12))
            bound = Counter(get=len(keys) * fetches(c), put=0 if ro else 1)
            return self._api(
                op, {"url": url, "keys": keys}, host, slot, bound, env=env, read_only=ro
            )
        if base == "torch_xla_start":
            bound = start_bound(c, extra, read_only=ro)
            return self._api(op, {"url": url}, host, slot, bound, env=env, read_only=ro)
        if base == "cli_stats":
            args = ["stats", "--path", url, *(["--json"] if r.random() < 0.5 else [])]
            return self._cli(op, args, host, slot, stats_bound(c), env=env, read_only=ro)
        if base == "cli_config":
            show = r.random() < 0.4
            size = r.choice(["10K", "200K", "1M", "100M", "none"])
            args = [
                "config",
                "--path",
                url,
                *(["--show"] if show else ["--max-size", size]),
                *(["--json"] if r.random() < 0.3 else []),
            ]
            if not show and r.random() < 0.3:
                args += ["--max-age", r.choice(["1h", "30d", "none"])]
            bound = Counter(get=2, put=0 if show or ro else 1)
            exits: dict[int, tuple[bytes, ...]] = (
                {2: (b"read-only",)} if ro and not show else {0: ()}
            )
            return self._cli(op, args, host, slot, bound, env=env, exits=exits, read_only=ro)
        if base == "cli_prune":
            untrusted = r.random() < 0.2
            # The statuses a planted object may lead to, and what each must say.
            busy: tuple[bytes, ...] = (b"another prune holds", b"took over", b"prune stopped")
            if c.refused["prune.lease"]:
                busy += (b"can be neither created nor found",)  # below it, none can remove
            # 3: its listing of entries was cut short by keys the client cannot list (it
            # pruned what it saw, and says so).
            exits = {0: (), 1: busy, 3: (b"prune cut short",)}
            if untrusted:
                args = ["prune", "--untrusted", "--path", url, *flags]
                bound = untrusted_bound(c)
                # 1: keys the client cannot remove are left, each named (with --json, in
                # the report's "unlistable").
                exits = {
                    0: (),
                    1: (b"cannot be listed or removed by this client", b'"unlistable": [\n'),
                }
            else:
                size = r.choice(["", "", "0", "10K", "500K", "10M"])
                args = ["prune", "--path", url, *flags, *(["--max-size", size] if size else [])]
                if r.random() < 0.2:
                    args += ["--older-than", r.choice(["1s", "1h", "30d"])]
                bound = prune_bound(c, extra, upkeep.Limits())
                bound["get"] += 1  # the command reads the budget before the prune does
                exits[2] = (b"nothing to prune to",)  # no --max-size and no budget stored
            if "--json" not in args and r.random() < 0.3:
                args.append("--json")
            if ro:
                bound, exits = Counter(), {2: (b"read-only",)}
            return self._cli(
                op,
                args,
                host,
                slot,
                bound,
                env=env,
                exits=exits,
                read_only=ro,
                prunes=not ro,
                entries=entries,
            )
        raise AssertionError(op)

    def operate(self) -> str:
        r = self.rng
        ops: list[tuple[str, float]] = [
            ("put", 3),
            ("put_torch_xla", 1.2),
            ("get", 2),
            ("torch_xla_start", 1.5),
            ("cli_stats", 1.5),
            ("cli_prune", 2),
            ("cli_config", 1),
            ("together", 1.2),
        ]
        if self.read_only_hosts:
            ops += [
                (f"ro_{o}", w)
                for o, w in (
                    ("put", 0.4),
                    ("put_torch_xla", 0.3),
                    ("get", 0.4),
                    ("torch_xla_start", 0.3),
                    ("cli_stats", 0.2),
                    ("cli_prune", 0.4),
                    ("cli_config", 0.3),
                )
            ]
        op = r.choices([o[0] for o in ops], weights=[o[1] for o in ops])[0]
        c = self.census()
        if op == "together":
            # Several hosts at once: writers (each may prune), a prune, a start, a reader.
            names = r.sample(
                ["put", "put", "cli_prune", "torch_xla_start", "get", "put_torch_xla"],
                r.randint(2, 4),
            )
            # What others may add meanwhile: every writer's entries and markers (8 at most)
            # and each host's record.
            extra = 8 * sum(n.startswith("put") for n in names) + len(names)
            procs = [self.one(n, c, slot, extra) for slot, n in enumerate(names)]
            self._wait(procs, c)
            return "together: " + ", ".join(names)
        self._wait([self.one(op, c, 0)], c)
        return op

    # ---- waiting and judging -----------------------------------------------------------

    def _wait(self, procs: list[Proc], before: Census) -> None:
        wait_children(list(procs), self._judge, self._hung, poll=0.01)
        # A step ends when the server has answered every request its processes made: one a
        # client gave up on (its timeout, or a process killed) still reaches the server, and
        # a write landing later would be taken for the next step's.
        for p in procs:
            p.relay.settle()
        # Read-only hosts run alone (a writer beside them would change what they see).
        if procs and all(p.read_only for p in procs):
            after = self.census()
            if after.objects != before.objects:
                changed = {
                    k: (before.objects.get(k), after.objects.get(k))
                    for k in sorted(set(after.objects) | set(before.objects))
                    if after.objects.get(k) != before.objects.get(k)
                }
                asked = [
                    f"{m} {urllib.parse.unquote(t)[:160]} {st}"
                    for p in procs
                    for m, t, st in p.relay.trace
                ]
                self._fail(
                    "read_only",
                    ",".join(p.op for p in procs),
                    f"objects changed (before, after): {dict(list(changed.items())[:6])}; "
                    f"asked: {asked[-40:]}",
                )

    def _hung(self, p: Proc) -> bool:
        """Whether ``p`` made no request (and did not exit) for its ``idle_limit``, or has
        run past ``op_limit``: a process working through what it may read makes requests as
        it goes, whatever their number."""
        now = time.monotonic()
        idle = now - max(p.started, p.relay.last_request)
        return idle > p.idle_limit or now - p.started > self.op_limit

    def _judge(self, p: Proc, peak: int | None, hung: bool) -> None:
        p.out.seek(0)
        p.err.seek(0)
        stdout = p.out.read()
        both = stdout + p.err.read()
        p.stdout = stdout.decode("utf-8", "backslashreplace")
        p.out.close()
        p.err.close()
        tail = both.decode("utf-8", "backslashreplace")[-1500:]
        p.output = both.decode("utf-8", "backslashreplace")
        rc = p.rc = p.popen.returncode
        wire = p.relay.take()
        self.figures.late += p.relay.in_flight > 0
        self.figures.ops += 1
        fig = self.figures.by_op.setdefault(p.op, OpFigures())
        failed_before = len(self.failures)
        cmd = " ".join(p.argv[3:] if p.argv[1] == "-c" else p.argv)[:300]
        if hung:
            self._fail(
                "hang",
                p.op,
                f"no request for {p.idle_limit:.0f} s, or past {self.op_limit:.0f} s in all; "
                f"{cmd}; {tail[-400:]}",
            )
        elif rc < 0 or rc in (134, 137, 139):
            self._fail("abort", p.op, f"exit {rc}; {cmd}; {tail[-600:]}")
        if b"panicked" in both or b"PanicException" in both:
            self._fail("panic", p.op, tail)
        elif b"Traceback (most recent call last)" in both:
            self._fail("traceback", p.op, f"{cmd}; {tail}")
        elif not hung and rc >= 0 and rc not in p.exits:
            self._fail("error", p.op, f"exit {rc}; {cmd}; {tail}")
        elif not hung and p.exits.get(rc) and not any(m in both for m in p.exits[rc]):
            self._fail("error", p.op, f"exit {rc} saying none of {p.exits[rc]}; {cmd}; {tail}")
        if any(m in both for m in ESC_MARKERS):
            i = min(both.find(m) for m in ESC_MARKERS if m in both)
            self._fail("escape", p.op, repr(both[max(0, i - 100) : i + 100]))
        if peak is not None and peak > p.bound_kib:
            self._fail("rss", p.op, f"peak RSS {peak >> 10} MiB > {p.bound_kib >> 10} MiB; {cmd}")
        elif peak is None and not hung and rc >= 0:
            self._fail("rss", p.op, f"exit {rc} without reporting its peak RSS")
        retried = wire.get("5xx", 0)
        # A process that may prune rewrites the lease every BEAT_S of the time it ran.
        bound = Counter(p.bound)
        if p.prunes:
            bound["put"] += math.ceil((time.monotonic() - p.started) / BEAT_S)
        over = {k: (v, bound[k]) for k, v in wire.items() if k != "5xx" and v > bound[k] + retried}
        if p.read_only:
            over.update({k: (wire[k], 0) for k in WRITES if wire.get(k)})
        if over:
            asked = [
                f"{m} {urllib.parse.unquote(t)[:160]} {st}"
                for m, t, st in p.relay.trace
                if request_kind(m, t) in over
            ]
            tail = f"{tail[-300:]}; asked: {asked[-60:]}"
            self._fail("requests", p.op, f"over the bound (made, bound): {over}; {cmd}; {tail}")
        if os.listdir(p.work):
            self._fail("local", p.op, f"left {os.listdir(p.work)[:5]} in its working directory")
        report = _last_json(p.stdout) if p.argv[2] == _HOST_CHILD else {}
        self.figures.writer_prunes += int(report.get("prunes") or 0)
        # A planted object is a refused value or a miss, never the tier failing (the server
        # is up: only an answer of 5xx may be one).
        errors = {k: v for k, v in report.get("tier", {}).items() if k.endswith("_errors") and v}
        if errors and not retried:
            self._fail("tier", p.op, f"the bucket's tier failed: {errors}; {cmd}; {tail[-600:]}")
        p.seconds = time.monotonic() - p.started
        p.wire, p.bound_total, p.peak = wire, sum(bound.values()), peak
        p.failed = len(self.failures) - failed_before
        fig.add(rc, peak, p.bound_kib, wire, p.bound_total, p.seconds)
        fig.failures += p.failed

    def _fail(self, kind: str, op: str, detail: str) -> None:
        self.figures.failures[kind] += 1
        self.failures.append(Failure(self.step, kind, op, detail))
        self.log(f"step {self.step}: {kind} in {op}: {detail[-600:]}")

    # ---- the loop ----------------------------------------------------------------------

    def run(self, steps: int, floods: int = 0) -> Figures:
        """``steps`` steps, then (with ``floods``) the flood round of that many keys a kind,
        then the final phase."""
        for _ in range(steps):
            self.step += 1
            try:
                what = "plant: " + self.plant() if self.rng.random() < 0.45 else self.operate()
            except Exception:
                if self._server_up(f"step {self.step}"):
                    raise
                return self.figures
            self.log(f"step {self.step}: {what}")
            if not self._server_up(what):
                return self.figures
            self.check_outside(what)
            self.figures.steps += 1
        if floods:
            self.floods(floods)
        self.final()
        if self._server_up("final"):
            self.check_outside("final")
        return self.figures

    # The operations the flood round runs with each flood, one at a time.
    FLOOD_OPS = ("stats", "torch_xla start", "get", "writer", "prune", "prune --untrusted")

    def floods(self, n: int) -> None:
        """Each kind of flood (``tests/floods.py``) alone, ``n`` keys on the relay, with the
        bucket past its stored budget, and every operation of ``FLOOD_OPS`` run once with it,
        judged as every step's (its requests against its bound, its memory, its exit status
        and output); then taken back. The figures: ``Figures.floods``."""
        import obstore

        # Past its budget: a writer prunes (an object planted below the name, where the
        # service has directories, refuses this: then the prune of the round removes it).
        with contextlib.suppress(Exception):
            obstore.put(self.client, upkeep.CONFIG, b'{"max_size": 10000, "max_age_s": null}')
        for kind in sorted(FLOODS):
            self.step += 1
            flood = [f"{self.prefix}/{k}" for k in FLOODS[kind](self.scene(), n)]
            self.log(f"step {self.step}: flood round: {kind}: {len(flood)}")
            ops: dict[str, tuple[int, int, int, float, int, int, int]] = {}
            for op in self.FLOOD_OPS:
                # Each operation meets the whole flood (the one before may have removed
                # what it could), and no prune's state: a writer then prunes (a prune cut
                # short just before would make it leave that for an interval).
                with self.relays[0]._lock:
                    self.relays[0].planted.clear()
                self.relays[0].plant_many(flood, 1, when(kind))
                with contextlib.suppress(Exception):
                    obstore.delete(self.client, upkeep.STATE)
                c = self.census()
                p = self._flood_op(op, c)
                self._wait([p], c)
                ops[op] = (
                    p.rc,
                    sum(v for k, v in p.wire.items() if k != "5xx"),
                    p.bound_total,
                    p.seconds,
                    p.peak or 0,
                    p.bound_kib,
                    p.failed,
                )
                if not self._server_up(f"flood round: {kind}"):
                    return
            keys = len(flood)
            self.figures.floods[kind] = (keys, ops)
            self.check_outside(f"flood round: {kind}")
        with self.relays[0]._lock:
            self.relays[0].planted.clear()

    def _flood_op(self, op: str, c: Census) -> Proc:
        host = self._host(fresh=True)
        entries = c.listed["entries"]
        if op == "prune":
            busy = (b"another prune holds", b"took over", b"prune stopped")
            return self._cli(
                "flood_prune",
                ["prune", "--path", self.url, "--json"],
                host,
                0,
                prune_bound(c, 0, upkeep.Limits()) + Counter(get=1),
                exits={0: (), 1: busy, 3: (b"prune cut short",)},
                prunes=True,
                entries=entries,
            )
        if op == "prune --untrusted":
            return self._cli(
                "flood_untrusted",
                ["prune", "--untrusted", "--path", self.url],
                host,
                0,
                untrusted_bound(c),
                exits={0: (), 1: (b"cannot be listed or removed by this client",)},
                prunes=True,
                entries=entries,
            )
        if op == "stats":
            return self._cli("flood_stats", ["stats", "--path", self.url], host, 0, stats_bound(c))
        if op == "writer":
            puts = self._puts(4, False)
            return self._api(
                "flood_put",
                {"url": self.url, "puts": puts, "keys": self._get_keys(4)},
                host,
                0,
                writer_bound(c, len(puts), 0, len(puts), len(puts)),
                prunes=True,
                entries=entries + len(puts),
            )
        if op == "torch_xla start":
            return self._api("flood_torch_xla_start", {"url": self.url}, host, 0, start_bound(c))
        keys = self._get_keys(8)
        return self._api(
            "flood_get",
            {"url": self.url, "keys": keys},
            host,
            0,
            Counter(get=8 * fetches(c), put=1),
        )

    def _server_up(self, what: str) -> bool:
        """Whether the server still runs; if not, a failure of the run (not of the package,
        but nothing after it is judged), with the end of its log."""
        if self.s3.proc.poll() is None:
            return True
        log = self.s3.root / "weed.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        self._fail("server", what, f"the S3 server exited ({self.s3.proc.returncode}): {tail}")
        return False

    def final(self) -> None:
        """The attacker stops: what was planted is removed (as with the cloud's own tool).
        A writer fills the bucket, a budget of half its bytes is stored, and one prune must
        bring the entries within ``upkeep.LOW_WATERMARK`` of it (docs/remote.md), skipping
        nothing; a new host must then be served every entry kept."""
        import obstore

        self.step += 1
        with self.relays[0]._lock:
            self.relays[0].planted.clear()
        keys = sorted(self.planted_keys, key=lambda k: -k.count("/"))
        for i in range(0, len(keys), upkeep.DELETE_BATCH):
            batch = keys[i : i + upkeep.DELETE_BATCH]
            try:
                obstore.delete(self.client, batch)
            except Exception:
                # GCS answers the delete of an object already gone 404, and the batch
                # stops there: the rest one at a time.
                for key in batch:
                    with contextlib.suppress(Exception):
                        obstore.delete(self.client, key)
        self.planted_keys.clear()
        results: dict[str, Any] = {}
        c = self.census()
        self._final_cli("final_config", ["config", "--path", self.url, "--max-size", "none"], c)
        mine = [f"final-{i}-{self.rng.getrandbits(32):08x}" for i in range(16)]
        w = self._api(
            "final_put",
            {"url": self.url, "puts": [(k, 20_000, None) for k in mine], "keys": mine},
            self._host(fresh=True),
            0,
            writer_bound(c, len(mine), 0, len(mine), len(mine)),
            prunes=True,
            entries=c.listed["entries"] + len(mine),
        )
        self._wait([w], c)
        c = self.census()
        held = _entry_bytes(c)
        budget = held // 2
        results.update(budget=budget, bytes_before=held)
        self._final_cli(
            "final_config", ["config", "--path", self.url, "--max-size", str(budget)], c
        )
        prune = self._final_cli("final_prune", ["prune", "--path", self.url, "--json"], c)
        stats = self._final_cli("final_stats", ["stats", "--path", self.url, "--json"], c)
        results["prune"] = {
            k: prune.get(k) for k in ("removed", "entries", "bytes", "skipped", "pruned")
        }
        results["stats"] = {
            k: stats.get(k) for k in ("entries", "bytes", "skipped", "listing_complete", "junk")
        }
        after = self.census()
        results["bytes_after"] = now = _entry_bytes(after)
        limit = int(budget * upkeep.LOW_WATERMARK)
        if now > limit:
            self._fail(
                "final",
                "final_prune",
                f"{now} bytes of entries left, over {limit} (90 % of the {budget} budget)",
            )
        # The prune may remove directories the removed objects left (a "squat"); after it,
        # nothing untrusted is left to see.
        if (
            set(prune.get("skipped") or ()) - {"squat"}
            or stats.get("skipped")
            or stats.get("junk")
            or not stats.get("listing_complete")
        ):
            self._fail("final", "final_stats", f"untrusted objects seen once removed: {results}")
        # A new host is served every entry of the writer's that prune kept.
        kept = [k for k in mine if f"{objstore.ENTRY_DIR}/{entry_name(k)}" in after.objects]
        g = self._api(
            "final_get",
            {"url": self.url, "keys": kept},
            self._host(fresh=True),
            0,
            Counter(get=len(kept) * fetches(after), put=1),
        )
        self._wait([g], after)
        got = _last_json(g.stdout).get("hits", 0) if g.rc == 0 else 0
        results["kept"], results["served"] = len(kept), got
        if not kept or got != len(kept):
            self._fail("final", "final_get", f"{got} of the {len(kept)} entries kept were served")
        self.figures.final = results

    def _final_cli(self, op: str, args: list[str], c: Census) -> dict[str, Any]:
        """One command of the final phase, which must exit 0; its JSON, if it printed one."""
        bounds = {
            "final_config": Counter(get=2, put=1),
            "final_prune": prune_bound(c, 0, upkeep.Limits()) + Counter(get=1),
            "final_stats": stats_bound(c),
        }
        p = self._cli(
            op,
            args,
            self._host(fresh=True),
            0,
            bounds[op],
            prunes=op == "final_prune",
            entries=c.listed["entries"],
        )
        self._wait([p], c)
        return _last_json(p.stdout) if p.rc == 0 else {}


def _entry_bytes(c: Census) -> int:
    return sum(
        size
        for k, (size, _) in c.objects.items()
        if k.startswith(objstore.ENTRY_DIR + "/") and k.count("/") == 2
    )


def _last_json(output: str) -> dict[str, Any]:
    """The JSON object a command or a host's process printed last, or {}."""
    try:
        value = json.loads(output[output.index("{") : output.rindex("}") + 1])
    except ValueError:
        try:
            value = json.loads(output.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {}
    return value if isinstance(value, dict) else {}


# --- reports --------------------------------------------------------------------------------


def summary(f: Figures, seed: int | str, failures: list[Failure]) -> str:
    """The figures of a run (``seed``: its seed, or the label of several runs merged)."""
    lines = [
        f"seed {seed}: {f.steps} steps, {f.ops} operations ({f.processes} processes), "
        f"{f.plants} plants",
        "failures: " + ", ".join(f"{label} {f.failures[k]}" for k, label in KINDS.items()),
        f"a process doing nothing: {f.base_kib / 1024:.0f} MiB; writers' own prunes: "
        f"{f.writer_prunes}; ended with a request at the server: {f.late}",
        "planted: " + ", ".join(f"{k} {v}" for k, v in sorted(f.plants_by_kind.items())),
        table(f),
    ]
    if f.floods:
        lines.append(flood_table(f))
    if f.final:
        lines.append(f"final: {json.dumps(f.final, sort_keys=True)}")
    lines += first_failures(failures, 600)
    return "\n".join(lines)


def table(f: Figures) -> str:
    rows = [
        "| operation | runs | exit statuses | longest | peak RSS (bound) | most requests (bound) "
        "| of which | failures |",
        "|---|---:|---|---:|---:|---:|---|---:|",
    ]
    for op, o in sorted(f.by_op.items()):
        kinds = ", ".join(f"{v} {k.upper()}" for k, v in sorted(o.by_kind.items()) if v)
        exits = ", ".join(f"{rc} x{n}" for rc, n in sorted(o.exits.items()))
        rows.append(
            f"| {op} | {o.n} | {exits} | {o.seconds:.1f} s | {o.peak_kib / 1024:.0f} MiB "
            f"({o.bound_kib / 1024:.0f}) | {o.requests} ({o.bound}) | {kinds or '-'} | "
            f"{o.failures} |"
        )
    return "\n".join(rows)


def flood_table(f: Figures) -> str:
    """Per kind of flood, each operation run with it: its exit status, requests (their
    bound), time and peak RSS (its bound); and the failures found."""
    ops = Harness.FLOOD_OPS
    rows = [
        "| flood | keys | " + " | ".join(ops) + " | failures |",
        "|---|---:|" + "---|" * len(ops) + "---:|",
    ]
    for kind, (keys, by_op) in sorted(f.floods.items()):
        cells = []
        for op in ops:
            if op not in by_op:
                cells.append("-")
                continue
            rc, n, bound, secs, peak, bound_kib, _ = by_op[op]
            cells.append(f"{rc}: {n} ({bound}), {secs:.1f} s, {peak >> 10} MiB ({bound_kib >> 10})")
        failed = sum(row[6] for row in by_op.values())
        rows.append(f"| {kind} | {keys:,} | " + " | ".join(cells) + f" | {failed} |")
    return "\n".join(rows)


def run(
    steps: int,
    seed: int,
    base: Path,
    server: BucketServer | None = None,
    floods: int = 0,
    **kw: Any,
) -> Harness:
    """``steps`` steps, the flood round (``floods`` keys a kind; none with 0) and the final
    phase with ``seed``, on ``server`` (else a server of its own, stopped after)."""
    from tests.tiers.servers import start_s3

    server = server if server is not None else start_s3(base / "weed")
    h = None
    try:
        h = Harness(base / f"run-{seed}", seed, server, **kw)
        h.run(steps, floods)
        return h
    finally:
        if h is not None:
            h.close()
        if server is None:
            server.stop()


def cleanup(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)


__all__ = ["Census", "Failure", "Figures", "Harness", "cleanup", "run", "summary", "table"]
