"""How a host start lists the markers it follows (``layout``, "marker"; a framework's
adapter decides what it fetches by them), so that objects others plant there cannot crowd
the real markers out.

A marker vouches for nothing: anyone who can write the bucket plants one, empty, under any
name. What a host can check costs nothing (its key's entry name is the marker's, under
this host's build); what it cannot is whether the entry exists, and a listing in key order
capped at ``PULL_MARKERS`` objects is crowded out by that many objects planted before the
real ones. So a start that finds more markers than it can follow blindly, or a listing cut
short, lists what does exist instead: the entries (``entries/``, a request per 1,000), and
then the markers of those entries only, a page at a time from one listed entry's name to
the next (``markers_of``): a range of the directory that holds no listed entry's markers is
jumped over whatever it holds, and an entry whose markers fill more than
``GROUP_PAGES`` pages (an entry has one key, so one marker: the rest were planted) is
left for the end, so that it costs the others nothing. Where the pages run out (markers
planted by the thousand under many entries' names), the entries whose markers were not all
listed are named (``Markers.crowded``): the start asks for those entries themselves, whose
files name their own keys (``_core.entry_head_key``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from xla_pcache._names import EntryName
from xla_pcache.bucket.layout import MARKER_DIR, MARKER_NAME, MARKER_NAMES, epoch
from xla_pcache.bucket.listing import LIST_PAGE, MAX_RECOVERIES, MAX_UNLISTABLE, Listing
from xla_pcache.bucket.reader import BucketReader

# A start's listing of the markers of listed entries: at most this many pages in all, and
# this many pages of one entry's markers before the others are listed.
MARKER_PAGES = 100
GROUP_PAGES = 2


@dataclass
class Markers:
    """Markers found: (entry name, tag, when marked), and whether the
    listing saw every marker of the entries it was given (``complete``); when it did not,
    the entries whose markers it may have missed (``crowded``, sorted)."""

    found: list[tuple[EntryName, str, float]] = field(default_factory=list)
    complete: bool = True
    pages: int = 0
    crowded: list[str] = field(default_factory=list)


def markers_of(reader: BucketReader, names: Sequence[str], *, pages: int = MARKER_PAGES) -> Markers:
    """The markers of the entries ``names`` (sorted) in the markers' directory, listed through
    ``reader`` (a ``BucketReader``) a page at a time: each page starts at the next entry
    of ``names`` not yet covered, so whatever lies between two of them costs nothing past
    the page that reached it. At most ``pages`` pages, one entry's markers ``GROUP_PAGES``
    pages at a time; the refused keys and recoveries of one listing (``listing``)
    among them all."""
    out = Markers()
    wanted = set(names)
    refused = recovered = 0
    deferred: list[str] = []  # where an entry's markers go on, when they filled its pages
    group, group_pages = "", 0
    i = 0
    sweeping = True  # not yet on to the entries left for the end
    start: str | None = names[0] if names else None
    while start is not None or deferred:
        if start is None:
            start = deferred.pop(0)
            group, group_pages = start[:32], 0
            sweeping = False
        if out.pages >= pages or refused > MAX_UNLISTABLE:
            out.complete = False
            out.crowded = _not_listed(names, start, deferred, sweeping)
            break
        listing = Listing(
            MARKER_DIR,
            LIST_PAGE,
            MARKER_NAMES,
            start=start,
            budget=MAX_UNLISTABLE - refused,
            recoveries=MAX_RECOVERIES - recovered,
            skip_junk=True,
        )
        last = ""
        for meta in reader.listing_of(listing):
            rel = str(meta["path"]).rpartition("/")[2]
            last = max(last, rel)
            m = MARKER_NAME.fullmatch(rel)
            if m is not None and m.group(1) in wanted:
                out.found.append((EntryName(m.group(1)), m.group(2), epoch(meta)))
        out.pages += 1
        refused += listing.refused
        recovered += listing.recovered
        if not listing.complete and not listing.capped:
            # Keys the client cannot list hid part of that page: which entries' markers
            # they hid is not known, so each from where it began on may be one.
            out.complete = False
            hidden = _not_listed(names, start, deferred, sweeping)
            out.crowded = sorted({*out.crowded, *hidden})
        if not listing.capped:
            start = None  # the end of the directory
            i = len(names)
            continue
        head = last[:32]
        if head in wanted and head == group:
            group_pages += 1
        else:
            group, group_pages = head, 1
        if head in wanted and group_pages < GROUP_PAGES:
            start = last  # the same entry's markers go on
            continue
        if head in wanted:
            deferred.append(last)  # planted after its marker (or before): for the end
        i = bisect.bisect_right(names, head, i)
        start = names[i] if i < len(names) else None
    return out


def _not_listed(names: Sequence[str], start: str, deferred: list[str], sweeping: bool) -> list[str]:
    """The entries of ``names`` whose markers a listing stopped at ``start`` (a page's
    first key) has not all seen: the one ``start`` is in, those after it while the first
    sweep through ``names`` was still on (``sweeping``), and those left for the end
    (``deferred``)."""
    left = {d[:32] for d in deferred}
    at = bisect.bisect_left(names, start[:32])
    if sweeping:
        left.update(names[at:])
    elif at < len(names) and names[at] == start[:32]:
        left.add(names[at])
    return sorted(left)
