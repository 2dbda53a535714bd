"""One use record, an object under a bucket's ``records/``: ``r-<ms>-<tag>-<puts>-<bytes>``,
the entries one host used and wrote since its previous record, one entry name a line, gzip
(``recorder.py`` uploads them, a prune folds them). The name carries when (the host's clock, in
milliseconds) and how many entries and bytes that host wrote to the bucket since, so that a
writer estimates the bucket's size from one listing, without reading a record."""

from __future__ import annotations

import secrets
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from xla_pcache.bucket.layout import USE_RECORD_DIR, USE_RECORD_LINE, USE_RECORD_NAME, epoch
from xla_pcache.bucket.reader import (
    CLOCK_SLACK_S,
    MAX_USE_RECORD,
    BucketReader,
    checked_count,
    listed_size,
)


@dataclass(frozen=True)
class UseRecord:
    """One use record: when it was written (its own time, within the clock slack), what
    its host wrote since its previous one, the object's size, and ``written``: the time
    the service gave it (no writer sets it: a record planted later cannot claim to be
    older)."""

    path: str
    when: float
    puts: int
    put_bytes: int
    size: int
    written: float = 0.0


def parse_use_record(meta: Mapping[str, Any]) -> UseRecord | None:
    """A record object's listing, checked: None for a name no host writes."""
    path = str(meta["path"])
    m = USE_RECORD_NAME.fullmatch(path.rpartition("/")[2])
    size = listed_size(meta)
    if m is None or size is None:
        return None
    written = epoch(meta)
    own = int(m.group(1)) / 1000
    when = own if abs(own - written) <= CLOCK_SLACK_S else written
    puts, put_bytes = checked_count(int(m.group(3))), checked_count(int(m.group(4)))
    if puts is None or put_bytes is None:
        return None
    return UseRecord(path, when, puts, put_bytes, size, written)


def use_record_lines(reader: BucketReader, path: str) -> Iterator[str]:
    """The entry names the record at ``path`` holds, streamed (lines that are none
    skipped)."""
    # The line's shape is an entry name's: no EntryName made for each (a million of
    # them in a planted record cost seconds), only for the few that are entries.
    for m in reader.gzip_lines(path, MAX_USE_RECORD, "record", USE_RECORD_LINE):
        yield m.group(1).decode("ascii")


def new_use_record_name(puts: int, put_bytes: int) -> str:
    """The path of a new record: when (ms), a random tag (unique), and what its host wrote
    since."""
    ms = int(time.time() * 1000)
    return f"{USE_RECORD_DIR}/r-{ms}-{secrets.token_hex(8)}-{max(0, puts)}-{max(0, put_bytes)}"


def use_record_body(names: Iterable[str]) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress("".join(f"{n}\n" for n in sorted(set(names))).encode()) + c.flush()
