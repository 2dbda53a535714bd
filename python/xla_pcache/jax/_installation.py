"""What ``install()`` sets up in JAX, one step each, and what it keeps to undo it.

``Installation`` is the record of one installation: the store, the options and arguments
it runs with, and every JAX option or function it replaced (``uninstall()`` puts them
back). The steps, in the order ``install()`` takes them: the settings and the store's
options (``settled``), the cache path and where it came from (``chosen_path``), keys kept
free of the path (``keys_free_of_path``), JAX's caching thresholds (``apply_thresholds``),
a miss that fails the call (``raise_on_miss``), the hooks on JAX's compile and cache read
(``hook_jax``), and a directory JAX's own cache filled, served and adopted
(``adopt_own_cache``). Handing the cache to JAX is ``install()``'s own last step.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, cast

from xla_pcache import cache_path
from xla_pcache._text import package_logger
from xla_pcache.config import PATH_VAR, Settings
from xla_pcache.jax import _adopt, _compile_context
from xla_pcache.jax import _thresholds as _jax_thresholds
from xla_pcache.jax._hooks import (
    CACHE_DIR_OPTION,
    RAISE_ERRORS_OPTION,
    XLA_CACHES_OPTION,
    Hooks,
)
from xla_pcache.jax.ahead import _prefetch, _read_hook
from xla_pcache.sizes import parse_duration, parse_size
from xla_pcache.store import Store, StoreOptions, settle

# The adapter's logger: these steps' warnings are install()'s.
logger = package_logger("xla_pcache.jax")


@dataclasses.dataclass
class Installation:
    hooks: Hooks
    path: str
    # What every store of this installation is opened with (install()'s arguments over the
    # settings, JAX's own budget below the variable's).
    options: StoreOptions
    original_factory: Callable[[str], Any]
    previous_cache_dir: str | None
    previous_xla_caches: str | None
    store: Store | None
    meta: dict[str, str]
    compile_wait: float = 0.0  # seconds; 0: single flight off
    on_miss: str = "compile"
    # jax_raise_persistent_cache_errors before install() set it for on_miss="error".
    previous_raise_errors: bool | None = None
    via: str = "install()"
    # JAX's caching thresholds: what is in force and where from, and the values the adapter
    # replaced (restored by uninstall unless the program changed them since).
    thresholds: list[_jax_thresholds.Decision] = dataclasses.field(default_factory=list)
    replaced_thresholds: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Stores opened by _factory for other directories (after set_cache_dir); closed on
    # uninstall.
    others: list[Store] = dataclasses.field(default_factory=list)
    # The bucket the path named (the store is its host-local store): its location, or None.
    bucket: str | None = None
    # An unserved URL named by the path: JAX runs uncached (the factory returns None).
    uncached: bool = False
    # Unserved URLs already warned about by the factory.
    warned: set[str] = dataclasses.field(default_factory=set)
    # Directories JAX's own cache filled, served and adopted on a miss; None: there are none.
    adopter: _adopt.Adopter | None = None
    # JAX's get_cache_key, when _adopt.KeyAliases stands in for it.
    original_get_cache_key: Callable[..., str] | None = None
    # Loading ahead: the form of JAX's cache read the wrapper stands in for (None: off), the
    # settings it runs with, and the session: begun at installation for the store opened
    # there, then the one of the cache JAX uses (``attached``).
    prefetch_form: int | None = None
    settings: Settings = dataclasses.field(default_factory=Settings)
    session: _prefetch.Prefetch | None = None
    # Compiling ahead: the form of JAX's compile function a compiler process calls (None:
    # off); each session has its own (``Prefetch.ahead``).
    compile_form: int | None = None


def settled(
    hooks: Hooks, max_size: int | str | None, read_only: bool | None
) -> tuple[Settings, StoreOptions]:
    """The environment's settings, with JAX's own budget below the variable's, and the
    options every store of the installation is opened with (the arguments over both); a
    malformed argument is the caller's error, raised here."""
    settings = Settings.from_env()
    if settings.max_size is None:
        jax_max = hooks.jax.config.values.get("jax_compilation_cache_max_size", -1)
        if isinstance(jax_max, int) and jax_max > 0:
            settings = settings.replace(max_size=jax_max)
    options = settle(
        settings, max_size=max_size, read_only=None if read_only is None else bool(read_only)
    )
    return settings, options


def explicit_thresholds(
    min_compile_time: float | str | None, min_entry_size: int | str | None
) -> dict[str, float | int]:
    """install()'s threshold arguments that were given, parsed (seconds, bytes)."""
    explicit: dict[str, float | int] = {}
    if min_compile_time is not None:
        explicit["min_compile_time"] = parse_duration(min_compile_time, name="min_compile_time")
    if min_entry_size is not None:
        explicit["min_entry_size"] = parse_size(min_entry_size, name="min_entry_size") or 0
    return explicit


def jax_dir_source(value: str | None) -> str:
    """Where JAX's cache directory came from: its variable, or ``jax.config.update``."""
    # JAX_COMPILATION_CACHE_DIR is JAX's own variable, read by JAX: only compared here.
    if value and os.environ.get("JAX_COMPILATION_CACHE_DIR", "").strip() == value:
        return "JAX_COMPILATION_CACHE_DIR"
    return CACHE_DIR_OPTION if value else "the default path"


