"""A store key with the runtime build that compiled it: ``<framework key>@build-<32 hex>``.

Every executable's key an adapter gives the store ends with the build of the runtime that
compiled it (``xla_pcache.builds``), so that a process asks only for its own build's
entries. This module is the one place that knows how: ``join`` makes a store key of a
framework's key and a build, ``split`` reads one back (``strip`` keeps the framework's key),
and ``is_build`` says what a build is here: 32 lowercase hex digits, nothing else. A build is
checked where it comes in (a ``Build`` is made, a stored key is split), not at each join: a
join is on every get, and costs a concatenation. Keys that
are a compile's inputs rather than a build's output (a prefetch plan, a module record) carry
none. It imports nothing, so the miss log and every adapter can use it.
"""

from __future__ import annotations

import re

__all__ = ["DIGEST_HEX", "is_build", "join", "split", "strip", "suffix"]

# How many hex digits a build's digest has in a key (``builds`` truncates its digest to it).
DIGEST_HEX = 32
_SEPARATOR = "@build-"
_DIGEST = re.compile(f"[0-9a-f]{{{DIGEST_HEX}}}")


def is_build(text: str) -> bool:
    """Whether ``text`` is a build as keys carry it: 32 lowercase hex digits."""
    return _DIGEST.fullmatch(text) is not None


def suffix(build: str) -> str:
    """What the store keys of ``build`` end with (``build``: a digest ``is_build`` accepts,
    not checked again here)."""
    return _SEPARATOR + build


def join(key: str, build: str | None) -> str:
    """The store key of the framework's ``key`` compiled by ``build`` (a digest ``is_build``
    accepts: a ``Build``'s, or one ``split`` read; not checked again here); ``key`` itself
    for None (no build: what a release before keys carried one wrote, or a test of a mirror
    alone)."""
    return key if build is None else key + _SEPARATOR + build


def split(stored: str) -> tuple[str, str | None]:
    """(the framework's key, the build's digest) of the store key ``stored``; the build is
    None when the key carries none (an entry written before keys carried one, a plan, a
    record, or a key whose tail only looks like a build)."""
    head, sep, build = stored.rpartition(_SEPARATOR)
    if sep and is_build(build):
        return head, build
    return stored, None


def strip(stored: str) -> str:
    """The framework's key of the store key ``stored`` (``split``'s first part)."""
    return split(stored)[0]
