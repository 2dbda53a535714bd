"""How a directory of a bucket's upkeep is listed whatever was planted in it (the walk
``reader.BucketReader`` runs for every listing).

S3, GCS and Azure keep keys that the client (``object_store``) refuses: a ``//``, a ``.`` or
``..`` segment, a control character. The service lists them among the others and the
client refuses the page (1,000 keys) that holds one as a whole, naming only that key; such a
key can be neither read nor removed through the client. Nothing else of that page is seen.
So the walk:

- **resumes after a refused key** where the next name of ours could be (``Names.skip``):
  after every key that shares the refused key's start (``resume_after``), and past whatever
  lies between it and the next name xla_pcache writes there (an entry's 32 hex digits, a
  marker's, a record's ``r-``); a flood in one gap between names of ours (``entries/ab/...``,
  ``entries/./...``, names that are no hex) costs one refused page, whatever its size;
- **asks for the entry the refused key hides behind**: a key ``entries/<32 hex><anything>``
  sorts right after the entry ``entries/<32 hex>``, which shares its refused page, so that
  entry is asked for with a HEAD (an attacker who plants one such key after every entry
  costs each listing a page and a HEAD an entry, and hides none of them);
- **recovers the objects that shared a refused page** when at least a page of keys was
  listed before it (asking again from further back, a binary search: ``recover``);
- **gallops past a flood**: after ``GALLOP_AFTER`` refused keys in a row with no name of
  ours listed between them (an object asked for by name behind a refused key does not
  count: anyone can PUT one behind each key of a flood) it leaves the rest of that range for
  later and goes on from the middle of what is left, so that keys planted before (or
  around) the real entries cost a few probes, not one page each, before the entries after
  them are listed. The range left last is listed first (the one whose end the walk has just
  reached clean: where the flood ends and the entries begin), each the same way, which is a
  binary search for the flood's end; the ranges left are listed while the budget lasts;
- **lists with a delimiter** when the caller may hold a whole listing in memory (``prune``
  and ``stats`` from the command; never a program's own prune or a host start that lists
  markers,
  whose memory must not grow with what was planted): once ``DELIMIT_AFTER`` refused keys,
  or a refused page it could not recover, showed that every refused key so far has its bad
  part below a name (``entries/<32 hex>//x``), it lists the directory once with a
  delimiter, and the service rolls each such key into the common prefix
  ``entries/<32 hex>/``, which the client parses: every entry is seen, with a request per
  1,000 objects and prefixes, however many such keys there are. A key refused at the first
  level (a control character in the name itself, ``entries/.``) makes that listing fail as
  a whole too; the walk then goes on without it;
- **stops at a budget**: at most ``MAX_UNLISTABLE`` refused pages a listing. What it has not
  listed then is not taken as absent: the listing is not ``complete`` and says why
  (``Listing.cut_short``), and callers act on what they saw and say so.

What no walk can list: an entry whose every page holds a refused key that is no name of
ours and that it cannot ask for by name, that is, keys refused at the first level planted
within a page of every entry. A request that meets one names that key and nothing else, so
listing past them costs a request each; the budget bounds that, and the listing says it was
cut short. ``list_requests_bound`` is what one walk costs at most.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from xla_pcache.bucket.pages import chunks, delimited

Meta = Mapping[str, Any]

# The service's page of a listing (S3 and GCS return at most 1000 keys a request).
LIST_PAGE = 1000
# Refused pages one listing goes past before it stops (its budget), and the keys named in a
# report.
MAX_UNLISTABLE = 256
REPORTED = 100
# Refused pages one listing tries to recover, and how many keys it keeps to do so.
MAX_RECOVERIES = 16
RING = LIST_PAGE
# Refused keys in a row, no name of ours between them, before the walk gallops.
GALLOP_AFTER = 4
# Refused keys (all below a name) before a listing that may hold everything lists with a
# delimiter.
DELIMIT_AFTER = 8
# One recovery: a binary search over RING keys, at most two requests a probe.
RECOVERY_LISTS = 2 * math.ceil(math.log2(RING))
# What a refused key costs a listing at most besides recoveries: its refused page, the page
# that resumes after it, and the page of a range a gallop leaves for later; a HEAD of the
# next name of ours when the resumed listing starts at it, and one of the entry it hides.
LISTS_PER_REFUSED = 3
HEADS_PER_REFUSED = 2

HEX = "0123456789abcdef"
_HEX32 = 32


def list_requests_bound(objects: int, refused: int) -> int:
    """The most listing requests one listing of ``objects`` objects (keys below the
    directory, refused ones included) makes when ``refused`` keys the client refuses are
    among them: a request a page, twice (a listing with a delimiter after a first pass), a
    page more for each refused key and range it opens, and the recoveries' probes."""
    r = min(refused, MAX_UNLISTABLE + 1)
    pages = max(1, math.ceil(objects / LIST_PAGE))
    return 2 * pages + 2 + r * LISTS_PER_REFUSED + (MAX_RECOVERIES * RECOVERY_LISTS if r else 0)


