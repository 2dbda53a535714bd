"""A bucket as the cache path: ``gs://``, ``s3://`` or ``az://`` wherever a cache directory
is named (``XLA_PERSISTENT_CACHE_PATH``, ``JAX_COMPILATION_CACHE_DIR``, ``install(path)``,
torch_xla's ``initialize_cache``, ``--path`` of the CLI); ``xla_pcache.cache_path`` routes
such a path here and opens its store (``open_store``).

Such a path is served by a host-local store, ``$XDG_CACHE_HOME/xla_pcache/remote/<name>``
(``XLA_PCACHE_LOCAL_PATH`` if set), with the bucket as its remote tier: a local miss asks
the bucket (and publishes what it gets locally), a put is written through to it, single
flight goes through claims on the bucket, ``?trust=required`` and the trusted keys apply as
to any tier, and ``XLA_PERSISTENT_CACHE_READ_ONLY`` makes every tier read-only (nothing is
written to the bucket; the local store still keeps what this host fetched and compiled).
Nothing is created anywhere else: a URL is never a directory. The host-local store is
this user's own (``own_local_store``): made mode 0700, and refused when another user owns
it or it is a link, since whoever can write it chooses what this host's processes load.
One of this user's that others can write (an earlier release made it under ``umask 002``)
is repaired: made 0700 and emptied (a planted entry with a valid checksum would be served
to a host that trusts no key, so nothing in it is kept; the bucket still has its entries).
An ``XLA_PCACHE_LOCAL_PATH`` others can write is left as it is, and this user's own
``xla_pcache-<uid>`` beneath it holds the store. The store then works through the handle
that was checked (``Store(own_root_fd=)``), never through the path again.

``BucketStore`` is the store of such a path: a ``Store`` whose hits are also noted for the
bucket's pruning (``recorder.py``); and what any framework's adapter uses of the bucket,
by type (never a method looked up by name): its upkeep (``bucket()``), the tier that writes
it (``writer()``), a fetch that says what the core refused there (``fetch``) and the
markers of the entries it wrote (``mark``). No framework is named here.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from xla_pcache import _core
from xla_pcache._names import EntryName
from xla_pcache._owndir import OwnDir, open_own
from xla_pcache._text import package_logger
from xla_pcache._url import BUCKET_SCHEMES
from xla_pcache.config import LOCAL_PATH_VAR, Settings
from xla_pcache.store import Store, StoreOptions

if TYPE_CHECKING:
    from xla_pcache.bucket.upkeep import Bucket
    from xla_pcache.tiers import Fetch, TierURL
    from xla_pcache.tiers.objstore import ObjectTier

log = package_logger("xla_pcache")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def location(url: str) -> str:
    """The bucket and prefix the bucket path ``url`` names (``objstore.parse_object_url``:
    the one identity of a bucket path, what two spellings of one cache have in common).
    ``ValueError`` for a URL that is no bucket path."""
    from xla_pcache.tiers.objstore import parse_object_url

    return parse_object_url(url)[0]


def _location_or_none(tier: TierURL) -> str | None:
    """The location of a tier that is a bucket, else None."""
    if tier.scheme not in BUCKET_SCHEMES:
        return None
    from xla_pcache.tiers.objstore import parse_object_url

    try:
        return parse_object_url(tier)[0]
    except ValueError:
        return None


def local_name(url: str) -> str:
    """The host-local store's directory name for the bucket path ``url``: readable, one path
    component, and distinct for every bucket and prefix (a digest of them)."""
    return _dir_name(location(url))


def _dir_name(loc: str) -> str:
    readable = _UNSAFE.sub("_", loc.replace("://", "-", 1).replace("/", "_")).strip("._-")
    digest = hashlib.sha256(loc.encode()).hexdigest()[:12]
    return f"{readable[:80]}-{digest}"


def local_path(url: str, settings: Settings) -> str:
    """``XLA_PCACHE_LOCAL_PATH``, else ``$XDG_CACHE_HOME/xla_pcache/remote/<local_name>``."""
    if settings.local_path:
        return os.path.abspath(settings.local_path)
    return os.path.join(settings.remote_store_root(), local_name(url))


# Said when a host-local store an earlier release left open to the group is emptied.
_REFETCHED = (
    "this host fetches the bucket's entries again; what it compiled that did not reach the "
    "bucket is compiled again"
)


def own_local_store(loc: str, settings: Settings) -> OwnDir:
    """Opens the host-local store's directory of the bucket at ``loc`` (``location``) as a
    directory of
    this user's own (``_owndir``), made mode 0700 when absent: the default one and its root
    repaired when an earlier release left them open to the group, ``XLA_PCACHE_LOCAL_PATH``
    never changed (when others can write it, this user's own directory beneath it is the
    store). The handle is the caller's to open the store on and close. ``CacheError`` naming
    a directory another user owns, or a link."""
    try:
        if settings.local_path:
            named = os.path.abspath(settings.local_path)
            return open_own(named, rule="named", refetched=_REFETCHED)
        with open_own(settings.remote_store_root(), rule="repair", refetched=_REFETCHED) as top:
            return open_own(_dir_name(loc), rule="repair", parent=top, refetched=_REFETCHED)
    except _core.CacheError as e:
        raise _core.CacheError(
            f"{e}: a bucket path's host-local store must be this user's own (set "
            f"{LOCAL_PATH_VAR} to a directory of your own)"
        ) from None


def chain_for(loc: str, bucket: TierURL, opts: StoreOptions) -> tuple[TierURL, ...]:
    """The remote chain of a bucket path: the store's other tiers (``XLA_PCACHE_REMOTE``'s,
    or ``remote=``: a faster tier in front, such as Redis; the bucket itself left out),
    then the bucket (at ``loc``); every tier read-only for a read-only process."""
    tiers = [t for t in opts.chain if _location_or_none(t) != loc]
    tiers.append(bucket)
    return tuple(t.as_read_only() if opts.read_only else t for t in tiers)


class BucketStore(Store):
    """The host-local store of a bucket path: a ``Store`` with the bucket as its last tier,
    whose hits are also recorded for the bucket's pruning (``serve_bucket``; opened by
    ``xla_pcache.open_store``). ``bucket_url`` is the path as given; ``path`` the local
    directory."""

    bucket_url: str = ""
    # The bucket and prefix it names (``location``): the cache's identity.
    bucket_location: str = ""
    # Nothing is written to the bucket (read-only, or its URL's ?ro=1): no entry, record or
    # marker.
    bucket_ro: bool = False
    _recorder: Any = None
    # Guards the lazy making of the bucket's upkeep client (shared: it is only that).
    _bucket_lock = threading.Lock()

    def get(self, key: _core.Key, *, count: bool = True) -> _core.Blob | None:
        blob = super().get(key, count=count)
        if blob is not None and count:
            self._note(blob)
        return blob

    def count_hit(self, blob: _core.Blob) -> None:
        super().count_hit(blob)
        self._note(blob)

    def touch(self, key: _core.Key) -> bool:
        """A use of ``key``'s entry recorded here and, as a hit's is, in the bucket's use
        record: an entry no lookup reads (a plan, a module record) ages in the bucket with
        the entries it belongs with, not first."""
        touched = super().touch(key)
        recorder = self._recorder
        if touched and recorder is not None:
            trusted = self.trusted_key_names or ()
            recorder.note(key, lambda: _names_any(key, trusted))
        return touched

    def _note(self, blob: _core.Blob) -> None:
        """A use of ``blob``'s entry, for the bucket's pruning (a read ahead is not one
        until it serves a lookup: ``count_hit``)."""
        recorder = self._recorder
        if recorder is not None:
            key, signer = blob.key, blob.signer
            recorder.note(key, lambda: _names(key, signer))

    def _chain_put(self, names: list[str], data: bytes, replace: bool) -> None:
        super()._chain_put(names, data, replace)
        if self._recorder is not None:
            self._bucket_tier()  # found now, while the chain is open, for the record's counts
            self._recorder.wrote(names)

    def serve_bucket(self, url: str, loc: str, *, read_only: bool) -> None:
        """Makes this store the bucket path ``url``'s (at ``loc``): its hits recorded for the
        bucket's pruning unless ``read_only`` (nothing is then written to the bucket) or
        ``XLA_PCACHE_BUCKET_RECORD_INTERVAL`` is 0."""
        self.bucket_url = url.strip()
        self.bucket_location = loc
        self.bucket_ro = read_only
        self._recorder = None
        settings = self.settings
        if not read_only and settings.bucket_record_interval > 0:
            from xla_pcache.bucket.recorder import UseRecorder

            self._recorder = UseRecorder(
                self.root_fd(),
                self.bucket,
                self._written,
                interval=settings.bucket_record_interval,
                auto_prune=settings.bucket_auto_prune,
            )

    def bucket(self) -> Bucket:
        """The bucket's upkeep (``upkeep.Bucket``), made on first use."""
        with self._bucket_lock:
            made: Bucket | None = getattr(self, "_upkeep", None)
            if made is None:
                from xla_pcache.bucket.upkeep import Bucket

                made = self._upkeep = Bucket(
                    self.bucket_url,
                    timeout=self.settings.remote_timeout,
                    read_only=self.bucket_ro,
                )
            return made

    def _bucket_tier(self, *, open_it: bool = True) -> Any:
        """The bucket's tier as the chain holds it (opened now unless ``open_it`` is False):
        an ``ObjectTier``, or a ``ReadOnlyTier`` reading one when nothing is written to the
        bucket; kept once found: its counters outlive the chain's close."""
        found = getattr(self, "_object_tier", None)
        if found is not None or not open_it:
            return found
        chain = self.remote
        for tier in chain.tiers if chain is not None else ():
            # The chain holds no other tier of the bucket's location (``chain_for``).
            if tier.url == self.bucket_location:
                self._object_tier = tier
                return tier
        return None

    def writer(self) -> ObjectTier | None:
        """The bucket's tier when this store writes the bucket, else None: a read-only
        bucket's tier (``bucket_ro``) is a ``ReadOnlyTier``, which has no write."""
        from xla_pcache.tiers.objstore import ObjectTier

        tier = self._bucket_tier()
        return tier if isinstance(tier, ObjectTier) else None

    def fetch(self, key: _core.Key) -> tuple[_core.Blob | None, Fetch | None]:
        """Asks the tiers for ``key`` as a local miss does (nothing counted, the directory
        not looked at): their verified entry, published here unless read-only, or None; and
        what the fetch found (``tiers.Fetch``: each value refused, by which tier, with the
        core's verdict), None when there is no chain."""
        blob, found = self._fetch(key)
        return blob, cast("Fetch | None", found)

    def _written(self) -> tuple[int, int]:
        """This process's entries and bytes written to the bucket (successful creates)."""
        tier = self._bucket_tier(open_it=False)
        if tier is None:
            return (0, 0)
        counts = tier.stats()
        return int(counts.get("remote_puts", 0)), int(counts.get("remote_written_bytes", 0))

    # ---------------------------------------------------------------- markers
    def mark(self, key: str, tag: str) -> None:
        """After the entry of ``key`` was queued for the bucket: a marker with ``tag`` of
        each name it was put under (the plain one, and a signer's own: ``layout``,
        "marker"), written after the entry, on the tier's thread. A signer's own marker is
        what its hosts follow when the plain name holds something else (garbage planted
        there first, then removed by a host's start with its marker: the signer's copy and
        its marker stay). Nothing when this store does not write the bucket."""
        tier = self.writer()
        if tier is None:
            return
        names = [EntryName(n) for n in _names(key, self.signing_key_name)]

        def mark() -> None:
            # Each name's marker whatever became of the other's: an object planted below
            # the plain marker's name must not cost the signer's own marker too.
            for name in names:
                try:
                    self.bucket().mark(name, tag)
                except Exception as e:
                    # Not the tier's failure (its entry went out before): a service with
                    # directories refuses a marker someone planted an object below. One
                    # warning, and the tier is not left alone for it.
                    if tier.first_warning("marker"):
                        from xla_pcache.tiers.objstore import scrub

                        log.warning(
                            "xla_pcache: writing a marker to %s failed (%s: %s); other hosts "
                            "will not fetch that entry by it before they start",
                            tier.url,
                            type(e).__name__,
                            scrub(str(e)),
                        )

        tier.submit(mark)

    def close(self) -> None:
        recorder, self._recorder = self._recorder, None
        super().close()  # finishes the writes the record counts
        if recorder is not None:
            recorder.close()


def _names_any(key: _core.Key, signers: Iterable[str]) -> list[str]:
    """The names an entry of ``key`` may have in the bucket: the plain one, and each trusted
    signer's own."""
    return [_core.entry_name(key), *(_core.signed_entry_name(key, s) for s in signers)]


def _names(key: _core.Key, signer: str | None) -> list[str]:
    names = [_core.entry_name(key)]
    if signer is not None:
        names.append(_core.signed_entry_name(key, signer))
    return names
