"""The doctor's report printed for people (``--json`` prints the dict itself): every value
that came from a path, a version, a cache writer or an error is escaped, never read as rich
markup, and its control sequences are made visible.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xla_pcache._text import raw_stream, shown


def _e(value: object) -> str:
    # Paths, versions and error texts (some quote files a cache writer chose) are printed as
    # they are, never read as rich markup.
    # Control sequences in them are made visible (shown), never sent to the terminal.
    return escape(shown(value))


def _render(console: Console, report: dict[str, Any]) -> None:
    from xla_pcache.sizes import format_size

    cfg = report["config"]
    console.print(
        f"xla_pcache {report['xla_pcache']} (format {report['format_version']}), "
        f"Python {report['python']}"
    )
    console.print(f"Cache: [bold]{_e(cfg['path'])}[/] (from {_e(cfg['path_source'])})")
    if "bucket" in cfg:
        console.print(
            f"  a bucket: {_e(cfg['bucket'])}, served by this host-local store in front of it"
        )
    if "read_only" in cfg:
        console.print(
            f"  read-only: {cfg['read_only']}, max size: {format_size(cfg['max_size'])}, "
            f"in-memory capacity: {cfg['memory_capacity']}"
        )
    trust = cfg.get("trust")
    if trust is not None:
        signing, trusted = trust["signing_key"], trust["trusted_keys"]
        console.print(
            "  signing: "
            + (
                f"every put signed by {_e(signing['name'])} (key file {_e(signing['file'])})"
                if signing
                else "puts are unsigned"
            )
        )
        console.print(
            "  trusted keys: "
            + (
                ", ".join(_e(k["name"]) for k in trusted) + ": only entries they signed are loaded"
                if trusted
                else "none set, every verified entry is loaded (any writer's)"
            )
        )
    cache = report["cache"]
    if cache:
        size = cache.get("bytes")
        console.print(
            f"  filesystem: {_e(cache['filesystem'])} "
            f"({'mmap' if cache['mmap_reads'] else 'pread'} reads), "
            f"{cache.get('entries')} entries, "
            f"{format_size(size) if isinstance(size, int) else _e(size)}"
        )
    stored = cache.get("stored_settings")
    if stored is not None:
        from xla_pcache.metrics import human_duration

        age, kept = cache.get("max_age_s"), cache.get("max_size")
        console.print(
            f"  budget kept: {format_size(kept) if kept else 'unbounded'} (stored in the "
            f"cache: {format_size(stored['max_size']) if stored['max_size'] else 'none'}), "
            f"max age: {human_duration(age) if age else 'none'}"
        )
    for tier in cache.get("remote", []):
        console.print(
            f"  remote tier {tier['tier']}: {_e(tier['url'])}"
            + (" (read-only)" if tier["read_only"] else "")
            + (" (trusted entries only)" if tier.get("trust_required") else "")
        )
    checks = cache.get("bucket_checks")
    if checks:
        console.print(
            "  the bucket, each request once: "
            + ", ".join(f"{_e(c['step'])} {'ok' if c['ok'] else 'FAILED'}" for c in checks)
        )
    for name, state in report.get("activation", {}).items():
        console.print(f"Zero-code activation for {_e(name)}: {_e(state)}")
    caching = report.get("jax_caching", {})
    if caching:
        console.print(
            "What JAX stores (a jax.config.update in the program before activation wins):"
        )
    for option, setting in caching.items():
        console.print(f"  {_e(option)} = {_e(setting['value'])} (from {_e(setting['source'])})")
    _render_prefetch(console, report)
    table = Table(title="Frameworks")
    for column in ("framework", "versions", "backend", "serialize", "load", "note"):
        table.add_column(column)
    for name, fw in report["frameworks"].items():
        versions = ", ".join(f"{d} {v}" for d, v in fw["versions"].items())
        if "error" in fw:
            table.add_row(
                _e(name),
                _e(versions),
                _e(fw["backend_hint"]),
                "?",
                "?",
                f"[red]{_e(fw['error'])}[/]",
            )
            continue
        note = fw.get("detail", "")
        if fw.get("adapter") not in (None, "ok"):
            note = f"{note} adapter: {fw['adapter']}".strip()
        if fw.get("remembered"):
            note = f"{note} (remembered)".strip()
        if fw.get("cache_error"):
            note = f"{note} ({fw['cache_error']})".strip()
        table.add_row(
            _e(name),
            _e(versions),
            _e(fw.get("backend")),
            "[green]yes[/]" if fw.get("serialize") else "[red]no[/]",
            "[green]yes[/]" if fw.get("load") else "[red]no[/]",
            _e(note),
        )
    if report["frameworks"]:
        console.print(table)
        _render_builds(console, report["frameworks"])
        _render_key_settings(console, report.get("jax_keys"))
    else:
        console.print("No framework found: install jax or torch_xla.")
    for problem in report["problems"]:
        console.print(f"[red]problem:[/] {_e(problem)}")


def _render_builds(console: Console, frameworks: dict[str, Any]) -> None:
    """The runtime builds in force: each entry's key ends with its build, and a process
    loads only its own build's entries (docs/jax.md, docs/torch_xla.md)."""
    console.print("Runtime builds (a process loads only entries its own build made):")
    for name, fw in frameworks.items():
        build = fw.get("build") or {}
        if "error" in build:
            console.print(f"  {_e(name)}: [red]unknown[/] ({_e(build['error'])})")
            continue
        console.print(f"  {_e(name)}: build {_e(build.get('digest'))}")
        for role, r in (build.get("roles") or {}).items():
            if role == "unreadable":
                console.print(f"    [red]unreadable[/]: {_e('; '.join(r.get('messages', [])))}")
                continue
            console.print(
                f"    {_e(role)}: {_e(r.get('file'))} {_e(r.get('id'))}"
                + (
                    f" (+{r['files'] - 1} more files, digest {_e(r.get('digest'))})"
                    if r.get("files", 1) > 1
                    else ""
                )
            )
        if build.get("record_problems"):
            console.print(
                "    [red]the record of identities was refused[/] (see the warning): every "
                "process hashes the binaries"
            )
        _render_record(console, build.get("record"))


