"""``xla-pcache``: look after a cache directory (stats, ls, prune, verify, clear, ...).

Expected failures (no path, not a cache, a ``CacheError``, a malformed option or variable)
print one line on stderr and exit 2. ``verify`` exits 1 when it finds problems. Importing
this module must stay cheap: the framework-facing commands import their modules lazily.
"""

from __future__ import annotations

import heapq
import importlib
import itertools
import json
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from xla_pcache import _core, bucket
from xla_pcache._core import CacheError
from xla_pcache._text import ShownStream, raw_stream, shown
from xla_pcache.config import (
    MAX_SIZE_VAR,
    PATH_VAR,
    READ_ONLY_VAR,
    SIGNING_KEY_VAR,
    TRUSTED_KEYS_VAR,
    Settings,
)
from xla_pcache.sizes import format_size, parse_duration, parse_size
from xla_pcache.store import Store

if TYPE_CHECKING:
    from xla_pcache._reports import Entry, VerifyReport

app = typer.Typer(
    name="xla-pcache",
    help="Inspect and maintain an xla_pcache compilation cache directory.",
    no_args_is_help=True,
    # Markdown: a docstring's lines are one paragraph, rewrapped to the terminal, instead of
    # breaking where the source line ended.
    rich_markup_mode="markdown",
    add_completion=False,
    # Expected errors are reported in one line; anything else is a bug and should show a
    # plain traceback, without the local variables rich would print.
    pretty_exceptions_enable=False,
)