# ------------------------------------------------------------------------------ keys
def _bad_segment(segment: str) -> bool:
    return segment in ("", ".", "..") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in segment)


def parseable(key: str) -> bool:
    """Whether ``object_store`` takes ``key`` as a path (its ``Path::parse``: one ``/`` at
    either end ignored, no empty, ``.`` or ``..`` segment, no ASCII control character)."""
    core = key.removeprefix("/").removesuffix("/")
    return core == "" or not any(_bad_segment(s) for s in core.split("/"))


def bad_depth(rel: str) -> int:
    """Which segment of ``rel`` (a key below a directory) the client refuses: 0 for the
    name itself, 1 for what lies below it, ...; -1 when none."""
    for i, seg in enumerate(rel.removesuffix("/").split("/")):
        if _bad_segment(seg):
            return i
    return -1


def resume_after(key: str) -> str | None:
    """The first key after ``key`` (refused by the client) that the client can name, such
    that every key between the two is refused as well: a listing resumes after it (and
    looks at it alone). None when ``key``'s first segment is the refused one."""
    lead = 1 if key.startswith("/") else 0
    core = key[lead:].removesuffix("/")
    at = lead
    for i, seg in enumerate(core.split("/")):
        if _bad_segment(seg):
            if i == 0:
                return None
            head = key[: at - 1]  # the good segments before it, without the "/"
            if seg == "":
                # ``head//...``: every key that starts so is refused; next is ``head/0``.
                nxt = f"{head}/0"
            elif seg in (".", ".."):
                rest = key[at + len(seg) :]
                # ``head/../...`` all refused (next: ``head/..0``); ``head/..`` alone is
                # followed by keys ``head/..<control>...``, refused, then ``head/.. ``.
                nxt = f"{head}/{seg}0" if rest.startswith("/") else f"{head}/{seg} "
            else:
                j = next(k for k, c in enumerate(seg) if ord(c) < 0x20 or ord(c) == 0x7F)
                # Every key that starts ``head/<seg[:j]><control>`` is refused, and the
                # controls 0x00-0x1F are one run: next is a space, after DEL U+0080.
                nxt = f"{head}/{seg[:j]}" + (" " if ord(seg[j]) < 0x20 else "\x80")
            return nxt if parseable(nxt) and nxt > key else None
        at += len(seg) + 1
    return None


def _rust_string(text: str, start: int) -> str | None:
    """The Rust string literal (Debug format) starting after the quote at ``start``."""
    out: list[str] = []
    i = start
    simple = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out)
        if c == "\\" and i + 1 < len(text):
            e = text[i + 1]
            if e in simple:
                out.append(simple[e])
                i += 2
                continue
            if e == "u" and text.startswith("{", i + 2):
                end = text.find("}", i + 3)
                if end < 0:
                    return None
                try:
                    out.append(chr(int(text[i + 3 : end], 16)))
                except ValueError:
                    return None
                i = end + 1
                continue
            return None
        out.append(c)
        i += 1
    return None


def refused_key(e: BaseException) -> str | None:
    """The key an ``InvalidPathError`` of a listing names (the whole key in the bucket), or
    None for any other error. obstore's message carries the Rust error's Debug form, where
    the key is an escaped string literal: ``path: "..."``. The message shows the key raw
    before that, and a planted key may hold ``path: "`` itself: the field is read from the
    Debug form, where a quote inside the key is escaped, and only a key the client refuses
    is taken."""
    try:
        from obstore.exceptions import InvalidPathError
    except ImportError:
        return None
    if not isinstance(e, InvalidPathError):
        return None
    text = str(e)
    debug = text.find("Debug source:")
    at = text.find('path: "', debug) if debug >= 0 else -1
    if at < 0:
        at = text.rfind('path: "')
    key = None if at < 0 else _rust_string(text, at + len('path: "'))
    return None if key is None or parseable(key) else key


