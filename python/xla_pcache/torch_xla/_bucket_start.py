"""torch_xla's start on a bucket path: what a host fetches from the bucket before torch_xla
starts (``pull``: torch_xla looks only in its own directory, so the host copy must hold the
entries first), and in what order, so that objects others plant cannot steer it away from
the real entries, at a cost bounded whatever they planted. It reaches the bucket through
what the bucket exposes to any framework (``bucket.BucketStore``: its store, its upkeep
``Bucket`` and the markers there), never by a method's name.

Markers are untrusted: anyone who can write the bucket plants one, empty, under any name,
and garbage at a made-up graph's entry name beside it. A writer marks each name it put an
entry under: the plain one and, when it signs, its signer's own (so that hosts trusting
that signer still find the entry when the plain name holds something else). A start lists
at most ``PULL_MARKERS`` objects under ``torch_xla/``; a marker whose name is none of its
graph's entry names under this build for this host (the plain one, a trusted signer's own)
costs nothing more. When that listing was cut short or names more
than ``PULL_MISSES`` entries to fetch, it follows only markers of entries that exist (the
entries listed, then their markers: ``bucket.marker_listing.markers_of``), and an entry whose
markers that listing could not finish (planted by the thousand under its name) is asked for
by name: the first bytes of its file name its key (the core verifies the whole file when it
is fetched), and only a key of a torch_xla graph of this build is fetched; any other is
refused and counted.

The order of the fetches is what a planted flood cannot predict. Newest first, until
``PULL_MISSES`` fetches found no entry, or half the fetches (``PULL_FETCHES``) or half the
store's room went (what a start with nothing planted does: the newest entries first, within
the store's budget; entries planted newer than the real ones that verify are no misses, and
take only that half); then the rest, and the entries asked for by
name, in an order drawn afresh for each start (``random.SystemRandom``), until the fetches
there that found nothing reach ``PULL_MISSES`` plus the entries fetched there. Any fixed order
(newest first, then oldest first) is beaten by one more planted object than the refusals it
allows, put where it looks first; a drawn one is not. With ``p`` planted objects among the
rest beside ``r`` real entries, the start fetches at least one real entry unless its first
``PULL_MISSES`` draws were all planted (a chance below ``(p / (p + r)) ** PULL_MISSES``),
and a share of them in proportion past that; with ``p`` at most ``PULL_MISSES`` that is the
only way it stops early, so it fetches every real entry but with a chance of
``1 / C(p + r, r)`` (32 planted, 20 real: 8e-15). What a start costs is bounded all the
same: at most ``PULL_FETCHES`` fetches, of which at most ``2 * PULL_MISSES`` plus one per
entry fetched in the drawn order find nothing.

What a start proves to be garbage a writing host removes (``_bucket_garbage``: an object
no reader would serve, by the core's verdict given to the fetch that met it, with the
marker it followed, at most ``PULL_REMOVALS`` a start), so a planted flood drains across the
fleet's starts. A later release's entry is no garbage: it is a miss, and left.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable

from xla_pcache import _core
from xla_pcache._names import EntryName
from xla_pcache._text import package_logger
from xla_pcache.bucket import BucketStore
from xla_pcache.bucket.layout import HEAD_BYTES
from xla_pcache.bucket.upkeep import Bucket
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.torch_xla._bucket_garbage import Garbage

log = package_logger("xla_pcache")

# What a torch_xla host start may cost at most: objects of ``torch_xla/`` listed (one request
# a thousand), entries fetched, fetches that found no entry newest first (and past them, as
# many more plus one per entry fetched in a drawn order); and, when it cannot follow the
# markers blindly, objects of ``entries/`` listed (then the markers of those entries,
# ``marker_listing.MARKER_PAGES`` pages at most).
PULL_MARKERS = 10_000
PULL_FETCHES = 1_000
PULL_MISSES = 32
PULL_ENTRIES = 100_000
# The names asked for that may lead a start to a key it holds or fetched, no miss, besides
# those it reads the key under: signers' own names it does not trust.
NAMES_A_KEY = 2
_GRAPH = re.compile(r"[0-9]{1,40}")  # torch_xla's file names, as a marker carries them

Marked = list[tuple[EntryName, str, float]]
# A fetch to try: a key (from a marker), or an entry name (its markers crowded out).
_Item = tuple[str, bool]


def pull(store: BucketStore, key_of: Callable[[str], str]) -> int:
    """Fetches into ``store`` (a bucket path's) the bucket's torch_xla entries of the keys
    ``key_of`` makes of torch_xla's file names that it lacks, within its budget (the
    module's docstring says which, in what order, at what cost). Returns how many."""
    try:
        bucket = store.bucket()
        marked, listing = bucket.markers(limit=PULL_MARKERS)
        wanted = _wanted(store, marked, key_of)
        by_name: list[str] = []
        if not listing.complete or len(wanted) > PULL_MISSES:
            wanted, by_name = _wanted_existing(store, bucket, marked, key_of)
    except Exception as e:
        from xla_pcache.tiers import redact

        log.warning(
            "xla_pcache: listing torch_xla's entries in %s failed (%s); this host starts "
            "with what it has",
            redact(store.bucket_url),
            type(e).__name__,
        )
        return 0
    return _Fetches(store, bucket, key_of).run(wanted, by_name)


def _wanted(store: BucketStore, marked: Marked, key_of: Callable[[str], str]) -> list[str]:
    """The keys of the markers ``marked`` (newest first) that name one of their graph's
    entry names under this build (the plain one, a trusted signer's own) and that
    ``store`` lacks, each once."""
    out: dict[str, None] = {}
    for name, graph, _when in marked:
        key = key_of(graph)
        if key not in out and _vouches(store, name, key) and key not in store:
            out[key] = None
    return list(out)


def _vouches(store: BucketStore, name: str, key: str) -> bool:
    """Whether a marker of entry ``name`` leads ``store`` to ``key``: ``name`` is one the
    store reads an entry of ``key`` under (a signer's own only when it trusts that signer:
    a host that trusts none follows the plain names only, at no cost for the others)."""
    return name in store.entry_names(key)


def _wanted_existing(
    store: BucketStore, bucket: Bucket, marked: Marked, key_of: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """``_wanted`` of the markers of entries that exist (newest first), found from a
    listing of the entries, then those of entries that listing did not see (when it was
    cut short: they cost a request each, within the misses' cap); and the names of the
    listed entries whose markers the listing of markers could not finish, with no marker
    of this build found (asked for by name)."""
    entries, listing = bucket.listed_entries(limit=PULL_ENTRIES)
    found = bucket.markers_of(sorted(entries))
    every = sorted(found.found + marked, key=lambda t: t[2], reverse=True)
    known = _wanted(store, [t for t in every if t[0] in entries], key_of)
    unseen = (
        []
        if listing.complete
        else _wanted(store, [t for t in marked if t[0] not in entries], key_of)
    )
    vouched = {name for name, graph, _ in every if _vouches(store, name, key_of(graph))}
    by_name = [n for n in found.crowded if n not in vouched]
    if not (listing.complete and found.complete):
        crowded = f", {len(by_name)} entries asked for by name" if by_name else ""
        bucket.reader.skip(
            "torch_xla-cut-short",
            "a host start's listing of the bucket's entries or of their markers was cut "
            f"short ({listing.cut_short() or 'its markers'}): it fetches what it found"
            f"{crowded}",
        )
    return known + unseen, by_name


class _Fetches:
    """One start's fetches: newest first, then the rest in a drawn order."""

    def __init__(self, store: BucketStore, bucket: Bucket, key_of: Callable[[str], str]) -> None:
        self.store, self.bucket, self.key_of = store, bucket, key_of
        self.graph_of = graph_reader(key_of)
        self.garbage = Garbage(store, bucket)
        self.tried: set[str] = set()  # the keys fetched this start, found or not
        self.repeats: Counter[str] = Counter()  # names asked for that led to them again

    def run(self, wanted: list[str], by_name: list[str]) -> int:
        try:
            return self._run(wanted, by_name)
        finally:
            self.garbage.report()

    def _run(self, wanted: list[str], by_name: list[str]) -> int:
        budget, used = self.store.max_size, self.store.stats()["bytes"]
        # Newest first takes at most half the fetches and half the room: entries planted
        # newer than the real ones that verify are no misses, and would take it all.
        newest_until = None if budget is None else used + max(budget - used, 0) // 2
        fetched = attempts = misses = 0
        newest: list[_Item] = [(k, False) for k in reversed(wanted)]  # popped from the end
        drawn: list[_Item] | None = None  # what is left once newest first stopped
        late = 0  # entries fetched in the drawn order
        while True:
            if drawn is None and (
                not newest
                or misses >= PULL_MISSES
                or attempts >= PULL_FETCHES // 2
                or (newest_until is not None and used >= newest_until)
            ):
                drawn = newest + [(n, True) for n in by_name]
                random.SystemRandom().shuffle(drawn)
                misses = 0
            left = newest if drawn is None else drawn
            if not left:
                break
            if attempts >= PULL_FETCHES or (drawn is not None and misses >= PULL_MISSES + late):
                self._cut_short(len(left) + (len(by_name) if drawn is None else 0))
                break
            attempts += 1
            blob, missed = self._fetch(left.pop())
            misses += missed
            if blob is None:
                continue
            used += len(blob)
            fetched += 1
            late += drawn is not None
            if budget is not None and used > budget:
                break
        return fetched

    def _cut_short(self, left: int) -> None:
        self.bucket.reader.skip(
            "torch_xla-markers",
            f"a host start fetches at most {PULL_FETCHES} torch_xla entries, and stops once "
            f"{PULL_MISSES} fetches newest first and {PULL_MISSES} more (plus one per entry "
            f"fetched there) in a drawn order found no entry: {left} were not fetched",
        )

    def _fetch(self, item: _Item) -> tuple[_core.Blob | None, bool]:
        """The entry ``item`` names, fetched into the store, or None; and whether that was
        a miss (nothing of this build's torch_xla there)."""
        what, named = item
        key = self._key_named(what) if named else what
        if key is None:
            return None, True
        if key in self.store or key in self.tried:
            # This host has it, or this start fetched it already: asked for by name with
            # its marker crowded out, or under another of its names (a signer's own): a
            # second fetch would GET it again, and count it twice when found. No miss for
            # the names this host reads the key under (the plain one, a trusted signer's
            # own: one each, whatever the fleet's signers, and a held key's are all
            # repeats), nor for NAMES_A_KEY others (signers' own it does not trust); past
            # them, a name that leads to the key again is one, or headers forged by the
            # thousand naming one key would take every try of every start.
            if named and not _vouches(self.store, what, key):
                self.repeats[key] += 1
                return None, self.repeats[key] > NAMES_A_KEY
            return None, False
        self.tried.add(key)
        blob, fetched = self.store.fetch(key)
        proved = self.garbage.proved(fetched)
        if proved:
            graph = None if named else self.graph_of(key)
            self.garbage.remove(proved, graph=graph, fetched=blob is not None)
        return blob, blob is None

    def _key_named(self, name: str) -> str | None:
        """The key the entry file ``name`` says it holds (its first bytes) when that is a
        torch_xla key of this build; None (refused, counted) otherwise. Whatever ``name``
        is, the key is then fetched under the names this host reads it under (the plain
        one, a trusted signer's own) and verified whole there: a copy under a signer's
        own name this host does not trust leads it to the plain copy, not to a miss, and a
        header forged under any name leads it to nothing a marker could not."""
        try:
            head = self.bucket.reader.first_bytes(f"{ENTRY_DIR}/{name}", HEAD_BYTES)
        except Exception:
            head = None
        key = None if head is None else _core.entry_head_key(head)
        if isinstance(key, str) and self.graph_of(key):
            return key
        self.bucket.reader.skip(
            "torch_xla-not-ours",
            "an entry a host start asked for by name (its markers crowded out by others) "
            "holds no torch_xla entry of this build: not fetched",
        )
        return None


def graph_reader(key_of: Callable[[str], str]) -> Callable[[str], str | None]:
    """torch_xla's file name in a key ``key_of`` makes, None for any other key. ``key_of``
    puts the name between a fixed head and tail (``torch_xla._keys.store_key``:
    ``torch_xla/`` and the build's suffix), read from two keys it makes; a name is taken
    only when ``key_of`` makes that very key of it."""
    one, two = key_of("1"), key_of("2")
    cut = next((i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b), len(one))
    head, tail = one[:cut], one[cut + 1 :]

    def graph_of(key: str) -> str | None:
        if len(key) <= len(head) + len(tail) or not (key.startswith(head) and key.endswith(tail)):
            return None
        graph = key[len(head) : len(key) - len(tail)]
        return graph if _GRAPH.fullmatch(graph) and key_of(graph) == key else None

    return graph_of
