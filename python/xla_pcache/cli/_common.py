"""What the ``xla-pcache`` commands share: the common options, one-line errors and exit
statuses, Ctrl-C and SIGTERM, progress bars, opening a cache or a bucket, and how keys,
ages and JSON are printed."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from xla_pcache import _core
from xla_pcache._core import CacheError
from xla_pcache._text import raw_stream, shown
from xla_pcache._url import FILE_SCHEME, is_url, url_scheme
from xla_pcache.cache_path import Route, open_store, route
from xla_pcache.config import PATH_VAR, READ_ONLY_VAR, TRUSTED_KEYS_VAR, Settings
from xla_pcache.store import Store, settle

if TYPE_CHECKING:
    from rich.console import Console

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


class Failure(Exception):
    """An expected error: reported in one line, exit status 2."""


def fail(message: str) -> NoReturn:
    raise Failure(message)


@contextmanager
def reported() -> Iterator[None]:
    """Turn expected errors into one line on stderr and exit status 2, never a traceback."""
    try:
        yield
    except (Failure, CacheError, ValueError, OSError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, OSError) and not isinstance(exc, CacheError) and exc.filename:
            # Python's own OSError text quotes the path with repr(); say it plainly.
            text = f"{exc.filename}: {exc.strerror or type(exc).__name__}"
        typer.echo(f"xla-pcache: error: {key_text(text)}", err=True)
        raise typer.Exit(2) from None


class _Terminated(BaseException):
    """SIGTERM during a long command, raised where the command is, so that what it holds
    (export's temporary file beside the bundle) is cleaned up as for Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


@contextmanager
def interruptible(what: str) -> Iterator[None]:
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


def progress_bar(console: Console) -> Any:
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


def plain_console() -> Console:
    # Keys, metadata, paths and error texts are chosen by whoever wrote the cache or typed the
    # command: print them as they are, never as rich markup or emoji codes ("[/]" in a key
    # would otherwise raise, "[bold]" restyle the table).
    # Rich writes to the stream under the CLI's escaping one (its own colours and progress
    # bar are control sequences): what it is given to show is passed through shown().
    # Imported here: a command that prints no table (--json, an error) never loads rich.
    from rich.console import Console

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


def directory_route(path: str | None, settings: Settings) -> Route:
    """The cache directory ``--path`` (else ``XLA_PERSISTENT_CACHE_PATH``) names, routed:
    a ``file:`` URL's directory decoded, its ``?ro=1`` in ``read_only``. Any other URL,
    which these commands do not take, fails here naming what does, and a ``file:`` URL
    that names no directory says why."""
    root = os.path.expanduser(path) if path else settings.path
    if not root:
        fail(f"no cache directory: pass --path or set {PATH_VAR}")
    if is_url(root):
        where = route(root)
        if where.kind == "local":
            return where
        if url_scheme(root) == FILE_SCHEME:
            fail(f"{redact(root)} cannot be served: {where.reason}")
        from xla_pcache.bucket import local_path

        local = (
            f"; this host's copy of it is the directory {local_path(root, settings)}"
            if where.kind == "bucket"
            else ""
        )
        fail(
            f"{redact(root)} is a URL: stats, prune and config take a bucket, this command "
            f"a directory{local}"
        )
    return Route("local", root)


def _existing_cache(root: str) -> None:
    """Fails unless ``root`` is a cache directory (a FORMAT file in it): these commands never
    create one."""
    if not os.path.exists(root):
        fail(f"{root}: no such directory")
    if not os.path.isdir(root):
        fail(f"{root}: not a directory")
    fmt = os.path.join(root, "FORMAT")
    try:
        # lstat: a FORMAT that is a link, a FIFO or a directory is never opened (a FIFO would
        # block the open; a link could point anywhere).
        mode = os.lstat(fmt).st_mode
    except FileNotFoundError:
        fail(f"{root}: not an xla_pcache cache (no FORMAT file)")
    except OSError as exc:
        fail(f"{root}: cannot read the FORMAT file: {exc.strerror or exc}")
    if not stat.S_ISREG(mode):
        fail(f"{root}: not an xla_pcache cache (FORMAT is {_file_kind(mode)}, not a file)")


def open_cache(path: str | None, *, read_only: bool, write: bool = False) -> Store:
    """Open an existing cache; never create one.

    The store is opened read-only first so that a directory of an unknown format is refused
    before anything is written to it. ``write`` reopens it writable for prune/repair/clear.
    """
    # Read even when only looking, so that a malformed value is reported by every command.
    settings = Settings.from_env()
    where = directory_route(path, settings)
    root = where.path
    _existing_cache(root)
    # The flag and a file: URL's ?ro=1 add to the variable: they can only ask for read-only.
    opts = settle(settings, read_only=read_only or where.read_only or None)
    store = open_store(root, opts.replace(read_only=True))
    if not write:
        return store
    store.close()
    if opts.read_only:
        fail(f"{root}: the cache is read-only (--read-only, {READ_ONLY_VAR} or the URL's ?ro=1)")
    return open_store(root, opts)


def redact(url: str) -> str:
    """``url`` without credentials or option values (``xla_pcache.tiers.redact``)."""
    from xla_pcache.tiers import redact as redact_url

    return redact_url(url)


def bucket_url(path: str | None) -> str | None:
    """The bucket ``--path`` (else ``XLA_PERSISTENT_CACHE_PATH``) names, or None for a
    directory; a URL that is no bucket xla_pcache serves fails here."""
    raw = path if path else Settings.from_env().path
    if not raw or not is_url(raw):
        return None
    where = route(raw)
    if where.kind == "local":
        return None  # a file: URL naming a directory: the directory's commands take it
    if where.kind != "bucket":
        fail(f"{redact(raw)} cannot be served: {where.reason}")
    return where.path


@contextmanager
def open_bucket(url: str, *, read_only: bool = False) -> Iterator[Any]:
    """The upkeep of the bucket at ``url``, read-only by the one rule of a bucket path
    (``read_only`` over ``XLA_PERSISTENT_CACHE_READ_ONLY``, as ``store.settle`` decides, and
    the URL's ``?ro=1`` whatever they say); its service's errors are one line, exit 2."""
    from xla_pcache.bucket.upkeep import Bucket, BusyError
    from xla_pcache.tiers.objstore import scrub

    settings = Settings.from_env()
    # The flag adds to the variable; neither can take back the URL's ?ro=1 (``Bucket``).
    ro = settle(settings, read_only=read_only or None).read_only
    try:
        yield Bucket(url, timeout=max(settings.remote_timeout, 30.0), read_only=ro)
    except (Failure, typer.Exit, BusyError):
        raise
    except Exception as exc:
        fail(f"{redact(url)}: {type(exc).__name__}: {scrub(str(exc))}")


def refuse_read_only(b: Any, what: str) -> None:
    """One line, exit 2, when the bucket ``b`` (``open_bucket``) is read-only and the command
    would write to it (``what``)."""
    if b.read_only:
        fail(
            f"{redact(b.location)}: read-only (?ro=1 in the path, --read-only or "
            f"{READ_ONLY_VAR}): {what} writes to the bucket"
        )


def key_text(key: object) -> str:
    """A key as one printable line: control characters, bidi overrides and undecodable
    bytes escaped, so a hostile or binary key cannot break the table or the terminal."""
    return shown(key)


def format_ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def emit_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=key_text))


def list_untrusted(store: _core.Store, remove: bool) -> list[tuple[str, _core.Key, str]]:
    if store.trusted_key_names is None:
        fail(f"no trusted keys: set {TRUSTED_KEYS_VAR} to the keys whose entries are served")
    with interruptible("verify" if not remove else "prune"):
        return store.untrusted_entries(remove=remove)
