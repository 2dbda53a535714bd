"""A bucket's prune: under the prune lease, the hosts' records folded into ``usage``, the
entries unused past the max age removed and then the least recently used until the bucket
is within its budget, ``state`` written, and what killed hosts and removed entries left
behind (claims, markers) removed, all within ``prune_fold.Limits``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.bucket import prune_lease, prune_markers, prune_reach
from xla_pcache.bucket.layout import (
    ENTRY_NAMES,
    MARKER_DIR,
    MARKER_NAME,
    MARKER_NAMES,
    STATE,
    USAGE,
    epoch,
    ours,
)
from xla_pcache.bucket.objects import DELETE_BATCH, BucketObjects, Tally
from xla_pcache.bucket.prune_fold import (
    Deadline,
    Entry,
    Limits,
    check,
    entry_table,
    fold_usage,
    fold_use_record,
    usage_body,
    use_records_to_fold,
)
from xla_pcache.bucket.prune_reach import Reach, Unseen
from xla_pcache.bucket.reader import BucketReader, Listing, Names
from xla_pcache.bucket.stored_budget import read_stored_budget
from xla_pcache.tiers import objstore

log = package_logger("xla_pcache")

# Claims older than this were left by killed hosts (a live one is rewritten every 10 s).
STALE_CLAIM_S = 86400.0
# A marker is written after its entry; Last-Modified is whole seconds on some services.
MARKER_SLACK_S = 1.0
# Prune to this fraction of the budget, as the directory does: writers then find room for a
# while before the next prune.
LOW_WATERMARK = 0.9


@dataclass
class PruneReport:
    """What a prune found and did, with the requests it made by kind. ``skipped``: what was
    read and refused, by kind (``unlistable`` names the keys the client cannot list or
    remove, with how to remove them); ``junk_removed``: objects under ``entries/``,
    ``records/`` and the markers' directory that are nothing xla_pcache writes.

    ``pruned`` is False when a limit stopped it (``busy`` says which; nothing more was
    removed) or when its listing of ``entries/`` or of ``records/`` was cut short
    (``cut_short`` says why: keys the client cannot list hid part of it; records not listed
    are not folded, so the uses they hold did not count), or when it left records for the
    next prune (``records_left``: the newest, records are folded oldest first) while some
    it folded named no entry it listed (they took the places of those left). A prune
    whose listing of ``entries/`` was cut short asked for the entries that records,
    ``usage`` and markers name and it did not list by name (``asked`` HEADs, ``reached``
    found: ``prune_reach.py``), and removed what the budget required among the entries it
    listed and reached (``entries_before``); what it did not see is not taken as absent:
    their markers, records and uses are kept for a prune that sees them.
    ``directories``: names under ``entries/`` with objects below them (planted), which a
    listing with a delimiter named."""

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
    asked: int = 0
    reached: int = 0
    listing_complete: bool = True
    cut_short: str | None = None
    directories: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    unlistable: list[str] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prune(
    objects: BucketObjects,
    max_size: int | None,
    older_than: float | None,
    *,
    stale_after: float,
    limits: Limits,
) -> PruneReport:
    """``Bucket.prune``: its report, with the requests it made."""
    objects.writable()
    started = time.monotonic()
    deadline = None if limits.seconds is None else started + limits.seconds
    objects.begin()
    report = PruneReport(objects.url)
    tally = Tally()
    try:
        with prune_lease.hold(objects, stale_after) as lost:
            _prune(objects, report, max_size, older_than, limits, deadline, lost, tally)
    except Deadline:
        report.pruned = False
        report.busy = (
            f"stopped after {limits.seconds:.0f} s, before removing what was left to remove"
        )
        objects.reader.warn_once("deadline", f"a prune {report.busy}: prune it from cron")
    report.junk_removed = tally.removed
    report.junk_names = tally.names
    report.skipped = dict(objects.reader.skipped)
    report.unlistable = list(objects.reader.unlistable)
    report.requests = dict(objects.requests)
    report.seconds = time.monotonic() - started
    return report


def _prune(
    objects: BucketObjects,
    report: PruneReport,
    max_size: int | None,
    older_than: float | None,
    limits: Limits,
    deadline: float | None,
    lost: threading.Event,
    tally: Tally,
) -> None:
    reader = objects.reader
    budget = read_stored_budget(objects)
    report.max_age_s = older_than if older_than is not None else budget.max_age_s
    target = max_size
    if target is None and budget.max_size is not None:
        target = int(budget.max_size * LOW_WATERMARK)
    report.max_size = max_size if max_size is not None else budget.max_size
    # Records first, then entries: an entry a folded record names was written before
    # that record, so it is in the listing below (docs/remote.md).
    records, junk_records, report.records_left, record_listing = use_records_to_fold(
        reader, limits, deadline
    )
    listing = Listing(
        objstore.ENTRY_DIR, limits.entries, ENTRY_NAMES, delimit=limits.entries is None
    )
    entries = entry_table(objects, listing, deadline, tally)
    report.listing_complete = listing.complete
    report.directories = listing.directories
    if listing.capped:
        # What it may hold, not what the fleet may do: it prunes among what it listed,
        # says it was cut short, and marks ``state`` so (one writer an interval tries
        # again, not every writer at every check).
        reader.warn_once(
            "too-many",
            f"holds more than {limits.entries:,} objects under entries/: a writer's prune "
            "prunes among the first it lists (run `xla-pcache prune` from cron)",
        )
    cut = [] if listing.complete else [listing.cut_short() or "entries/"]
    if not record_listing.complete:
        # The uses those records hold are not counted: an entry they name may go first.
        cut.append(f"the hosts' records not folded: {record_listing.cut_short()}")
    if cut:
        report.pruned = False
        report.cut_short = "; ".join(cut)
        # A program's own prune lists without a delimiter; the command may see further.
        further = "" if listing.delimit else ", or run `xla-pcache prune`, which sees further"
        reader.skip(
            "cut-short",
            f"this prune's listing was cut short ({report.cut_short}): it removes what the "
            "budget requires among the entries it listed or reached by name and takes none "
            f"it did not see as absent; remove the keys named{further}",
        )
    check(deadline)
    # Cut short: the names the fleet gives of entries not listed are offered, and asked.
    unseen = None if listing.complete else Unseen(entries, limits.asks)
    turns = 0 if unseen is None else limits.asks
    usage_missed = fold_usage(reader, entries, unseen)
    folded: list[str] = []
    missed: list[int] = []
    empty = 0
    for record in records:
        check(deadline)
        m, named = fold_use_record(reader, record, entries, unseen, turns)
        missed.append(m)
        empty += not named
        folded.append(record.path)
    report.records_folded = len(folded)
    if report.records_left and empty:
        _records_crowded(report, reader, empty)
    reach = None
    if unseen is not None:
        prune_reach.offer_markers(reader, unseen)
        sizes = {r.path: r.size for r in records}
        reach = prune_reach.ask(
            objects, unseen, deadline, records=sizes, reread_bytes=limits.record_bytes
        )
        prune_reach.fold_again(
            reader, reach, entries, zip(records, missed, strict=True), usage_missed, deadline
        )
        entries.update(reach.entries)
        report.asked, report.reached = reach.asked, len(reach.entries)
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
                objects.url,
            )
            break
        check(deadline)
        batch = doomed[i : i + DELETE_BATCH]
        objects.delete([f"{objstore.ENTRY_DIR}/{n}" for n in batch])
        report.removed += len(batch)
        report.removed_bytes += sum(entries[n].size for n in batch)
        report.removed_names += batch
    for n in report.removed_names:
        entries.pop(n, None)
    report.entries = len(entries)
    report.bytes = sum(e.size for e in entries.values())
    usage_kept = _write_usage(objects, entries, reach, bool(folded), bool(report.removed))
    totals = {"time": time.time(), "entries": report.entries, "bytes": report.bytes}
    objects.put_or_warn(STATE, json.dumps({**totals, "complete": listing.complete}).encode())
    # Only after usage holds them: a prune that dies before this folds them again.
    if usage_kept:
        objects.delete(folded if reach is None else reach.resolved)
    if junk_records:
        objects.remove_junk(junk_records, tally)
    report.claims_removed = _drop_stale_claims(objects, tally)
    dead = set(report.removed_names) | (set() if reach is None else reach.absent)
    report.markers_removed = _drop_markers(objects, entries, listing.complete, dead, tally)


def _records_crowded(report: PruneReport, reader: BucketReader, empty: int) -> None:
    """A prune that left records for the next one (past ``Limits.records`` or
    ``record_bytes``) folds the oldest, so the ones left are the newest, and a fleet with
    more records than a prune folds catches up over the next prunes. But when folded
    records named no entry it listed (planted, or naming entries since removed), they took
    places that the records left could have had, whose uses then did not count: an entry
    only they name may have gone as unused. That is a prune cut short, said as such."""
    why = (
        f"{report.records_left} records left unfolded while {empty} folded named no entry "
        "listed: the uses the records left hold did not count"
    )
    report.pruned = False
    report.cut_short = why if report.cut_short is None else f"{report.cut_short}; {why}"
    reader.skip(
        "records-crowded", f"a prune's records were crowded out: {why}", report.records_left
    )


def _write_usage(
    objects: BucketObjects,
    entries: Mapping[str, Entry],
    reach: Reach | None,
    folded: bool,
    removed: bool,
) -> bool:
    """Writes ``usage`` when it changed (unchanged it is not rewritten: 2.5 MB at 100k
    entries with uses); whether it now holds the records to delete. A prune that saw every
    entry writes their uses. One cut short (``reach``) writes those of the entries it
    listed and reached, and carries the lines of the names it could not rule out, so that
    the records whose every name it listed, reached or found absent can go (a listing cut
    short would otherwise drop the uses of those it did not see, and deleting the records
    would lose theirs). The records it keeps are folded again next time: their uses, a
    tie-break, may count twice."""
    if reach is None:
        return not (folded or removed) or objects.put_or_warn(USAGE, usage_body(entries))
    if not (reach.resolved or removed):
        return False
    return objects.put_or_warn(USAGE, reach.usage.finish(entries))


def _drop_stale_claims(objects: BucketObjects, tally: Tally) -> int:
    """Claims a killed host left (over ``STALE_CLAIM_S`` old) and, as junk, whatever
    under ``claims/`` is no claim, removed a batch at a time as they are listed."""
    cutoff = time.time() - STALE_CLAIM_S

    def verdict(meta: Any) -> str | None:
        if not ours(str(meta["path"])):
            return "junk"
        return "doomed" if epoch(meta) < cutoff else None

    return _sweep(objects, objstore.CLAIM_DIR, ENTRY_NAMES, verdict, tally)


def _drop_markers(
    objects: BucketObjects,
    kept: Mapping[str, Entry],
    complete: bool,
    gone: set[str],
    tally: Tally,
) -> int:
    """Markers that vouch for nothing, removed a batch at a time as they are listed: an
    entry has one key, so one marker; its writer writes it after the entry. So markers
    older than their entry go (planted before it was written), and of those not older,
    one stays and the others go, told apart by the entry's header (``prune_markers``);
    markers of entries no longer there go when the listing saw every entry
    (``complete``), or when the entry is known ``gone`` (removed, or asked for and
    absent); objects under the markers' directory that are no marker go as junk. How many markers
    were removed."""
    out = _Removals(objects, tally)
    judge = prune_markers.Judge(objects.reader)
    for meta in objects.reader.listing(MARKER_DIR, names=MARKER_NAMES):
        path = str(meta["path"])
        m = MARKER_NAME.fullmatch(path.rpartition("/")[2])
        if m is None or path.count("/") != MARKER_DIR.count("/") + 1:
            out.junk.append(path)
        else:
            entry = kept.get(m.group(1))
            if entry is None:
                if complete or m.group(1) in gone:
                    out.doomed.append(path)
            elif epoch(meta) < entry.written - MARKER_SLACK_S:
                out.doomed.append(path)
            else:
                out.doomed.extend(judge.doomed(m.group(1), m.group(2), path, entry.size))
        out.flush()
    return out.finish()


def _sweep(
    objects: BucketObjects,
    prefix: str,
    names: Names,
    verdict: Callable[[Any], str | None],
    tally: Tally,
) -> int:
    """The objects listed under ``prefix`` that ``verdict`` calls ``"doomed"`` deleted, and
    those it calls ``"junk"`` (nothing xla_pcache writes there) removed as junk, a batch
    at a time as they are listed, so that what is held does not grow with the listing.
    How many doomed were deleted."""
    out = _Removals(objects, tally)
    for meta in objects.reader.listing(prefix, names=names):
        kind = verdict(meta)
        if kind == "junk":
            out.junk.append(str(meta["path"]))
        elif kind == "doomed":
            out.doomed.append(str(meta["path"]))
        out.flush()
    return out.finish()


class _Removals:
    """What a sweep of a listing removes: ``doomed`` objects deleted and ``junk`` removed
    (``BucketObjects.remove_junk``) a batch at a time as the listing goes, so that what is
    held does not grow with it."""

    def __init__(self, objects: BucketObjects, tally: Tally) -> None:
        self.objects = objects
        self.tally = tally
        self.doomed: list[str] = []
        self.junk: list[str] = []
        self.removed = 0

    def flush(self, *, final: bool = False) -> None:
        """Removes what is held once a batch is full (all of it when ``final``)."""
        if final or len(self.doomed) >= DELETE_BATCH:
            self.removed += len(self.doomed)
            self.objects.delete(self.doomed)
            self.doomed = []
        if (final and self.junk) or len(self.junk) >= DELETE_BATCH:
            self.objects.remove_junk(self.junk, self.tally)
            self.junk = []

    def finish(self) -> int:
        """Removes the rest; how many doomed objects were deleted in all."""
        self.flush(final=True)
        return self.removed
