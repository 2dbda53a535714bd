"""A bucket's own upkeep, for a cache whose path is a bucket (docs/remote.md, "A cache in a
bucket"): its budget, kept as an object beside the entries; the records of which entries the
hosts used; pruning, least recently used first; its totals; and the markers that let a
torch_xla host find the bucket's torch_xla entries.

Below ``<prefix>/xla_pcache-1/``, beside ``entries/`` and ``claims/`` (``objstore.py``):

- ``config``: the budget, JSON ``{"max_size": bytes or null, "max_age_s": seconds or null}``,
  written by ``xla-pcache config --path s3://...``;
- ``records/r-<ms>-<tag>-<puts>-<bytes>``: entries one host used since its previous record,
  one entry name a line, gzip (``records.py`` writes them). The name carries when (the
  host's clock, in milliseconds) and how many entries and bytes that host wrote to the
  bucket since, so that a writer estimates the bucket's size from one listing, without
  reading a record;
- ``usage``: the records prune folded: ``<name> <last use> <uses>`` a line, gzip;
- ``state``: the totals the last prune left, JSON ``{"time", "entries", "bytes"}``;
- ``prune.lease``: held while a prune runs, so one host prunes at a time;
- ``torch_xla/<entry name>-<graph hash>``: empty markers of the torch_xla entries.

Times: an entry was last used when it was written (its ``Last-Modified``, the service's
clock, whole seconds) or when a record naming it was uploaded, whichever is later. A
record's time is the one in its name (milliseconds: uses a second apart keep their order),
unless that is more than ``CLOCK_SLACK_S`` from its ``Last-Modified`` (a host clock that is
wrong, or lies, cannot keep entries for ever); ``max_age`` and a stale lease are judged
against this host's clock.

Everything read here is untrusted (whoever can write the bucket wrote it) and is read
through one reader, ``bucket_reader.BucketReader``: sizes bounded before a byte is read,
records and usage streamed a line at a time, numbers range-checked, keys the client cannot
parse skipped, and whatever does not pass counted and warned about once. A prune's memory
is that of the entries it lists (``Limits.entries`` bounds it for writers) and a constant:
the records and ``usage`` are folded into the listed entries as they stream, so names of no
entry cost nothing. A hostile object can make prune keep or drop entries under the prefix,
which such a writer could delete anyway; never more.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import threading
import time
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from xla_pcache._core import ReadOnlyError
from xla_pcache._names import EntryName, entry_name_or_none
from xla_pcache._text import package_logger
from xla_pcache.tiers import objstore
from xla_pcache.tiers.base import redact
from xla_pcache.tiers.bucket_reader import (
    CLOCK_SLACK_S,
    CLOCKS_APART_S,
    LIST_PAGE,
    REPORTED,
    BucketReader,
    Listing,
    checked_age,
    checked_count,
    checked_size,
    checked_time,
    delete_hint,
)

log = package_logger("xla_pcache")

ROOT = "xla_pcache-1"
CONFIG = f"{ROOT}/config"
USAGE = f"{ROOT}/usage"
STATE = f"{ROOT}/state"
LEASE = f"{ROOT}/prune.lease"
RECORD_DIR = f"{ROOT}/records"
TORCH_XLA_DIR = f"{ROOT}/torch_xla"
# Bounds on what is read back: a record holds one host's uses of an interval (33 bytes an
# entry name); the usage index every entry with a use (about 50 bytes each, gzip halves it:
# 2.5 MB at 100k entries). Both are streamed: the bounds are on time, not memory.
MAX_RECORD = 8 << 20
MAX_USAGE = 64 << 20
# What xla_pcache writes there inflates to about twice its size: a record or usage is read
# no further than this many times its own size (a gzip bomb costs what its bytes cost).
MAX_INFLATE = 4
DELETE_BATCH = 1000
# The prune lease: rewritten every third of it while a prune runs; taken over when it has not
# been rewritten for STALE_AFTER_S by this host's clock (hosts' clocks may differ by that much).
LEASE_S = 60.0
STALE_AFTER_S = CLOCKS_APART_S
# Claims older than this were left by killed hosts (a live one is rewritten every 10 s).
STALE_CLAIM_S = 86400.0
# Prune to this fraction of the budget, as the directory does: writers then find room for a
# while before the next prune.
LOW_WATERMARK = 0.9
# A writer's budget check lists at most this many records: more means a prune is due.
ESTIMATE_RECORDS = 10 * LIST_PAGE
# Below an object planted under one of our names as a prefix, the "directories" a service
# with directories (SeaweedFS, MinIO, hierarchical namespaces) made: removed up to this deep.
SQUAT_DEPTH = 4
# What a squat check lists below one of our names.
SQUAT_LIST = 100
# The directories a squat check walks below one of our fixed names, emptied or left empty
# (a key is at most 1,024 bytes, so no chain of them is deeper than 512).
SQUAT_DIRS = 520
# The least name of ours in a directory (``Listing.floor``): entries, claims and markers
# begin with an entry name, records with "r-".
_FLOOR = "0" * 32

_RECORD = re.compile(r"r-([0-9]{1,15})-([0-9a-f]{16})-([0-9]{1,12})-([0-9]{1,16})")
_MARKER = re.compile(r"([0-9a-f]{32})-([0-9]{1,40})")
_USAGE_LINE = re.compile(rb"([0-9a-f]{32}) ([0-9]{1,12}(?:\.[0-9]{1,6})?) ([0-9]{1,19})")
_RECORD_LINE = re.compile(rb"[ \t]*([0-9a-f]{32})[ \t]*")
_FIXED = frozenset(("config", "usage", "state", "prune.lease"))
_NAMED_DIRS = {"entries": re.compile(r"[0-9a-f]{32}"), "claims": re.compile(r"[0-9a-f]{32}")}


def _epoch(meta: Mapping[str, Any]) -> float:
    lm = meta.get("last_modified")
    return float(lm.timestamp()) if lm is not None else 0.0


@dataclass(frozen=True)
class Limits:
    """What one prune reads at most: ``records`` records (by count and ``record_bytes`` in
    all; the rest wait for the next prune), ``entries`` objects under ``entries/`` (None:
    all; past it the prune removes nothing and says so), and ``seconds`` from its start
    (None: no deadline; past it the prune stops where it is and removes nothing more)."""

    records: int = 10_000
    record_bytes: int = 256 << 20
    entries: int | None = None
    seconds: float | None = None


# A writer prunes inside the user's program (records.py): its memory is bounded by the
# entries it may hold (about 320 bytes each as measured, listing included: 80 MB at the cap;
# docs/remote.md), its time by a deadline, after which the program goes on and cron's
# `xla-pcache prune` is the way.
WRITER_LIMITS = Limits(entries=250_000, seconds=120.0)


@dataclass(frozen=True)
class Budget:
    """The bucket's stored budget: bytes and seconds, None where not set."""

    max_size: int | None = None
    max_age_s: float | None = None


