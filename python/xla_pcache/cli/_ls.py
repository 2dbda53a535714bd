"""``xla-pcache ls``: the entries of a cache, streamed a shard directory at a time, or the
first N in an order."""

from __future__ import annotations

import heapq
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from xla_pcache import _core
from xla_pcache._text import shown
from xla_pcache.cli._common import (
    JsonOption,
    PathOption,
    ReadOnlyOption,
    format_ago,
    key_text,
    open_cache,
    plain_console,
    reported,
)
from xla_pcache.sizes import format_size

if TYPE_CHECKING:
    from xla_pcache._reports import Entry


class SortKey(StrEnum):
    size = "size"
    age = "age"
    last_use = "last-use"


def _iter_entries(store: _core.Store) -> Iterator[Entry]:
    """Every entry, a shard directory at a time: the first ones come at once at any size."""
    for shard in store.entry_shards():
        yield from store.entries(shard)


def _entry_json(entry: Entry) -> dict[str, Any]:
    key = entry["key"]
    result: dict[str, Any] = {**entry, "key": key if isinstance(key, str) else key_text(key)}
    if isinstance(key, bytes):
        # The text form of a binary key is lossy; the hex form is exact.
        result["key_hex"] = key.hex()
    return result


def _sort_key(sort: SortKey) -> tuple[Callable[[Entry], float], bool]:
    """The key of an order, and whether its largest values come first. Each order puts
    first what the column names most of: the biggest, the oldest, the longest unused (the
    next candidates for eviction)."""
    if sort is SortKey.size:
        return (lambda e: e["disk_bytes"] or e["size"]), True
    if sort is SortKey.age:
        return (lambda e: e["created"]), False
    return (lambda e: e["last_use"] or e["created"]), False


def _ordered(entries: Iterable[Entry], sort: SortKey, limit: int) -> list[Entry]:
    """The first ``limit`` entries in ``sort`` order (all of them when ``limit`` is 0),
    holding at most ``limit`` of them at a time (a heap over the stream)."""
    key, largest = _sort_key(sort)
    if limit:
        pick = heapq.nlargest if largest else heapq.nsmallest
        return pick(limit, entries, key=key)
    return sorted(entries, key=key, reverse=largest)


_LS_COLUMNS = ("size", "on disk", "age", "last use", "hits", "producer", "signer", "key")
_LS_WIDTHS = (8, 8, 8, 8, 6, 20, 12)


def _ls_line(cells: Iterable[str]) -> str:
    *fixed, key = cells
    parts = [
        f"{c:<{w}}" if i >= len(_LS_WIDTHS) - 2 else f"{c:>{w}}"
        for i, (c, w) in enumerate(zip(fixed, _LS_WIDTHS, strict=True))
    ]
    return "  ".join([*parts, key])


def _ls_row(entry: Entry, now: float) -> str:
    meta = entry["meta"]
    producer = " ".join(meta[k] for k in ("framework", "framework_version") if k in meta)
    last_use = entry["last_use"]
    return _ls_line(
        (
            format_size(entry["size"]),
            format_size(entry["disk_bytes"]),
            format_ago(now - entry["created"]),
            format_ago(None if last_use is None else now - last_use),
            str(entry["hits"]),
            key_text(producer) if producer else "-",
            key_text(entry.get("signer") or "-"),
            key_text(entry["key"]),
        )
    )


def _json_item(entry: Entry) -> str:
    text = json.dumps(_entry_json(entry), indent=2, sort_keys=True, default=key_text)
    return "  " + text.replace("\n", "\n  ")


def list_entries(
    path: PathOption = None,
    read_only: ReadOnlyOption = False,
    sort: Annotated[
        SortKey | None,
        typer.Option(
            "--sort",
            help="Largest, oldest or least recently used first (reads every entry's header, "
            "keeping only --limit of them). Default: directory order, streamed.",
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            "-n",
            min=0,
            help="At most N entries; 0 for all. Default: a screenful on a terminal, all "
            "when piped or with --json.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Entries with key, size, age, last use, hits, producer (framework and version) and
    signer (the key name a signed entry names; `verify --trusted` checks the signatures).

    Lines are printed as each shard directory is read, so the first come at once at any
    size. Hits are the hits recorded, at most one per process per hit interval: a lower
    bound."""
    if limit is None and as_json:
        limit = 0
    elif limit is None:
        # Only a listing for a terminal asks rich what the terminal is.
        console = plain_console()
        limit = 0 if not console.is_terminal else max(10, console.height - 5)
    with reported(), open_cache(path, read_only=read_only) as store:
        try:
            _write_entries(store, sort, limit, as_json)
        except BrokenPipeError:
            # The reader (head, less) had enough: not an error. Python would otherwise
            # complain while flushing stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _write_entries(store: _core.Store, sort: SortKey | None, limit: int, as_json: bool) -> None:
    out = sys.stdout
    stream: Iterable[Entry] = _iter_entries(store)
    if sort is not None:
        stream = _ordered(stream, sort, limit)
    elif limit:
        stream = itertools.islice(stream, limit)
    if as_json:
        first = True
        for entry in stream:
            out.write(("[\n" if first else ",\n") + _json_item(entry))
            first = False
        out.write("[]\n" if first else "\n]\n")
        out.flush()
        return
    total = len(store)
    out.write(f"{total:,} entries in {shown(store.path)} (from the index)\n")
    out.write(_ls_line(_LS_COLUMNS) + "\n")
    now = time.time()
    written = 0
    for entry in stream:
        out.write(_ls_row(entry, now) + "\n")
        written += 1
        if written % 256 == 0:
            out.flush()
    if limit and written == limit and total > written:
        out.write(f"... and about {total - written:,} more (--limit 0 lists every one)\n")
    out.flush()
