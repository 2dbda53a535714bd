"""The variables torch_xla reads its cache settings from (``XLA_PERSISTENT_CACHE_PATH``,
``_READ_ONLY``), as the adapter sets them: around the creation of torch_xla's cache, which
reads them once, and for child processes, which inherit them. torch_xla never finds the
shared directory in them: a torch_xla without xla_pcache would write in place into it."""

from __future__ import annotations

import os
from typing import Any

from xla_pcache import cache_path
from xla_pcache._core import CacheError
from xla_pcache.config import PATH_VAR, READ_ONLY_VAR, SHARED_PATH_VAR


def start_cache(xlac: Any, directory: str | None, read_only: bool) -> None:
    """Make torch_xla create its computation cache now, reading ``directory``.

    torch_xla reads XLA_PERSISTENT_CACHE_PATH/_READ_ONLY once, when it first needs its
    cache. Creating it here, under install()'s control, rather than at the first
    execution, means the variables can be put back at once and no later change to them can
    send torch_xla's in-place writes into the shared directory.
    """
    saved = {name: os.environ.get(name) for name in (PATH_VAR, READ_ONLY_VAR)}
    try:
        if directory is None:
            os.environ.pop(PATH_VAR, None)
        else:
            os.environ[PATH_VAR] = directory
        os.environ[READ_ONLY_VAR] = "1" if read_only else "0"
        xlac._xla_get_num_cached_compilation_graph()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if not xlac._xla_computation_cache_is_initialized():
        raise CacheError("torch_xla did not create its computation cache when asked")


def hide_from_children(path: str) -> None:
    """Child processes inherit the environment. One that runs torch_xla without calling
    install() would write in place into the shared directory; moving the path to our own
    variable gives it no persistent cache instead, and install() in it still finds it."""
    os.environ[SHARED_PATH_VAR] = path
    os.environ.pop(PATH_VAR, None)


def leave_for_children(resolved: str, ro: bool) -> None:
    """torch_xla's own call leaves its settings in the environment for child processes;
    so does this one, with the path in the variable only xla_pcache reads (see
    hide_from_children), which activation in a child serves from the store."""
    os.environ[READ_ONLY_VAR] = "1" if ro else "0"
    hide_from_children(resolved)


def leave_without_cache() -> None:
    """After a failed activation: torch_xla must not find the store's path, or it would
    write its own files in place into the store. Children keep the path in the variable
    only xla_pcache reads, so they try again."""
    raw = os.environ.pop(PATH_VAR, "").strip()
    if raw:
        os.environ[SHARED_PATH_VAR] = cache_path.route(raw).path


def source(resolved: str) -> str:
    """Which setting named ``resolved``, for a warning."""
    settings_path = (
        os.environ.get(PATH_VAR, "").strip() or os.environ.get(SHARED_PATH_VAR, "").strip()
    )
    if settings_path and cache_path.route(settings_path).path == resolved:
        return PATH_VAR
    return "torch_xla's cache path"
