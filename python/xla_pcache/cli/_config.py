"""``xla-pcache config``: a cache's stored budget (size, max age), in its directory or
beside a bucket's entries."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from xla_pcache import _core
from xla_pcache.cli._common import (
    JsonOption,
    PathOption,
    bucket_url,
    emit_json,
    fail,
    open_bucket,
    open_cache,
    refuse_read_only,
    reported,
)
from xla_pcache.config import MAX_SIZE_VAR
from xla_pcache.sizes import format_size, parse_duration, parse_size

# Values that unset a stored setting.
_UNSET = ("none", "off", "unset")


def _stored_budget_text(budget: dict[str, Any]) -> list[str]:
    from xla_pcache.metrics import human_duration

    size, age = budget.get("max_size"), budget.get("max_age_s")
    return [
        "max size: " + (f"{format_size(size)} ({size:,} B)" if size else "not set (unbounded)"),
        "max age: " + (human_duration(age) if age else "not set (entries never age out)"),
    ]


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
    with reported():
        changing = max_size is not None or max_age is not None
        if changing and show:
            fail("--show prints the settings; it cannot be combined with --max-size/--max-age")
        url = bucket_url(path)
        if url is not None:
            _config_bucket(url, max_size, max_age, as_json)
            return
        if not changing:
            with open_cache(path, read_only=True) as store:
                current = store.cache_settings()
                effective = {"max_size": store.max_size, "max_age_s": store.max_age}
        else:
            new_size, new_age = _parsed_budget(max_size, max_age)
            with open_cache(path, read_only=False, write=True) as store:
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
        emit_json({"stored": current, "effective": effective})
        return
    for line in _stored_budget_text(dict(current)):
        typer.echo(line)
    if effective["max_size"] != current["max_size"]:
        typer.echo(
            f"this process's budget: {format_size(effective['max_size'])} "
            f"(lowered by ${MAX_SIZE_VAR})"
        )


def _parsed_budget(max_size: str | None, max_age: str | None) -> tuple[int | None, float | None]:
    """The budget and max age the options ask for (None: unset), held to the core's bounds
    (``_core.check_size``, ``_core.check_max_age``) with the options' own words."""
    new_size = new_age = None
    if max_size is not None and max_size.strip().lower() not in _UNSET:
        size = parse_size(max_size, name="--max-size") or 0
        try:
            new_size = _core.check_size("--max-size", size)
        except ValueError:
            fail(f"--max-size must be positive ('none' unsets it), got {max_size!r}")
    if max_age is not None and max_age.strip().lower() not in _UNSET:
        age = parse_duration(max_age, name="--max-age")
        try:
            new_age = _core.check_max_age("--max-age", age)
        except ValueError:
            fail(f"--max-age must be at least 1 second, got {max_age!r}")
    return new_size, new_age


def _config_bucket(url: str, max_size: str | None, max_age: str | None, as_json: bool) -> None:
    from xla_pcache.bucket.upkeep import BucketStoredBudget

    new_size, new_age = _parsed_budget(max_size, max_age)
    with open_bucket(url) as b:
        current = b.read_stored_budget()
        if max_size is not None or max_age is not None:
            refuse_read_only(b, "config --max-size/--max-age")
            current = BucketStoredBudget(
                new_size if max_size is not None else current.max_size,
                new_age if max_age is not None else current.max_age_s,
            )
            b.write_stored_budget(current)
            current = b.read_stored_budget()
    stored = {"max_size": current.max_size, "max_age_s": current.max_age_s}
    if as_json:
        emit_json({"stored": stored, "effective": stored})
        return
    for line in _stored_budget_text(stored):
        typer.echo(line)