# ------------------------------------------------------------------------------ names
def _hex_run(s: str) -> int:
    k = 0
    while k < min(_HEX32, len(s)) and s[k] in HEX:
        k += 1
    return k


def _inc(p: str) -> str | None:
    """The hex string of ``p``'s length after ``p``; None after ``ff...f``."""
    if not p or p == "f" * len(p):
        return None
    return f"{int(p, 16) + 1:0{len(p)}x}"


def head_after(s: str) -> str | None:
    """The least 32-hex-digit string after ``s``; None when there is none."""
    k = _hex_run(s)
    p = s[:k]
    if k == _HEX32:
        return _inc(p)
    if k == len(s):
        return p + "0" * (_HEX32 - k)
    c = s[k]
    if c < "0":
        return p + "0" * (_HEX32 - k)
    if "9" < c < "a":
        return p + "a" + "0" * (_HEX32 - 1 - k)
    q = _inc(p)
    return None if q is None else q + "0" * (_HEX32 - k)


def position(s: str) -> int:
    """Where ``s`` lies among 32-hex-digit names, as a number (its hex head, padded)."""
    k = _hex_run(s)
    return int((s[:k] or "0").ljust(_HEX32, "0"), 16)


@dataclass(frozen=True)
class Names:
    """What the names xla_pcache writes in a directory look like, as far as a listing
    needs: ``hex``: they start with 32 hex digits (``exact``: they are those digits, as
    entries' and claims' are; else a ``-`` follows, as in markers); else they start with
    ``lead`` (records' ``r-``)."""

    hex: bool = True
    exact: bool = True
    lead: str = ""

    def skip(self, rel: str) -> tuple[str, bool] | None:
        """Where a listing may resume after the refused key ``rel`` (below the directory):
        an offset at or after the next key the client can name, with nothing of ours
        between ``rel`` and it, and whether the offset itself may be a name of ours (a
        listing starts after its offset: ask for it by name). None: nothing of ours lies
        after ``rel``."""
        nxt = resume_after("d/" + rel)
        ra = None if nxt is None else nxt[2:]
        if not self.hex:
            if rel < self.lead:
                return (self.lead, False) if ra is None or ra <= self.lead else (ra, False)
            if rel.startswith(self.lead):
                return None if ra is None else (ra, False)
            return None
        k = _hex_run(rel)
        if not self.exact and k == _HEX32 and len(rel) > _HEX32:
            c = rel[_HEX32]
            if c == "-":
                return None if ra is None else (ra, False)  # within a name's markers
            if c < "-":
                return (rel[:_HEX32] + "-", False)
            q = _inc(rel[:_HEX32])
            return None if q is None else (q, False)
        n = head_after(rel)
        if n is None:
            return None
        if not self.exact:
            return (n, False)  # a marker is longer than its head: n itself is none
        if n[:-1] > rel:
            return (n[:-1], False)
        if ra is not None and ra < n:
            return (ra, False)
        return (n, True)

    def first_after(self, rel: str) -> str | None:
        """A lower bound of the least name of ours after ``rel`` (None: there is none)."""
        if not self.hex:
            return self.lead if rel < self.lead else rel
        if not self.exact and _hex_run(rel) == _HEX32 and rel[_HEX32 : _HEX32 + 1] == "-":
            return rel
        n = head_after(rel)
        if self.exact or n is None:
            return n
        k = _hex_run(rel)
        return rel[:_HEX32] + "-" if k == _HEX32 and rel[_HEX32:] < "-" else n

    def ours_head(self, rel: str) -> bool:
        """Whether ``rel`` begins as a name of ours does (a flood between names ends)."""
        return _hex_run(rel) == _HEX32 if self.hex else rel.startswith(self.lead)


