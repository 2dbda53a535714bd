"""What a prune whose listing of ``entries/`` was cut short reaches by name.

S3, GCS and Azure keep keys that the client refuses, and one such key in a page hides that
whole page (``listing.py``): a single key planted right after the last entry hides every
entry of a bucket under 1,000 entries, and no listing through the client sees past it. The
fleet names its entries elsewhere, though: each host's use records name the entries it
used and wrote, ``usage`` those earlier prunes folded, and the markers theirs. So
when the listing was cut short, the prune offers every name those give that it did not list
to ``Unseen``, asks for the chosen ones by name, a HEAD each (``ask``), and prunes among
what it listed and what it reached.

Those names are untrusted (a planted record names anything): they are names to ask about,
nothing more. Each passes the gate of listed names (``entry_name_or_none``), and at most
``Limits.asks`` are asked a prune, found or not. Which go first: the oldest use first
within each source, the sources taking turns (records, ``usage``, markers), and among the
records each record its own turns (a name of each, the oldest record first, then a second
of each, ...), so that no one planted object, and no flood of one kind, takes the whole
bound from the others.

A second pass over the records and ``usage`` then folds the uses of the entries reached (a
name's uses may lie anywhere in them). It also lets the prune keep going while the key
stays: a record whose every name was listed, reached or found absent is folded, and goes,
once ``usage`` holds it; ``usage`` is rewritten with the entries' uses and, carried as
read, the lines of names it could neither see nor rule out (at most ``CARRY_LINES``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from xla_pcache._names import entry_name_or_none
from xla_pcache.bucket.layout import MARKER_DIR, MARKER_NAME, MARKER_NAMES, epoch
from xla_pcache.bucket.objects import BucketObjects
from xla_pcache.bucket.prune_fold import ASK_THREADS, Entry, UsageBody, check, usage_lines
from xla_pcache.bucket.reader import BucketReader, Listing, Meta, listed_size
from xla_pcache.bucket.use_record import UseRecord, use_record_lines
from xla_pcache.tiers import objstore

# The sources of names, in the order they take turns.
KINDS = ("records", "usage", "markers")
# Objects of the markers' directory a prune cut short lists for their names (a request a
# thousand), as many as a host start that follows them lists.
MARKERS_LISTED = 10_000
# Lines of ``usage`` of names a prune cut short could neither see nor rule out, carried into
# the ``usage`` it writes (about 25 bytes each, gzip, while it is made).
CARRY_LINES = 100_000

# The records' second order, drawn for each prune (``Unseen``).
DRAWN = "records-drawn"
# A record whose name was found earns its next names this many turns, before any other.
GRANT = 2
# Names a record read again for them gives at least (more, 4 a turn it has earned).
REREAD_NAMES = 64
# Bytes of records read again for their names, at most, a prune (as many as it folds).
REREAD_BYTES = 256 << 20

Rank = tuple[float, float, str]


class Unseen:
    """Names of entries that a listing did not see (not in ``listed``), offered by source
    (``KINDS``) with a rank (lower first); at most ``bound`` kept a source, so that what it
    holds does not grow with what was planted. ``names`` gives those to ask, in turn.

    A record's names are ranked (place in it, its service time, its path): a name of each
    record before any record's second. The records take those turns twice over, kept
    apart: the oldest first (a record planted later cannot go before a host's earlier
    one) and, alternately, in an order drawn for this prune (records planted earlier
    cannot know which go first)."""

    def __init__(self, listed: Mapping[str, Entry], bound: int) -> None:
        self.listed = listed
        self.bound = bound
        self._held: dict[str, list[tuple[Rank, str]]] = {k: [] for k in (*KINDS, DRAWN)}
        self._salt = secrets.token_bytes(16)

    def offer(self, kind: str, rank: Rank, name: str) -> None:
        if self.bound <= 0 or name in self.listed:
            return
        self._hold(kind, rank, name)
        if kind == "records":
            place, _, path = rank
            self._hold(DRAWN, (place, self._drawn(path), path), name)

    def _hold(self, kind: str, rank: Rank, name: str) -> None:
        held = self._held[kind]
        held.append((rank, name))
        if len(held) >= 2 * self.bound:
            self._trim(held)

    def _drawn(self, path: str) -> float:
        """The record's place in this prune's drawn order: the same for each of its names,
        not known to whoever wrote it."""
        digest = hashlib.blake2b(path.encode(), key=self._salt, digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2.0**64

    def _trim(self, held: list[tuple[Rank, str]]) -> None:
        """``held``: each name once, at its lowest rank, the ``bound`` lowest."""
        best: dict[str, Rank] = {}
        for rank, name in held:
            if name not in best or rank < best[name]:
                best[name] = rank
        held[:] = sorted((r, n) for n, r in best.items())[: self.bound]

    def _queue(self, kind: str) -> deque[tuple[str, str | None]]:
        held = self._held[kind]
        self._trim(held)
        return deque((n, r[2] if kind in ("records", DRAWN) else None) for r, n in held)

    def names(self) -> list[tuple[str, str | None]]:
        """At most ``bound`` names to ask, the sources taking turns, each name once and
        past the gate of listed names; each with the record that named it (None: ``usage``
        or a marker)."""
        aged, drawn = self._queue("records"), self._queue(DRAWN)
        records: deque[tuple[str, str | None]] = deque()
        while aged or drawn:
            for q in (aged, drawn):
                if q:
                    records.append(q.popleft())
        queues = [records, self._queue("usage"), self._queue("markers")]
        out: list[tuple[str, str | None]] = []
        taken: set[str] = set()
        while len(out) < self.bound and any(queues):
            for q in queues:
                while q:
                    name, path = q.popleft()
                    if name not in taken and entry_name_or_none(name) is not None:
                        taken.add(name)
                        out.append((name, path))
                        break
                if len(out) >= self.bound:
                    break
        return out


def offer_markers(reader: BucketReader, unseen: Unseen) -> None:
    """The entries named by the markers among the first ``MARKERS_LISTED`` objects of
    the markers' directory (a marker is written right after its entry: its time, the oldest
    first)."""
    listing = Listing(MARKER_DIR, MARKERS_LISTED, MARKER_NAMES, skip_junk=True)
    depth = MARKER_DIR.count("/") + 1
    for meta in reader.listing_of(listing):
        path = str(meta["path"])
        m = MARKER_NAME.fullmatch(path.rpartition("/")[2])
        if m is not None and path.count("/") == depth:
            unseen.offer("markers", (epoch(meta), 0.0, ""), m.group(1))


@dataclass
class Reach:
    """What a prune cut short reached by name: ``entries`` found (with their uses once
    ``fold_again`` ran), the names ``absent`` (asked, no such object), how many it
    ``asked``, the records it ``reread`` for further names; after ``fold_again``: the
    records ``resolved`` (each name listed, reached or absent: folded), and ``usage``, the
    new one begun with the lines carried."""

    entries: dict[str, Entry] = field(default_factory=dict)
    absent: set[str] = field(default_factory=set)
    asked: int = 0
    reread: int = 0
    resolved: list[str] = field(default_factory=list)
    usage: UsageBody = field(default_factory=UsageBody)


class _Turns:
    """The order of the asks, adapted to what they find: ``order`` (``Unseen.names``),
    except that a record whose name was found earns its next ``GRANT`` names a turn before
    anything else (read again for them, within ``reread_bytes`` of records in all). A record
    of names of nothing thus costs a turn a round, a host's record naming the entries the
    listing missed is asked to its end, and a planted record earns a turn of its own only
    for an entry that exists (reached, which is what the asks are for)."""

    def __init__(
        self,
        reader: BucketReader,
        order: list[tuple[str, str | None]],
        listed: Mapping[str, Entry],
        records: Mapping[str, int],
        reread_bytes: int,
    ) -> None:
        self.reader = reader
        self.base = deque(order)
        self.listed = listed
        self.records = records
        self.reread_bytes = reread_bytes
        self.taken: set[str] = set()
        self.credit: dict[str, int] = {}
        self.front: dict[str, deque[str]] = {}
        self.ended: set[str] = set()  # read to its end, or past what may be read again
        self.hot: deque[str] = deque()
        self.reread = 0

    def found(self, path: str | None) -> None:
        if path is None or path not in self.records:
            return
        if self.credit.get(path, 0) <= 0:
            self.hot.append(path)
        self.credit[path] = self.credit.get(path, 0) + GRANT

    def next(self) -> tuple[str, str | None] | None:
        while self.hot:
            hot = self.hot[0]
            name = self._front(hot)
            if name is None:
                self.hot.popleft()
                continue
            self.credit[hot] -= 1
            if self.credit[hot] <= 0:
                self.hot.popleft()
            self.taken.add(name)
            return name, hot
        while self.base:
            name, path = self.base.popleft()
            if name not in self.taken:
                self.taken.add(name)
                return name, path
        return None

    def _front(self, path: str) -> str | None:
        """The record's next name not yet asked, read again for more when none is held."""
        front = self.front.setdefault(path, deque())
        while True:
            while front:
                name = front.popleft()
                if name not in self.taken:
                    return name
            if path in self.ended or self.records[path] > self.reread_bytes:
                self.ended.add(path)
                return None
            self.reread_bytes -= self.records[path]
            self.reread += 1
            want = max(REREAD_NAMES, 4 * self.credit[path])
            for name in use_record_lines(self.reader, path):
                if (
                    name not in self.taken
                    and name not in self.listed
                    and entry_name_or_none(name) is not None
                ):
                    front.append(name)
                    if len(front) >= want:
                        break
            else:
                self.ended.add(path)
            if not front:
                self.ended.add(path)
                return None


