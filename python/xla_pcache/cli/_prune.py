"""``xla-pcache prune``: evict a cache directory down to a size or an age, remove its
untrusted entries, or prune a bucket."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Annotated

import typer

from xla_pcache._text import shown
from xla_pcache.cli._common import (
    JsonOption,
    PathOption,
    ReadOnlyOption,
    bucket_url,
    emit_json,
    fail,
    interruptible,
    key_text,
    list_untrusted,
    open_bucket,
    open_cache,
    plain_console,
    progress_bar,
    redact,
    refuse_read_only,
    reported,
)
from xla_pcache.config import MAX_SIZE_VAR, TRUSTED_KEYS_VAR
from xla_pcache.sizes import format_size, parse_duration, parse_size

if TYPE_CHECKING:
    from xla_pcache.bucket.upkeep import PruneReport


# Named as _common's shared options are, so that prune's signature reads as a list of what
# it takes.
MaxSizeOption = Annotated[
    str | None,
    typer.Option(
        "--max-size", help=f"Evict down to this size (e.g. 50G) (default: below ${MAX_SIZE_VAR})"
    ),
]
OlderThanOption = Annotated[
    str | None, typer.Option("--older-than", help="Evict entries unused this long (e.g. 7d).")
]
UntrustedOption = Annotated[
    bool,
    typer.Option(
        "--untrusted",
        help=f"Remove the entries no trusted key signed (keys from ${TRUSTED_KEYS_VAR}); "
        "for a bucket, the objects that are nothing xla_pcache writes.",
    ),
]


def _targets(max_size: str | None, older_than: str | None) -> tuple[int | None, float | None]:
    """The size and the age to prune to, as the options gave them (None: not given)."""
    target = parse_size(max_size, name="--max-size")
    age = None if older_than is None else parse_duration(older_than, name="--older-than")
    return target, age


def prune(
    path: PathOption = None,
    read_only: ReadOnlyOption = False,
    max_size: MaxSizeOption = None,
    older_than: OlderThanOption = None,
    untrusted: UntrustedOption = False,
    as_json: JsonOption = False,
) -> None:
    """Evict least recently used entries now and print what was removed. A bucket
    (`--path s3://...`) is pruned least recently used first, reads counted (the hosts'
    records), within `--max-size` or its stored budget (to 90 %), one host at a time; with
    `--untrusted`, what in it is nothing xla_pcache writes is removed (and keys the client
    cannot name are listed, with the command that removes each)."""
    with reported():
        url = bucket_url(path)
    if url is not None:
        _prune_bucket(url, read_only, max_size, older_than, untrusted, as_json)
        return
    if untrusted:
        _prune_untrusted(path, read_only, as_json)
        return
    with reported():
        target, age = _targets(max_size, older_than)
        with open_cache(path, read_only=read_only, write=True) as store:
            if target is None and age is None and store.max_size is None and not store.max_age:
                fail(
                    "nothing to prune to: pass --max-size or --older-than, set "
                    f"{MAX_SIZE_VAR}, or store a budget with `xla-pcache config`"
                )
            console = plain_console()
            with interruptible("prune"), progress_bar(console) as bar:
                bar.add_task(f"pruning {store.path}", total=None)
                result = store.evict(max_size=target, older_than=age)
            # evict() reports file names; their keys are read back from trash/, where the
            # evicted files stay a few minutes (no walk of the whole cache).
            keys_by_name = store.trashed_keys(result["names"])
    removed_keys = [key_text(keys_by_name.get(n, n)) for n in result["names"]]
    if as_json:
        emit_json({**result, "keys": removed_keys})
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
    from xla_pcache.bucket.upkeep import BusyError

    with reported():
        if untrusted:
            _remove_untrusted_objects(url, read_only, as_json)
            return
        target, age = _targets(max_size, older_than)
        with open_bucket(url, read_only=read_only) as b:
            refuse_read_only(b, "prune")
            budget = b.read_stored_budget()
            if target is None and age is None and budget.max_size is None and not budget.max_age_s:
                fail(
                    "nothing to prune to: pass --max-size or --older-than, or store a budget "
                    f"with `xla-pcache config --path {redact(url)} --max-size ...`"
                )
            try:
                with interruptible("prune"):
                    report = b.prune(max_size=target, older_than=age)
            except BusyError as exc:
                typer.echo(f"xla-pcache: prune skipped: {shown(exc)}", err=True)
                raise typer.Exit(1) from None
    if as_json:
        emit_json(report.as_dict())
        _prune_exit(report)
        return
    for name in report.removed_names:
        typer.echo(f"removed {shown(name)}")
    typer.echo(
        f"removed {report.removed} entries, {format_size(report.removed_bytes)}; "
        f"{report.entries} left, {format_size(report.bytes)} "
        f"(budget {format_size(report.max_size)})"
    )
    if report.junk_removed:
        typer.echo(f"removed {report.junk_removed} objects that are nothing xla_pcache writes")
    if report.records_left:
        typer.echo(f"{report.records_left} hit records left for the next prune")
    _untrusted_lines(report.skipped, report.unlistable, url)
    requests = ", ".join(f"{n} {k}" for k, n in sorted(report.requests.items()))
    typer.echo(f"{requests} requests in {report.seconds:.2f} s")
    _prune_exit(report)


# A bucket's prune whose listing of entries was cut short: it removed what the budget
# required among what it listed, and no more can be said of the rest.
CUT_SHORT_EXIT = 3


def _prune_exit(report: PruneReport) -> None:
    """Says why a bucket's prune did not prune everything, and exits 1 (a limit stopped
    it) or ``CUT_SHORT_EXIT`` (its listing was cut short)."""
    if report.busy:
        typer.echo(f"xla-pcache: prune stopped: {shown(report.busy)}", err=True)
        raise typer.Exit(1)
    if report.cut_short:
        typer.echo(
            f"xla-pcache: prune cut short: {shown(report.cut_short)}; it removed what the "
            f"budget required among the {report.entries_before} entries it listed or reached "
            f"by name ({report.reached} of {report.asked} asked for) and took none it did "
            "not see as absent (remove the keys named below, or see docs/remote.md)",
            err=True,
        )
        raise typer.Exit(CUT_SHORT_EXIT)
    if not report.pruned:
        raise typer.Exit(1)


def _untrusted_lines(skipped: dict[str, int], unlistable: list[str], url: str) -> None:
    """What was skipped as untrusted, and how to remove each key the client cannot name."""
    from xla_pcache.bucket.reader import delete_hint
    from xla_pcache.tiers.objstore import parse_object_url

    if skipped:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(skipped.items()))
        typer.echo(f"skipped as untrusted: {shown(kinds)}", err=True)
    location = urllib.parse.urlsplit(parse_object_url(url)[0])
    for key in unlistable:
        hint = delete_hint(location.scheme, location.hostname or "", key)
        typer.echo(
            f"xla-pcache: {shown(key)} cannot be listed or removed by this client; remove "
            f"it with: {shown(hint)}",
            err=True,
        )


def _remove_untrusted_objects(url: str, read_only: bool, as_json: bool) -> None:
    with open_bucket(url, read_only=read_only) as b:
        refuse_read_only(b, "prune --untrusted")
        with interruptible("prune"):
            report = b.remove_untrusted()
    if as_json:
        emit_json(report.as_dict())
    else:
        for name in report.removed_names:
            typer.echo(f"removed {shown(name)}")
        typer.echo(f"removed {report.removed} objects that are nothing xla_pcache writes")
        _untrusted_lines(report.skipped, report.unlistable, url)
    if report.unlistable:
        raise typer.Exit(1)  # still in the bucket: the report says how to remove each


def _prune_untrusted(path: str | None, read_only: bool, as_json: bool) -> None:
    with reported(), open_cache(path, read_only=read_only, write=True) as store:
        found = list_untrusted(store, remove=True)
    if as_json:
        emit_json([{"path": p, "key": key_text(k), "why": w} for p, k, w in found])
        return
    for where, key, why in found:
        # A name held by no entry (a directory, a FIFO, a link) has no key: its path says it.
        typer.echo(f"removed {key_text(key) or key_text(where)} ({key_text(why)})")
    typer.echo(f"removed {len(found)} untrusted entries")
