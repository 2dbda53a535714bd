"""What a prune whose listing of ``entries/`` was cut short reaches by name.

S3, GCS and Azure keep keys that the client refuses, and one such key in a page hides that
whole page (``listing.py``): a single key planted right after the last entry hides every
entry of a bucket under 1,000 entries, and no listing through the client sees past it. The
fleet names its entries elsewhere, though: each host's use records name the entries it
used and wrote, ``usage`` those earlier prunes folded, and torch_xla's markers theirs. So
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

from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from xla_pcache._names import entry_name_or_none
from xla_pcache.bucket.layout import MARKER_NAME, MARKER_NAMES, TORCH_XLA_DIR, epoch
from xla_pcache.bucket.objects import BucketObjects
from xla_pcache.bucket.prune_fold import ASK_THREADS, Entry, UsageBody, check, usage_lines
from xla_pcache.bucket.reader import BucketReader, Listing, Meta, listed_size
from xla_pcache.bucket.use_record import UseRecord, use_record_lines
from xla_pcache.tiers import objstore

# The sources of names, in the order they take turns.
KINDS = ("records", "usage", "markers")
# Objects of ``torch_xla/`` a prune cut short lists for their names (a request a thousand),
# as many as a torch_xla host start lists.
MARKERS_LISTED = 10_000
# Lines of ``usage`` of names a prune cut short could neither see nor rule out, carried into
# the ``usage`` it writes (about 25 bytes each, gzip, while it is made).
CARRY_LINES = 100_000

Rank = tuple[float, float, str]


class Unseen:
    """Names of entries that a listing did not see (not in ``listed``), offered by source
    (``KINDS``) with a rank (lower first); at most ``bound`` kept a source, so that what it
    holds does not grow with what was planted. ``names`` gives those to ask, in turn."""

    def __init__(self, listed: Mapping[str, Entry], bound: int) -> None:
        self.listed = listed
        self.bound = bound
        self._held: dict[str, list[tuple[Rank, str]]] = {k: [] for k in KINDS}

    def offer(self, kind: str, rank: Rank, name: str) -> None:
        if self.bound <= 0 or name in self.listed:
            return
        held = self._held[kind]
        held.append((rank, name))
        if len(held) >= 2 * self.bound:
            self._trim(held)

    def _trim(self, held: list[tuple[Rank, str]]) -> None:
        """``held``: each name once, at its lowest rank, the ``bound`` lowest."""
        best: dict[str, Rank] = {}
        for rank, name in held:
            if name not in best or rank < best[name]:
                best[name] = rank
        held[:] = sorted((r, n) for n, r in best.items())[: self.bound]

    def names(self) -> list[str]:
        """At most ``bound`` names to ask, the sources taking turns, each name once and
        past the gate of listed names."""
        queues = []
        for kind in KINDS:
            held = self._held[kind]
            self._trim(held)
            queues.append(deque(n for _, n in held))
        out: list[str] = []
        taken: set[str] = set()
        while len(out) < self.bound and any(queues):
            for q in queues:
                while q:
                    name = q.popleft()
                    if name not in taken and entry_name_or_none(name) is not None:
                        taken.add(name)
                        out.append(name)
                        break
                if len(out) >= self.bound:
                    break
        return out


def offer_markers(reader: BucketReader, unseen: Unseen) -> None:
    """The entries named by the markers among the first ``MARKERS_LISTED`` objects of
    ``torch_xla/`` (a marker is written right after its entry: its time, the oldest first)."""
    listing = Listing(TORCH_XLA_DIR, MARKERS_LISTED, MARKER_NAMES, skip_junk=True)
    depth = TORCH_XLA_DIR.count("/") + 1
    for meta in reader.listing_of(listing):
        path = str(meta["path"])
        m = MARKER_NAME.fullmatch(path.rpartition("/")[2])
        if m is not None and path.count("/") == depth:
            unseen.offer("markers", (epoch(meta), 0.0, ""), m.group(1))


@dataclass
class Reach:
    """What a prune cut short reached by name: ``entries`` found (with their uses once
    ``fold_again`` ran), the names ``absent`` (asked, no such object), how many it
    ``asked``; after ``fold_again``: the records ``resolved`` (each name listed, reached or
    absent: folded), and ``usage``, the new one begun with the lines carried."""

    entries: dict[str, Entry] = field(default_factory=dict)
    absent: set[str] = field(default_factory=set)
    asked: int = 0
    resolved: list[str] = field(default_factory=list)
    usage: UsageBody = field(default_factory=UsageBody)


def ask(
    objects: BucketObjects, names: list[str], deadline: float | None, threads: int = ASK_THREADS
) -> Reach:
    """A HEAD of ``entries/<name>`` for each of ``names``, ``threads`` at a time: what
    exists (its size and time from the answer, through the listing's gate) is reached,
    what does not is absent; a request that fails is neither (one warning)."""
    reader = objects.reader
    out = Reach(asked=len(names))

    def one(name: str) -> tuple[str, Meta | None, BaseException | None]:
        try:
            return name, reader.head(f"{objstore.ENTRY_DIR}/{name}"), None
        except Exception as e:
            return name, None, e

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="xla_pcache-prune-ask") as pool:
        step = max(1, threads) * 16
        for i in range(0, len(names), step):
            check(deadline)
            for name, meta, err in pool.map(one, names[i : i + step]):
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
