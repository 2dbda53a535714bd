"""torch_xla's cache files and the store keys they are kept under: torch_xla names each file
by its graph's 128-bit hash in decimal, and the store keeps it under ``torch_xla/<name>``
joined with the runtime's build (``xla_pcache.build_key``, ``xla_pcache.builds``)."""

from __future__ import annotations

from xla_pcache import build_key
from xla_pcache.builds import Build

KEY_PREFIX = "torch_xla/"


def is_torch_xla_name(name: str) -> bool:
    """torch_xla names its files by the 128-bit graph hash printed in decimal."""
    return 0 < len(name) <= 40 and name.isascii() and name.isdigit()


def store_key(name: str, build: Build | None = None) -> str:
    """The store's key of torch_xla's file ``name`` compiled by ``build`` (its runtime's
    build, ``xla_pcache.builds``; None only where no build is wanted: tests of the mirror
    alone)."""
    return build_key.join(KEY_PREFIX + name, build.digest if build is not None else None)


def name_of(key: str, build: Build | None) -> str:
    """torch_xla's file name of a key of ``build``; "" for any other key."""
    bare, of = build_key.split(key)
    if of != (build.digest if build is not None else None) or not bare.startswith(KEY_PREFIX):
        return ""
    name = bare.removeprefix(KEY_PREFIX)
    return name if is_torch_xla_name(name) else ""
