"""What a bucket's prune reads, and its limits: the entries listed, with what the hosts'
records and ``usage`` (``<name> <last use> <uses>`` a line, gzip: the records earlier
prunes folded) say of their use, folded into them as they stream, so that names of no entry
cost nothing (or, when the listing was cut short, go to ``prune_reach.Unseen``, which holds
a bounded number) and a prune's memory is that of the entries it lists."""

from __future__ import annotations

import heapq
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from xla_pcache._names import entry_name_or_none
from xla_pcache.bucket.layout import (
    RECORD_NAMES,
    USAGE,
    USAGE_LINE,
    USE_RECORD_DIR,
    epoch,
)
from xla_pcache.bucket.objects import DELETE_BATCH, BucketObjects, Tally
from xla_pcache.bucket.reader import (
    LIST_PAGE,
    MAX_USAGE,
    MAX_USE_RECORD,
    BucketReader,
    Listing,
    checked_count,
    checked_time,
    listed_size,
)
from xla_pcache.bucket.use_record import UseRecord, parse_use_record, use_record_lines
from xla_pcache.tiers import objstore

# The entries a prune whose listing of ``entries/`` was cut short asks for by name at most
# (a HEAD each, found or not: ``prune_reach.py``), and how many at a time.
ASK_BOUND = 2_000
ASK_THREADS = 16


@dataclass(frozen=True)
class Limits:
    """What one prune reads at most: ``records`` records (by count and ``record_bytes`` in
    all; the rest wait for the next prune), ``entries`` objects under ``entries/`` (None:
    all; past it the prune removes what the budget requires among those it listed and says
    it was cut short), ``asks`` names of entries it did not list, asked for by name when
    its listing was cut short (a HEAD each), and ``seconds`` from its start (None: no
    deadline; past it the prune stops where it is and removes nothing more)."""

    records: int = 10_000
    record_bytes: int = 256 << 20
    entries: int | None = None
    asks: int = ASK_BOUND
    seconds: float | None = None


# What a prune reads at most unless told otherwise (``xla-pcache prune``).
PRUNE_LIMITS = Limits()
# A writer prunes inside the user's program (recorder.py): its memory is bounded by the
# entries it may hold (about 320 bytes each as measured, listing included: 80 MB at the cap;
# docs/remote.md), its time by a deadline, after which the program goes on and cron's
# `xla-pcache prune` is the way.
WRITER_LIMITS = Limits(entries=250_000, seconds=120.0)


@dataclass(slots=True)
class Entry:
    """One entry under ``entries/`` (its object is ``entries/<name>``): its size, when it
    was written and last used, uses. Small: a prune holds one per entry."""

    size: int
    written: float
    last_use: float
    uses: int = 0


class Deadline(Exception):
    """A prune past its ``Limits.seconds``."""


def check(deadline: float | None) -> None:
    """``Deadline`` once the monotonic clock is past ``deadline``."""
    if deadline is not None and time.monotonic() > deadline:
        raise Deadline


def entry_table(
    objects: BucketObjects, listing: Listing, deadline: float | None, tally: Tally | None
) -> dict[str, Entry]:
    """The objects under ``entries/`` that are entries, by name. Everything else there
    (a name no reader asks for) is left out, and with ``tally`` removed as it is found,
    so that it costs no memory."""
    out: dict[str, Entry] = {}
    start = f"{objstore.ENTRY_DIR}/"
    junk: list[str] = []
    for meta in objects.reader.listing_of(listing):
        path = str(meta["path"])
        name = entry_name_or_none(path.removeprefix(start))
        size = listed_size(meta)
        if name is None or size is None:
            if tally is not None:
                junk.append(path)
                if len(junk) >= DELETE_BATCH:
                    objects.remove_junk(junk, tally)
                    junk = []
        else:
            written = epoch(meta)
            out[name] = Entry(size, written, written)
        if deadline is not None and listing.listed % LIST_PAGE == 0:
            check(deadline)
    if junk:
        objects.remove_junk(junk, tally)
    return out