# ------------------------------------------------------------------------------ the walk
@dataclass
class Listing:
    """One listing's iteration (``BucketReader.listing``); after it: ``complete`` unless it
    stopped early (``capped`` by the caller's limit, or at the budget of refused pages:
    ``unexplored`` ranges were not listed) or may have missed objects (``hidden_pages``:
    refused pages it could not recover), and the keys it went past. ``names``: what the
    names of ours there look like (a refused key where none can be hides nothing; None:
    anything). ``delimit``: the caller may hold the whole listing in memory, so it may list
    with a delimiter (``delimited``: it did; ``directories``: the common prefixes it named,
    each a name with objects below it). ``start``: list after this name (below
    ``prefix``). ``budget``: the refused pages it goes past at most; ``recoveries``: the
    refused pages whose objects it tries to recover at most (``recovered``: it tried).
    ``skip_junk``: a full page that ends in a name that is none of ours resumes where the
    next one can be, so objects planted before or between names cost a page a run, not a
    page a thousand (for a caller that wants names of ours only: a prune lists junk to
    remove it)."""

    prefix: str
    limit: int | None = None
    names: Names | None = None
    delimit: bool = False
    start: str | None = None
    budget: int = MAX_UNLISTABLE
    recoveries: int = MAX_RECOVERIES
    skip_junk: bool = False
    complete: bool = True
    capped: bool = False
    listed: int = 0
    refused: int = 0
    recovered: int = 0
    unlistable: list[str] = field(default_factory=list)
    hidden_pages: int = 0
    unexplored: int = 0
    delimited: bool = False
    directories: int = 0

    def cut_short(self) -> str | None:
        """Why this listing may not have seen every object of ours there (None: it did)."""
        if self.complete:
            return None
        if self.capped:
            return f"stopped after {self.listed:,} objects"
        why = []
        if self.unexplored:
            why.append(
                f"{self.refused} keys the client cannot list, its budget, left "
                f"{self.unexplored} ranges of {self.prefix}/ unlisted"
            )
        if self.hidden_pages:
            why.append(
                f"{self.hidden_pages} pages of {self.prefix}/ shared with a key the client "
                "cannot list were not seen"
            )
        return "; ".join(why) or f"{self.prefix}/ was not listed to its end"


@dataclass
class _Span:
    """Keys after ``after`` up to ``upto`` (None: the end), below the prefix."""

    after: str | None
    upto: str | None = None


class _Stop(Exception):
    """The listing's budget or limit is reached."""


