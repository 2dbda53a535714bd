"""What a torch_xla host start on a bucket removes of what it proved to be garbage
(``_bucket_start``): so that a flood of garbage entries with their markers, planted by a
writer of the bucket without a key, drains across the fleet's starts rather than staying
until a prune over budget, as the directory store removes a corrupt entry it reads.

Only a writing host removes anything (not a read-only store, not a bucket read-only by its
URL's ``?ro=1``), and only an object of the bucket (not of a tier in front of it) that its
start fetched for a key and that no reader of any release would serve, whatever keys it
trusts: one the core's verdict calls ``garbage`` (``_core.Refusal.garbage``), given to the
fetch that met it (``tiers.Fetch``), never asked again of the bytes:

- an object whose first bytes hold no entry file of its name (no header that decodes, a
  header filed under another name, a length the object does not have, no bytes), as the
  tier read them whole; or
- one the core's gate refused when read whole as ``corrupt`` (a checksum, the metadata, a
  signed digest the payload does not match) or ``other_key``.

An entry merely ``untrusted`` (unsigned, or signed by a key this host does not trust) is
another host's to serve, and is left; so is a later release's entry (``newer_format``: that
release reads it), a value over a size limit, and a read that failed or was cut short,
which prove nothing.

With it goes that name's marker (the name and the graph), unless the start fetched the key
from another of its names (a trusted signer's own): never another name's marker, so a
signer's own marker stays whatever its hosts' plain name held, and a host that does not
trust that signer (it never reads the signer's name) cannot remove it. One start
removes at most ``PULL_REMOVALS`` entries (a request each: the entry and its marker in one
batch), counted in its reads' ``skipped`` (``torch_xla-garbage``, one warning a start), and
stops at the first removal that fails (a bucket that refuses deletes to this host, a
service down), counted ``torch_xla-garbage-failed``.

A delete is unconditional (``object_store`` has no conditional delete, nor do all
services): an object replaced between the read that proved it garbage and the delete is
removed all the same. The window is one round trip, and what it can cost is small: an
entry's plain name is only created (``If-None-Match: *``), so nothing replaces garbage
there; a signer's own name is overwritten by its signer, whose entry would then be gone
until that signer puts it again (and its plain copy, if any, still serves).
"""

from __future__ import annotations

from xla_pcache.bucket import BucketStore
from xla_pcache.bucket.layout import MARKER_DIR
from xla_pcache.bucket.upkeep import Bucket
from xla_pcache.tiers import Fetch
from xla_pcache.tiers.objstore import ENTRY_DIR, scrub

# The garbage entries one start removes at most: the refusals a start with a flood planted
# pays before it stops (``PULL_MISSES`` newest first, as many in a drawn order), so that
# removing them at most doubles what the flood costs it.
PULL_REMOVALS = 64


class Garbage:
    """One start's removals: ``proved`` of each fetch, then ``remove``."""

    def __init__(self, store: BucketStore, bucket: Bucket) -> None:
        self.bucket = bucket
        # None for a bucket read-only by the process or its URL: nothing is removed.
        self.tier = store.writer()
        self.removed = 0
        self.failed = False

    def proved(self, fetched: Fetch | None) -> list[str]:
        """The names of the bucket's objects that ``fetched`` (one key's fetch) found to be
        no entry of their name for any reader: what the core called garbage, of this
        bucket's tier only."""
        if fetched is None or self.tier is None or self.failed or self.removed >= PULL_REMOVALS:
            return []
        return [r.name for r in fetched.refused if r.tier is self.tier and r.verdict.garbage]

    def remove(self, proved: list[str], *, graph: str | None, fetched: bool) -> None:
        """Removes the objects ``proved`` garbage, within the start's bound, each with its
        own marker of ``graph`` (None: found by name) when nothing was fetched for the
        key."""
        for name in dict.fromkeys(proved):
            if self.failed or self.removed >= PULL_REMOVALS:
                return
            paths = [f"{ENTRY_DIR}/{name}"]
            if graph is not None and not fetched:
                paths.append(f"{MARKER_DIR}/{name}-{graph}")
            try:
                self.bucket.delete(paths)
            except Exception as e:
                self.failed = True
                self.bucket.reader.skip(
                    "torch_xla-garbage-failed",
                    f"removing a garbage entry a host start fetched failed "
                    f"({type(e).__name__}: {scrub(str(e))}): it is left for later starts",
                )
                return
            self.removed += 1

    def report(self) -> None:
        """Counts what this start removed (one warning a start)."""
        if self.removed:
            self.bucket.reader.skip(
                "torch_xla-garbage",
                f"a host start removed {self.removed} objects at torch_xla entries' names "
                "that are no entry for any reader (garbage someone planted, or damage), with "
                f"the markers it followed to them (at most {PULL_REMOVALS} a start)",
                self.removed,
            )
