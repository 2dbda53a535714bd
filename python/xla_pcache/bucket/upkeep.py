"""A bucket's own upkeep, for a cache whose path is a bucket (docs/remote.md, "A cache in a
bucket"): its budget, kept as an object beside the entries; the records of which entries the
hosts used; pruning, least recently used first; its totals; and the markers that let a
host find entries by a listing before its framework starts (``layout.py``, "marker").
``Bucket`` is the one door to them;
the parts live in modules of their own: the objects' names (``layout.py``), the requests
(``objects.py``), the stored budget (``stored_budget.py``), a use record
(``use_record.py``), the prune lease (``prune_lease.py``), what a prune reads and its
limits (``prune_fold.py``) and the prune (``prune.py``).

Below ``<prefix>/xla_pcache-1/``, beside ``entries/`` and ``claims/`` (``tiers/objstore.py``):

- ``config``: the budget, JSON ``{"max_size": bytes or null, "max_age_s": seconds or null}``,
  written by ``xla-pcache config --path s3://...``;
- ``records/r-<ms>-<tag>-<puts>-<bytes>``: a use record, the entries one host used and wrote since
  its previous one, one entry name a line, gzip (``recorder.py`` writes them). The name
  carries when (the host's clock, in milliseconds) and how many entries and bytes that host
  wrote to the bucket since, so that a writer estimates the bucket's size from one listing,
  without reading a record;
- ``usage``: the records prune folded: ``<name> <last use> <uses>`` a line, gzip;
- ``state``: the totals the last prune left, JSON ``{"time", "entries", "bytes"}``;
- ``prune.lease``: held while a prune runs, so one host prunes at a time;
- ``torch_xla/<entry name>-<tag>``: empty markers of entries (``layout.MARKER_DIR``; the
  tag is the last segment of the entry's key, ``layout.marker_tag``).

A later layout of these objects lives below its own root (``xla_pcache-2/``), which nothing
here lists, reads, writes or removes.

Times: an entry was last used when it was written (its ``Last-Modified``, the service's
clock, whole seconds) or when a record naming it was uploaded, whichever is later. A
record's time is the one in its name (milliseconds: uses a second apart keep their order),
unless that is more than ``CLOCK_SLACK_S`` from its ``Last-Modified`` (a host clock that is
wrong, or lies, cannot keep entries for ever); ``max_age`` and a stale lease are judged
against this host's clock.

Everything read here is untrusted (whoever can write the bucket wrote it) and is read
through one reader, ``reader.BucketReader``: sizes bounded before a byte is read,
records and usage streamed a line at a time, numbers range-checked, keys the client cannot
parse skipped, and whatever does not pass counted and warned about once. A prune's memory
is that of the entries it lists (``Limits.entries`` bounds it for writers) and a constant:
the records and ``usage`` are folded into the listed entries as they stream, so names of no
entry cost nothing (a prune whose listing was cut short holds a bounded number of them, to
ask for by name: ``prune_reach.py``). A hostile object can make prune keep or drop entries
under the prefix, which such a writer could delete anyway; never more.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Unpack

from xla_pcache._names import EntryName, entry_name_or_none
from xla_pcache.bucket import marker_listing, prune, prune_lease, stored_budget
from xla_pcache.bucket.layout import (
    CONFIG,
    ENTRY_NAMES,
    LEASE,
    MARKER_DIR,
    MARKER_NAME,
    MARKER_NAMES,
    RECORD_NAMES,
    ROOT,
    STATE,
    USAGE,
    USE_RECORD_DIR,
    USE_RECORD_NAME,
    epoch,
    ours,
)
from xla_pcache.bucket.objects import (
    DELETE_BATCH,
    SQUAT_DEPTH,
    SQUAT_DIRS,
    SQUAT_LIST,
    BucketObjects,
    ClientOptions,
    Tally,
)
from xla_pcache.bucket.prune import LOW_WATERMARK, STALE_CLAIM_S, PruneReport
from xla_pcache.bucket.prune_fold import (
    PRUNE_LIMITS,
    WRITER_LIMITS,
    Entry,
    Limits,
    entry_table,
)
from xla_pcache.bucket.prune_lease import LEASE_S, STALE_AFTER_S, BlockedError, BusyError
from xla_pcache.bucket.reader import (
    LIST_PAGE,
    MAX_INFLATE,
    MAX_USAGE,
    MAX_USE_RECORD,
    Listing,
    checked_count,
    checked_size,
    checked_time,
    delete_hint,
    listed_size,
)
from xla_pcache.bucket.stored_budget import BucketStoredBudget
from xla_pcache.bucket.use_record import (
    UseRecord,
    new_use_record_name,
    parse_use_record,
    use_record_body,
    use_record_lines,
)
from xla_pcache.tiers import objstore

# What callers and tests name through this module, from the modules that hold them.
__all__ = [
    "CONFIG",
    "DELETE_BATCH",
    "ESTIMATE_RECORDS",
    "LEASE",
    "LEASE_S",
    "LOW_WATERMARK",
    "MARKER_DIR",
    "MAX_INFLATE",
    "MAX_USAGE",
    "MAX_USE_RECORD",
    "PRUNE_LIMITS",
    "ROOT",
    "SQUAT_DEPTH",
    "SQUAT_DIRS",
    "SQUAT_LIST",
    "STALE_AFTER_S",
    "STALE_CLAIM_S",
    "STATE",
    "USAGE",
    "USE_RECORD_DIR",
    "USE_RECORD_NAME",
    "WRITER_LIMITS",
    "BlockedError",
    "Bucket",
    "BucketStoredBudget",
    "BusyError",
    "Entry",
    "Estimate",
    "Limits",
    "PruneReport",
    "UntrustedReport",
    "UseRecord",
    "new_use_record_name",
    "use_record_body",
]

# A writer's budget check lists at most this many records: more means a prune is due.
ESTIMATE_RECORDS = 10 * LIST_PAGE


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
    ``known`` is False when no prune has run, the last one was cut short, or the records
    are too many to list here or their listing was (only a prune can tell). After a prune
    cut short (its listing hid entries) with every record listed, ``lower`` is True:
    ``bytes`` is what that prune saw, listed or reached by name, plus what hosts recorded
    writing since it, at least what the bucket holds of what can be seen.
    ``last_prune``: when the last prune ran, as its ``state`` says (None: none did)."""

    bytes: int
    entries: int
    known: bool
    records: int
    last_prune: float | None = None
    lower: bool = False


