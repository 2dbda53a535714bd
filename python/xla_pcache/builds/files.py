"""Which files make a framework's runtime: its packages' shared objects, found as ``import``
would find the packages and named by their path below them. Which packages a framework's
build is made of is the adapters' business (``jax/_build.py``, ``torch_xla/_build.py``)."""

from __future__ import annotations

import importlib.util
import os

# (role, path, name within the role's directory)
Wanted = tuple[str, str, str]

_SKIP_DIRS = frozenset({"include", "__pycache__"})
# A package holding more shared objects than this is not one of the frameworks': the rest is
# ignored.
_MAX_FILES = 512


def package_dirs(name: str) -> list[str]:
    """The directories of the package ``name``, found as ``import`` would find them, without
    importing it; empty when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [str(p) for p in spec.submodule_search_locations]


def shared_objects(role: str, top: str, prefix: str = "") -> list[Wanted]:
    """Every shared object under ``top`` (headers and caches left out), named by its path
    below ``top`` (after ``prefix``)."""
    out: list[Wanted] = []
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for f in sorted(files):
            if f.endswith(".so") or ".so." in f:
                path = os.path.join(root, f)
                out.append((role, path, os.path.join(prefix, os.path.relpath(path, top))))
                if len(out) >= _MAX_FILES:
                    return out
    return out


def unique(wanted: list[Wanted]) -> list[Wanted]:
    """``wanted`` without a path named twice (the first kept)."""
    seen: set[str] = set()
    out = []
    for item in wanted:
        if item[1] not in seen:
            seen.add(item[1])
            out.append(item)
    return out