PathOption = Annotated[
    str | None,
    typer.Option(
        "--path", "-p", help=f"Cache directory (default: ${PATH_VAR})", show_default=False
    ),
]
ReadOnlyOption = Annotated[
    bool,
    typer.Option("--read-only", help=f"Never write to the cache (default: ${READ_ONLY_VAR})"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


class SortKey(StrEnum):
    size = "size"
    age = "age"
    last_use = "last-use"


class Failure(Exception):
    """An expected error: reported in one line, exit status 2."""


def _fail(message: str) -> NoReturn:
    raise Failure(message)


@contextmanager
def _reported() -> Iterator[None]:
    """Turn expected errors into one line on stderr and exit status 2, never a traceback."""
    try:
        yield
    except (Failure, CacheError, ValueError, OSError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, OSError) and not isinstance(exc, CacheError) and exc.filename:
            # Python's own OSError text quotes the path with repr(); say it plainly.
            text = f"{exc.filename}: {exc.strerror or type(exc).__name__}"
        typer.echo(f"xla-pcache: error: {_key_text(text)}", err=True)
        raise typer.Exit(2) from None


class _Terminated(BaseException):
    """SIGTERM during a long command, raised where the command is, so that what it holds
    (export's temporary file beside the bundle) is cleaned up as for Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


@contextmanager
def _interruptible(what: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM during a long command: the store stopped after the entry it was at
    (every step of verify, prune, export and import leaves a valid cache) and the command's
    own temporary files are removed; say so, exit 130 (143 for SIGTERM)."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread (an embedding): the default action stays
        previous = None
    try:
        yield
    except (KeyboardInterrupt, _Terminated) as exc:
        typer.echo(
            f"xla-pcache: {what} interrupted; the cache is left valid (nothing half-done)",
            err=True,
        )
        raise typer.Exit(143 if isinstance(exc, _Terminated) else 130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _NoProgress:
    """What a command reports progress to when no terminal shows it."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> int:
        return 0

    def update(self, task: int, **fields: object) -> None:
        return None

    def advance(self, task: int, advance: float = 1) -> None:
        return None


def _progress(console: Console) -> Any:
    """A rich progress bar on a terminal (nothing otherwise), with a count and the time."""
    if not console.is_terminal:
        return _NoProgress()
    # Lazy: only a terminal needs the progress machinery.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=True)


def _iter_entries(store: _core.Store) -> Iterator[Entry]:
    """Every entry, a shard directory at a time: the first ones come at once at any size."""
    for shard in store.entry_shards():
        yield from store.entries(shard)


def _console() -> Console:
    # Keys, metadata, paths and error texts are chosen by whoever wrote the cache or typed the
    # command: print them as they are, never as rich markup or emoji codes ("[/]" in a key
    # would otherwise raise, "[bold]" restyle the table).
    # Rich writes to the stream under the CLI's escaping one (its own colours and progress
    # bar are control sequences): what it is given to show is passed through shown().
    return Console(file=raw_stream(sys.stdout), highlight=False, markup=False, emoji=False)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _resolve_path(path: str | None, settings: Settings) -> str:
    root = os.path.expanduser(path) if path else settings.path
    if not root:
        _fail(f"no cache directory: pass --path or set {PATH_VAR}")
    if bucket.is_url(root):
        where = bucket.route(root)
        local = (
            f"; this host's copy of it is the directory {bucket.local_path(root, settings)}"
            if where.kind == "bucket"
            else ""
        )
        _fail(
            f"{redact(root)} is a URL: stats, prune and config take a bucket, this command "
            f"a directory{local}"
        )
    if not os.path.exists(root):
        _fail(f"{root}: no such directory")
    if not os.path.isdir(root):
        _fail(f"{root}: not a directory")
    fmt = os.path.join(root, "FORMAT")
    try:
        # lstat: a FORMAT that is a link, a FIFO or a directory is never opened (a FIFO would
        # block the open; a link could point anywhere).
        mode = os.lstat(fmt).st_mode
    except FileNotFoundError:
        _fail(f"{root}: not an xla_pcache cache (no FORMAT file)")
    except OSError as exc:
        _fail(f"{root}: cannot read the FORMAT file: {exc.strerror or exc}")
    if not stat.S_ISREG(mode):
        _fail(f"{root}: not an xla_pcache cache (FORMAT is {_file_kind(mode)}, not a file)")
    return root


def _open(path: str | None, *, read_only: bool, write: bool = False) -> Store:
    """Open an existing cache; never create one.

    The store is opened read-only first so that a directory of an unknown format is refused
    before anything is written to it. ``write`` reopens it writable for prune/repair/clear.
    """
    # Read even when only looking, so that a malformed value is reported by every command.
    settings = Settings.from_env()
    root = _resolve_path(path, settings)
    read_only = settings.read_only or read_only
    store = Store(root, read_only=True, settings=settings)
    if not write:
        return store
    store.close()
    if read_only:
        _fail(f"{root}: the cache is read-only (--read-only or {READ_ONLY_VAR})")
    return Store(root, read_only=False, settings=settings)


def redact(url: str) -> str:
    """``url`` without credentials or option values (``xla_pcache.tiers.redact``)."""
    from xla_pcache.tiers import redact as redact_url

    return redact_url(url)


def _bucket_url(path: str | None) -> str | None:
    """The bucket ``--path`` (else ``XLA_PERSISTENT_CACHE_PATH``) names, or None for a
    directory; a URL that is no bucket xla_pcache serves fails here."""
    raw = path if path else Settings.from_env().path
    if not raw or not bucket.is_url(raw):
        return None
    where = bucket.route(raw)
    if where.kind != "bucket":
        _fail(f"{redact(raw)} cannot be served: {where.reason}")
    return where.path


@contextmanager
def _bucket(url: str) -> Iterator[Any]:
    """The upkeep of the bucket at ``url``; its service's errors are one line, exit 2."""
    from xla_pcache.tiers.objstore import scrub
    from xla_pcache.tiers.upkeep import Bucket, BusyError

    settings = Settings.from_env()
    try:
        yield Bucket(url, timeout=max(settings.remote_timeout, 30.0))
    except (Failure, typer.Exit, BusyError):
        raise
    except Exception as exc:
        _fail(f"{redact(url)}: {type(exc).__name__}: {scrub(str(exc))}")


def _key_text(key: object) -> str:
    """A key as one printable line: control characters, bidi overrides and undecodable
    bytes escaped, so a hostile or binary key cannot break the table or the terminal."""
    return shown(key)


def _entry_json(entry: Entry) -> dict[str, Any]:
    key = entry["key"]
    result: dict[str, Any] = {**entry, "key": key if isinstance(key, str) else _key_text(key)}
    if isinstance(key, bytes):
        # The text form of a binary key is lossy; the hex form is exact.
        result["key_hex"] = key.hex()
    return result


def _format_ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _emit_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=_key_text))


# stats ---------------------------------------------------------------------------------------

# Shown first, in this order, with these labels; any other counter the store reports follows.
_STAT_ROWS = (
    ("entries", "entries"),
    ("bytes", "bytes on disk"),
    ("max_size", "budget"),
    ("max_age_s", "max age (unused entries evicted)"),
    ("fill", "fill"),
    ("hits", "hits"),
    ("adopted", "of them adopted from JAX's cache"),
    ("misses", "misses"),
    ("hit_rate", "hit rate"),
    ("puts", "puts"),
    ("compile_saved_ms", "compile time saved"),
    ("evictions", "evictions"),
    ("corrupt", "corrupt"),
    ("puts_refused", "puts refused (over budget, no room made in time)"),
    # How fresh entries and bytes are: see docs/reliability.md (stale views).
    ("view_age_s", "index as of"),
    # Single flight (compile claims): see docs/jax.md.
    ("claims", "compile claims taken"),
    ("claim_waits", "waits for another's compile"),
    ("claim_wait_ms", "time spent waiting"),
    ("claim_wait_timeouts", "waits that ran out"),
    ("claim_takeovers", "claims taken over (holder gone)"),
    ("claims_abandoned", "claims given up unpublished"),
)


