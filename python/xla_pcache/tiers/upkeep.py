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

Everything read here is untrusted (whoever can write the bucket wrote it): names are checked
as every entry name is (``EntryName``), sizes are bounded before anything is read, and what
does not parse is skipped with one warning. A hostile object can make prune keep or drop
entries under the prefix, which such a writer could delete anyway; never more.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from xla_pcache._core import ReadOnlyError
from xla_pcache._names import EntryName, entry_name_or_none
from xla_pcache._text import package_logger
from xla_pcache.tiers import objstore
from xla_pcache.tiers.base import redact

log = package_logger("xla_pcache")

ROOT = "xla_pcache-1"
CONFIG = f"{ROOT}/config"
USAGE = f"{ROOT}/usage"
STATE = f"{ROOT}/state"
LEASE = f"{ROOT}/prune.lease"
RECORD_DIR = f"{ROOT}/records"
TORCH_XLA_DIR = f"{ROOT}/torch_xla"
# Bounds on what is read back: a budget is a few bytes; a record holds one host's uses of
# an interval (33 bytes an entry name); the usage index every entry with a use (about 50
# bytes each, gzip halves it: 2.5 MB at 100k entries).
MAX_SMALL = 4096
MAX_RECORD = 8 << 20
MAX_USAGE = 64 << 20
MAX_INFLATE = 4
# The service's page of a listing (S3 and GCS return at most 1000 keys a request): what the
# request counts below assume.
LIST_PAGE = 1000
DELETE_BATCH = 1000
# The prune lease: rewritten every third of it while a prune runs; taken over when it has not
# been rewritten for STALE_AFTER_S by this host's clock (hosts' clocks may differ by that much).
LEASE_S = 60.0
STALE_AFTER_S = 600.0
# Claims older than this were left by killed hosts (a live one is rewritten every 10 s).
STALE_CLAIM_S = 86400.0
# Prune to this fraction of the budget, as the directory does: writers then find room for a
# while before the next prune.
LOW_WATERMARK = 0.9

_RECORD = re.compile(r"r-([0-9]{1,15})-([0-9a-f]{16})-([0-9]{1,12})-([0-9]{1,16})")
# How far a record's own time may be from the service's Last-Modified of it.
CLOCK_SLACK_S = 300.0
_MARKER = re.compile(r"([0-9a-f]{32})-([0-9]{1,40})")


def _epoch(meta: Mapping[str, Any]) -> float:
    lm = meta.get("last_modified")
    return float(lm.timestamp()) if lm is not None else 0.0


def _lru(entry: Entry) -> tuple[float, int]:
    return entry.last_use, entry.uses


def _inflate(data: bytes, limit: int) -> bytes | None:
    """gzip ``data``, or None when it is not gzip or inflates past ``limit``."""
    try:
        d = zlib.decompressobj(wbits=31)
        out = d.decompress(data, limit + 1)
        if len(out) > limit or not d.eof:
            return None
        return out
    except zlib.error:
        return None


@dataclass(frozen=True)
class Budget:
    """The bucket's stored budget: bytes and seconds, None where not set."""

    max_size: int | None = None
    max_age_s: float | None = None


@dataclass
class Entry:
    """One object under ``entries/``: its size, when it was written and last used, uses."""

    path: str
    size: int
    written: float
    last_use: float
    uses: int = 0


@dataclass
class PruneReport:
    """What a prune found and did, with the requests it made by kind."""

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
    claims_removed: int = 0
    markers_removed: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Estimate:
    """The bucket's size as the last prune left it plus what hosts recorded writing since;
    ``known`` is False when no prune has run (only a listing can tell)."""

    bytes: int
    entries: int
    known: bool
    records: int


class BusyError(Exception):
    """Another host holds the prune lease."""


