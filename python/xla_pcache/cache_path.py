"""A cache path, what it names, and the one door to its store (``open_store``).

Wherever a cache is named (``XLA_PERSISTENT_CACHE_PATH``, ``JAX_COMPILATION_CACHE_DIR``,
``install(path)``, torch_xla's ``initialize_cache``, ``PersistentCache(path)``, ``--path`` of
the command), the path is one of three things (``route``):

- a directory (a local path, or a ``file:`` URL naming one on this host, percent-decoded,
  ``?ro=1`` making it read-only: ``_file_url``): its ``Store``;
- a bucket (``gs://``, ``s3://``, ``az://``): its host-local store, a ``BucketStore`` with the
  bucket as its last remote tier (``xla_pcache.bucket``);
- a URL that cannot be served (any other scheme, a malformed bucket URL, a ``file:`` URL
  naming no directory of this host, obstore not installed): never a directory named after
  it. The caller says so once
  (``warn_unserved``), naming where it came from, and runs uncached or, for a bucket
  without obstore, leaves it to JAX's own cache (``Route.own_cache``).

``open_store`` is the only place the package turns a path into a store: the adapters, the
command, ``doctor``, ``PersistentCache`` and ``from_env`` all come through it (a test holds
every other module to that). It takes the route, settles what the store is opened with once
(``store.settle``: an argument over ``Settings`` over the environment, sizes and durations
parsed, the remote chain checked) and opens the store on the result.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Unpack

from xla_pcache._file_url import directory as file_directory
from xla_pcache._text import package_logger
from xla_pcache._url import BUCKET_SCHEMES, FILE_SCHEME, is_url, url_scheme
from xla_pcache.config import Settings
from xla_pcache.store import Store, StoreArgs, StoreOptions, settle

if TYPE_CHECKING:
    from xla_pcache.tiers import TierURL

log = package_logger("xla_pcache")

EXTRA = 'pip install "xla-pcache[objstore]"'


@dataclass(frozen=True)
class Route:
    """Where a cache path goes: ``local`` (``path``: the directory, absolute; ``read_only``:
    a ``file:`` URL's ``?ro=1``), ``bucket`` (``path``: the URL as given; ``location``: the
    bucket and prefix it names, the cache's identity; ``tier``: the URL parsed, once) or
    ``unserved`` (``path``: the URL; ``reason`` says why, ``own_cache`` whether JAX's own
    cache can take it instead)."""

    kind: Literal["local", "bucket", "unserved"]
    path: str
    reason: str = ""
    own_cache: bool = False
    read_only: bool = False
    location: str = field(default="", compare=False, repr=False)
    tier: TierURL | None = field(default=None, compare=False, repr=False)


def route(raw: str | os.PathLike[str] | Route) -> Route:
    """Classifies a cache path (a ``Route`` is its own). A local one comes back absolute
    (``~`` expanded; a ``file:`` URL's directory decoded, ``_file_url``)."""
    if isinstance(raw, Route):
        return raw
    text = os.fspath(raw).strip() if isinstance(raw, str) else os.fspath(raw)
    scheme = url_scheme(text)
    if scheme is None:
        return Route("local", os.path.abspath(os.path.expanduser(text)))
    if scheme == FILE_SCHEME:
        try:
            named = file_directory(text)
        except ValueError as e:
            return Route("unserved", text, f"a file: URL that names no directory here: {e}")
        return Route("local", named.path, read_only=named.read_only)
    if scheme not in BUCKET_SCHEMES:
        return Route(
            "unserved",
            text,
            f"xla_pcache serves gs://, s3:// and az:// URLs, not {scheme}://",
        )
    if not _has_obstore():
        return Route("unserved", text, f"serving it needs obstore: {EXTRA}", own_cache=True)
    from xla_pcache.tiers.base import parse_tier_url
    from xla_pcache.tiers.objstore import parse_object_url

    tier = parse_tier_url(text)
    try:
        location, _ = parse_object_url(tier)
    except ValueError as e:
        # The reason is shown wherever the URL is (redacted): no part of the URL redaction
        # hides may reach it (a value the option parser quotes, say).
        from xla_pcache.tiers.base import hide_url_secrets

        return Route("unserved", text, hide_url_secrets(str(e), text))
    return Route("bucket", text, location=location, tier=tier)


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


def open_store(
    path: str | os.PathLike[str] | Route,
    settings: Settings | StoreOptions | None = None,
    *,
    name: str = "path",
    **given: Unpack[StoreArgs],
) -> Store:
    """The store of the cache path ``path`` (or of a ``route`` already taken of it): a
    directory's ``Store``, or a bucket's host-local ``BucketStore`` with the bucket behind
    it. What is not given comes from ``settings`` by ``store.settle``'s one rule (without
    settings, the environment's, less its budget and ``read_only``); a caller that settled
    them already (to know them before the store opens) passes the ``StoreOptions``. For a
    bucket,
    ``read_only`` (given or from the settings) makes every tier read-only and writes nothing
    to the bucket, as its URL's ``?ro=1`` does; the host-local store still keeps what this
    host fetched and compiled. A ``file:`` URL's ``?ro=1`` makes its directory's store
    read-only, whatever ``read_only`` says (it can only add to it, as for a bucket). A URL
    that cannot be served is a ``ValueError`` naming ``name``; a directory that cannot be
    used raises what ``Store`` raises."""
    where = route(path)
    if where.kind == "unserved":
        from xla_pcache.tiers import redact

        raise ValueError(f"{name} {redact(where.path)!r} cannot be served: {where.reason}")
    if isinstance(settings, StoreOptions):
        if given:
            raise TypeError("open_store: options are given settled or as arguments, not both")
        opts = settings
    else:
        opts = settle(settings, **given)
    if where.kind == "local" or where.tier is None:
        if where.read_only and not opts.read_only:
            opts = opts.replace(read_only=True)
        return Store._open(where.path, opts)
    # Here, not at the top: a directory's store never needs the bucket's machinery.
    from xla_pcache.bucket import BucketStore, chain_for, own_local_store

    chain = chain_for(where.location, where.tier, opts)
    local = opts.replace(read_only=False, chain=chain, chain_text=",".join(t.text for t in chain))
    with own_local_store(where.location, opts.settings) as own:
        store = BucketStore._open(own.path, local, own_root_fd=own.fd)
    store.serve_bucket(where.path, where.location, read_only=opts.read_only or where.tier.read_only)
    return store


__all__ = ["Route", "is_url", "open_store", "route", "shown_path", "warn_unserved"]
