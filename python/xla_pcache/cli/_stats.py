"""``xla-pcache stats``: a cache directory's counters (table, JSON or Prometheus text), or a
bucket's."""

from __future__ import annotations

import re
import time
from enum import StrEnum
from typing import Annotated, Any

import typer

from xla_pcache import _core
from xla_pcache._text import shown
from xla_pcache.cli._common import (
    JsonOption,
    PathOption,
    ReadOnlyOption,
    bucket_url,
    emit_json,
    fail,
    format_ago,
    open_bucket,
    open_cache,
    plain_console,
    reported,
)
from xla_pcache.sizes import format_size

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
    ("other_build", "of them another build's entry (jaxlib, torch_xla, PJRT plugin)"),
    ("hit_rate", "hit rate"),
    ("puts", "puts"),
    ("compile_saved_ms", "compile time saved"),
    ("evictions", "evictions"),
    ("corrupt", "corrupt"),
    ("newer_format", "a later release's entries met (left alone)"),
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
    # Loading ahead (JAX): see docs/jax.md.
    ("prefetch_planned", "executables planned to load ahead"),
    ("prefetch_loaded", "loaded ahead"),
    ("prefetch_used", "loaded ahead and used (each also a hit)"),
    ("prefetch_wasted", "loaded ahead, never used"),
    ("prefetch_errors", "failed to load ahead"),
    ("prefetch_saved_ms", "time loading ahead saved"),
    ("prefetch_plans_written", "plans written"),
    ("prefetch_plans_refused", "plans refused"),
    # Compiling ahead (JAX): see docs/jax.md.
    ("prefetch_compiled", "programs compiled ahead"),
    ("prefetch_compiled_used", "compiled ahead and used"),
    ("prefetch_modules_refused", "module records refused"),
    # The runtime's build (docs/jax.md): starts that paid its hash for want of a record.
    ("build_rehashes", "starts that hashed the runtime (no record kept; see doctor)"),
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
    if name in ("compile_saved_ms", "prefetch_saved_ms") and isinstance(value, int):
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
    with reported():
        url = bucket_url(path)
        if url is not None:
            if output is StatsFormat.prometheus:
                fail("--format prometheus is for a directory, not a bucket")
            with open_bucket(url) as b:
                report = b.stats()
            _bucket_stats(report, as_json or output is StatsFormat.json)
            return
    with reported(), open_cache(path, read_only=read_only) as store:
        report = _stats_report(store)
    if output is StatsFormat.prometheus:
        from xla_pcache.metrics import prometheus_text

        with reported():
            try:
                text = prometheus_text(report)
            except ImportError as exc:
                fail(str(exc))
        typer.echo(text, nl=False)
        return
    if as_json or output is StatsFormat.json:
        emit_json(report)
        return
    from rich.table import Table

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
    plain_console().print(table)


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
    ("junk", "objects under entries/ that are no entry"),
    ("directories", "names under entries/ with objects planted below"),
    ("skipped", "objects skipped as untrusted"),
)


def _bucket_stats(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(report)
        return
    from rich.table import Table

    table = Table(title=shown(f"xla_pcache {report['path']} (bucket)"), show_header=False)
    table.add_column("counter")
    table.add_column("value", justify="right")
    for name, label in _BUCKET_ROWS:
        value = report.get(name)
        if name == "last_prune":
            text = "never" if value is None else f"{format_ago(time.time() - value)} ago"
            if report.get("last_prune_complete") is False:
                saw = report.get("last_prune_entries")
                size = report.get("last_prune_bytes")
                text += (
                    " (cut short: its totals count what it saw"
                    + (
                        ""
                        if saw is None or size is None
                        else f", {saw:,} entries, {format_size(size)}"
                    )
                    + ", listed or reached by name)"
                )
        elif name == "skipped" and value:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(report["skipped_by_kind"].items()))
            text = f"{value:,} ({kinds})"
        else:
            text = _stat_text(name, value)
        table.add_row(label, shown(text))
    requests = ", ".join(f"{n} {k}" for k, n in sorted(report["requests"].items()))
    table.add_row("requests", shown(f"{requests} ({report['seconds']:.2f} s)"))
    plain_console().print(table)
    _unlistable_lines(report)


def _unlistable_lines(report: dict[str, Any]) -> None:
    """Each key the client can neither list nor remove, and the command that removes it."""
    for key, hint in zip(report["unlistable"], report["unlistable_hints"], strict=True):
        typer.echo(
            f"xla-pcache: {shown(key)} cannot be listed or removed by this client; remove "
            f"it with: {shown(hint)}",
            err=True,
        )
    if not report.get("listing_complete", True):
        why = report.get("listing_cut_short") or "too many keys the client cannot list"
        typer.echo(
            f"xla-pcache: the listing of entries was cut short ({shown(why)}): the totals "
            "count what it saw",
            err=True,
        )
