"""A ``file:`` URL as a cache path: the directory it names (RFC 8089), or why it names none.

``file:///srv/cache`` and ``file://localhost/srv/cache`` are ``/srv/cache``; ``file:/srv/cache``
too (the RFC's form without an authority). The path is percent-decoded once
(``file:///srv/my%20cache`` is ``/srv/my cache``), byte for byte as the filesystem takes a
name. The options are a bucket's read-only ones, parsed by the same parser
(``tiers.base.parse_tier_url``): ``?ro=1`` (or ``?read_only=``, a boolean; empty is true)
makes the cache read-only, as ``XLA_PERSISTENT_CACHE_READ_ONLY=1`` would. Anything else is
refused, never read as part of a name: another host (the file is not on this one), a user or
port, a relative path (``file:cache``), an encoded ``/`` (``%2F``: no name holds one) or NUL
(``%00``: no path does), a ``%`` that is no escape (``%zz``), a network share
(``file:////host/share``), any other option (``trust=`` is a remote tier's: a directory
serves what its trusted keys allow), a read-only option given twice (``?ro=1&ro=0``: a tier
takes the last, a directory's mode is not left to the order), a ``#`` part, or a control
character. So no directory is ever made under a name taken from a URL.

``cache_path.route`` and ``Store()`` both take a ``file:`` URL through ``directory`` here.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

# An encoded '/' within a name; a '%' that encodes nothing.
_ENCODED_SLASH = re.compile(r"%2f", re.IGNORECASE)
_BARE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_LOCAL_HOSTS = ("", "localhost")


@dataclass(frozen=True)
class FileURL:
    """The directory a ``file:`` URL names: absolute, decoded; whether it is read-only."""

    path: str
    read_only: bool = False


def directory(url: str) -> FileURL:
    """The directory the ``file:`` URL ``url`` names. ``ValueError`` saying why it names
    none (see the module's docstring); the message never quotes an option's value."""
    text = url.strip()
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        # urlsplit would drop a tab or a newline silently and name another directory.
        raise ValueError("it holds a control character (percent-encode it)")
    if "#" in text:
        raise ValueError("a '#' part, which names no directory (write '#' as %23)")
    # Here, not at the top: a plain directory path never needs the tiers' parser.
    from xla_pcache.tiers.base import RO_OPTIONS, parse_tier_url

    tier = parse_tier_url(text)
    if tier.error is not None:
        raise ValueError(tier.error)
    query = urllib.parse.parse_qsl(urllib.parse.urlsplit(text).query, keep_blank_values=True)
    if sum(1 for k, _ in query if k in RO_OPTIONS) > 1:
        # ?ro=1&ro=0: a tier takes the last; a directory's mode is not left to the order.
        raise ValueError("a read-only option given twice (ro, read_only): say it once")
    if tier.trust_required:
        raise ValueError(
            "trust=required is an option of a remote tier; a directory serves the entries "
            "its trusted keys allow (XLA_PCACHE_TRUSTED_KEYS)"
        )
    if urllib.parse.urlsplit(tier.bare).query:
        # Not named: what follows a '?' may be a token pasted by mistake.
        raise ValueError("an option other than ro and read_only (not shown)")
    # The text as written: the tier's ``bare`` is rebuilt, with a '//' and a '/' added.
    parts = urllib.parse.urlsplit(text)
    host = parts.netloc.lower()
    if host not in _LOCAL_HOSTS:
        if "@" in host or ":" in host:
            raise ValueError("a user or a port, which a file: URL of this host has none of")
        raise ValueError(
            f"it names a file on host {parts.netloc!r}: xla_pcache serves directories of "
            "this host (file:///path or file://localhost/path); mount it and give its path"
        )
    raw = parts.path
    if _BARE_PERCENT.search(raw):
        # Left as it is, it would name a directory the URL does not spell out.
        raise ValueError("a '%' that is no escape (write '%' as %25)")
    if _ENCODED_SLASH.search(raw):
        raise ValueError("an encoded '/' (%2F) within a name, which no name holds")
    path = os.fsdecode(urllib.parse.unquote_to_bytes(raw))
    if "\0" in path:
        raise ValueError("an encoded NUL (%00), which no path holds")
    if not path:
        raise ValueError("it names no directory")
    if not path.startswith("/"):
        raise ValueError(
            "a relative path: a file: URL names an absolute one (give a relative directory "
            "as it is, without file:)"
        )
    if path.startswith("//"):
        raise ValueError(
            "it names a network share (file:////host/share): mount it and give its path"
        )
    return FileURL(os.path.abspath(path), tier.read_only)
