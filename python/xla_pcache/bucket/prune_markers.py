"""Which of an entry's markers a prune keeps when more than one may be its own.

An entry has one key, so one marker (``<entry name>-<tag>``, ``layout.marker_tag``), which
its writer writes right after it; two or more not older than the entry mean others were
planted beside it, and no time tells which is real (Last-Modified is whole seconds on some
services, and a planter can write in the same second). The entry's own header does: its
key gives the tag. So the first marker of an entry is held; at a second, the prune reads
the entry's first bytes once (a ranged GET) and keeps the markers of the tag the key they
name gives (the core reads it: ``_core.entry_head_key``), removing the others, as the
listing goes (nothing is held but the first).

A prune reads at most ``MARKER_READS`` headers. Past them, or when the header cannot be
read, every marker that may be the real one stays until a later prune: a planted marker
under a real entry's name costs a host start nothing (its name is not its key's entry
name, so it is not followed), while removing the real one would hide the entry from the
hosts that find it by its marker. So does a later release's entry, whose header this
release cannot read (nothing is removed as if it were no entry). A header whose key gives
no tag (an entry no one marks) keeps none of them, and nor does an object that holds no
entry file at all (its first bytes name no key, or it is smaller than any entry: no read):
its markers are no entry's, and kept they would take the same reads at every prune, so
that markers planted under the real entries listed after it stayed for good.
"""

from __future__ import annotations

from typing import Any

from xla_pcache import _core
from xla_pcache.bucket.layout import HEAD_BYTES, marker_tag
from xla_pcache.tiers.objstore import ENTRY_DIR

# The entries' headers one prune reads at most to tell their real marker from planted ones.
MARKER_READS = 100


class Judge:
    """One prune's judgement of the markers of its listed entries, fed in listing order
    (an entry's markers are listed one after another: their names begin with its name)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.reads = 0
        self.name = ""
        self.first: tuple[str, str] | None = None  # (tag, path) held, undecided
        self.asked = False  # whether this entry's header was asked for
        self.graph: str | None = None  # the tag its key gives, once asked
        self.told = False  # whether that answer tells the real marker

    def doomed(self, name: str, graph: str, path: str, size: int) -> list[str]:
        """The markers to remove now, of ``path`` (entry ``name``'s marker of tag
        ``graph``, not older than the entry, which was listed ``size`` bytes) and the one
        held before it."""
        if name != self.name:
            self.name, self.first, self.asked = name, (graph, path), False
            return []
        out: list[str] = []
        if not self.asked:
            self.asked = True
            small = size < _core.ENTRY_MIN_BYTES
            self.told, self.graph = (True, None) if small else self._read(name)
            held, self.first = self.first, None
            if held is not None and self._planted(held[0]):
                out.append(held[1])
        if self._planted(graph):
            out.append(path)
        return out

    def _planted(self, graph: str) -> bool:
        return self.told and graph != self.graph

    def _read(self, name: str) -> tuple[bool, str | None]:
        """Whether entry ``name``'s first bytes tell its real marker (read within the
        bound, and not a later release's entry), and the tag the key they name gives (None:
        a key no one marks, or no key at all)."""
        if self.reads >= MARKER_READS:
            return False, None
        self.reads += 1
        try:
            head = self.reader.first_bytes(f"{ENTRY_DIR}/{name}", HEAD_BYTES)
        except Exception:
            return False, None
        if head is None:
            return False, None  # gone since it was listed: its markers go with it later
        key = _core.entry_head_key(head)
        if isinstance(key, _core.Refusal):
            # A later release's entry keeps its markers; first bytes that name no key hold
            # no entry file: no marker of it is real.
            return key.kind != "newer_format", None
        return True, marker_tag(key)