def _render_key_settings(console: Console, keys: dict[str, Any] | None) -> None:
    """The compression and flags in this host's JAX keys, and the store's entries made under
    others (a fleet split by them shares no entry)."""
    if not keys:
        return
    host = keys.get("host") or {}
    if "error" in host:
        console.print(f"JAX's keys on this host: [red]unknown[/] ({_e(host['error'])})")
        return
    flags = host.get("flags")
    console.print(
        f"JAX's keys on this host: compression {_e(host.get('compression', '?'))}, flags "
        + (_e(" ".join(flags)) if flags else "none" if flags is not None else "?")
        + " (hosts that share entries need both alike)"
    )
    for name in ("compression_error", "flags_error"):
        if host.get(name):
            console.print(f"  [red]{_e(name)}[/]: {_e(host[name])}")
    entries = keys.get("entries")
    if not entries:
        return
    for other in entries.get("other", []):
        console.print(
            f"  [yellow]{other['entries']} of the store's {entries['recorded']} JAX entries[/] "
            f"were made with {_e(other['part'])} {_e(other['value'] or '(none)')}: this host "
            "never reads them"
        )
    if entries.get("other_left_out"):
        console.print(f"  and {entries['other_left_out']} more made under still other settings")


def _render_record(console: Console, record: dict[str, Any] | None) -> None:
    """Where the identities of the runtime's binaries are remembered: a process start
    then pays a stat per file; where they cannot be, it hashes them all again."""
    from xla_pcache.sizes import format_size

    if not record:
        return
    if record.get("unkept"):
        console.print(
            "    [red]identities remembered nowhere[/] "
            f"({_e(record['unkept'])}): every process hashes these binaries again "
            f"({format_size(record.get('hashed_bytes') or 0)}) at its first compile"
        )
    elif record.get("dir"):
        skipped = record.get("skipped") or []
        console.print(
            f"    identities remembered in {_e(record['dir'])}"
            + (f" (not in {_e('; '.join(skipped))})" if skipped else "")
        )