def _stats_report(store: _core.Store) -> dict[str, Any]:
    stats = store.stats()
    budget = stats["max_size"]
    report: dict[str, Any] = {**stats, "fill": stats["bytes"] / budget if budget else None}
    # These describe the handle this command opened (read-only to look), not the cache.
    del report["read_only"], report["mmap_reads"]
    return report


def _view_age_text(age: float | None, fresh: bool) -> str:
    if age is None:
        return "unknown"
    text = f"{age:,.1f} s ago"
    if fresh is False:
        # A read-only store on a network filesystem cannot bypass the client's cache.
        text += " (plus the filesystem client's attribute cache time)"
    return text


def _stat_text(name: str, value: object) -> str:
    if value is None:
        return {"max_size": "unbounded", "max_age_s": "not set"}.get(name, "-")
    if name == "max_age_s" and isinstance(value, int | float):
        from xla_pcache.metrics import human_duration

        return human_duration(value)
    if isinstance(value, int) and ("bytes" in name.split("_") or name == "max_size"):
        return f"{format_size(value)} ({value:,} B)"
    if name == "claim_wait_ms" and isinstance(value, int):
        return f"{value / 1000:,.1f} s"
    if name == "compile_saved_ms" and isinstance(value, int):
        from xla_pcache.metrics import human_duration

        return human_duration(value / 1000)
    if name in ("fill", "hit_rate") and isinstance(value, float):
        return f"{value:.1%}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


# This process's per-tier counters of the remote chain (``tier2_hits``).
_TIER_COUNTER = re.compile(r"tier\d+_")


class StatsFormat(StrEnum):
    table = "table"
    json = "json"
    prometheus = "prometheus"


@app.command()
def stats(
    path: PathOption = None,
    read_only: ReadOnlyOption = False,
    as_json: JsonOption = False,
    output: Annotated[
        StatsFormat,
        typer.Option(
            "--format",
            help="table, json (as --json) or prometheus (text exposition format, for "
            "node_exporter's textfile collector; needs the metrics extra)",
        ),
    ] = StatsFormat.table,
) -> None:
    """Entries, bytes on disk, budget and fill, hits, misses, puts, compile time saved,
    evictions, corrupt, compile claims and waits. For a bucket (`--path s3://...`):
    entries, bytes, budget and fill, records not yet folded, the last prune."""
    with _reported():
        url = _bucket_url(path)
        if url is not None:
            if output is StatsFormat.prometheus:
                _fail("--format prometheus is for a directory, not a bucket")
            with _bucket(url) as b:
                report = b.stats()
            _bucket_stats(report, as_json or output is StatsFormat.json)
            return
    with _reported(), _open(path, read_only=read_only) as store:
        report = _stats_report(store)
    if output is StatsFormat.prometheus:
        from xla_pcache.metrics import prometheus_text

        with _reported():
            try:
                text = prometheus_text(report)
            except ImportError as exc:
                _fail(str(exc))
        typer.echo(text, nl=False)
        return
    if as_json or output is StatsFormat.json:
        _emit_json(report)
        return
    table = Table(
        title=shown(f"xla_pcache {report['path']} ({report['filesystem']})"), show_header=False
    )
    table.add_column("counter")
    table.add_column("value", justify="right")
    listed = {"path", "filesystem", "view_fresh"}
    for name, label in _STAT_ROWS:
        if name == "view_age_s":
            text = _view_age_text(report[name], report["view_fresh"])
        else:
            text = _stat_text(name, report.get(name))
        table.add_row(label, shown(text))
        listed.add(name)
    for name in sorted(report.keys() - listed):
        if (name.startswith("remote_") or _TIER_COUNTER.match(name)) and not report[name]:
            continue  # no rows of zeros for remote tiers that did nothing (or are not set)
        table.add_row(shown(name.replace("_", " ")), shown(_stat_text(name, report[name])))
    _console().print(table)


_BUCKET_ROWS = (
    ("entries", "entries"),
    ("bytes", "bytes"),
    ("max_size", "budget"),
    ("max_age_s", "max age (unused entries pruned)"),
    ("fill", "fill"),
    ("records_pending", "hit records not yet folded by prune"),
    ("recorded_puts_bytes", "bytes written since the last prune (recorded)"),
    ("last_prune", "last prune"),
    ("claims", "compile claims"),
)


def _bucket_stats(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _emit_json(report)
        return
    table = Table(title=shown(f"xla_pcache {report['path']} (bucket)"), show_header=False)
    table.add_column("counter")
    table.add_column("value", justify="right")
    for name, label in _BUCKET_ROWS:
        value = report.get(name)
        if name == "last_prune":
            text = "never" if value is None else f"{_format_ago(time.time() - value)} ago"
        else:
            text = _stat_text(name, value)
        table.add_row(label, shown(text))
    requests = ", ".join(f"{n} {k}" for k, n in sorted(report["requests"].items()))
    table.add_row("requests", shown(f"{requests} ({report['seconds']:.2f} s)"))
    _console().print(table)


# ls ------------------------------------------------------------------------------------------


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
            _format_ago(now - entry["created"]),
            _format_ago(None if last_use is None else now - last_use),
            str(entry["hits"]),
            _key_text(producer) if producer else "-",
            _key_text(entry.get("signer") or "-"),
            _key_text(entry["key"]),
        )
    )


