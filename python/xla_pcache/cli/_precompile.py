"""``xla-pcache precompile``: compile the store's module records for a TPU topology on this
host (JAX's TPU runtime installed, no TPU needed), with the fleet's flags and compression,
into the store under the keys the TPU computes (``xla_pcache.jax.ahead._precompile``).

It says where the flags and compression came from (options, else each record's key parts:
what the fleet's host that wrote it had), prints a line per record on stderr as it goes, and
ends with a report (``--json`` for scripts). Exit status: 0 when nothing failed, 1 when a
compile or a put failed, 2 for what it refuses whole (no JAX TPU runtime, an unknown
topology, a read-only path, a trusting store that would not sign).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Annotated, Any

import typer

from xla_pcache._text import shown
from xla_pcache.cli._common import JsonOption, PathOption, emit_json, fail, key_text, reported
from xla_pcache.config import PATH_VAR, SIGNING_KEY_VAR, Settings
from xla_pcache.sizes import format_size


def precompile(
    topology: Annotated[
        str,
        typer.Option("--topology", "-t", help="The fleet's TPU topology, as v5e:1x1 or v5e:2x2."),
    ],
    path: PathOption = None,
    plan: Annotated[
        str | None,
        typer.Option(
            "--plan",
            help="Only the programs of this workload's plan (its XLA_PCACHE_PREFETCH_NAME, "
            "or a plan's key).",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Only programs whose name matches (a shell pattern)."),
    ] = None,
    libtpu_init_args: Annotated[
        str | None,
        typer.Option(
            "--libtpu-init-args",
            help="The fleet's LIBTPU_INIT_ARGS (JAX's own TPU VM flag is added as JAX adds "
            "it there). Default: each record's own flags.",
        ),
    ] = None,
    compression: Annotated[
        str | None,
        typer.Option(
            "--compression",
            help="What the fleet's JAX compresses with: zlib (no zstandard installed) or "
            "zstd. Default: each record's own.",
        ),
    ] = None,
    chips_per_host: Annotated[
        str | None,
        typer.Option("--chips-per-host", help="One host's chips, as 2,2,1 (multi-host)."),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            max=256,
            help="Compiles at once (default: as "
            "compiling ahead, XLA_PCACHE_COMPILE_AHEAD_THREADS).",
        ),
    ] = None,
    compile_timeout: Annotated[
        float,
        typer.Option(
            "--compile-timeout",
            min=0.001,
            help="One compile's seconds at most: past them the record fails and the "
            "others go on in a new compiler process.",
        ),
    ] = 3600.0,
    as_json: JsonOption = False,
) -> None:
    """Compile the store's module records for a TPU topology on this host (no TPU needed),
    with the fleet's flags and compression, under the keys the TPU computes; skip what is
    present; say what could not be compiled and why."""
    with reported():
        code = _run(
            topology,
            path,
            plan,
            name,
            libtpu_init_args,
            compression,
            chips_per_host,
            jobs,
            compile_timeout,
            as_json,
        )
    raise typer.Exit(code)


def _say(text: str) -> None:
    typer.echo(f"precompile: {key_text(text)}", err=True)


def _run(
    topology_text: str,
    path: str | None,
    plan: str | None,
    name: str | None,
    libtpu_init_args: str | None,
    compression: str | None,
    chips_per_host: str | None,
    jobs: int | None,
    compile_timeout: float,
    as_json: bool,
) -> int:
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("libtpu") is None:
        fail("precompile needs JAX with its TPU runtime on this host: pip install 'jax[tpu]'")
    from xla_pcache.jax.ahead import _fleet, _precompile

    try:
        topology = _fleet.parse_topology(topology_text, chips_per_host)
        flags = None
        if libtpu_init_args is not None:
            flags = _fleet.with_tpu_vm_flag(
                _fleet.split_flags(libtpu_init_args, "--libtpu-init-args")
            )
        fleet_compression = None
        if compression is not None:
            fleet_compression = _fleet.COMPRESSION_NAMES.get(compression.strip().lower())
            if fleet_compression is None:
                raise _fleet.FleetError(f"--compression {compression!r} is not zlib or zstd")
            if (
                fleet_compression == _fleet.ZSTANDARD
                and importlib.util.find_spec("zstandard") is None
            ):
                raise _fleet.FleetError("--compression zstd needs zstandard installed here")
    except _fleet.FleetError as exc:
        fail(str(exc))
    settings = Settings.from_env()
    raw = os.path.expanduser(path) if path else settings.path
    if not raw:
        fail(f"no cache path: pass --path or set {PATH_VAR}")
    store = _open(raw, settings)
    with store:
        import jax
        from jax._src.lib import version_str as jaxlib

        from xla_pcache.jax import _build

        build = _build.build()
        keys = None
        if plan is not None:
            keys = tuple(_precompile.plan_keys(store, plan, jax.__version__))
        request = _precompile.Request(
            topology=topology,
            flags=flags,
            flags_source="--libtpu-init-args" if flags is not None else "",
            compression=fleet_compression,
            compression_source="--compression" if fleet_compression is not None else "",
            keys=keys,
            name=name,
            threads=jobs or settings.compile_ahead_thread_count(),
            reserve=settings.compile_ahead_reserve(),
            compile_timeout=compile_timeout,
        )
        _say(
            f"{shown(raw)}: compiling for {topology.name} ({topology.device_count} "
            f"{topology.device_kind} devices), {request.threads} at once, leaving "
            f"{format_size(request.reserve)} of memory free; keys end {build.suffix}"
        )
        if flags is not None:
            _say(f"flags: {' '.join(_fleet.keyed(flags))} (from --libtpu-init-args)")
        else:
            _say("flags: each record's own (its key parts: what the host that wrote it had)")
        _say(
            f"compression: {fleet_compression} (from --compression)"
            if fleet_compression is not None
            else "compression: each record's own (its key parts)"
        )

        def shown_outcome(o: Any, i: int, n: int) -> None:
            what = f" as {o.stored_as}" if o.stored_as and o.status == "compiled" else ""
            took = f" in {o.compile_s:.1f} s" if o.status == "compiled" else ""
            why = f": {o.detail}" if o.detail and o.status != "present" else ""
            _say(f"[{i}/{n}] {o.key}: {o.status}{what}{took}{why}")

        report = _precompile.precompile(
            store,
            request,
            build=build,
            meta={"framework": "jax", "framework_version": jax.__version__},
            jaxlib=jaxlib,
            shown=shown_outcome,
        )
    counts = report.counts()
    if as_json:
        emit_json(
            {
                "path": shown(raw),
                "topology": topology.name,
                "build": report.build,
                "settings": report.settings,
                "counts": counts,
                "seconds": round(report.seconds, 3),
                "complete_listing": report.cut_short is None,
                "cut_short": report.cut_short,
                "records": [o.as_dict() for o in report.outcomes],
            }
        )
    else:
        for used in report.settings:
            typer.echo(
                f"{used['records']} record(s) with flags [{shown(used['flags'])}] and "
                f"{shown(used['compression'])} ({shown(used['source'])})"
            )
        for o in report.outcomes:
            if o.status in ("not compilable", "failed"):
                typer.echo(f"{o.status}: {key_text(o.key)}: {key_text(o.detail)}")
        typer.echo(
            f"compiled {counts['compiled']}, present {counts['present']}, not compilable "
            f"{counts['not compilable']}, failed {counts['failed']} in {report.seconds:.1f} s"
        )
        if report.cut_short is not None:
            typer.echo(f"not every record may have been looked at: {shown(report.cut_short)}")
    return 1 if counts["failed"] else 0


def _open(raw: str, settings: Settings) -> Any:
    """The writable store of ``raw`` (a directory or a bucket); refused, before anything
    is read, where it is read-only or would write what its own readers refuse."""
    from xla_pcache.cache_path import open_store, route
    from xla_pcache.cli._common import redact
    from xla_pcache.store import settle

    where = route(raw)
    if where.kind == "unserved":
        fail(f"{redact(raw)} cannot be served: {where.reason}")
    opts = settle(settings)
    read_only = (
        opts.read_only or where.read_only or (where.tier is not None and where.tier.read_only)
    )
    shown_raw = redact(raw) if where.kind == "bucket" else raw
    if read_only:
        fail(
            f"{shown_raw}: the cache is read-only (XLA_PERSISTENT_CACHE_READ_ONLY or the "
            "path's ?ro=1): precompile writes executables"
        )
    if where.kind == "local" and not os.path.isdir(where.path):
        fail(f"{where.path}: no such cache directory")
    store = open_store(where, opts)
    if store.trusted_key_names is not None and store.signing_key_name is None:
        store.close()
        fail(
            f"{shown_raw}: the store serves only signed entries and this host signs none "
            f"(set {SIGNING_KEY_VAR}): what precompile stored would never be served"
        )
    return store