def _job_memory_line(job: dict[str, Any], ahead: dict[str, Any]) -> str:
    """The job's memory as found (the cgroup limit of least room, or the host's) and the
    memory compiling ahead keeps free, with where that comes from."""
    from xla_pcache.sizes import format_size

    def size(n: int | None) -> str:
        return "unknown" if n is None else format_size(n)

    limits = job.get("limits") or []
    host = f"host {size(job.get('host_total'))}, {size(job.get('host_available'))} available"
    if job.get("tightest") is not None:
        lim = limits[job["tightest"]]
        found = (
            f"cgroup v{lim['version']} {_e(lim['cgroup'])} limits it to {size(lim['limit'])} "
            f"({size(lim['use'])} used; {_e(lim['source'])} in {_e(lim['directory'])}); {host}"
        )
    else:
        found = f"no cgroup limit found: {host}"
    return (
        f"the job's memory: {found}; {size(ahead['memory_kept_free'])} kept free "
        f"({_e(ahead.get('memory_kept_free_from', ''))})"
    )


def _render_prefetch(console: Console, report: dict[str, Any]) -> None:
    from xla_pcache.metrics import human_duration
    from xla_pcache.sizes import format_size

    pf = report.get("prefetch")
    jax = report["frameworks"].get("jax")
    if not pf or jax is None:
        return
    line = f"Loading ahead (JAX): {_e(pf['state'])}"
    if pf["state"] == "on":
        hook = jax.get("prefetch")
        line += (
            f", {pf['threads']} threads, up to {format_size(pf['memory'])} loaded and not yet "
            f"used; plans named by {_e(pf['name'] or 'the program (its path in its project)')}"
        )
        if hook is not None and hook != "ok":
            line += f"; [red]off in this JAX[/]: {_e(hook)}"
    console.print(line)
    ahead = pf.get("compile_ahead")
    if ahead and pf["state"] == "on":
        line = f"Compiling ahead what is missing (JAX): {_e(ahead['state'])}"
        if ahead["state"] == "on":
            line += (
                f", in a compiler process of {ahead['threads']} threads (CPU and TPU programs), "
                f"starting only while more than {format_size(ahead['memory_kept_free'])} of "
                "memory is available"
            )
            hook = jax.get("compile_ahead")
            if hook is not None and hook != "ok":
                line += f"; [red]off in this JAX[/]: {_e(hook)}"
        console.print(line)
        if ahead["state"] == "on" and "job_memory" in pf:
            console.print(f"  {_job_memory_line(pf['job_memory'], ahead)}")
    counts = report["cache"].get("prefetch")
    if counts:
        console.print(
            f"  so far: {counts.get('planned', 0)} planned, {counts.get('loaded', 0)} loaded "
            f"ahead, {counts.get('used', 0)} used, {counts.get('wasted', 0)} wasted, "
            f"{counts.get('errors', 0)} failed, time saved "
            f"{human_duration(counts.get('saved_ms', 0) / 1000)}; plans written "
            f"{counts.get('plans_written', 0)}, refused {counts.get('plans_refused', 0)}; "
            f"compiled ahead {counts.get('compiled', 0)}, used "
            f"{counts.get('compiled_used', 0)}, module records refused "
            f"{counts.get('modules_refused', 0)}"
        )


def _console() -> Console:
    # Rich writes to the stream under the CLI's escaping one: what it is given is escaped.
    out = raw_stream(sys.stdout)
    console = Console(file=out)
    if not console.is_terminal:
        # Piped or redirected: whole lines, not wrapped at rich's default of 80 columns.
        console = Console(file=out, width=10_000)
    return console