@dataclass(slots=True)
class Entry:
    """One entry under ``entries/`` (its object is ``entries/<name>``): its size, when it
    was written and last used, uses. Small: a prune holds one per entry."""

    size: int
    written: float
    last_use: float
    uses: int = 0


@dataclass(frozen=True)
class Record:
    """One record object: when it was written (its own time, within the clock slack), what
    its host wrote since its previous one, and the object's size."""

    path: str
    when: float
    puts: int
    put_bytes: int
    size: int


@dataclass
class PruneReport:
    """What a prune found and did, with the requests it made by kind. ``skipped``: what was
    read and refused, by kind (``unlistable`` names the keys the client cannot list or
    remove, with how to remove them); ``junk_removed``: objects under ``entries/``,
    ``records/`` and ``torch_xla/`` that are nothing xla_pcache writes."""

    url: str
    pruned: bool = True
    busy: str | None = None
    max_size: int | None = None
    max_age_s: float | None = None
    entries_before: int = 0
    bytes_before: int = 0
    entries: int = 0
    bytes: int = 0
    removed: int = 0
    removed_bytes: int = 0
    removed_names: list[str] = field(default_factory=list)
    records_folded: int = 0
    records_left: int = 0
    claims_removed: int = 0
    markers_removed: int = 0
    junk_removed: int = 0
    junk_names: list[str] = field(default_factory=list)
    listing_complete: bool = True
    skipped: dict[str, int] = field(default_factory=dict)
    unlistable: list[str] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class UntrustedReport:
    """What ``remove_untrusted`` removed (``removed`` objects, the first ``REPORTED`` by
    name) and what it could not (``unlistable``: keys the client cannot name, with a
    command that removes each)."""

    url: str
    removed: int = 0
    removed_names: list[str] = field(default_factory=list)
    unlistable: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Estimate:
    """The bucket's size as the last prune left it plus what hosts recorded writing since;
    ``known`` is False when no prune has run or the records are too many to list here
    (only a prune can tell)."""

    bytes: int
    entries: int
    known: bool
    records: int


class BusyError(Exception):
    """Another host holds the prune lease, or (``BlockedError``) the lease cannot be taken."""


class BlockedError(BusyError):
    """The prune lease can be neither created nor found, and what blocks it could not be
    removed (objects below its name the client cannot remove, or no permission to)."""


class _Deadline(Exception):
    """A prune past its ``Limits.seconds``."""