class Bucket:
    """The upkeep of one bucket prefix. Every request is counted by kind in ``requests``
    (a listing counts one request a page of ``LIST_PAGE``, as the services page them).

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
        self._store = objstore.open_store(
            location, timeout=timeout, environ=environ, for_writes=True
        )
        self.requests: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- plumbing
    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.requests[kind] += n

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("xla_pcache: bucket %s: %s", self.url, message)

    def listing(self, prefix: str) -> Iterator[Mapping[str, Any]]:
        import obstore

        n = 0
        try:
            for chunk in obstore.list(self._store, prefix, chunk_size=LIST_PAGE):
                n += len(chunk)
                yield from chunk
        finally:
            self._count("list", max(1, math.ceil(n / LIST_PAGE)))

    def get_small(self, path: str, limit: int) -> bytes | None:
        """The object at ``path`` if it is at most ``limit`` bytes; None when missing, and
        (with one warning) when larger."""
        import obstore

        self._count("get")
        try:
            got = obstore.get(self._store, path, options={"range": (0, limit + 1)})
            size = int(got.meta["size"])
            if size > limit:
                self._warn_once(path, f"{path} is {size} bytes, over {limit}: ignored")
                return None
            return bytes(got.bytes())
        except Exception as e:
            if objstore._classify(e) == "missing":
                return None
            raise

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

    # ---------------------------------------------------------------- the budget
    def read_budget(self) -> Budget:
        raw = self.get_small(CONFIG, MAX_SMALL)
        if raw is None:
            return Budget()
        try:
            data = json.loads(raw.decode("utf-8"))
            size, age = data.get("max_size"), data.get("max_age_s")
            if size is not None and (
                isinstance(size, bool) or not isinstance(size, int) or size <= 0
            ):
                raise ValueError("max_size")
            if age is not None and (
                isinstance(age, bool)
                or not isinstance(age, int | float)
                or not math.isfinite(age)
                or age < 1
            ):
                raise ValueError("max_age_s")
        except (ValueError, UnicodeDecodeError, AttributeError) as e:
            self._warn_once("config", f"its budget object ({CONFIG}) is malformed ({e}): ignored")
            return Budget()
        return Budget(size, None if age is None else float(age))

    def write_budget(self, budget: Budget) -> None:
        body = {"max_size": budget.max_size, "max_age_s": budget.max_age_s}
        self.put(CONFIG, json.dumps(body).encode())

    # ---------------------------------------------------------------- what is there
    def entries(self) -> dict[str, Entry]:
        """Every object under ``entries/``, by its entry name (junk planted there by its
        path: it counts and is pruned like an entry never used)."""
        out: dict[str, Entry] = {}
        start = f"{objstore.ENTRY_DIR}/"
        for meta in self.listing(objstore.ENTRY_DIR):
            path = str(meta["path"])
            written = _epoch(meta)
            checked = entry_name_or_none(path.removeprefix(start))
            key = checked if checked is not None else path
            out[key] = Entry(path, int(meta["size"]), written, written)
        return out

    def records(self) -> list[tuple[str, float, int, int]]:
        """Each record object: (path, when written, entries and bytes its host wrote)."""
        out = []
        for meta in self.listing(RECORD_DIR):
            path = str(meta["path"])
            m = _RECORD.fullmatch(path.rpartition("/")[2])
            when = written = _epoch(meta)
            puts = put_bytes = 0
            if m:
                own = int(m.group(1)) / 1000
                when = own if abs(own - written) <= CLOCK_SLACK_S else written
                puts, put_bytes = int(m.group(3)), int(m.group(4))
            out.append((path, when, puts, put_bytes))
        return out

    def read_usage(self) -> dict[str, tuple[float, int]]:
        """What earlier prunes folded: entry name -> (last use, uses)."""
        raw = self.get_small(USAGE, MAX_USAGE)
        if raw is None:
            return {}
        text = _inflate(raw, MAX_USAGE * MAX_INFLATE)
        if text is None:
            self._warn_once("usage", f"{USAGE} is not what prune writes: ignored")
            return {}
        usage: dict[str, tuple[float, int]] = {}
        for line in text.split(b"\n"):
            parts = line.split()
            if len(parts) != 3:
                continue
            name = entry_name_or_none(parts[0].decode("ascii", "replace"))
            try:
                when, uses = float(parts[1]), int(parts[2])
            except ValueError:
                continue
            if name is not None and math.isfinite(when) and uses >= 0:
                usage[name] = (when, uses)
        return usage

    def _record_names(self, path: str) -> list[EntryName]:
        raw = self.get_small(path, MAX_RECORD)
        text = None if raw is None else _inflate(raw, MAX_RECORD * MAX_INFLATE)
        if text is None:
            if raw is not None:
                self._warn_once("record", f"a record ({path}) is not what hosts write: ignored")
            return []
        out = []
        for line in text.split(b"\n"):
            name = entry_name_or_none(line.strip().decode("ascii", "replace"))
            if name is not None:
                out.append(name)
        return out

    def read_state(self) -> dict[str, float] | None:
        raw = self.get_small(STATE, MAX_SMALL)
        if raw is None:
            return None
        try:
            data = json.loads(raw.decode("utf-8"))
            state = {k: float(data[k]) for k in ("time", "entries", "bytes")}
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
            self._warn_once("state", f"{STATE} is malformed: ignored")
            return None
        if not all(math.isfinite(v) and v >= 0 for v in state.values()):
            return None
        return state

    def estimate(self) -> Estimate:
        """The bucket's size without listing its entries: the last prune's totals plus the
        writes hosts recorded since (one GET and one listing of ``records/``)."""
        state = self.read_state()
        records = self.records()
        puts = sum(r[2] for r in records)
        put_bytes = sum(r[3] for r in records)
        if state is None:
            return Estimate(put_bytes, puts, False, len(records))
        return Estimate(
            int(state["bytes"]) + put_bytes, int(state["entries"]) + puts, True, len(records)
        )

    # ---------------------------------------------------------------- torch_xla markers
    def mark_torch_xla(self, name: EntryName, graph: str) -> None:
        self.put(f"{TORCH_XLA_DIR}/{name}-{graph}", b"")

    def torch_xla_entries(self) -> list[tuple[EntryName, str, float]]:
        """(entry name, torch_xla's file name, when marked) of each marker, newest first."""
        out = []
        for meta in self.listing(TORCH_XLA_DIR):
            m = _MARKER.fullmatch(str(meta["path"]).rpartition("/")[2])
            if m:
                out.append((EntryName(m.group(1)), m.group(2), _epoch(meta)))
        out.sort(key=lambda t: t[2], reverse=True)
        return out

    # ---------------------------------------------------------------- the prune lease
    def _take_lease(self, stale_after: float, body: bytes) -> str | None:
        try:
            return self.put(LEASE, body, mode="create")
        except Exception as e:
            if objstore._classify(e) not in ("exists", "precondition"):
                raise
        import obstore

        self._count("head")
        meta = obstore.head(self._store, LEASE)
        age = time.time() - _epoch(meta)
        if age < stale_after:
            holder = self.get_small(LEASE, MAX_SMALL) or b"{}"
            try:
                owner = str(json.loads(holder.decode("utf-8")).get("owner", "?"))[:100]
            except (ValueError, UnicodeDecodeError, AttributeError):
                owner = "?"
            raise BusyError(f"another prune holds {LEASE} ({owner}, rewritten {age:.0f} s ago)")
        try:
            return self.put(LEASE, body, mode={"e_tag": meta["e_tag"]})
        except Exception as e:
            if objstore._classify(e) in ("exists", "precondition"):
                raise BusyError(f"another host took over {LEASE} first") from None
            raise

    @contextlib.contextmanager
    def lease(self, stale_after: float = STALE_AFTER_S) -> Iterator[threading.Event]:
        """Holds the prune lease (``BusyError`` when another host does), rewritten in the
        background; the event is set once it was lost (taken over after a long silence)."""
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
                    import obstore

                    self._count("head")
                    if obstore.head(self._store, LEASE)["e_tag"] == e_tag:
                        self.delete([LEASE])

    # ---------------------------------------------------------------- prune
    def prune(
        self,
        max_size: int | None = None,
        older_than: float | None = None,
        *,
        stale_after: float = STALE_AFTER_S,
    ) -> PruneReport:
        """Removes entries unused for longer than ``older_than`` (else the stored max age),
        then the least recently used until the bucket is within ``max_size`` (else within
        ``LOW_WATERMARK`` of the stored budget), under the prune lease. Folds the hosts'
        records into ``usage``, writes ``state``, and removes claims left by killed hosts and
        the torch_xla markers of removed entries. ``BusyError`` when another host prunes;
        ``ReadOnlyError``, before any request, when the bucket is read-only."""
        self.writable()
        started = time.monotonic()
        self.requests.clear()
        report = PruneReport(self.url)
        with self.lease(stale_after) as lost:
            budget = self.read_budget()
            report.max_age_s = older_than if older_than is not None else budget.max_age_s
            target = max_size
            if target is None and budget.max_size is not None:
                target = int(budget.max_size * LOW_WATERMARK)
            report.max_size = max_size if max_size is not None else budget.max_size
            # Records first, then entries: an entry a folded record names was written before
            # that record, so it is in the listing below (docs/remote.md).
            records = self.records()
            usage = self.read_usage()
            for path, when, _puts, _bytes in records:
                for used in set(self._record_names(path)):
                    last, uses = usage.get(used, (0.0, 0))
                    usage[used] = (max(last, when), uses + 1)
            report.records_folded = len(records)
            entries = self.entries()
            for key, entry in entries.items():
                last, uses = usage.get(key, (0.0, 0))
                entry.last_use, entry.uses = max(entry.written, last), uses
            report.entries_before = len(entries)
            report.bytes_before = total = sum(e.size for e in entries.values())
            doomed: list[str] = []
            if report.max_age_s is not None:
                cutoff = time.time() - report.max_age_s
                doomed = [n for n, e in entries.items() if e.last_use < cutoff]
            gone = set(doomed)
            total -= sum(entries[n].size for n in doomed)
            if target is not None and total > target:
                # What is no entry (a name no reader asks for) first, then least recently
                # used, fewest uses, name: the same order on every host.
                order = sorted(
                    (n for n in entries if n not in gone),
                    key=lambda n: (entry_name_or_none(n) is not None, *_lru(entries[n]), n),
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
                batch = doomed[i : i + DELETE_BATCH]
                self.delete([entries[n].path for n in batch])
                report.removed += len(batch)
                report.removed_bytes += sum(entries[n].size for n in batch)
                report.removed_names += batch
            removed = set(report.removed_names)
            kept = {n: e for n, e in entries.items() if n not in removed}
            report.entries = len(kept)
            report.bytes = sum(e.size for e in kept.values())
            if records or report.removed:
                # Unchanged otherwise: not rewritten (2.5 MB at 100k entries with uses).
                self._write_usage(
                    {n: (e.last_use, e.uses) for n, e in kept.items() if e.uses and len(n) == 32}
                )
            self.put(
                STATE,
                json.dumps(
                    {"time": time.time(), "entries": report.entries, "bytes": report.bytes}
                ).encode(),
            )
            # Only after usage holds them: a prune that dies before this folds them again.
            self.delete([r[0] for r in records])
            report.claims_removed = self._drop_stale_claims()
            report.markers_removed = self._drop_markers(kept.keys())
        report.requests = dict(self.requests)
        report.seconds = time.monotonic() - started
        return report

    def _write_usage(self, usage: Mapping[str, tuple[float, int]]) -> None:
        lines = "".join(f"{n} {t:.3f} {u}\n" for n, (t, u) in sorted(usage.items()))
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        self.put(USAGE, c.compress(lines.encode()) + c.flush())

    def _drop_stale_claims(self) -> int:
        cutoff = time.time() - STALE_CLAIM_S
        stale = [str(m["path"]) for m in self.listing(objstore.CLAIM_DIR) if _epoch(m) < cutoff]
        self.delete(stale)
        return len(stale)

    def _drop_markers(self, kept: Iterable[str]) -> int:
        names = set(kept)
        doomed = [
            f"{TORCH_XLA_DIR}/{name}-{graph}"
            for name, graph, _ in self.torch_xla_entries()
            if name not in names
        ]
        self.delete(doomed)
        return len(doomed)

    # ---------------------------------------------------------------- stats
    def stats(self) -> dict[str, Any]:
        """Entries and bytes (a listing), the budget and fill, the records not yet folded,
        the last prune's time, and the requests this took."""
        self.requests.clear()
        started = time.monotonic()
        budget = self.read_budget()
        entries = self.entries()
        total = sum(e.size for e in entries.values())
        records = self.records()
        state = self.read_state()
        claims = sum(1 for _ in self.listing(objstore.CLAIM_DIR))
        return {
            "path": self.url,
            "entries": len(entries),
            "bytes": total,
            "max_size": budget.max_size,
            "max_age_s": budget.max_age_s,
            "fill": total / budget.max_size if budget.max_size else None,
            "records_pending": len(records),
            "recorded_puts_bytes": sum(r[3] for r in records),
            "last_prune": None if state is None else state["time"],
            "claims": claims,
            "requests": dict(self.requests),
            "seconds": time.monotonic() - started,
        }


def new_record_name(puts: int, put_bytes: int) -> str:
    """The path of a new record: when (ms), a random tag (unique), and what its host wrote
    since."""
    ms = int(time.time() * 1000)
    return f"{RECORD_DIR}/r-{ms}-{secrets.token_hex(8)}-{max(0, puts)}-{max(0, put_bytes)}"


def record_body(names: Iterable[str]) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress("".join(f"{n}\n" for n in sorted(set(names))).encode()) + c.flush()