def ask(
    objects: BucketObjects,
    unseen: Unseen,
    deadline: float | None,
    threads: int = ASK_THREADS,
    records: Mapping[str, int] | None = None,
    reread_bytes: int = REREAD_BYTES,
) -> Reach:
    """A HEAD of ``entries/<name>`` for at most ``unseen.bound`` names, ``threads`` at a
    time, in turns (``_Turns``: ``unseen.names()``, and further names of the ``records``,
    path to size, whose names were found): what exists (its size and time from the answer,
    through the listing's gate) is reached, what does not is absent; a request that fails
    is neither (one warning)."""
    reader = objects.reader
    out = Reach()
    turns = _Turns(reader, unseen.names(), unseen.listed, records or {}, reread_bytes)

    def one(name: str) -> tuple[str, Meta | None, BaseException | None]:
        try:
            return name, reader.head(f"{objstore.ENTRY_DIR}/{name}"), None
        except Exception as e:
            return name, None, e

    width = max(1, threads)
    with ThreadPoolExecutor(width, thread_name_prefix="xla_pcache-prune-ask") as pool:
        pending: dict[Future[tuple[str, Meta | None, BaseException | None]], str | None] = {}
        try:
            while True:
                while len(pending) < width and out.asked < unseen.bound:
                    nxt = turns.next()
                    if nxt is None:
                        break
                    out.asked += 1
                    pending[pool.submit(one, nxt[0])] = nxt[1]
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                check(deadline)
                for future in done:
                    path = pending.pop(future)
                    name, meta, err = future.result()
                    if err is not None:
                        reader.skip(
                            "ask-failed",
                            f"asking for an entry by name failed ({type(err).__name__}: "
                            f"{objstore.scrub(str(err))}): not taken as absent",
                        )
                    elif meta is None:
                        out.absent.add(name)
                    else:
                        size = listed_size(meta)
                        if size is not None:
                            written = epoch(meta)
                            out.entries[name] = Entry(size, written, written)
                            turns.found(path)
        finally:
            for future in pending:
                future.cancel()
    out.reread = turns.reread
    return out