class Bucket:
    """The upkeep of one bucket prefix. Every request is counted by kind in ``requests``
    (a listing counts one request a page of ``LIST_PAGE``, as the services page them);
    everything read goes through ``reader``.

    ``read_only`` (or the URL's ``?ro=1``) makes every write refused (``ReadOnlyError``):
    no budget, record, marker, usage, state, lease or delete, so no prune either; it only
    reads (stats, listings)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        environ: Mapping[str, str] = os.environ,
        read_only: bool = False,
    ) -> None:
        location, url_read_only = objstore.parse_object_url(url)
        self.location = location
        self.url = redact(location)
        self.read_only = read_only or url_read_only
        # ``timeout`` bounds connecting; a request (a page of a listing, a batch of deletes)
        # gets at least a minute, as the tiers' writes do.
        self._store = objstore.open_client(
            location, timeout=timeout, environ=environ, for_writes=True
        )
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        parts = urllib.parse.urlsplit(location)
        self.reader = BucketReader(
            self._store,
            url=self.url,
            scheme=parts.scheme,
            bucket=parts.hostname or "",
            store_prefix=parts.path,
            count=self._count,
        )

    # ---------------------------------------------------------------- plumbing
    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.requests[kind] += n

    def _begin(self) -> None:
        """A new report: its requests and skips counted from here (warnings stay once)."""
        self.requests.clear()
        self.reader.skipped.clear()

    def listing(self, prefix: str, *, limit: int | None = None) -> Iterator[Mapping[str, Any]]:
        return self.reader.listing(prefix, limit=limit)

    def writable(self) -> None:
        """``ReadOnlyError`` when this bucket is read-only: every write asks here first."""
        if self.read_only:
            raise ReadOnlyError(
                f"bucket {self.url} is read-only (?ro=1, --read-only or "
                "XLA_PERSISTENT_CACHE_READ_ONLY): nothing is written to it"
            )

    def put(self, path: str, data: bytes, mode: Any = "overwrite") -> str | None:
        import obstore

        self.writable()
        self._count("put")
        result = obstore.put(self._store, path, data, mode=mode, use_multipart=False)
        return str(result["e_tag"]) if result.get("e_tag") else None

    def _put_or_warn(self, path: str, data: bytes) -> bool:
        """Writes one of the upkeep's objects; a refusal (an object planted below its name,
        where the service has directories, refuses it there) is one warning, not an error
        for the whole prune."""
        try:
            self.put(path, data)
        except Exception as e:
            self.reader.skip(
                f"write-{path.rpartition('/')[2]}",
                f"writing {path} failed ({type(e).__name__}: {objstore.scrub(str(e))}); "
                "`xla-pcache prune --untrusted` removes objects planted below its name",
            )
            return False
        return True

    def delete(self, paths: list[str]) -> None:
        """Deletes ``paths`` in batches (one request each on S3 and Azure; one per object on
        GCS); an object already gone is no error."""
        import obstore

        if paths:
            self.writable()
        for i in range(0, len(paths), DELETE_BATCH):
            batch = paths[i : i + DELETE_BATCH]
            self._count("delete")
            try:
                obstore.delete(self._store, batch)
            except Exception as e:
                if len(batch) == 1 and objstore._classify(e) == "missing":
                    continue
                # GCS and Azure answer an error for a missing object: one at a time.
                for path in batch:
                    self._count("delete")
                    try:
                        obstore.delete(self._store, path)
                    except Exception as e1:
                        if objstore._classify(e1) != "missing":
                            raise

    def _head(self, path: str) -> Mapping[str, Any] | None:
        import obstore

        self._count("head")
        try:
            return obstore.head(self._store, path)
        except Exception as e:
            if objstore._classify(e) == "missing":
                return None
            raise

    def _remove_junk(self, paths: list[str], tally: _Tally | None = None) -> None:
        """Removes ``paths`` (objects xla_pcache did not write). One planted below a name
        xla_pcache creates (an entry's, a claim's, the lease's: a prefix squat) made
        "directories" on a service that has them (SeaweedFS, MinIO, hierarchical
        namespaces), and an emptied one there still refuses the conditional create of its
        name: those between the name and the object are removed too, deepest first, when a
        HEAD finds no object there."""
        self.delete(paths)
        if tally is not None:
            tally.add(paths)
        dirs: set[str] = set()
        for path in paths:
            name = _squatted(path)
            if name is None:
                continue
            rest = path[len(name) + 1 :].split("/")[:-1][: SQUAT_DEPTH - 1]
            dirs.update(f"{name}/{'/'.join(rest[:d])}" for d in range(1, len(rest) + 1))
            dirs.add(name)
        # One at a time, deepest first: a directory goes only once it is empty.
        for d in sorted(dirs, key=lambda d: -d.count("/")):
            if self._head(d) is None:
                self.delete([d])

    # ---------------------------------------------------------------- the budget
    def read_budget(self) -> Budget:
        data = self.reader.json_object(CONFIG, "config")
        if data is None:
            return Budget()
        raw_size, raw_age = data.get("max_size"), data.get("max_age_s")
        size = None if raw_size is None else checked_size(raw_size)
        age = None if raw_age is None else checked_age(raw_age)
        if (raw_size is not None and size is None) or (raw_age is not None and age is None):
            self.reader.skip(
                "config-malformed",
                f"its budget object ({CONFIG}) holds a max_size or max_age_s out of range "
                "(1 byte to 2^63-1, 1 s to 1e9 s): ignored",
            )
            return Budget()
        return Budget(size, age)

    def write_budget(self, budget: Budget) -> None:
        body = {"max_size": budget.max_size, "max_age_s": budget.max_age_s}
        self.put(CONFIG, json.dumps(body).encode())

    # ---------------------------------------------------------------- what is there
    def _entry_table(
        self, listing: Listing, deadline: float | None, tally: _Tally | None
    ) -> dict[str, Entry]:
        """The objects under ``entries/`` that are entries, by name. Everything else there
        (a name no reader asks for) is left out, and with ``tally`` removed as it is found,
        so that it costs no memory."""
        out: dict[str, Entry] = {}
        start = f"{objstore.ENTRY_DIR}/"
        junk: list[str] = []
        for meta in self.reader.listing_of(listing):
            path = str(meta["path"])
            name = entry_name_or_none(path.removeprefix(start))
            size = checked_size(meta.get("size"), zero=True)
            if name is None or size is None:
                if tally is not None:
                    junk.append(path)
                    if len(junk) >= DELETE_BATCH:
                        self._remove_junk(junk, tally)
                        junk = []
            else:
                written = _epoch(meta)
                out[name] = Entry(size, written, written)
            if deadline is not None and listing.listed % LIST_PAGE == 0:
                _check(deadline)
        if junk:
            self._remove_junk(junk, tally)
        return out

    def entries(self) -> dict[str, Entry]:
        """Every entry object under ``entries/``, by its entry name (objects there that are
        no entry are left out: ``prune`` removes them)."""
        return self._entry_table(Listing(objstore.ENTRY_DIR, floor=_FLOOR), None, None)

    def _record(self, meta: Mapping[str, Any]) -> Record | None:
        """A record object's listing, checked: None for a name no host writes."""
        path = str(meta["path"])
        m = _RECORD.fullmatch(path.rpartition("/")[2])
        size = checked_size(meta.get("size"), zero=True)
        if m is None or size is None:
            return None
        written = _epoch(meta)
        own = int(m.group(1)) / 1000
        when = own if abs(own - written) <= CLOCK_SLACK_S else written
        puts, put_bytes = checked_count(int(m.group(3))), checked_size(int(m.group(4)), zero=True)
        if puts is None or put_bytes is None:
            return None
        return Record(path, when, puts, put_bytes, size)

    def records(self, limit: int | None = None) -> list[tuple[str, float, int, int]]:
        """Each record object: (path, when written, entries and bytes its host wrote);
        objects there that are no record count as records that say nothing."""
        out = []
        for meta in self.reader.listing(RECORD_DIR, limit=limit, floor="r-"):
            r = self._record(meta)
            if r is None:
                out.append((str(meta["path"]), _epoch(meta), 0, 0))
            else:
                out.append((r.path, r.when, r.puts, r.put_bytes))
        return out

    def record_names(self, path: str) -> Iterator[EntryName]:
        """The entry names a record holds, streamed (lines that are none skipped)."""
        return map(EntryName, self._record_lines(path))

    def _record_lines(self, path: str) -> Iterator[str]:
        # The line's shape is an entry name's: no EntryName made for each (a million of
        # them in a planted record cost seconds), only for the few that are entries.
        for m in self.reader.gzip_lines(path, MAX_RECORD, MAX_INFLATE, "record", _RECORD_LINE):
            yield m.group(1).decode("ascii")

    def read_state(self) -> dict[str, float] | None:
        data = self.reader.json_object(STATE, "state")
        if data is None:
            return None
        state = {
            "time": checked_time(data.get("time")),
            "entries": checked_count(data.get("entries")),
            "bytes": checked_size(data.get("bytes"), zero=True),
        }
        if any(v is None for v in state.values()):
            self.reader.skip("state-malformed", f"{STATE} holds a value out of range: ignored")
            return None
        return {k: float(v) for k, v in state.items() if v is not None}

    def estimate(self) -> Estimate:
        """The bucket's size without listing its entries: the last prune's totals plus the
        writes hosts recorded since (one GET and a listing of ``records/``, at most
        ``ESTIMATE_RECORDS`` of them: more means a prune is due)."""
        state = self.read_state()
        listing = Listing(RECORD_DIR, ESTIMATE_RECORDS, "r-")
        puts = put_bytes = n = 0
        for meta in self.reader.listing_of(listing):
            n += 1
            r = self._record(meta)
            if r is not None:
                puts += r.puts
                put_bytes += r.put_bytes
        if state is None or not listing.complete:
            return Estimate(put_bytes, puts, False, n)
        return Estimate(int(state["bytes"]) + put_bytes, int(state["entries"]) + puts, True, n)

    # ---------------------------------------------------------------- torch_xla markers
    def mark_torch_xla(self, name: EntryName, graph: str) -> None:
        self.put(f"{TORCH_XLA_DIR}/{name}-{graph}", b"")

    def torch_xla_entries(self, limit: int | None = None) -> list[tuple[EntryName, str, float]]:
        """(entry name, torch_xla's file name, when marked) of each marker among the first
        ``limit`` objects under ``torch_xla/``, newest first."""
        out = []
        for meta in self.reader.listing(TORCH_XLA_DIR, limit=limit, floor=_FLOOR):
            m = _MARKER.fullmatch(str(meta["path"]).rpartition("/")[2])
            if m:
                out.append((EntryName(m.group(1)), m.group(2), _epoch(meta)))
        out.sort(key=lambda t: t[2], reverse=True)
        return out

    # ---------------------------------------------------------------- the prune lease
    def _clear_squat(self, name: str) -> list[str]:
        """Objects planted below ``name`` (one of the upkeep's own names, which is no
        object) as a prefix: removed, with every directory below ``name`` and ``name``
        itself (``_clear_dirs``). The keys removed (empty when there were none)."""
        found = [str(m["path"]) for m in self.reader.listing(name, limit=SQUAT_LIST)]
        if found:
            self._remove_junk(found)
            self.reader.skip(
                "squat",
                f"objects planted below {name} ({found[0]!r}"
                f"{' and more' if len(found) > 1 else ''}) made it a directory: removed",
                len(found),
            )
        if self._clear_dirs(name) and not found:
            self.reader.skip(
                "squat",
                f"directories left below {name} by objects planted there and removed since "
                "(they refuse its create): removed",
            )
        return found

    def _clear_dirs(self, name: str) -> int:
        """Removes the directories below ``name`` that hold no object, children before
        their parent, then ``name`` when a HEAD finds no object there: on a service with
        directories (SeaweedFS, MinIO, hierarchical namespaces), what objects planted below
        it leave once they are gone, or leave deeper than ``_remove_junk`` goes. Such
        directories refuse the create of ``name`` and no listing of objects shows them; a
        listing with a delimiter does. At most ``SQUAT_DIRS`` directories are taken (a
        listing of each, and a request to remove each: the service refuses to remove one
        that still holds something); the rest wait for the next time. How many were
        taken."""
        taken = 0
        stack: list[tuple[str, bool]] = [(name, False)]
        while stack:
            d, done = stack.pop()
            if done:
                if d != name:
                    self.delete([d])
                elif self._head(name) is None:
                    self.delete([name])
                continue
            stack.append((d, True))
            below = [sub for sub in self.reader.directories(d) if sub.startswith(d + "/")]
            below = below[: SQUAT_DIRS - taken]
            taken += len(below)
            stack.extend((sub, False) for sub in below)
        return taken

    def _take_lease(self, stale_after: float, body: bytes) -> str | None:
        meta: Mapping[str, Any] | None = None
        for attempt in range(2):
            try:
                return self.put(LEASE, body, mode="create")
            except Exception as e:
                if objstore._classify(e) not in ("exists", "precondition"):
                    raise
            meta = self._head(LEASE)
            if meta is not None:
                break
            # Refused, and not there: its holder released it just now (try again), or
            # objects planted below its name make it a directory, which refuses the
            # create (a prefix squat: SeaweedFS, MinIO, hierarchical namespaces).
            if attempt == 0:
                self._clear_squat(LEASE)
        if meta is None:
            unlistable = [k for k in self.reader.unlistable if f"/{LEASE}/" in f"/{k}"]
            hint = (
                delete_hint(self.reader.scheme, self.reader.bucket, unlistable[0])
                if unlistable
                else f"`xla-pcache prune --untrusted --path {self.url}`"
            )
            raise BlockedError(
                f"{LEASE} can be neither created nor found: something below its name blocks "
                f"it; remove it with {hint}"
            )
        age = time.time() - _epoch(meta)
        if age < stale_after:
            holder = self.reader.json_object(LEASE, "lease") or {}
            owner = str(holder.get("owner", "?"))[:100]
            raise BusyError(f"another prune holds {LEASE} ({owner}, rewritten {age:.0f} s ago)")
        try:
            return self.put(LEASE, body, mode={"e_tag": meta["e_tag"]})
        except Exception as e:
            if objstore._classify(e) in ("exists", "precondition", "missing"):
                raise BusyError(f"another host took over {LEASE} first") from None
            raise

    @contextlib.contextmanager
    def lease(self, stale_after: float = STALE_AFTER_S) -> Iterator[threading.Event]:
        """Holds the prune lease (``BusyError`` when another host does, ``BlockedError``
        when it cannot be taken), rewritten in the background; the event is set once it was
        lost (taken over after a long silence)."""
        body = json.dumps({"owner": f"{socket.gethostname()}-{os.getpid()}"}).encode()
        e_tag = self._take_lease(stale_after, body)
        lost = threading.Event()
        stop = threading.Event()

        def beat() -> None:
            nonlocal e_tag
            while not stop.wait(LEASE_S / 3):
                try:
                    e_tag = self.put(LEASE, body, mode={"e_tag": e_tag})
                except Exception:
                    lost.set()
                    return

        beater = threading.Thread(target=beat, name="xla_pcache-prune-lease", daemon=True)
        beater.start()
        try:
            yield lost
        finally:
            stop.set()
            beater.join()
            if not lost.is_set():
                with contextlib.suppress(Exception):
                    meta = self._head(LEASE)
                    if meta is not None and meta["e_tag"] == e_tag:
                        self.delete([LEASE])

    # ---------------------------------------------------------------- prune
    def prune(
        self,
        max_size: int | None = None,
        older_than: float | None = None,
        *,
        stale_after: float = STALE_AFTER_S,
        limits: Limits = Limits(),
    ) -> PruneReport:
        """Removes entries unused for longer than ``older_than`` (else the stored max age),
        then the least recently used until the bucket is within ``max_size`` (else within
        ``LOW_WATERMARK`` of the stored budget), under the prune lease; objects under
        ``entries/`` that are no entry go whatever the budget. Folds the hosts' records into
        ``usage`` (at most ``limits.records`` of them), writes ``state``, and removes claims
        left by killed hosts and the torch_xla markers of removed entries. ``BusyError``
        when another host prunes; within ``limits`` otherwise (``pruned`` False and ``busy``
        saying why when a limit stopped it);
        ``ReadOnlyError``, before any request, when the bucket is read-only."""
        self.writable()
        started = time.monotonic()
        deadline = None if limits.seconds is None else started + limits.seconds
        self._begin()
        report = PruneReport(self.url)
        tally = _Tally()
        try:
            with self.lease(stale_after) as lost:
                self._prune(report, max_size, older_than, limits, deadline, lost, tally)
        except _Deadline:
            report.pruned = False
            report.busy = (
                f"stopped after {limits.seconds:.0f} s, before removing what was left to remove"
            )
            self.reader.warn_once("deadline", f"a prune {report.busy}: prune it from cron")
        report.junk_removed = tally.removed
        report.junk_names = tally.names
        report.skipped = dict(self.reader.skipped)
        report.unlistable = list(self.reader.unlistable)
        report.requests = dict(self.requests)
        report.seconds = time.monotonic() - started
        return report

    def _prune(
        self,
        report: PruneReport,
        max_size: int | None,
        older_than: float | None,
        limits: Limits,
        deadline: float | None,
        lost: threading.Event,
        tally: _Tally,
    ) -> None:
        budget = self.read_budget()
        report.max_age_s = older_than if older_than is not None else budget.max_age_s
        target = max_size
        if target is None and budget.max_size is not None:
            target = int(budget.max_size * LOW_WATERMARK)
        report.max_size = max_size if max_size is not None else budget.max_size
        # Records first, then entries: an entry a folded record names was written before
        # that record, so it is in the listing below (docs/remote.md).
        records, junk_records, report.records_left = self._records_to_fold(limits, deadline)
        listing = Listing(objstore.ENTRY_DIR, limits.entries, _FLOOR)
        entries = self._entry_table(listing, deadline, tally)
        report.listing_complete = listing.complete
        if listing.capped:
            report.pruned = False
            report.busy = (
                f"more than {limits.entries:,} objects under entries/: not pruned here "
                "(run `xla-pcache prune` from cron)"
            )
            self.reader.warn_once("too-many", f"holds {report.busy}")
            return
        _check(deadline)
        self._fold_usage(entries)
        folded: list[str] = []
        for record in records:
            _check(deadline)
            self._fold_record(record, entries)
            folded.append(record.path)
        report.records_folded = len(folded)
        report.entries_before = len(entries)
        report.bytes_before = total = sum(e.size for e in entries.values())
        doomed: list[str] = []
        if report.max_age_s is not None:
            cutoff = time.time() - report.max_age_s
            doomed = [n for n, e in entries.items() if e.last_use < cutoff]
        gone = set(doomed)
        total -= sum(entries[n].size for n in doomed)
        if target is not None and total > target:
            # Least recently used, fewest uses, name: the same order on every host.
            order = sorted(
                (n for n in entries if n not in gone),
                key=lambda n: (entries[n].last_use, entries[n].uses, n),
            )
            for victim in order:
                if total <= target:
                    break
                doomed.append(victim)
                total -= entries[victim].size
        for i in range(0, len(doomed), DELETE_BATCH):
            if lost.is_set():
                log.warning(
                    "xla_pcache: bucket %s: the prune lease was taken over; stopping",
                    self.url,
                )
                break
            _check(deadline)
            batch = doomed[i : i + DELETE_BATCH]
            self.delete([f"{objstore.ENTRY_DIR}/{n}" for n in batch])
            report.removed += len(batch)
            report.removed_bytes += sum(entries[n].size for n in batch)
            report.removed_names += batch
        for n in report.removed_names:
            entries.pop(n, None)
        report.entries = len(entries)
        report.bytes = sum(e.size for e in entries.values())
        usage_kept = True
        if folded or report.removed:
            # Unchanged otherwise: not rewritten (2.5 MB at 100k entries with uses).
            usage_kept = self._put_or_warn(USAGE, _usage_body(entries))
        self._put_or_warn(
            STATE,
            json.dumps(
                {"time": time.time(), "entries": report.entries, "bytes": report.bytes}
            ).encode(),
        )
        # Only after usage holds them: a prune that dies before this folds them again.
        if usage_kept:
            self.delete(folded)
        if junk_records:
            self._remove_junk(junk_records, tally)
        report.claims_removed = self._drop_stale_claims(tally)
        # A listing that did not see every entry cannot tell which markers are orphans.
        if listing.complete:
            report.markers_removed = self._drop_markers(entries, tally)

    def _records_to_fold(
        self, limits: Limits, deadline: float | None
    ) -> tuple[list[Record], list[str], int]:
        """The records this prune folds (the first ``limits.records``, within
        ``limits.record_bytes`` in all), the objects under ``records/`` that are no record
        or too large to read (removed), and how many records wait for the next prune."""
        records: list[Record] = []
        junk: list[str] = []
        left = 0
        total = 0
        for i, meta in enumerate(self.reader.listing(RECORD_DIR, floor="r-")):
            if i % LIST_PAGE == 0:
                _check(deadline)
            r = self._record(meta)
            if r is None or r.size > MAX_RECORD:
                if len(junk) < limits.records:
                    junk.append(str(meta["path"]))
                    if r is not None:
                        self.reader.skip(
                            "record-oversized", f"{r.path} is over {MAX_RECORD} bytes: removed"
                        )
                else:
                    left += 1
                continue
            if len(records) >= limits.records or total + r.size > limits.record_bytes:
                left += 1
                continue
            total += r.size
            records.append(r)
        if left:
            self.reader.warn_once(
                "records-left",
                f"{left} records wait for the next prune (a prune folds at most "
                f"{limits.records:,} records, {limits.record_bytes:,} bytes)",
            )
        return records, junk, left

    def _fold_usage(self, entries: Mapping[str, Entry]) -> None:
        """What earlier prunes folded, streamed into ``entries`` (names of no entry cost
        nothing)."""
        bad = 0
        now = time.time()
        for m in self.reader.gzip_lines(USAGE, MAX_USAGE, MAX_INFLATE, "usage", _USAGE_LINE):
            entry = entries.get(m.group(1).decode("ascii"))
            if entry is None:
                continue
            when = checked_time(float(m.group(2)), now)
            uses = checked_count(int(m.group(3)))
            if when is None or uses is None:
                bad += 1
                continue
            entry.last_use = max(entry.last_use, when)
            entry.uses = max(entry.uses, uses)
        if bad:
            self.reader.skip("usage-lines", f"{USAGE} has lines prune does not write: skipped", bad)

    def _fold_record(self, record: Record, entries: Mapping[str, Entry]) -> None:
        """One record, streamed into ``entries``: each entry it names used once more, at its
        time (a name it repeats counts once; names of no entry cost nothing)."""
        seen: set[str] = set()
        for name in self._record_lines(record.path):
            entry = entries.get(name)
            if entry is None or name in seen:
                continue
            seen.add(name)
            entry.last_use = max(entry.last_use, record.when)
            entry.uses = min(entry.uses + 1, (1 << 63) - 1)

    def _drop_stale_claims(self, tally: _Tally) -> int:
        """Claims a killed host left (over ``STALE_CLAIM_S`` old) and, as junk, whatever
        under ``claims/`` is no claim, removed a batch at a time as they are listed."""
        cutoff = time.time() - STALE_CLAIM_S
        stale: list[str] = []
        junk: list[str] = []
        removed = 0
        for m in self.reader.listing(objstore.CLAIM_DIR, floor=_FLOOR):
            path = str(m["path"])
            if not _ours(path):
                junk.append(path)
            elif _epoch(m) < cutoff:
                stale.append(path)
            if len(stale) >= DELETE_BATCH:
                removed += len(stale)
                self.delete(stale)
                stale = []
            if len(junk) >= DELETE_BATCH:
                self._remove_junk(junk, tally)
                junk = []
        removed += len(stale)
        self.delete(stale)
        if junk:
            self._remove_junk(junk, tally)
        return removed

    def _drop_markers(self, kept: Container[str], tally: _Tally) -> int:
        """Markers of entries no longer there, and objects under ``torch_xla/`` that are no
        marker, removed a batch at a time as they are listed."""
        doomed: list[str] = []
        junk: list[str] = []
        removed = 0
        for meta in self.reader.listing(TORCH_XLA_DIR, floor=_FLOOR):
            path = str(meta["path"])
            m = _MARKER.fullmatch(path.rpartition("/")[2])
            if m is None or path.count("/") != TORCH_XLA_DIR.count("/") + 1:
                junk.append(path)
            elif m.group(1) not in kept:
                doomed.append(path)
            if len(doomed) >= DELETE_BATCH:
                removed += len(doomed)
                self.delete(doomed)
                doomed = []
            if len(junk) >= DELETE_BATCH:
                self._remove_junk(junk, tally)
                junk = []
        self.delete(doomed)
        if junk:
            self._remove_junk(junk, tally)
        return removed + len(doomed)

    # ---------------------------------------------------------------- untrusted objects
    def remove_untrusted(self) -> UntrustedReport:
        """Removes every object below ``xla_pcache-1/`` that is nothing xla_pcache writes
        (a name of no shape of ours, an object planted below one of our names as a prefix,
        with the directories it made), and reports by name, with the command that removes
        each, the keys the client cannot name. Entries are not read: one whose bytes are
        not an entry is refused by every reader, and pruned as never used.
        ``ReadOnlyError``, before any request, when the bucket is read-only."""
        self.writable()
        self._begin()
        report = UntrustedReport(self.url)
        tally = _Tally()
        junk: list[str] = []
        for meta in self.reader.listing(ROOT):
            path = str(meta["path"])
            if not _ours(path):
                junk.append(path)
                if len(junk) >= DELETE_BATCH:
                    self._remove_junk(junk, tally)
                    junk = []
        if junk:
            self._remove_junk(junk, tally)
        # Directories left at names of ours by a squat whose objects are gone already.
        for name in (LEASE, CONFIG, USAGE, STATE):
            if self._head(name) is None:
                self._clear_dirs(name)
        report.removed, report.removed_names = tally.removed, tally.names
        report.unlistable = list(self.reader.unlistable)
        report.hints = [
            delete_hint(self.reader.scheme, self.reader.bucket, k) for k in report.unlistable
        ]
        report.skipped = dict(self.reader.skipped)
        report.requests = dict(self.requests)
        return report

    # ---------------------------------------------------------------- stats
    def stats(self) -> dict[str, Any]:
        """Entries and bytes (a listing), the budget and fill, the records not yet folded,
        the last prune's time, what was skipped as untrusted, and the requests this took."""
        self._begin()
        started = time.monotonic()
        budget = self.read_budget()
        count = total = junk = 0
        listing = Listing(objstore.ENTRY_DIR, floor=_FLOOR)
        start = f"{objstore.ENTRY_DIR}/"
        for meta in self.reader.listing_of(listing):
            size = checked_size(meta.get("size"), zero=True)
            if entry_name_or_none(str(meta["path"]).removeprefix(start)) is None or size is None:
                junk += 1
            else:
                count += 1
                total += size
        records = pending_bytes = 0
        for meta in self.reader.listing(RECORD_DIR, floor="r-"):
            records += 1
            r = self._record(meta)
            pending_bytes += 0 if r is None else r.put_bytes
        state = self.read_state()
        claims = sum(1 for _ in self.reader.listing(objstore.CLAIM_DIR, floor=_FLOOR))
        return {
            "path": self.url,
            "entries": count,
            "bytes": total,
            "max_size": budget.max_size,
            "max_age_s": budget.max_age_s,
            "fill": total / budget.max_size if budget.max_size else None,
            "records_pending": records,
            "recorded_puts_bytes": pending_bytes,
            "last_prune": None if state is None else state["time"],
            "claims": claims,
            "junk": junk,
            "listing_complete": listing.complete,
            "skipped": sum(self.reader.skipped.values()),
            "skipped_by_kind": dict(self.reader.skipped),
            "unlistable": list(self.reader.unlistable),
            "unlistable_hints": [
                delete_hint(self.reader.scheme, self.reader.bucket, k)
                for k in self.reader.unlistable
            ],
            "requests": dict(self.requests),
            "seconds": time.monotonic() - started,
        }


@dataclass
class _Tally:
    """Objects removed as junk: how many, the first ``REPORTED`` by name."""

    removed: int = 0
    names: list[str] = field(default_factory=list)

    def add(self, paths: list[str]) -> None:
        self.removed += len(paths)
        self.names += paths[: max(0, REPORTED - len(self.names))]


def _squatted(path: str) -> str | None:
    """The name xla_pcache creates that ``path`` lies below, if any: an entry's or a
    claim's (a 32-digit name in ``entries/`` or ``claims/``), or one of the fixed names."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == ROOT and parts[1] in _FIXED:
        return f"{ROOT}/{parts[1]}"
    if (
        len(parts) >= 4
        and parts[0] == ROOT
        and parts[1] in _NAMED_DIRS
        and _NAMED_DIRS[parts[1]].fullmatch(parts[2])
    ):
        return "/".join(parts[:3])
    return None


def _check(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise _Deadline


def _ours(path: str) -> bool:
    """Whether ``path`` (below the prefix) has the shape of something xla_pcache writes."""
    parts = path.split("/")
    if parts[0] != ROOT:
        return False
    if len(parts) == 2:
        return parts[1] in _FIXED
    if len(parts) != 3:
        return False
    kind, name = parts[1], parts[2]
    if kind in _NAMED_DIRS:
        return _NAMED_DIRS[kind].fullmatch(name) is not None
    if kind == "records":
        return _RECORD.fullmatch(name) is not None
    if kind == "torch_xla":
        return _MARKER.fullmatch(name) is not None
    return False


def _usage_body(entries: Mapping[str, Entry]) -> bytes:
    """``usage``: a line per entry with uses, sorted, gzip (made a piece at a time)."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [
        c.compress(f"{n} {e.last_use:.3f} {e.uses}\n".encode())
        for n, e in sorted((n, e) for n, e in entries.items() if e.uses)
    ]
    out.append(c.flush())
    return b"".join(out)


def new_record_name(puts: int, put_bytes: int) -> str:
    """The path of a new record: when (ms), a random tag (unique), and what its host wrote
    since."""
    ms = int(time.time() * 1000)
    return f"{RECORD_DIR}/r-{ms}-{secrets.token_hex(8)}-{max(0, puts)}-{max(0, put_bytes)}"


def record_body(names: Iterable[str]) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress("".join(f"{n}\n" for n in sorted(set(names))).encode()) + c.flush()