class Bucket:
    """The upkeep of one bucket prefix. Every request is counted by kind in ``requests``
    (a listing counts one request a page of ``LIST_PAGE``, as the services page them);
    everything read goes through ``reader`` (both ``objects``', which makes the requests).

    ``read_only`` (or the URL's ``?ro=1``) makes every write refused (``ReadOnlyError``):
    no budget, record, marker, usage, state, lease or delete, so no prune either; it only
    reads (stats, listings)."""

    def __init__(self, url: str, **client: Unpack[ClientOptions]) -> None:
        self.objects = BucketObjects(url, **client)
        self.location = self.objects.location
        self.url = self.objects.url
        self.requests = self.objects.requests
        self.reader = self.objects.reader

    @property
    def read_only(self) -> bool:
        return self.objects.read_only

    # ---------------------------------------------------------------- requests
    def listing(self, prefix: str, *, limit: int | None = None) -> Iterator[Mapping[str, Any]]:
        return self.objects.listing(prefix, limit=limit)

    def writable(self) -> None:
        """``ReadOnlyError`` when this bucket is read-only: every write asks here first."""
        self.objects.writable()

    def put(self, path: str, data: bytes, mode: Any = "overwrite") -> objstore.Version:
        return self.objects.put(path, data, mode)

    def delete(self, paths: list[str]) -> None:
        """Deletes ``paths`` in batches; an object already gone is no error."""
        self.objects.delete(paths)

    # ---------------------------------------------------------------- the budget
    def read_stored_budget(self) -> BucketStoredBudget:
        return stored_budget.read_stored_budget(self.objects)

    def write_stored_budget(self, budget: BucketStoredBudget) -> None:
        stored_budget.write_stored_budget(self.objects, budget)

    # ---------------------------------------------------------------- what is there
    def entries(self) -> dict[str, Entry]:
        """Every entry object under ``entries/``, by its entry name (objects there that are
        no entry are left out: ``prune`` removes them)."""
        return self.listed_entries()[0]

    def listed_entries(self, limit: int | None = None) -> tuple[dict[str, Entry], Listing]:
        """The entry objects among the first ``limit`` objects under ``entries/``, and how
        that listing went (``Listing.complete``); runs of objects that are no entry are
        jumped over, not listed (``Listing.skip_junk``)."""
        listing = Listing(objstore.ENTRY_DIR, limit, ENTRY_NAMES, skip_junk=True)
        return entry_table(self.objects, listing, None, None), listing

    def use_records(self, limit: int | None = None) -> list[tuple[str, float, int, int]]:
        """Each record object: (path, when written, entries and bytes its host wrote);
        objects there that are no record count as records that say nothing."""
        out = []
        for meta in self.reader.listing(USE_RECORD_DIR, limit=limit, names=RECORD_NAMES):
            r = parse_use_record(meta)
            if r is None:
                out.append((str(meta["path"]), epoch(meta), 0, 0))
            else:
                out.append((r.path, r.when, r.puts, r.put_bytes))
        return out

    def use_record_names(self, path: str) -> Iterator[EntryName]:
        """The entry names a record holds, streamed (lines that are none skipped)."""
        return map(EntryName, use_record_lines(self.reader, path))

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
        out = {k: float(v) for k, v in state.items() if v is not None}
        # Whether the prune that wrote it saw every entry (a prune cut short did not: its
        # totals are of what it saw). Earlier releases wrote no such field.
        out["complete"] = 0.0 if data.get("complete") is False else 1.0
        return out

    def estimate(self) -> Estimate:
        """The bucket's size without listing its entries: the last prune's totals plus the
        writes hosts recorded since (one GET and a listing of ``records/``, at most
        ``ESTIMATE_RECORDS`` of them: more means a prune is due)."""
        state = self.read_state()
        listing = Listing(USE_RECORD_DIR, ESTIMATE_RECORDS, RECORD_NAMES)
        puts = put_bytes = n = 0
        # A prune cut short keeps the records it could not fold, whose writes its totals
        # hold: only those recorded after it count on top of them.
        since = None if state is None or state["complete"] else state["time"]
        for meta in self.reader.listing_of(listing):
            n += 1
            r = parse_use_record(meta)
            if r is not None and (since is None or r.when > since):
                puts += r.puts
                put_bytes += r.put_bytes
        if state is None:
            return Estimate(put_bytes, puts, False, n)
        total = int(state["bytes"]) + put_bytes
        entries = int(state["entries"]) + puts
        if not listing.complete:
            return Estimate(put_bytes, puts, False, n, state["time"])
        if not state["complete"]:
            return Estimate(total, entries, False, n, state["time"], lower=True)
        return Estimate(total, entries, True, n, state["time"])

    # ---------------------------------------------------------------- markers
    def mark(self, name: EntryName, tag: str) -> None:
        """The marker of entry ``name`` with ``tag`` (``layout``, "marker")."""
        self.put(f"{MARKER_DIR}/{name}-{tag}", b"")

    def marked(self, limit: int | None = None) -> list[tuple[EntryName, str, float]]:
        """(entry name, tag, when marked) of each marker among the first ``limit`` objects
        under the markers' directory, newest first."""
        return self.markers(limit)[0]

    def markers(
        self, limit: int | None = None
    ) -> tuple[list[tuple[EntryName, str, float]], Listing]:
        """``marked``, and how its listing went (``Listing.complete``: false when ``limit``
        cut it short, or keys the client cannot list hid part of it); runs of objects that
        are no marker are jumped over (``Listing.skip_junk``)."""
        out = []
        listing = Listing(MARKER_DIR, limit, MARKER_NAMES, skip_junk=True)
        for meta in self.reader.listing_of(listing):
            m = MARKER_NAME.fullmatch(str(meta["path"]).rpartition("/")[2])
            if m:
                out.append((EntryName(m.group(1)), m.group(2), epoch(meta)))
        out.sort(key=lambda t: t[2], reverse=True)
        return out, listing

    def markers_of(self, names: list[str]) -> marker_listing.Markers:
        """The markers of the entries ``names`` (sorted), listed from one entry's name to
        the next so that nothing planted between them crowds them out
        (``marker_listing.markers_of``)."""
        return marker_listing.markers_of(self.reader, names)

    # ---------------------------------------------------------------- prune
    def lease(
        self, stale_after: float = STALE_AFTER_S
    ) -> contextlib.AbstractContextManager[threading.Event]:
        """Holds the prune lease (``BusyError`` when another host does, ``BlockedError``
        when it cannot be taken), rewritten in the background; the event is set once it was
        lost (taken over after a long silence)."""
        return prune_lease.hold(self.objects, stale_after)

    def prune(
        self,
        max_size: int | None = None,
        older_than: float | None = None,
        *,
        stale_after: float = STALE_AFTER_S,
        limits: Limits = PRUNE_LIMITS,
    ) -> PruneReport:
        """Removes entries unused for longer than ``older_than`` (else the stored max age),
        then the least recently used until the bucket is within ``max_size`` (else within
        ``LOW_WATERMARK`` of the stored budget), under the prune lease; objects under
        ``entries/`` that are no entry go whatever the budget. Folds the hosts' records into
        ``usage`` (at most ``limits.records`` of them), writes ``state``, and removes claims
        left by killed hosts and the markers of removed entries. ``BusyError``
        when another host prunes; within ``limits`` otherwise (``pruned`` False and ``busy``
        saying why when a limit stopped it);
        ``ReadOnlyError``, before any request, when the bucket is read-only."""
        return prune.prune(
            self.objects, max_size, older_than, stale_after=stale_after, limits=limits
        )

    # ---------------------------------------------------------------- untrusted objects
    def remove_untrusted(self) -> UntrustedReport:
        """Removes every object below ``xla_pcache-1/`` that is nothing xla_pcache writes
        (a name of no shape of ours, an object planted below one of our names as a prefix,
        with the directories it made), and reports by name, with the command that removes
        each, the keys the client cannot name. Entries are not read: one whose bytes are
        not an entry is refused by every reader, and pruned as never used.
        ``ReadOnlyError``, before any request, when the bucket is read-only."""
        objects = self.objects
        objects.writable()
        objects.begin()
        report = UntrustedReport(self.url)
        tally = Tally()
        junk: list[str] = []
        for meta in self.reader.listing(ROOT):
            path = str(meta["path"])
            if not ours(path):
                junk.append(path)
                if len(junk) >= DELETE_BATCH:
                    objects.remove_junk(junk, tally)
                    junk = []
        if junk:
            objects.remove_junk(junk, tally)
        # Directories left at names of ours by a squat whose objects are gone already.
        for name in (LEASE, CONFIG, USAGE, STATE):
            if self.reader.head(name) is None:
                objects.clear_dirs(name)
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
        self.objects.begin()
        started = time.monotonic()
        budget = self.read_stored_budget()
        count = total = junk = 0
        listing = Listing(objstore.ENTRY_DIR, names=ENTRY_NAMES, delimit=True)
        start = f"{objstore.ENTRY_DIR}/"
        for meta in self.reader.listing_of(listing):
            size = listed_size(meta)
            if entry_name_or_none(str(meta["path"]).removeprefix(start)) is None or size is None:
                junk += 1
            else:
                count += 1
                total += size
        records = pending_bytes = 0
        for meta in self.reader.listing(USE_RECORD_DIR, names=RECORD_NAMES):
            records += 1
            r = parse_use_record(meta)
            pending_bytes += 0 if r is None else r.put_bytes
        state = self.read_state()
        claims = sum(1 for _ in self.reader.listing(objstore.CLAIM_DIR, names=ENTRY_NAMES))
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
            "last_prune_complete": None if state is None else bool(state["complete"]),
            # What the last prune left of what it saw (listed, or reached by name when its
            # listing was cut short): more than this listing shows when one key hides a page.
            "last_prune_entries": None if state is None else int(state["entries"]),
            "last_prune_bytes": None if state is None else int(state["bytes"]),
            "claims": claims,
            "junk": junk,
            "listing_complete": listing.complete,
            "listing_cut_short": listing.cut_short(),
            "directories": listing.directories,
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
