"""What lives below a bucket prefix's ``xla_pcache-1/`` for its upkeep (``upkeep.py`` says
what each object holds): the objects' names, the shapes of the names xla_pcache writes
there and of the lines of its gzip objects, the time a listing gives an object, and what a
marker is.

A **marker** is an empty object ``<MARKER_DIR>/<entry name>-<tag>`` that a writer puts
after an entry, so that hosts that must hold entries before their framework starts find
them by a listing: its tag is the last segment of the entry's key without its build
(``marker_tag``), 1 to 40 digits. What a prune keeps of them is told by the entry's own
header (``prune_markers``); which framework writes and follows them is that framework's
adapter's business, not the bucket's. The directory's name is the one the buckets that
hold markers have.

The root's digit is the version of this layout: a release reads, writes and removes only
below its own root, so a later layout's objects (``xla_pcache-2/...``) are never touched."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from xla_pcache import build_key
from xla_pcache.bucket.listing import Names

ROOT = "xla_pcache-1"
CONFIG = f"{ROOT}/config"
USAGE = f"{ROOT}/usage"
STATE = f"{ROOT}/state"
LEASE = f"{ROOT}/prune.lease"
USE_RECORD_DIR = f"{ROOT}/records"
MARKER_DIR = f"{ROOT}/torch_xla"
# How much of an entry file is read to learn the key its header names (the fixed header and
# a key: far more than a marked key takes).
HEAD_BYTES = 4096
# What the names of ours in each directory look like, for its listings
# (``listing.Names``): entries' and claims' are entry names, markers begin with one,
# records with "r-".
ENTRY_NAMES = Names(hex=True, exact=True)
MARKER_NAMES = Names(hex=True, exact=False)
RECORD_NAMES = Names(hex=False, lead="r-")

USE_RECORD_NAME = re.compile(r"r-([0-9]{1,15})-([0-9a-f]{16})-([0-9]{1,12})-([0-9]{1,16})")
MARKER_TAG = re.compile(r"[0-9]{1,40}")
MARKER_NAME = re.compile(r"([0-9a-f]{32})-(" + MARKER_TAG.pattern + ")")
# The lines of the gzip objects: a record's, an entry name; usage's, ``<name> <last use>
# <uses>``.
USE_RECORD_LINE = re.compile(rb"[ \t]*([0-9a-f]{32})[ \t]*")
USAGE_LINE = re.compile(rb"([0-9a-f]{32}) ([0-9]{1,12}(?:\.[0-9]{1,6})?) ([0-9]{1,19})")
_FIXED = frozenset(("config", "usage", "state", "prune.lease"))
_NAMED_DIRS = {"entries": re.compile(r"[0-9a-f]{32}"), "claims": re.compile(r"[0-9a-f]{32}")}


def marker_tag(key: str | bytes | None) -> str | None:
    """The tag of a marker of an entry of ``key``: the last ``/``-separated segment of the
    key without its build, when the key has such a segment and it is a tag; else None (no
    marker of it is any entry's)."""
    if not isinstance(key, str) or "/" not in key:
        return None
    tag = build_key.strip(key).rpartition("/")[2]
    return tag if MARKER_TAG.fullmatch(tag) else None


def epoch(meta: Mapping[str, Any]) -> float:
    """When a listed object was last written (its ``Last-Modified``), 0 when not given."""
    lm = meta.get("last_modified")
    return float(lm.timestamp()) if lm is not None else 0.0


def squatted(path: str) -> str | None:
    """The name xla_pcache creates that ``path`` lies below, if any: an entry's or a
    claim's (a 32-digit name in ``entries/`` or ``claims/``), or one of the fixed names."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == ROOT and parts[1] in _FIXED:
        return f"{ROOT}/{parts[1]}"
    if (
        len(parts) >= 4
        and parts[0] == ROOT
        and parts[1] in _NAMED_DIRS
        and _NAMED_DIRS[parts[1]].fullmatch(parts[2])
    ):
        return "/".join(parts[:3])
    return None


def ours(path: str) -> bool:
    """Whether ``path`` (below the prefix) has the shape of something xla_pcache writes."""
    parts = path.split("/")
    if parts[0] != ROOT:
        return False
    if len(parts) == 2:
        return parts[1] in _FIXED
    if len(parts) != 3:
        return False
    kind, name = parts[1], parts[2]
    if kind in _NAMED_DIRS:
        return _NAMED_DIRS[kind].fullmatch(name) is not None
    if kind == "records":
        return USE_RECORD_NAME.fullmatch(name) is not None
    if f"{ROOT}/{kind}" == MARKER_DIR:
        return MARKER_NAME.fullmatch(name) is not None
    return False
