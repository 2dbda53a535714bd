"""The requests a bucket's upkeep makes of one prefix: its client, every request counted by
kind, the one reader of what is there (``reader.BucketReader``), writes refused when
the bucket is read-only, deletes in batches, and the removal of objects xla_pcache did not
write, with the directories that objects planted below one of its names leave behind."""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from xla_pcache._core import ReadOnlyError
from xla_pcache.bucket.layout import squatted
from xla_pcache.bucket.reader import REPORTED, BucketReader
from xla_pcache.tiers import objstore
from xla_pcache.tiers.base import redact

DELETE_BATCH = 1000
# Below an object planted under one of our names as a prefix, the "directories" a service
# with directories (SeaweedFS, MinIO, hierarchical namespaces) made: removed up to this deep.
SQUAT_DEPTH = 4
# What a squat check lists below one of our names at a time (a batch of removals).
SQUAT_LIST = 100
# The directories objects planted below our names made that one prune (or one removal of
# what is untrusted) asks about and removes at most, a HEAD and a DELETE each: a flood of
# such objects costs a prune this many, and the objects past it wait for the next one (with
# their directories, which no listing of objects would show once they are gone).
SQUAT_REMOVALS = 1000
# The directories a squat check walks below one of our fixed names, emptied or left empty
# (a key is at most 1,024 bytes, so no chain of them is deeper than 512).
SQUAT_DIRS = 520


@dataclass
class Tally:
    """Objects removed as junk: how many, the first ``REPORTED`` by name."""

    removed: int = 0
    names: list[str] = field(default_factory=list)

    def add(self, paths: list[str]) -> None:
        self.removed += len(paths)
        self.names += paths[: max(0, REPORTED - len(self.names))]


class ClientOptions(TypedDict, total=False):
    """How the client is made (``BucketObjects``' keyword arguments, which give their
    defaults): what a ``Bucket`` is opened with too."""

    timeout: float
    environ: Mapping[str, str]
    read_only: bool


