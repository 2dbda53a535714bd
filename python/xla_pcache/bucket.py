"""A bucket as the cache path: ``gs://``, ``s3://`` or ``az://`` wherever a cache directory
is named (``XLA_PERSISTENT_CACHE_PATH``, ``JAX_COMPILATION_CACHE_DIR``, ``install(path)``,
torch_xla's ``initialize_cache``, ``--path`` of the CLI).

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

A URL that cannot be served (an unknown scheme, a malformed bucket URL, obstore not installed)
is one warning naming the variable it came from and what to install; the caller then runs
uncached or leaves it to JAX's own cache (``Route.own_cache``).

``BucketStore`` is the store of such a path: a ``Store`` whose hits are also noted for the
bucket's pruning (``tiers/records.py``), and which can mark and pull torch_xla's entries.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from xla_pcache import _core
from xla_pcache._names import EntryName
from xla_pcache._owndir import OwnDir, open_own
from xla_pcache._text import package_logger
from xla_pcache.config import LOCAL_PATH_VAR, Settings
from xla_pcache.store import Store

log = package_logger("xla_pcache")

SCHEMES = ("gs", "s3", "az")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
EXTRA = 'pip install "xla-pcache[objstore]"'
# What a torch_xla host start may cost at most (``BucketStore.pull_torch_xla``): objects of
# ``torch_xla/`` listed (one request a thousand), entries fetched, markers found to lead to no
# entry before it stops.
PULL_MARKERS = 10_000
PULL_FETCHES = 1_000
PULL_MISSES = 32


def is_url(path: object) -> bool:
    """Whether ``path`` is written as a URL (``scheme://...``), never a directory name."""
    return isinstance(path, str) and _URL.match(path.strip()) is not None


@dataclass(frozen=True)
class Route:
    """Where a cache path goes: ``local`` (``path``: the directory), ``bucket`` (``path``:
    the URL) or ``unserved`` (``path``: the URL; ``reason`` says why, ``own_cache`` whether
    JAX's own cache can take it instead)."""

    kind: Literal["local", "bucket", "unserved"]
    path: str
    reason: str = ""
    own_cache: bool = False


def route(raw: str | os.PathLike[str]) -> Route:
    """Classifies a cache path. A local one comes back absolute (``file://`` taken off)."""
    text = os.fspath(raw).strip() if isinstance(raw, str) else os.fspath(raw)
    m = _URL.match(text) if isinstance(text, str) else None
    if m is None:
        return Route("local", os.path.abspath(os.path.expanduser(text)))
    scheme = m.group(1).lower()
    if scheme == "file":
        return Route("local", os.path.abspath(os.path.expanduser(text[len("file://") :])))
    if scheme not in SCHEMES:
        return Route(
            "unserved",
            text,
            f"xla_pcache serves gs://, s3:// and az:// URLs, not {scheme}://",
        )
    if not _has_obstore():
        return Route("unserved", text, f"serving it needs obstore: {EXTRA}", own_cache=True)
    from xla_pcache.tiers.objstore import parse_object_url

    try:
        parse_object_url(text)
    except ValueError as e:
        # The reason is shown wherever the URL is (redacted): no part of the URL redaction
        # hides may reach it (a value the option parser quotes, say).
        from xla_pcache.tiers.base import hide_url_secrets

        return Route("unserved", text, hide_url_secrets(str(e), text))
    return Route("bucket", text)


def _has_obstore() -> bool:
    try:
        return importlib.util.find_spec("obstore") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules: not importable
        return False


def warn_unserved(r: Route, source: str, instead: str) -> None:
    """The one warning for a URL that cannot be served, naming where it came from."""
    from xla_pcache.tiers import redact

    log.warning(
        "xla_pcache: %s=%s cannot be served (%s); %s",
        source,
        redact(r.path),
        r.reason,
        instead,
    )


def shown_path(path: str | os.PathLike[str]) -> str:
    """A cache path as a message shows it: a URL redacted (``tiers.redact``: no credential,
    option value or fragment), a directory as it is."""
    text = os.fspath(path)
    if not is_url(text):
        return str(text)
    from xla_pcache.tiers import redact

    return redact(text)


def location(url: str) -> str:
    """The bucket and prefix a URL names (scheme lower-cased, no options, no slashes at the
    ends): what two spellings of one cache have in common."""
    parts = urllib.parse.urlsplit(url.strip())
    return f"{parts.scheme.lower()}://{parts.netloc}/{parts.path.strip('/')}".rstrip("/")


def local_name(url: str) -> str:
    """The host-local store's directory name for ``url``: readable, one path component, and
    distinct for every bucket and prefix (a digest of them)."""
    loc = location(url)
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


def own_local_store(url: str, settings: Settings) -> OwnDir:
    """Opens the host-local store's directory of the bucket path ``url`` as a directory of
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
            return open_own(local_name(url), rule="repair", parent=top, refetched=_REFETCHED)
    except _core.CacheError as e:
        raise _core.CacheError(
            f"{e}: a bucket path's host-local store must be this user's own (set "
            f"{LOCAL_PATH_VAR} to a directory of your own)"
        ) from None


def _read_only_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = [(k, v) for k, v in query if k not in ("ro", "read_only")] + [("ro", "1")]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def bucket_read_only(url: str, settings: Settings, read_only: bool | None = None) -> bool:
    """Whether nothing may be written to the bucket of the path ``url``: the one rule for its
    entries, hosts' records, torch_xla markers, budget and prune, in every command and
    adapter. ``read_only`` (an argument, ``--read-only``), else the settings'
    (``XLA_PERSISTENT_CACHE_READ_ONLY``); and the URL's own ``?ro=1`` (or ``?read_only=1``)
    whatever they say."""
    from xla_pcache.tiers.base import split_mode

    ro = settings.read_only if read_only is None else read_only
    return ro or split_mode(url)[1]


def chain_for(url: str, settings: Settings, read_only: bool) -> str:
    """The remote chain of a bucket path: ``XLA_PCACHE_REMOTE``'s tiers (a faster tier in
    front, such as Redis), then the bucket; every tier read-only for a read-only process."""
    from xla_pcache.tiers import split_urls

    urls = [u for u in split_urls(settings.remote or "") if location(u) != location(url)]
    urls.append(url)
    return ",".join(_read_only_url(u) if read_only else u for u in urls)


class BucketStore(Store):
    """The host-local store of a bucket path: a ``Store`` with the bucket as its last tier,
    whose hits are also recorded for the bucket's pruning. ``bucket_url`` is the path as
    given (the cache's identity); ``path`` the local directory."""

    bucket_url: str = ""
    # Nothing is written to the bucket (``bucket_read_only``): no entry, record or marker.
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

    def _note(self, blob: _core.Blob) -> None:
        """A use of ``blob``'s entry, for the bucket's pruning (a read ahead is not one
        until it serves a lookup: ``count_hit``)."""
        recorder = self._recorder
        if recorder is not None:
            key, signer = blob.key, blob.signer
            recorder.note(key, lambda: _names(key, signer))

    def _tier_put(self, names: list[str], data: bytes) -> None:
        super()._tier_put(names, data)
        if self._recorder is not None:
            self._bucket_tier()  # found now, while the chain is open, for the record's counts
            self._recorder.wrote()

    def bucket(self) -> Any:
        """The bucket's upkeep (``tiers.upkeep.Bucket``), made on first use."""
        with self._bucket_lock:
            made = getattr(self, "_upkeep", None)
            if made is None:
                from xla_pcache.tiers.upkeep import Bucket

                made = self._upkeep = Bucket(
                    self.bucket_url,
                    timeout=self.settings.remote_timeout,
                    read_only=self.bucket_ro,
                )
            return made

    def _bucket_tier(self, *, open_it: bool = True) -> Any:
        """The bucket's tier in the chain (opened now unless ``open_it`` is False), kept
        once found: its counters outlive the chain's close."""
        found = getattr(self, "_object_tier", None)
        if found is not None or not open_it:
            return found
        from xla_pcache.tiers.objstore import ObjectTier

        chain = self.remote
        for tier in chain.tiers if chain is not None else ():
            if isinstance(tier, ObjectTier) and location(tier.url) == location(self.bucket_url):
                self._object_tier = tier
                return tier
        return None

    def _written(self) -> tuple[int, int]:
        """This process's entries and bytes written to the bucket (successful creates)."""
        tier = self._bucket_tier(open_it=False)
        if tier is None:
            return (0, 0)
        counts = tier.stats()
        return int(counts.get("remote_puts", 0)), int(counts.get("remote_written_bytes", 0))

    # ---------------------------------------------------------------- torch_xla
    def mark_torch_xla(self, key: str, graph: str) -> None:
        """After the entry of torch_xla's file ``graph`` was queued for the bucket: a marker
        that lets torch_xla hosts find it (written after the entry, on the tier's thread)."""
        if self.read_only or self.bucket_ro:
            return
        tier = self._bucket_tier()
        if tier is None:
            return
        name = EntryName(_core.entry_name(key))

        def mark() -> None:
            try:
                self.bucket().mark_torch_xla(name, graph)
            except Exception as e:
                # Not the tier's failure (its entry went out before): a service with
                # directories refuses a marker someone planted an object below. One
                # warning, and the tier is not left alone for it.
                if tier.first_warning("marker"):
                    from xla_pcache.tiers.objstore import scrub

                    log.warning(
                        "xla_pcache: writing a torch_xla marker to %s failed (%s: %s); "
                        "other hosts will not fetch that entry before they start",
                        tier.url,
                        type(e).__name__,
                        scrub(str(e)),
                    )

        tier.submit(mark)

    def pull_torch_xla(self, key_of: Callable[[str], str]) -> int:
        """Fetches into this store the bucket's torch_xla entries it lacks, newest first,
        within its budget (torch_xla looks only in its own directory, so its host copy must
        hold them before it starts). Returns how many were fetched.

        Markers are untrusted (anyone who can write the bucket plants them), so what a start
        costs is bounded whatever is there: one listing of at most ``PULL_MARKERS`` objects
        under ``torch_xla/`` (``PULL_MARKERS / 1000`` requests), a marker whose name is not
        its graph's entry name costs nothing more, and fetches stop after ``PULL_FETCHES``
        attempts or ``PULL_MISSES`` that found no entry (a marker of an entry that is not
        there, or not one)."""
        bucket = None
        try:
            bucket = self.bucket()
            marked = bucket.torch_xla_entries(limit=PULL_MARKERS)
        except Exception as e:
            from xla_pcache.tiers import redact

            log.warning(
                "xla_pcache: listing torch_xla's entries in %s failed (%s); this host starts "
                "with what it has",
                redact(self.bucket_url),
                type(e).__name__,
            )
            return 0
        budget, used, fetched = self.max_size, self.stats()["bytes"], 0
        attempts = misses = 0
        for name, graph, _when in marked:
            key = key_of(graph)
            if _core.entry_name(key) != name or key in self:
                continue  # a marker that does not name its graph's entry is ignored
            if attempts >= PULL_FETCHES or misses >= PULL_MISSES:
                bucket.reader.skip(
                    "torch_xla-markers",
                    f"a host start fetches at most {PULL_FETCHES} torch_xla entries and "
                    f"stops after {PULL_MISSES} markers of no entry: the rest of the markers "
                    "were not followed",
                )
                break
            attempts += 1
            blob = self._fetch(key)
            if blob is None:
                misses += 1
                continue
            used += len(blob)
            fetched += 1
            if budget is not None and used > budget:
                break
        return fetched

    def close(self) -> None:
        recorder, self._recorder = self._recorder, None
        super().close()  # finishes the writes the record counts
        if recorder is not None:
            recorder.close()


def _names(key: _core.Key, signer: str | None) -> list[str]:
    names = [_core.entry_name(key)]
    if signer is not None:
        names.append(_core.signed_entry_name(key, signer))
    return names


def open_store(
    url: str,
    *,
    settings: Settings,
    max_size: int | str | None = None,
    read_only: bool | None = None,
) -> BucketStore:
    """The host-local store of the bucket path ``url``, the bucket as its tier; what is not
    passed comes from ``settings`` (``read_only`` too: a read-only host writes nothing to
    the bucket). Raises what ``Store`` raises for a local directory that cannot be used."""
    if read_only is None:
        read_only = settings.read_only
    bucket_ro = bucket_read_only(url, settings, read_only)
    with own_local_store(url, settings) as own:
        store = BucketStore(
            own.path,
            max_size=max_size,
            read_only=False,
            remote=chain_for(url, settings, read_only),
            settings=settings,
            own_root_fd=own.fd,
        )
    store.bucket_url = url.strip()
    store.bucket_ro = bucket_ro
    store._recorder = None
    if not bucket_ro and settings.bucket_record_interval > 0:
        from xla_pcache.tiers.records import HitRecorder

        store._recorder = HitRecorder(
            store.root_fd(),
            store.bucket,
            store._written,
            interval=settings.bucket_record_interval,
            auto_prune=settings.bucket_auto_prune,
        )
    return store


def open_path(
    path: str | os.PathLike[str],
    *,
    settings: Settings | None,
    max_size: int | str | None = None,
    read_only: bool | None = None,
    name: str = "path",
) -> Store:
    """A ``Store`` for any cache path: a local directory's, or a bucket's host-local one,
    with ``Store``'s rule for what is not passed (``settings``, else the environment but
    for the budget and ``read_only``). A URL that cannot be served is a ``ValueError``
    naming ``name``."""
    r = route(path)
    if r.kind == "local":
        return Store(r.path, max_size=max_size, read_only=read_only, settings=settings)
    if r.kind == "unserved":
        from xla_pcache.tiers import redact

        raise ValueError(f"{name} {redact(r.path)!r} cannot be served: {r.reason}")
    if settings is None:
        # As Store without settings: the environment's, less its budget and read-only mode.
        settings = Settings.from_env().replace(max_size=None, read_only=False)
    return open_store(r.path, settings=settings, max_size=max_size, read_only=read_only)


__all__ = [
    "BucketStore",
    "Route",
    "bucket_read_only",
    "chain_for",
    "is_url",
    "local_name",
    "local_path",
    "location",
    "open_path",
    "open_store",
    "own_local_store",
    "route",
    "shown_path",
    "warn_unserved",
]
