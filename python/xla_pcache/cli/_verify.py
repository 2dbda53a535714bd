"""``xla-pcache verify``: check every file of a cache, or list the entries no trusted key
signed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from xla_pcache import _core
from xla_pcache._text import shown
from xla_pcache.cli._common import (
    JsonOption,
    PathOption,
    ReadOnlyOption,
    emit_json,
    interruptible,
    key_text,
    list_untrusted,
    open_cache,
    plain_console,
    progress_bar,
    reported,
)
from xla_pcache.config import TRUSTED_KEYS_VAR

if TYPE_CHECKING:
    from rich.console import Console

    from xla_pcache._reports import VerifyReport


def _run_verify(store: _core.Store, repair: bool, console: Console) -> VerifyReport:
    if not console.is_terminal:
        return store.verify(repair=repair)
    with progress_bar(console) as progress:
        task = progress.add_task(f"verifying {store.path}", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return store.verify(repair=repair, progress=advance)


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
        with reported(), open_cache(path, read_only=True) as store:
            names = store.trusted_key_names or []
            found = list_untrusted(store, remove=False)
        if as_json:
            emit_json(
                {
                    "trusted_keys": names,
                    "untrusted": [{"path": p, "key": key_text(k), "why": w} for p, k, w in found],
                }
            )
        else:
            for p, key, why in found:
                typer.echo(f"{key_text(key)}: {key_text(why)} ({key_text(p)})")
            typer.echo(f"{len(found)} untrusted entries (trusted keys: {', '.join(names)})")
        if found:
            raise typer.Exit(1)
        return
    console = plain_console()
    with reported(), open_cache(path, read_only=read_only, write=repair) as store:
        root = store.path
        with interruptible("verify"):
            report = _run_verify(store, repair, console)
    # Stale temp and trash files are housekeeping the store sweeps on its own, not problems.
    problems = report["problems"]
    if as_json:
        emit_json(report)
    else:
        from rich.table import Table

        table = Table(
            title=shown(f"verify{' --repair' if repair else ''} {root}"), show_header=False
        )
        table.add_column("check")
        table.add_column("result")
        for name, value in report.items():
            if isinstance(value, list | tuple | set):
                text = f"{len(value)}" + "".join(f"\n  {key_text(v)}" for v in value)
            else:
                text = key_text(value)
            table.add_row(shown(name.replace("_", " ")), text)
        console.print(table)
        console.print("no problems found" if problems == 0 else f"{problems} problems found")
    if problems:
        raise typer.Exit(1)
