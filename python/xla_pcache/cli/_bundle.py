"""``xla-pcache export`` and ``import``: a cache's verified entries to and from one bundle
file (``xla_pcache.bundle``), and ``import --from-jax``: adopting what JAX's own cache left."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from xla_pcache import _core
from xla_pcache._text import shown
from xla_pcache.cache_path import open_store
from xla_pcache.cli._common import (
    PathOption,
    directory_route,
    fail,
    interruptible,
    open_cache,
    plain_console,
    progress_bar,
    reported,
)
from xla_pcache.config import READ_ONLY_VAR, Settings
from xla_pcache.sizes import parse_duration, parse_size

if TYPE_CHECKING:
    from rich.console import Console

    from xla_pcache.store import Store


class Framework(StrEnum):
    jax = "jax"
    torch_xla = "torch_xla"


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

    with reported(), open_cache(path, read_only=True) as store:
        age = None if newer_than is None else parse_duration(newer_than, name="--newer-than")
        fw = None if framework is None else framework.value
        console = plain_console()
        try:
            with interruptible("export"), progress_bar(console) as bar:
                task = bar.add_task(f"exporting to {out}", total=None)

                def advance(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                n = export_bundle(
                    store, out, framework=fw, newer_than=age, min_hits=min_hits, progress=advance
                )
        except OSError as exc:
            # The error names the temporary file; the user asked for `out`.
            fail(f"cannot write {out}: {exc.strerror or exc}")
    console.print(shown(f"exported {n} entries to {out}"))


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
        with reported():
            fail("give either a bundle file or --from-jax DIR")
    if from_jax is not None:
        _import_from_jax(from_jax, path, max_entry_size)
        return
    assert bundle is not None
    with reported():
        entry_cap, settings, root = _import_target(path, max_entry_size)
        if not os.path.exists(bundle):
            fail(f"{bundle}: no such file")
        if os.path.isdir(bundle):
            fail(f"{bundle}: is a directory, not a bundle file")
        console = plain_console()
        # Entries are counted as they stream in: a bundle does not say how many it holds.
        with _importing(root, settings, console, "importing entries") as (store, bar, task):
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
    if report.newer_format:
        # A later release's entries: that release reads them, this one cannot; no failure.
        text += f", of a later release's format (not imported) {report.newer_format}"
    if report.unreadable:
        text += f"; the rest of the bundle is unreadable ({report.error})"
    console.print(shown(text))
    if report.rejected or report.unreadable:
        raise typer.Exit(1)


@contextmanager
def _importing(
    root: str, settings: Settings, console: Console, what: str
) -> Iterator[tuple[Store, Any, Any]]:
    """The store an import writes into, a progress bar and its task showing ``what``; an
    interrupt stops the import between entries."""
    with interruptible("import"), open_store(root, settings) as store, progress_bar(console) as bar:
        yield store, bar, bar.add_task(what, total=None)


def _import_target(
    path: str | None, max_entry_size: str | None
) -> tuple[int | None, Settings, str]:
    """What an import writes into: the entry size cap, the settings and a writable root."""
    entry_cap = parse_size(max_entry_size, name="--max-entry-size")
    if entry_cap is not None:
        try:
            entry_cap = _core.check_size("--max-entry-size", entry_cap)
        except ValueError:
            fail("--max-entry-size must be positive")
    settings = Settings.from_env()
    where = directory_route(path, settings)
    root = where.path
    if settings.read_only or where.read_only:
        fail(f"{root}: the cache is read-only ({READ_ONLY_VAR} or the URL's ?ro=1)")
    return entry_cap, settings, root


def _import_from_jax(source_dir: str, path: str | None, max_entry_size: str | None) -> None:
    from xla_pcache.jax import _adopt, _build
    from xla_pcache.jax._cache_dir import JaxCacheDir

    with reported():
        entry_cap, settings, root = _import_target(path, max_entry_size)
        source_dir = os.path.expanduser(source_dir)
        if not os.path.isdir(source_dir):
            fail(f"{source_dir}: not a directory")
        why = _adopt.refusal(settings.trusted_keys is not None)
        if why is not None:
            fail(
                f"{root}: {why}, so a trusting reader would never load them; nothing was "
                "imported. Import them into a cache that trusts no keys, or let a signer "
                "compile the programs again (docs/jax.md)"
            )
        formats, jax_version = _adopt.importer_formats()
        if jax_version is not None and _adopt.keys_hold_the_path(jax_version):
            fail(
                f"jax {jax_version}: before jax 0.11 JAX's keys hold the path of its cache "
                f"directory, so entries moved from {source_dir} would never be found under "
                "the adapter's keys; nothing was moved. Keep JAX_COMPILATION_CACHE_DIR set "
                "beside XLA_PERSISTENT_CACHE_PATH instead: each entry is adopted, under the "
                "right key, when a program asks for it (docs/jax.md)"
            )
        # Filed under the build of the runtime installed here, as a program here asks.
        build = _build.build()
        if not build.files:
            fail(
                "jaxlib is not installed here: its entries would be filed under no build a "
                "program asks for; nothing was moved. Run the import where the programs run"
            )
        console = plain_console()
        what = f"adopting JAX's entries from {source_dir}"
        with _importing(root, settings, console, what) as (store, bar, task):
            counts = _adopt.import_directory(
                store,
                JaxCacheDir(source_dir),
                formats=formats,
                cap=entry_cap,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
                build=build,
            )
    text = (
        f"adopted {counts[_adopt.ADOPTED]}, already present {counts[_adopt.PRESENT]}, "
        f"skipped as bad {counts[_adopt.REJECTED]}"
    )
    if counts[_adopt.SERVED]:
        text += f", left in place as the cache did not take them {counts[_adopt.SERVED]}"
    if counts[_adopt.PREDATES]:
        text += (
            ", left in place as JAX wrote them before this jaxlib was installed (they may "
            f"be another build's) {counts[_adopt.PREDATES]}"
        )
    console.print(text)
    if counts[_adopt.REJECTED] or counts[_adopt.SERVED]:
        raise typer.Exit(1)