def _json_item(entry: Entry) -> str:
    text = json.dumps(_entry_json(entry), indent=2, sort_keys=True, default=_key_text)
    return "  " + text.replace("\n", "\n  ")


@app.command("ls")
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
    console = _console()
    if limit is None:
        limit = 0 if as_json or not console.is_terminal else max(10, console.height - 5)
    with _reported(), _open(path, read_only=read_only) as store:
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


# prune ---------------------------------------------------------------------------------------


@app.command()
def prune(
    path: PathOption = None,
    read_only: ReadOnlyOption = False,
    max_size: Annotated[
        str | None,
        typer.Option(
            "--max-size",
            help=f"Evict down to this size (e.g. 50G) (default: below ${MAX_SIZE_VAR})",
        ),
    ] = None,
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Evict entries unused this long (e.g. 7d).")
    ] = None,
    untrusted: Annotated[
        bool,
        typer.Option(
            "--untrusted",
            help=f"Remove the entries no trusted key signed (keys from ${TRUSTED_KEYS_VAR}).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Evict least recently used entries now and print what was removed. A bucket
    (`--path s3://...`) is pruned least recently used first, reads counted (the hosts'
    records), within `--max-size` or its stored budget (to 90 %), one host at a time."""
    with _reported():
        url = _bucket_url(path)
    if url is not None:
        _prune_bucket(url, read_only, max_size, older_than, untrusted, as_json)
        return
    if untrusted:
        _prune_untrusted(path, read_only, as_json)
        return
    with _reported():
        target = parse_size(max_size, name="--max-size")
        age = None if older_than is None else parse_duration(older_than, name="--older-than")
        with _open(path, read_only=read_only, write=True) as store:
            if target is None and age is None and store.max_size is None and not store.max_age:
                _fail(
                    "nothing to prune to: pass --max-size or --older-than, set "
                    f"{MAX_SIZE_VAR}, or store a budget with `xla-pcache config`"
                )
            console = _console()
            with _interruptible("prune"), _progress(console) as bar:
                bar.add_task(f"pruning {store.path}", total=None)
                result = store.evict(max_size=target, older_than=age)
            # evict() reports file names; their keys are read back from trash/, where the
            # evicted files stay a few minutes (no walk of the whole cache).
            keys_by_name = store.trashed_keys(result["names"])
    removed_keys = [_key_text(keys_by_name.get(n, n)) for n in result["names"]]
    if as_json:
        _emit_json({**result, "keys": removed_keys})
    else:
        for key in removed_keys:
            typer.echo(f"removed {key}")
        typer.echo(f"removed {result['removed']} entries, {format_size(result['bytes'])}")
        # The index and the directory disagreed (other hosts' records not read yet): say so.
        dropped, added = result["dropped"], result["added"]
        if dropped or added:
            typer.echo(
                f"index reconciled with the directory: {dropped} records of files already "
                f"gone dropped, {added} unindexed files added"
            )
        for f in result["skipped_files"]:
            typer.echo(f"xla-pcache: prune went on without {shown(f)}", err=True)
    if result["skipped"]:
        typer.echo(f"xla-pcache: prune skipped: {shown(result['skipped'])}", err=True)
        raise typer.Exit(1)


def _prune_bucket(
    url: str,
    read_only: bool,
    max_size: str | None,
    older_than: str | None,
    untrusted: bool,
    as_json: bool,
) -> None:
    from xla_pcache.tiers.upkeep import BusyError

    with _reported():
        if untrusted:
            _fail("--untrusted is for a directory: a bucket's readers refuse what they distrust")
        if read_only or Settings.from_env().read_only:
            _fail(f"{redact(url)}: read-only (--read-only or {READ_ONLY_VAR})")
        target = parse_size(max_size, name="--max-size")
        age = None if older_than is None else parse_duration(older_than, name="--older-than")
        with _bucket(url) as b:
            budget = b.read_budget()
            if target is None and age is None and budget.max_size is None and not budget.max_age_s:
                _fail(
                    "nothing to prune to: pass --max-size or --older-than, or store a budget "
                    f"with `xla-pcache config --path {redact(url)} --max-size ...`"
                )
            try:
                with _interruptible("prune"):
                    report = b.prune(max_size=target, older_than=age)
            except BusyError as exc:
                typer.echo(f"xla-pcache: prune skipped: {shown(exc)}", err=True)
                raise typer.Exit(1) from None
    if as_json:
        _emit_json(report.as_dict())
        return
    for name in report.removed_names:
        typer.echo(f"removed {shown(name)}")
    typer.echo(
        f"removed {report.removed} entries, {format_size(report.removed_bytes)}; "
        f"{report.entries} left, {format_size(report.bytes)} "
        f"(budget {format_size(report.max_size)})"
    )
    requests = ", ".join(f"{n} {k}" for k, n in sorted(report.requests.items()))
    typer.echo(f"{requests} requests in {report.seconds:.2f} s")


def _untrusted(store: _core.Store, remove: bool) -> list[tuple[str, _core.Key, str]]:
    if store.trusted_key_names is None:
        _fail(f"no trusted keys: set {TRUSTED_KEYS_VAR} to the keys whose entries are served")
    with _interruptible("verify" if not remove else "prune"):
        return store.untrusted_entries(remove=remove)


def _prune_untrusted(path: str | None, read_only: bool, as_json: bool) -> None:
    with _reported(), _open(path, read_only=read_only, write=True) as store:
        found = _untrusted(store, remove=True)
    if as_json:
        _emit_json([{"path": p, "key": _key_text(k), "why": w} for p, k, w in found])
        return
    for where, key, why in found:
        # A name held by no entry (a directory, a FIFO, a link) has no key: its path says it.
        typer.echo(f"removed {_key_text(key) or _key_text(where)} ({_key_text(why)})")
    typer.echo(f"removed {len(found)} untrusted entries")


# config --------------------------------------------------------------------------------------

# Values that unset a stored setting.
_UNSET = ("none", "off", "unset")


def _settings_text(settings: dict[str, Any]) -> list[str]:
    from xla_pcache.metrics import human_duration

    size, age = settings.get("max_size"), settings.get("max_age_s")
    return [
        "max size: " + (f"{format_size(size)} ({size:,} B)" if size else "not set (unbounded)"),
        "max age: " + (human_duration(age) if age else "not set (entries never age out)"),
    ]


@app.command()
def config(
    path: PathOption = None,
    max_size: Annotated[
        str | None,
        typer.Option(
            "--max-size",
            help="The cache's byte budget (e.g. 50G; 'none' unsets it). Every process keeps "
            f"the cache within it; ${MAX_SIZE_VAR} or Store(max_size=) may only lower it.",
        ),
    ] = None,
    max_age: Annotated[
        str | None,
        typer.Option(
            "--max-age",
            help="Evict entries unused this long (e.g. 30d; 'none' unsets it), on the "
            "puts' eviction as well as on prune.",
        ),
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="Print the stored settings.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Store the cache's own settings in its directory (budget, max age), or show them. For
    a bucket (`--path s3://...`) they are an object beside its entries, kept by `prune` and
    by writers that find the bucket past them."""
    with _reported():
        changing = max_size is not None or max_age is not None
        if changing and show:
            _fail("--show prints the settings; it cannot be combined with --max-size/--max-age")
        url = _bucket_url(path)
        if url is not None:
            _config_bucket(url, max_size, max_age, as_json)
            return
        if not changing:
            with _open(path, read_only=True) as store:
                current = store.cache_settings()
                effective = {"max_size": store.max_size, "max_age_s": store.max_age}
        else:
            new_size, new_age = _parsed_settings(max_size, max_age)
            with _open(path, read_only=False, write=True) as store:
                current = store.cache_settings()
                if max_size is not None:
                    current["max_size"] = new_size
                if max_age is not None:
                    current["max_age_s"] = new_age
                store.write_cache_settings(
                    max_size=current["max_size"], max_age=current["max_age_s"]
                )
                current = store.cache_settings()
                effective = {"max_size": store.max_size, "max_age_s": store.max_age}
    if as_json:
        _emit_json({"stored": current, "effective": effective})
        return
    for line in _settings_text(dict(current)):
        typer.echo(line)
    if effective["max_size"] != current["max_size"]:
        typer.echo(
            f"this process's budget: {format_size(effective['max_size'])} "
            f"(lowered by ${MAX_SIZE_VAR})"
        )


def _parsed_settings(max_size: str | None, max_age: str | None) -> tuple[int | None, float | None]:
    new_size = new_age = None
    if max_size is not None and max_size.strip().lower() not in _UNSET:
        new_size = parse_size(max_size, name="--max-size")
        if not new_size:
            _fail(f"--max-size must be positive ('none' unsets it), got {max_size!r}")
    if max_age is not None and max_age.strip().lower() not in _UNSET:
        new_age = parse_duration(max_age, name="--max-age")
        if new_age < 1:
            _fail(f"--max-age must be at least 1 second, got {max_age!r}")
    return new_size, new_age


def _config_bucket(url: str, max_size: str | None, max_age: str | None, as_json: bool) -> None:
    from xla_pcache.tiers.upkeep import Budget

    new_size, new_age = _parsed_settings(max_size, max_age)
    with _bucket(url) as b:
        current = b.read_budget()
        if max_size is not None or max_age is not None:
            if Settings.from_env().read_only:
                _fail(f"{redact(url)}: read-only ({READ_ONLY_VAR})")
            current = Budget(
                new_size if max_size is not None else current.max_size,
                new_age if max_age is not None else current.max_age_s,
            )
            b.write_budget(current)
            current = b.read_budget()
    stored = {"max_size": current.max_size, "max_age_s": current.max_age_s}
    if as_json:
        _emit_json({"stored": stored, "effective": stored})
        return
    for line in _settings_text(stored):
        typer.echo(line)


# verify --------------------------------------------------------------------------------------


def _run_verify(store: _core.Store, repair: bool, console: Console) -> VerifyReport:
    if not console.is_terminal:
        return store.verify(repair=repair)
    with _progress(console) as progress:
        task = progress.add_task(f"verifying {store.path}", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return store.verify(repair=repair, progress=advance)


@app.command()
def verify(
    path: PathOption = None,
    read_only: ReadOnlyOption = False,
    repair: Annotated[
        bool, typer.Option("--repair", help="Remove bad files and repair the index.")
    ] = False,
    trusted: Annotated[
        bool,
        typer.Option(
            "--trusted",
            help=f"List the entries no trusted key signed (keys from ${TRUSTED_KEYS_VAR}); "
            "exit 1 if there are any.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Check every file of the cache; exit 1 if any problem was found (even if repaired)."""
    if trusted:
        with _reported(), _open(path, read_only=True) as store:
            names = store.trusted_key_names or []
            found = _untrusted(store, remove=False)
        if as_json:
            _emit_json(
                {
                    "trusted_keys": names,
                    "untrusted": [{"path": p, "key": _key_text(k), "why": w} for p, k, w in found],
                }
            )
        else:
            for p, key, why in found:
                typer.echo(f"{_key_text(key)}: {_key_text(why)} ({_key_text(p)})")
            typer.echo(f"{len(found)} untrusted entries (trusted keys: {', '.join(names)})")
        if found:
            raise typer.Exit(1)
        return
    console = _console()
    with _reported(), _open(path, read_only=read_only, write=repair) as store:
        root = store.path
        with _interruptible("verify"):
            report = _run_verify(store, repair, console)
    # Stale temp and trash files are housekeeping the store sweeps on its own, not problems.
    problems = report["problems"]
    if as_json:
        _emit_json(report)
    else:
        table = Table(
            title=shown(f"verify{' --repair' if repair else ''} {root}"), show_header=False
        )
        table.add_column("check")
        table.add_column("result")
        for name, value in report.items():
            if isinstance(value, list | tuple | set):
                text = f"{len(value)}" + "".join(f"\n  {_key_text(v)}" for v in value)
            else:
                text = _key_text(value)
            table.add_row(shown(name.replace("_", " ")), text)
        console.print(table)
        console.print("no problems found" if problems == 0 else f"{problems} problems found")
    if problems:
        raise typer.Exit(1)


# clear ---------------------------------------------------------------------------------------


@app.command()
def clear(
    path: PathOption = None,
    read_only: ReadOnlyOption = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete every entry (asks first unless --yes; refused in read-only mode)."""
    with _reported(), _open(path, read_only=read_only, write=True) as store:
        if not yes:
            count = len(store)
            question = f"Delete all {count} entries in {store.path}?"
            try:
                confirmed = typer.confirm(question, default=False)
            except typer.Abort:
                confirmed = False
            if not confirmed:
                typer.echo("nothing deleted", err=True)
                raise typer.Exit(1)
        removed = store.clear()
    typer.echo(f"removed {removed} entries")


# explain -------------------------------------------------------------------------------------


@app.command()
def explain(
    key: Annotated[
        str | None,
        typer.Argument(help="A missed key, or an entry's key (default: the recent misses)"),
    ] = None,
    path: PathOption = None,
    as_json: JsonOption = False,
    last: Annotated[int, typer.Option("--last", "-n", min=1, help="How many recent misses")] = 10,
) -> None:
    """Why did it miss: for each recent miss (or KEY), the nearest entry of the same program
    and the key components that differ, with both values where recorded."""
    from xla_pcache import explain as why

    with _reported(), _open(path, read_only=True) as store:
        try:
            results = why.explain(store, key, last)
        except why.NotRecorded:
            _fail(f"no miss and no entry recorded for key {_key_text(key)}")
    if as_json:
        _emit_json(results)
        return
    if not results:
        typer.echo("no misses recorded (misses are logged by writable processes)")
        return
    now = time.time()
    for i, result in enumerate(results):
        if i:
            typer.echo("")
        for line in why.lines(result, now):
            typer.echo(_key_text(line))


# keygen --------------------------------------------------------------------------------------


@app.command()
def keygen(
    name: Annotated[
        str, typer.Argument(help="The key's name, with a version for rotation: ci-1, then ci-2.")
    ],
    out: Annotated[str, typer.Option("--out", "-o", help="Private key file to create (0600).")],
) -> None:
    """Make an Ed25519 key pair for signed entries. The private key goes to --out (mode
    0600, never overwritten); the public key, NAME:BASE64, is printed on the last line."""
    import base64

    with _reported():
        try:
            _core.check_key_name(name)
        except ValueError as e:
            _fail(str(e))
        private = _core.generate_signing_key()
        public = base64.b64encode(_core.signing_public_key(private)).decode()
        target = os.path.expanduser(out)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            _fail(f"{target} exists: keygen never overwrites a key")
        except OSError as e:
            _fail(f"cannot create {target}: {e.strerror or e}")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(
                "# xla_pcache signing key (Ed25519, private): whoever holds it can sign entries.\n"
                f"# Use it with {SIGNING_KEY_VAR}={target}\n"
                f"{name}:{base64.b64encode(private).decode()}\n"
            )
    typer.echo(f"wrote the private key {name} to {target} (mode 0600)", err=True)
    typer.echo(f"trust it with {TRUSTED_KEYS_VAR}={name}:{public}", err=True)
    typer.echo(f"{name}:{public}")


# commands implemented elsewhere ----------------------------------------------------------------


def _lazy_main(module: str) -> Any:
    # Imported here, not at the top: these modules import JAX or torch, and `xla-pcache stats`
    # must not pay for that.
    try:
        return importlib.import_module(f"xla_pcache.cli._{module}").main
    except ImportError as exc:
        _fail(f"the {module} command is unavailable: {exc}")


@app.command()
def demo(
    path: Annotated[
        str | None,
        typer.Option("--path", "-p", help="Cache directory for the demo.", show_default=False),
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo's cache afterwards.")] = False,
) -> None:
    """Compile a small program twice and show the second run hit the cache."""
    with _reported():
        main_fn = _lazy_main("demo")
    raise typer.Exit(int(main_fn(path, keep)))


@app.command()
def doctor(path: PathOption = None, as_json: JsonOption = False) -> None:
    """Check the environment, the frameworks and the cache directory."""
    with _reported():
        main_fn = _lazy_main("doctor")
    raise typer.Exit(int(main_fn(path, as_json)))


# export / import (bundles, see xla_pcache.bundle) --------------------------------------------


class Framework(StrEnum):
    jax = "jax"
    torch_xla = "torch_xla"


@app.command("export")
def export_cmd(
    out: Annotated[str, typer.Option("--output", "-o", help="Bundle file to write (.tar.gz).")],
    path: PathOption = None,
    framework: Annotated[
        Framework | None, typer.Option("--framework", help="Only entries this framework wrote.")
    ] = None,
    newer_than: Annotated[
        str | None, typer.Option("--newer-than", help="Only entries written within, e.g. 7d.")
    ] = None,
    min_hits: Annotated[
        int,
        typer.Option(
            "--min-hits",
            min=0,
            help="Only entries with at least N hits recorded (at most one per process per "
            "hit interval, so a lower bound on uses).",
        ),
    ] = 0,
) -> None:
    """Write the cache's verified entries to a single bundle file."""
    from xla_pcache.bundle import export_bundle

    with _reported(), _open(path, read_only=True) as store:
        age = None if newer_than is None else parse_duration(newer_than, name="--newer-than")
        fw = None if framework is None else framework.value
        console = _console()
        try:
            with _interruptible("export"), _progress(console) as bar:
                task = bar.add_task(f"exporting to {out}", total=None)

                def advance(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                n = export_bundle(
                    store, out, framework=fw, newer_than=age, min_hits=min_hits, progress=advance
                )
        except OSError as exc:
            # The error names the temporary file; the user asked for `out`.
            _fail(f"cannot write {out}: {exc.strerror or exc}")
    console.print(shown(f"exported {n} entries to {out}"))


@app.command("import")
def import_cmd(
    bundle: Annotated[
        str | None, typer.Argument(help="Bundle file written by xla-pcache export.")
    ] = None,
    path: PathOption = None,
    from_jax: Annotated[
        str | None,
        typer.Option(
            "--from-jax",
            help="Adopt the entries JAX's own cache wrote in this directory instead of a "
            "bundle: each valid one is published and its file removed there.",
        ),
    ] = None,
    max_entry_size: Annotated[
        str | None,
        typer.Option(
            "--max-entry-size",
            help="Reject members larger than this (e.g. 4G) (default: the budget, at most 2G).",
        ),
    ] = None,
) -> None:
    """Publish each verifying entry of a bundle into the cache (created if missing)."""
    from xla_pcache.bundle import import_bundle

    if (bundle is None) == (from_jax is None):
        with _reported():
            _fail("give either a bundle file or --from-jax DIR")
    if from_jax is not None:
        _import_from_jax(from_jax, path, max_entry_size)
        return
    assert bundle is not None
    with _reported():
        entry_cap, settings, root = _import_target(path, max_entry_size)
        if not os.path.exists(bundle):
            _fail(f"{bundle}: no such file")
        if os.path.isdir(bundle):
            _fail(f"{bundle}: is a directory, not a bundle file")
        console = _console()
        bar = _progress(console)
        with (
            _interruptible("import"),
            Store(root, settings=settings) as store,
            bar,
        ):
            # Entries are counted as they stream in: a bundle does not say how many it holds.
            task = bar.add_task("importing entries", total=None)
            report = import_bundle(
                store, bundle, progress=lambda _n: bar.advance(task), max_entry_bytes=entry_cap
            )
    text = (
        f"imported {report.imported}, skipped as present {report.present}, "
        f"rejected as corrupt {report.rejected}"
    )
    if report.oversized:
        text += f" ({report.oversized} of them too large)"
    if report.untrusted:
        # Whole entries no trusted key signed: refused as a trusting get refuses them, and
        # no failure of the import.
        text += f", not trusted {report.untrusted}"
    if report.unreadable:
        text += f"; the rest of the bundle is unreadable ({report.error})"
    console.print(shown(text))
    if report.rejected or report.unreadable:
        raise typer.Exit(1)


def _import_target(
    path: str | None, max_entry_size: str | None
) -> tuple[int | None, Settings, str]:
    """What an import writes into: the entry size cap, the settings and a writable root."""
    entry_cap = parse_size(max_entry_size, name="--max-entry-size")
    if entry_cap == 0:
        _fail("--max-entry-size must be positive")
    settings = Settings.from_env()
    root = os.path.expanduser(path) if path else settings.path
    if not root:
        _fail(f"no cache directory: pass --path or set {PATH_VAR}")
    if settings.read_only:
        _fail(f"{root}: the cache is read-only ({READ_ONLY_VAR})")
    return entry_cap, settings, root


def _import_from_jax(source_dir: str, path: str | None, max_entry_size: str | None) -> None:
    from xla_pcache.jax import _adopt
    from xla_pcache.jax._cache_dir import JaxCacheDir

    with _reported():
        entry_cap, settings, root = _import_target(path, max_entry_size)
        source_dir = os.path.expanduser(source_dir)
        if not os.path.isdir(source_dir):
            _fail(f"{source_dir}: not a directory")
        why = _adopt.refusal(settings.trusted_keys is not None)
        if why is not None:
            _fail(
                f"{root}: {why}, so a trusting reader would never load them; nothing was "
                "imported. Import them into a cache that trusts no keys, or let a signer "
                "compile the programs again (docs/jax.md)"
            )
        formats, jax_version = _adopt.importer_formats()
        if jax_version is not None and _adopt.keys_hold_the_path(jax_version):
            _fail(
                f"jax {jax_version}: before jax 0.11 JAX's keys hold the path of its cache "
                f"directory, so entries moved from {source_dir} would never be found under "
                "the adapter's keys; nothing was moved. Keep JAX_COMPILATION_CACHE_DIR set "
                "beside XLA_PERSISTENT_CACHE_PATH instead: each entry is adopted, under the "
                "right key, when a program asks for it (docs/jax.md)"
            )
        console = _console()
        bar = _progress(console)
        with (
            _interruptible("import"),
            Store(root, max_size=settings.max_size, settings=settings) as store,
            bar,
        ):
            task = bar.add_task(f"adopting JAX's entries from {source_dir}", total=None)
            counts = _adopt.import_directory(
                store,
                JaxCacheDir(source_dir),
                formats=formats,
                cap=entry_cap,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    text = (
        f"adopted {counts[_adopt.ADOPTED]}, already present {counts[_adopt.PRESENT]}, "
        f"skipped as bad {counts[_adopt.REJECTED]}"
    )
    if counts[_adopt.SERVED]:
        text += f", left in place as the cache did not take them {counts[_adopt.SERVED]}"
    console.print(text)
    if counts[_adopt.REJECTED] or counts[_adopt.SERVED]:
        raise typer.Exit(1)


def _version_callback(value: bool) -> None:
    if value:
        from xla_pcache._core import __version__

        typer.echo(f"xla-pcache {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Inspect and maintain an xla_pcache compilation cache directory."""


def main() -> None:
    """Console-script entry point. Everything printed goes through one escaping stream
    (``xla_pcache._text``): names, paths, metadata and errors read from the cache, and the
    warnings the package logs while the command runs."""
    if not isinstance(sys.stdout, ShownStream):
        sys.stdout = ShownStream(sys.stdout)
    if not isinstance(sys.stderr, ShownStream):
        sys.stderr = ShownStream(sys.stderr)
    app(prog_name="xla-pcache")