def chosen_path(
    path: str | os.PathLike[str] | None, settings: Settings, previous_dir: str | None
) -> tuple[str, str]:
    """The cache path install() serves and its source, named in any warning about it: the
    argument, else the variable, else JAX's own directory, else the default path."""
    if path is not None:
        return os.fspath(path), "install(path)"
    if settings.path:
        return settings.path, PATH_VAR
    return previous_dir or settings.default_cache_path(), jax_dir_source(previous_dir)


def keys_free_of_path(hooks: Hooks) -> tuple[bool, str | None]:
    """On a jax whose keys depend on the cache path through XLA's side caches, turns those
    off (``jax_persistent_cache_enable_xla_caches="none"``) while installed: whether it did,
    and the value it replaced."""
    workaround = hooks.has_xla_caches_option and hooks.needs_path_workaround
    if not workaround:
        return False, None
    jax_config = hooks.jax.config
    previous: str | None = jax_config.values.get(XLA_CACHES_OPTION)
    if previous not in (None, "none", _adopt.XLA_CACHES_DEFAULT):
        logger.warning(
            "xla_pcache: setting %s='none' (was %r) while installed, so that cache "
            "keys do not depend on the cache path",
            XLA_CACHES_OPTION,
            previous,
        )
    jax_config.update(XLA_CACHES_OPTION, "none")
    return True, previous


def apply_thresholds(
    inst: Installation, settings: Settings, explicit: dict[str, float | int]
) -> None:
    """Set JAX's caching thresholds to the store's own, except those the program chose."""
    config = inst.hooks.jax.config
    values = config.values
    decisions = _jax_thresholds.decide(settings, os.environ, values, explicit)
    applied = []
    for decision in decisions:
        if decision.option not in values:  # pragma: no cover - present since jax 0.4.x
            continue
        if decision.apply:
            previous = values.get(decision.option)
            kind = type(previous) if isinstance(previous, int | float) else float
            # JAX checks the option's type; an applied value is always the store's number.
            value = kind(cast(float, decision.value))
            if previous != value:
                inst.replaced_thresholds[decision.option] = previous
                config.update(decision.option, value)
            decision = dataclasses.replace(decision, value=value)
        applied.append(decision)
    inst.thresholds = applied
    logger.debug(
        "xla_pcache: JAX caching thresholds: %s",
        ", ".join(f"{d.option}={d.value!r} ({d.source})" for d in applied),
    )


def raise_on_miss(inst: Installation) -> None:
    """In ``on_miss="error"`` mode, makes JAX raise what a cache read raised: JAX turns an
    exception from a cache read into a warning and compiles unless this option is set, and
    the miss must fail the jitted call."""
    if inst.on_miss != "error":
        return
    jax_config = inst.hooks.jax.config
    inst.previous_raise_errors = bool(jax_config.values.get(RAISE_ERRORS_OPTION, False))
    jax_config.update(RAISE_ERRORS_OPTION, True)


def hook_jax(inst: Installation, prefetch: bool | None) -> None:
    """The wrappers on JAX's compile and cache read: single flight (when a miss waits for
    another process's compile), loading ahead (the argument, else the settings) and, with
    it, compiling ahead; each only where this jax has what it wraps."""
    hooks, settings = inst.hooks, inst.settings
    if hooks.compiler is not None:
        # Each compile's context: single flight's claims, the key's capture for the put.
        _compile_context.install_hook(hooks.compiler)
    wants_prefetch = settings.prefetch if prefetch is None else bool(prefetch)
    if wants_prefetch and inst.store is not None and _read_hook.install_hook(hooks.cc):
        form = _read_hook.read_form(hooks.cc)
        inst.prefetch_form = form if isinstance(form, int) else None
        if settings.compile_ahead and hooks.compiler is not None and inst.on_miss != "error":
            inst.compile_form = _compile_form(hooks.compiler)


def _compile_form(compiler: Any) -> int | None:
    """The form of JAX's compile function a compiler process calls, or None, with one
    warning, on a JAX whose function is not one it knows: nothing is then compiled ahead."""
    from xla_pcache.jax.ahead._compiler import read_form

    found = read_form(compiler)
    if isinstance(found, str):
        logger.warning(
            "xla_pcache: compiling ahead is off: %s (JAX compiles as before; "
            "XLA_PCACHE_COMPILE_AHEAD=0 silences this)",
            found,
        )
        return None
    return found[1]


def adopt_own_cache(
    inst: Installation, where: cache_path.Route, previous_dir: str | None, workaround: bool
) -> None:
    """A directory JAX's own cache filled (the store's own, or the one JAX was set to before
    install()), served on a miss and its entries moved into the store as they are asked
    for; with keys kept free of the path, JAX's keys are aliased to the ones it wrote."""
    store, hooks = inst.store, inst.hooks
    if store is None or inst.bucket is not None or where.kind != "local":
        return
    sources = _adopt.sources(store, inst.path, previous_dir)
    if not sources:
        return
    inst.adopter = _adopt.Adopter(sources, hooks.cc)
    logger.info(
        "xla_pcache: serving and adopting the entries JAX's own cache left in %s",
        ", ".join(src.path for src in sources),
    )
    original_key = getattr(hooks.cc, "get_cache_key", None)
    if workaround and callable(original_key):
        inst.original_get_cache_key = original_key
        hooks.cc.get_cache_key = _adopt.KeyAliases(original_key, inst.adopter)