class BucketObjects:
    """The objects of one bucket prefix. Every request is counted by kind in ``requests``
    (a listing counts one request a page of ``LIST_PAGE``, as the services page them);
    everything read goes through ``reader``; with ``read_only`` (or the URL's ``?ro=1``)
    every write is refused (``ReadOnlyError``)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        environ: Mapping[str, str] = os.environ,
        read_only: bool = False,
    ) -> None:
        location, url_read_only = objstore.parse_object_url(url)
        self.location = location
        self.url = redact(location)
        self.read_only = read_only or url_read_only
        # ``timeout`` bounds connecting; a request (a page of a listing, a batch of deletes)
        # gets at least a minute, as the tiers' writes do.
        self._store = objstore.open_client(
            location, timeout=timeout, environ=environ, for_writes=True
        )
        self.requests: Counter[str] = Counter()
        self.squat_removals = SQUAT_REMOVALS
        self._lock = threading.Lock()
        parts = urllib.parse.urlsplit(location)
        self.reader = BucketReader(
            self._store,
            url=self.url,
            scheme=parts.scheme,
            bucket=parts.hostname or "",
            store_prefix=parts.path,
            count=self._count,
            page_wait_s=objstore.request_bound(timeout, for_writes=True),
        )

    @property
    def flat_names(self) -> bool:
        """Whether the service's names are flat, never directories: GCS's (its XML API has
        no directory, and the folders of a hierarchical-namespace bucket are not removed
        through it), where an object below one of our names is in the way of nothing.
        S3 and Azure services may have directories (MinIO, SeaweedFS, Data Lake)."""
        return self.reader.scheme == "gs"

    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.requests[kind] += n

    def begin(self) -> None:
        """A new report: its requests and skips counted from here (warnings stay once)."""
        self.requests.clear()
        self.reader.skipped.clear()
        self.squat_removals = SQUAT_REMOVALS

    def listing(self, prefix: str, *, limit: int | None = None) -> Iterator[Mapping[str, Any]]:
        return self.reader.listing(prefix, limit=limit)

    def writable(self) -> None:
        """``ReadOnlyError`` when this bucket is read-only: every write asks here first."""
        if self.read_only:
            raise ReadOnlyError(
                f"bucket {self.url} is read-only (?ro=1, --read-only or "
                "XLA_PERSISTENT_CACHE_READ_ONLY): nothing is written to it"
            )

    def put(self, path: str, data: bytes, mode: Any = "overwrite") -> objstore.Version:
        """Writes ``path``; which write it made (for an overwrite conditional on it)."""
        import obstore

        self.writable()
        self._count("put")
        result = obstore.put(self._store, path, data, mode=mode, use_multipart=False)
        return objstore.Version.of(result)

    def put_or_warn(self, path: str, data: bytes) -> bool:
        """Writes one of the upkeep's objects; a refusal (an object planted below its name,
        where the service has directories, refuses it there) is one warning, not an error
        for the whole prune."""
        try:
            self.put(path, data)
        except Exception as e:
            self.reader.skip(
                f"write-{path.rpartition('/')[2]}",
                f"writing {path} failed ({type(e).__name__}: {objstore.scrub(str(e))}); "
                "`xla-pcache prune --untrusted` removes objects planted below its name",
            )
            return False
        return True

    def delete(self, paths: list[str]) -> None:
        """Deletes ``paths`` in batches (one request each on S3 and Azure; one per object on
        GCS); an object already gone is no error."""
        import obstore

        if paths:
            self.writable()
        for i in range(0, len(paths), DELETE_BATCH):
            batch = paths[i : i + DELETE_BATCH]
            self._count("delete")
            try:
                obstore.delete(self._store, batch)
            except Exception as e:
                if len(batch) == 1 and objstore.classify(e) == "missing":
                    continue
                # GCS and Azure answer an error for a missing object: one at a time.
                for path in batch:
                    self._count("delete")
                    try:
                        obstore.delete(self._store, path)
                    except Exception as e1:
                        if objstore.classify(e1) != "missing":
                            raise

    def remove_junk(self, paths: list[str], tally: Tally | None = None) -> None:
        """Removes ``paths`` (objects xla_pcache did not write). One planted below a name
        xla_pcache creates (an entry's, a claim's, the lease's: a prefix squat) made
        "directories" on a service that has them (SeaweedFS, MinIO, hierarchical
        namespaces), and an emptied one there still refuses the conditional create of its
        name: those between the name and the object are removed too, deepest first, when a
        HEAD finds no object there, up to ``SQUAT_REMOVALS`` a prune; an object below a
        name past that is left, with its directories, for the next one. GCS's names are
        flat (``flat_names``): there an object below a name is beside it, no directory is
        left, and each is removed as any other."""
        dirs: set[str] = set()
        gone: list[str] = []
        for path in paths:
            name = None if self.flat_names else squatted(path)
            if name is not None:
                rest = path[len(name) + 1 :].split("/")[:-1][: SQUAT_DEPTH - 1]
                mine = {f"{name}/{'/'.join(rest[:d])}" for d in range(1, len(rest) + 1)}
                mine.add(name)
                new = mine - dirs
                if len(new) > self.squat_removals:
                    self.reader.warn_once(
                        "squat-removals",
                        f"objects planted below names of ours past the {SQUAT_REMOVALS} "
                        "directories one prune removes are left for the next prune",
                    )
                    continue
                self.squat_removals -= len(new)
                dirs |= new
            gone.append(path)
        self.delete(gone)
        if tally is not None:
            tally.add(gone)
        # One at a time, deepest first: a directory goes only once it is empty.
        for d in sorted(dirs, key=lambda d: -d.count("/")):
            if self.reader.head(d) is None:
                self.delete([d])

    def clear_squat(self, name: str) -> list[str]:
        """Objects planted below ``name`` (one of the upkeep's own names, which is no
        object) as a prefix: removed, all of them (a request a thousand, listed and
        removed a batch at a time), with every directory below ``name`` and ``name``
        itself (``clear_dirs``). The first ``SQUAT_LIST`` keys removed (empty when there
        were none)."""
        found: list[str] = []
        batch: list[str] = []
        n = 0
        for meta in self.reader.listing(name):
            path = str(meta["path"])
            n += 1
            batch.append(path)
            if len(found) < SQUAT_LIST:
                found.append(path)
            if len(batch) >= DELETE_BATCH:
                self.remove_junk(batch)
                batch = []
        if batch:
            self.remove_junk(batch)
        if found:
            self.reader.skip(
                "squat",
                f"objects planted below {name} ({found[0]!r}"
                f"{' and more' if n > 1 else ''}) made it a directory: removed",
                n,
            )
        if self.clear_dirs(name) and not found:
            self.reader.skip(
                "squat",
                f"directories left below {name} by objects planted there and removed since "
                "(they refuse its create): removed",
            )
        return found

    def clear_dirs(self, name: str) -> int:
        """Removes the directories below ``name`` that hold no object, children before
        their parent, then ``name`` when a HEAD finds no object there: on a service with
        directories (SeaweedFS, MinIO, hierarchical namespaces), what objects planted below
        it leave once they are gone, or leave deeper than ``remove_junk`` goes. Such
        directories refuse the create of ``name`` and no listing of objects shows them; a
        listing with a delimiter does. At most ``SQUAT_DIRS`` directories are taken (a
        listing of each, and a request to remove each: the service refuses to remove one
        that still holds something); the rest wait for the next time. How many were
        taken."""
        if self.flat_names:
            return 0
        taken = 0
        stack: list[tuple[str, bool]] = [(name, False)]
        while stack:
            d, done = stack.pop()
            if done:
                if d != name:
                    self.delete([d])
                elif self.reader.head(name) is None:
                    self.delete([name])
                continue
            stack.append((d, True))
            below = [sub for sub in self.reader.directories(d) if sub.startswith(d + "/")]
            below = below[: SQUAT_DIRS - taken]
            taken += len(below)
            stack.extend((sub, False) for sub in below)
        return taken