class Walk:
    """One listing of ``state.prefix`` through ``reader`` (a ``BucketReader``: its client,
    request counts, HEADs and notes of refused keys); see the module's text."""

    def __init__(self, reader: Any, state: Listing) -> None:
        self.reader = reader
        self.state = state
        self.names = state.names
        self.base = state.prefix + "/"
        self.pending: deque[_Span] = deque()
        # What was yielded, when a listing with a delimiter may follow (and must not give
        # an object twice).
        self.yielded: set[str] | None = set() if state.delimit and state.limit is None else None
        self.all_deep = True
        self.tried_delimiter = False
        self.found: list[Meta] = []
        # Of them, objects the last refused page's recovery listed (not asked for by name).
        self.recovered_here = 0

    def __iter__(self) -> Iterator[Meta]:
        state = self.state
        self.pending.append(_Span(None if state.start is None else self.base + state.start))
        stopped = False
        try:
            while self.pending:
                for meta in self._span(self.pending.pop()):
                    if self.yielded is not None:
                        self.yielded.add(str(meta["path"]))
                    yield meta
                if self._delimited_due(False):
                    done = yield from self._delimited()
                    if done:
                        return
        except _Stop:
            stopped = True
        if stopped and not state.capped and self._delimited_due(True):
            done = yield from self._delimited()
            if done:
                return
        state.unexplored += len(self.pending)
        if stopped or state.unexplored:
            state.complete = False

    # ---------------------------------------------------------------- helpers
    def _rel(self, key: str) -> str:
        return key[len(self.base) :] if key.startswith(self.base) else ""

    def _take(self) -> None:
        """One object more, within the caller's limit."""
        state = self.state
        if state.limit is not None and state.listed >= state.limit:
            state.complete, state.capped = False, True
            raise _Stop
        state.listed += 1

    def _delimited_due(self, at_budget: bool) -> bool:
        state = self.state
        if self.yielded is None or self.tried_delimiter or not self.all_deep:
            return False
        return state.refused > 0 and (
            at_budget
            or state.refused >= DELIMIT_AFTER
            or state.hidden_pages > 0
            or bool(self.pending)
        )

    # ---------------------------------------------------------------- one range
    def _span(self, span: _Span) -> Iterator[Meta]:
        state, reader = self.state, self.reader
        offset = span.after
        ring: deque[str] = deque(maxlen=RING)
        flood = 0
        while True:
            n = 0
            failed: BaseException | None = None
            try:
                stream = chunks(
                    reader.store,
                    state.prefix,
                    offset=offset,
                    chunk_size=LIST_PAGE,
                    wait_s=reader.page_wait_s,
                )
                jump = None
                for chunk in stream:
                    n += len(chunk)
                    for meta in chunk:
                        path = str(meta["path"])
                        if span.upto is not None and path > span.upto:
                            return
                        self._take()
                        ring.append(path)
                        if self.names is None or self.names.ours_head(self._rel(path)):
                            flood = 0
                        yield meta
                    jump = self._past_junk(chunk)
                    if jump is not None:
                        break
                if jump is None:
                    return
            except _Stop:
                raise
            except Exception as e:
                failed = e
            finally:
                # A listing is a request a page, the refused one included.
                reader.count("list", max(1, math.ceil(n / LIST_PAGE) + (failed is not None)))
            if failed is None:
                # A run of junk: resume where the next name of ours can be.
                if jump == "":
                    return  # none after it
                offset = jump
                ring.clear()
                continue
            bad = refused_key(failed)
            bad_path = None if bad is None else reader.relative(bad)
            if bad is None or bad_path is None:
                raise failed
            if span.upto is not None and bad_path > span.upto:
                # Beyond this range (another lists it): what lay before it in this one.
                yield from self._between(offset, span.upto, ring, bad_path, beyond=True)
                return
            rel = self._rel(bad_path)
            state.refused += 1
            reader.note_unlistable(bad, state)
            if bad_depth(rel) == 0:
                self.all_deep = False
            if state.refused > state.budget:
                reader.warn_once(
                    "unlistable-stop",
                    f"listing {state.prefix}/ went past {state.budget} keys the client "
                    f"cannot list (the last {bad!r}) and stopped there: what it did not list "
                    "is not taken as absent, and is seen once they are removed",
                )
                self.pending.append(_Span(offset, span.upto))
                raise _Stop
            yield from self._between(offset, span.upto, ring, bad_path, beyond=False)
            if self.recovered_here:
                # Objects listed between refused keys: no flood. An object found by name
                # behind the refused key is not enough: anyone can PUT one behind each key
                # of a flood, which then never galloped.
                flood = 0
            skipped = self._skip(rel)
            if skipped is None:
                return  # nothing of ours after it
            nxt, ask = skipped
            nxt_path = self.base + nxt
            if ask and (span.upto is None or nxt_path <= span.upto):
                here = reader.head(nxt_path)
                if here is not None:
                    self._take()
                    yield here
            flood += 1
            offset = nxt_path
            ring.clear()
            if flood >= GALLOP_AFTER and self.names is not None and self.names.hex:
                mid = self._middle(nxt, span.upto)
                if mid is not None:
                    self.pending.append(_Span(offset, mid))
                    offset = mid
                    flood = 0
            if self._delimited_due(False):
                self.pending.append(_Span(offset, span.upto))
                return

    def _past_junk(self, chunk: Any) -> str | None:
        """With ``skip_junk``, after a full page ending in a name none of ours: the offset
        to resume from ("" when nothing of ours can follow), else None. The name there
        itself is asked for when it may be one of ours."""
        if not self.state.skip_junk or self.names is None or len(chunk) < LIST_PAGE:
            return None
        last = self._rel(str(chunk[-1]["path"]))
        if self.names.ours_head(last):
            return None
        skipped = self.names.skip(last)
        if skipped is None:
            return ""
        nxt, ask = skipped
        return None if ask else self.base + nxt

    def _skip(self, rel: str) -> tuple[str, bool] | None:
        if self.names is not None:
            return self.names.skip(rel)
        nxt = resume_after("d/" + rel)
        return None if nxt is None else (nxt[2:], True)

    def _middle(self, after: str, upto: str | None) -> str | None:
        """A key halfway (by hex position) between ``after`` and ``upto`` (the end when
        None), as 31 hex digits below the prefix, when one lies strictly between."""
        lo = position(after)
        hi = 16**_HEX32 if upto is None else position(self._rel(upto))
        key = f"{(lo + hi) // 2:032x}"[: _HEX32 - 1]
        full = self.base + key
        if key <= after or (upto is not None and full >= upto):
            return None
        return full

    def _between(
        self, offset: str | None, upto: str | None, ring: deque[str], bad: str, *, beyond: bool
    ) -> Iterator[Meta]:
        """What of ours lay between ``offset`` and the refused key ``bad`` (or the range's
        end ``upto``, when ``bad`` lies beyond it), which its refused page held: asked for
        (the entry ``bad`` hides behind, with a HEAD) or recovered from ``ring`` (the keys
        just listed); where neither can be done, a page counted hidden."""
        state, reader = self.state, self.reader
        self.found = []
        self.recovered_here = 0
        after_rel = "" if offset is None else self._rel(offset)
        stop = upto if beyond and upto is not None else bad

        def past(rel: str | None) -> bool:
            return rel is None or (self.base + rel > stop if beyond else self.base + rel >= stop)

        first = None if self.names is None else self.names.first_after(after_rel)
        if self.names is not None and past(first):
            return
        rel = self._rel(bad)
        if not beyond and self.names is not None and self.names.exact and _hex_run(rel) == _HEX32:
            head = self.base + rel[:_HEX32]
            if offset is None or head > offset:
                meta = reader.head(head)
                if meta is not None:
                    self._take()
                    self.found.append(meta)
                    yield meta
                if first == rel[:_HEX32]:
                    return  # the one name of ours there
        attempted = bool(ring) and state.recovered < state.recoveries
        raw: list[Meta] = []
        got: list[Meta] = []
        if attempted:
            state.recovered += 1
            have = {str(m["path"]) for m in self.found}
            raw = recover(reader, state.prefix, list(ring), bad)
            got = [
                m for m in raw if not past(self._rel(str(m["path"]))) and str(m["path"]) not in have
            ]
        if not raw and not (attempted and len(ring) == RING):
            state.hidden_pages += 1
            state.complete = False
        for meta in got:
            self._take()
            self.found.append(meta)
            if self.names is None or self.names.ours_head(self._rel(str(meta["path"]))):
                self.recovered_here += 1
            yield meta

    # ---------------------------------------------------------------- with a delimiter
    def _delimited(self) -> Generator[Meta, None, bool]:
        """The directory listed once with a delimiter: every object directly below it,
        each key planted below a name rolled into that name's common prefix. True when it
        listed (the walk is then complete); False when a key refused at the first level
        made it fail too (the walk goes on without it)."""
        self.tried_delimiter = True
        state, reader = self.state, self.reader
        n = 0
        failed = False
        try:
            got = delimited(reader.store, state.prefix, wait_s=reader.page_wait_s)
            n = len(got["objects"]) + len(got["common_prefixes"])
        except Exception as e:
            bad = refused_key(e)
            if bad is None:
                raise
            failed = True
            state.refused += 1
            reader.note_unlistable(bad, state)
            return False
        finally:
            reader.count("list", max(1, math.ceil(n / LIST_PAGE) + failed))
        seen = self.yielded or set()
        for meta in got["objects"]:
            if str(meta["path"]) not in seen:
                state.listed += 1
                yield meta
        state.delimited = True
        state.directories = len(got["common_prefixes"])
        state.hidden_pages = state.unexplored = 0
        state.complete = True
        self.pending.clear()
        reader.warn_once(
            "delimited",
            f"{state.prefix}/ holds keys the client cannot list below names of its objects: "
            "listed once more with a delimiter, which rolls them up",
        )
        return True


