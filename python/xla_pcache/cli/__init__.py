"""``xla-pcache``: look after a cache directory (stats, ls, prune, verify, clear, ...).

Expected failures (no path, not a cache, a ``CacheError``, a malformed option or variable)
print one line on stderr and exit 2. ``verify`` exits 1 when it finds problems. Importing
this module must stay cheap: the framework-facing commands import their modules lazily.

The commands live in modules named for them (``_stats``, ``_ls``, ``_prune``, ``_config``,
``_verify``, ``_bundle`` for export and import, ``_doctor``, ``_demo``, ``_precompile``), on
what they share (``_common``); the small ones are here, and every one is registered below, in
the order ``--help`` lists them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from typing import Annotated, Any

import typer

from xla_pcache import _core
from xla_pcache._text import ShownStream
from xla_pcache.cli._bundle import export_cmd, import_cmd
from xla_pcache.cli._common import (
    JsonOption,
    PathOption,
    ReadOnlyOption,
    emit_json,
    fail,
    key_text,
    open_cache,
    reported,
)
from xla_pcache.cli._config import config
from xla_pcache.cli._ls import list_entries
from xla_pcache.cli._precompile import precompile
from xla_pcache.cli._prune import prune
from xla_pcache.cli._stats import stats
from xla_pcache.cli._verify import verify
from xla_pcache.config import SIGNING_KEY_VAR, TRUSTED_KEYS_VAR

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


# clear ---------------------------------------------------------------------------------------


def clear(
    path: PathOption = None,
    read_only: ReadOnlyOption = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Also delete the entries of a later release's format (left by default: that "
            "release reads them).",
        ),
    ] = False,
) -> None:
    """Delete every entry but a later release's (asks first unless --yes; refused in
    read-only mode)."""
    with reported(), open_cache(path, read_only=read_only, write=True) as store:
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
        removed = store.clear(all=every)
    typer.echo(f"removed {removed} entries")


# explain -------------------------------------------------------------------------------------


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

    with reported(), open_cache(path, read_only=True) as store:
        try:
            results = why.explain(store, key, last, _module_differ(store))
        except why.NotRecorded:
            fail(f"no miss and no entry recorded for key {key_text(key)}")
    if as_json:
        emit_json(results)
        return
    if not results:
        typer.echo("no misses recorded (misses are logged by writable processes)")
        return
    now = time.time()
    for i, result in enumerate(results):
        if i:
            typer.echo("")
        for line in why.lines(result, now):
            typer.echo(key_text(line))


def _module_differ(store: Any) -> Any:
    """Where JAX is installed, what diffs a changed program's module against the nearest
    record's (records are JAX's, and JAX's own MLIR reads them); else None."""
    if importlib.util.find_spec("jax") is None:
        return None
    from xla_pcache.jax import _module_diff

    return _module_diff.Differ(store)


# keygen --------------------------------------------------------------------------------------


def keygen(
    name: Annotated[
        str, typer.Argument(help="The key's name, with a version for rotation: ci-1, then ci-2.")
    ],
    out: Annotated[str, typer.Option("--out", "-o", help="Private key file to create (0600).")],
) -> None:
    """Make an Ed25519 key pair for signed entries. The private key goes to --out (mode
    0600, never overwritten); the public key, NAME:BASE64, is printed on the last line."""
    import base64

    with reported():
        try:
            _core.check_key_name(name)
        except ValueError as e:
            fail(str(e))
        private = _core.generate_signing_key()
        public = base64.b64encode(_core.signing_public_key(private)).decode()
        target = os.path.expanduser(out)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            fail(f"{target} exists: keygen never overwrites a key")
        except OSError as e:
            fail(f"cannot create {target}: {e.strerror or e}")
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
        fail(f"the {module} command is unavailable: {exc}")


def demo(
    path: Annotated[
        str | None,
        typer.Option("--path", "-p", help="Cache directory for the demo.", show_default=False),
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo's cache afterwards.")] = False,
) -> None:
    """Compile a small program twice and show the second run hit the cache."""
    with reported():
        code = int(_lazy_main("demo")(path, keep))
    raise typer.Exit(code)


def doctor(path: PathOption = None, as_json: JsonOption = False) -> None:
    """Check the environment, the frameworks and the cache directory."""
    with reported():
        main_fn = _lazy_main("doctor")
    raise typer.Exit(int(main_fn(path, as_json)))


# Every command, in the order `xla-pcache --help` lists them, named for its function unless
# named here.
app.command()(stats)
app.command("ls")(list_entries)
app.command()(prune)
app.command()(config)
app.command()(verify)
app.command()(clear)
app.command()(explain)
app.command()(keygen)
app.command()(demo)
app.command()(doctor)
app.command()(precompile)
app.command("export")(export_cmd)
app.command("import")(import_cmd)


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
