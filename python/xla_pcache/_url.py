"""A path written as a URL: the one test of whether a cache path is one (``is_url``), its
scheme, and the schemes a cache path or a remote tier may name.

A URL is never a directory: every place that takes a cache path (the store, the adapters,
the command, ``XLA_PCACHE_LOCAL_PATH``) asks here, so that nothing is ever created under a
name made of a URL. ``file:`` is the one URL that names a directory (``_file_url``: the
directory it names, or why none), with or without ``//`` (``file:/srv/cache`` is one).
"""

from __future__ import annotations

import re

# ``scheme://``, the scheme as RFC 3986 spells one.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# ``file:`` without ``//`` is a URL too (RFC 8089's ``file:/path``; ``file:cache`` is one it
# refuses), never a relative directory named ``file:...``.
_FILE = re.compile(r"^file:", re.IGNORECASE)
FILE_SCHEME = "file"

# The object stores a cache path (and a remote tier) may name: S3, GCS, Azure Blob.
BUCKET_SCHEMES = ("s3", "gs", "az")
# Redis, a remote tier only; its URLs are the only ones that carry a password.
REDIS_SCHEMES = ("redis", "rediss", "unix")


def url_scheme(path: object) -> str | None:
    """The scheme of ``path`` written as a URL (``scheme://...``, or ``file:...``;
    surrounding blanks ignored), lower-cased; None for anything else (a directory name, a
    path object)."""
    if not isinstance(path, str):
        return None
    text = path.strip()
    m = _URL.match(text)
    if m is not None:
        return m.group(1).lower()
    return FILE_SCHEME if _FILE.match(text) else None


def is_url(path: object) -> bool:
    """Whether ``path`` is written as a URL (``scheme://...``), never a directory name."""
    return url_scheme(path) is not None


def names_directory(path: object) -> bool:
    """Whether ``path`` names a directory: not a URL, or a ``file:`` one (which may still
    name none: ``_file_url.directory`` says)."""
    return url_scheme(path) in (None, FILE_SCHEME)