def fold_again(
    reader: BucketReader,
    reach: Reach,
    listed: Mapping[str, Entry],
    records: Iterable[tuple[UseRecord, int]],
    usage_missed: int,
    deadline: float | None,
) -> None:
    """The second pass: ``usage`` and the ``records`` (each with how many names of no
    listed entry it met in the first pass) folded into ``reach.entries``; the records whose
    every name is listed, reached or absent noted ``resolved``; ``usage``'s lines of names
    neither listed, reached nor absent carried into ``reach.usage`` (``CARRY_LINES`` at
    most: the rest are dropped, counted)."""
    reached = reach.entries

    def known(name: str) -> bool:
        return name in listed or name in reached or name in reach.absent

    if usage_missed:
        dropped = 0
        for name, when, uses in usage_lines(reader):
            entry = reached.get(name)
            if entry is not None:
                entry.last_use = max(entry.last_use, when)
                entry.uses = max(entry.uses, uses)
            elif not known(name):
                if reach.usage.carried < CARRY_LINES:
                    reach.usage.carry(name, when, uses)
                else:
                    dropped += 1
        if dropped:
            reader.skip(
                "usage-carried",
                f"usage names more than {CARRY_LINES:,} entries a prune cut short could "
                "not reach: the rest of their uses are dropped",
                dropped,
            )
    for record, missed in records:
        if not missed:
            reach.resolved.append(record.path)  # every name it holds was listed
            continue
        check(deadline)
        # As ``fold_use_record``: a name it repeats counts once.
        seen: set[str] = set()
        resolved = True
        for name in use_record_lines(reader, record.path):
            entry = reached.get(name)
            if entry is None:
                resolved = resolved and known(name)
            elif name not in seen:
                seen.add(name)
                entry.last_use = max(entry.last_use, record.when)
                entry.uses = min(entry.uses + 1, (1 << 63) - 1)
        if resolved:
            reach.resolved.append(record.path)