def recover(reader: Any, prefix: str, ring: list[str], bad: str) -> list[Meta]:
    """The objects between ``ring[-1]`` and ``bad`` that the refused page held: the listing
    asked from an earlier key of ``ring`` (which holds the keys just listed, in order, with
    none missing) so that its page ends before ``bad``. A start further back reaches less
    far, so the nearest start whose page is accepted gives them all."""
    last = ring[-1]
    best: list[Meta] = []
    lo, hi = 1, len(ring)
    while lo <= hi:
        mid = (lo + hi) // 2
        got = _probe(reader, prefix, ring[-mid], last, bad)
        if got:
            best, hi = got, mid - 1
        else:
            lo = mid + 1
    return best


def _probe(reader: Any, prefix: str, start: str, last: str, bad: str) -> list[Meta]:
    got: list[Meta] = []
    n = 0
    refused = False
    try:
        for chunk in chunks(
            reader.store, prefix, offset=start, chunk_size=1, wait_s=reader.page_wait_s
        ):
            n += len(chunk)
            for meta in chunk:
                path = str(meta["path"])
                if path > bad or len(got) >= LIST_PAGE:
                    return got
                if path > last:
                    got.append(meta)
    except Exception as e:
        if refused_key(e) is None:
            raise
        refused = True
    finally:
        reader.count("list", max(1, math.ceil(n / LIST_PAGE) + refused))
    return got