def use_records_to_fold(
    reader: BucketReader, limits: Limits, deadline: float | None
) -> tuple[list[UseRecord], list[str], int, Listing]:
    """The records a prune folds: the oldest by the service's time (``UseRecord.written``,
    which no writer sets), as many as ``limits.records`` and ``limits.record_bytes`` allow
    in all, so that those left for the next prune are newer than every one folded and
    records planted now, whatever their names, wait behind the hosts' earlier ones. Also
    the objects under ``records/`` that are no record or too large to read (removed), how
    many records wait, and how the listing of ``records/`` went (keys the client refuses
    may cut it short: the records past them are not folded, and the prune says so)."""
    chosen: list[_Newest] = []  # a heap, the newest on top
    cutoff: tuple[float, str] | None = None  # the oldest left: every one newer is left
    junk: list[str] = []
    left = 0
    total = 0
    listing = Listing(USE_RECORD_DIR, names=RECORD_NAMES)
    for i, meta in enumerate(reader.listing_of(listing)):
        if i % LIST_PAGE == 0:
            check(deadline)
        r = parse_use_record(meta)
        if r is None or r.size > MAX_USE_RECORD:
            if len(junk) < limits.records:
                junk.append(str(meta["path"]))
                if r is not None:
                    reader.skip(
                        "record-oversized", f"{r.path} is over {MAX_USE_RECORD} bytes: removed"
                    )
            else:
                left += 1
            continue
        key = (r.written, r.path)
        if cutoff is not None and key > cutoff:
            left += 1
            continue
        heapq.heappush(chosen, _Newest(key, r))
        total += r.size
        while chosen and (len(chosen) > limits.records or total > limits.record_bytes):
            newest = heapq.heappop(chosen)
            total -= newest.record.size
            left += 1
            cutoff = newest.key if cutoff is None else min(cutoff, newest.key)
    if left:
        reader.warn_once(
            "records-left",
            f"{left} records wait for the next prune (a prune folds at most "
            f"{limits.records:,} records, {limits.record_bytes:,} bytes, the oldest first)",
        )
    records = [n.record for n in sorted(chosen, key=lambda n: n.key)]
    return records, junk, left, listing


@dataclass(slots=True)
class _Newest:
    """A record in the heap of those chosen, the newest first."""

    key: tuple[float, str]
    record: UseRecord

    def __lt__(self, other: _Newest) -> bool:
        return self.key > other.key


class Offers(Protocol):
    """Where the names of entries a listing did not see go (``prune_reach.Unseen``)."""

    def offer(self, kind: str, rank: tuple[float, float, str], name: str) -> None: ...


def usage_lines(reader: BucketReader) -> Iterator[tuple[str, float, int]]:
    """``usage``'s lines, streamed and checked: (name, last use, uses); a line out of the
    bounds is counted and skipped."""
    bad = 0
    now = time.time()
    for m in reader.gzip_lines(USAGE, MAX_USAGE, "usage", USAGE_LINE):
        when = checked_time(float(m.group(2)), now)
        uses = checked_count(int(m.group(3)))
        if when is None or uses is None:
            bad += 1
            continue
        yield m.group(1).decode("ascii"), when, uses
    if bad:
        reader.skip("usage-lines", f"{USAGE} has lines prune does not write: skipped", bad)


def fold_usage(
    reader: BucketReader, entries: Mapping[str, Entry], unseen: Offers | None = None
) -> int:
    """What earlier prunes folded, streamed into ``entries`` (names of no entry cost
    nothing, or with ``unseen`` are offered to it). How many lines named no entry."""
    missed = 0
    for name, when, uses in usage_lines(reader):
        entry = entries.get(name)
        if entry is None:
            missed += 1
            if unseen is not None:
                unseen.offer("usage", (when, 0.0, ""), name)
            continue
        entry.last_use = max(entry.last_use, when)
        entry.uses = max(entry.uses, uses)
    return missed


def fold_use_record(
    reader: BucketReader,
    record: UseRecord,
    entries: Mapping[str, Entry],
    unseen: Offers | None = None,
    turns: int = 0,
) -> tuple[int, int]:
    """One record, streamed into ``entries``: each entry it names used once more, at its
    time (a name it repeats counts once; names of no entry cost nothing, or with
    ``unseen`` the first ``turns`` are offered to it, each at its turn within the record,
    the record's age its service time). How many names of no entry it met, and how many
    entries it named."""
    seen: set[str] = set()
    missed = 0
    for name in use_record_lines(reader, record.path):
        entry = entries.get(name)
        if entry is None:
            if unseen is not None and missed < turns:
                unseen.offer("records", (float(missed), record.written, record.path), name)
            missed += 1
            continue
        if name in seen:
            continue
        seen.add(name)
        entry.last_use = max(entry.last_use, record.when)
        entry.uses = min(entry.uses + 1, (1 << 63) - 1)
    return missed, len(seen)


class UsageBody:
    """A new ``usage``, gzip, made a piece at a time: ``carry`` lines first (of names the
    prune did not reach, as read), then ``finish`` a line per entry with uses, sorted."""

    def __init__(self) -> None:
        self._c = zlib.compressobj(6, zlib.DEFLATED, 31)
        self._out: list[bytes] = []
        self.carried = 0

    def carry(self, name: str, when: float, uses: int) -> None:
        self._out.append(self._c.compress(f"{name} {when:.3f} {uses}\n".encode()))
        self.carried += 1

    def finish(self, entries: Mapping[str, Entry]) -> bytes:
        c = self._c
        self._out += [
            c.compress(f"{n} {e.last_use:.3f} {e.uses}\n".encode())
            for n, e in sorted((n, e) for n, e in entries.items() if e.uses)
        ]
        self._out.append(c.flush())
        return b"".join(self._out)


def usage_body(entries: Mapping[str, Entry]) -> bytes:
    """``usage``: a line per entry with uses, sorted, gzip (made a piece at a time)."""
    return UsageBody().finish(entries)
