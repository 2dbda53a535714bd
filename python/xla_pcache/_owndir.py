"""Host-local directories of this user's own, as handles (``_core.own_directory``, the rule
of ``rust/core/src/owndir.rs``): torch_xla's local directory, pools and views, and a bucket
path's host-local store.

Each is opened without following a link and checked on that handle; everything done in it
afterwards goes through the handle (the ``*at`` calls, ``dir_fd=``), so a directory renamed
into its place later (by whoever can write its parent) is never used. Two cases are said
here, once each: a directory an earlier release made under ``umask 002`` (this user's,
writable by the group) is repaired (made 0700, what it held discarded: others could have
written there), one warning; and a root the user named that others can write (a shared
scratch directory) is left as it is, with this user's own directory beneath it used
instead, one line at info level.
"""

from __future__ import annotations

import contextlib
import os
import threading
from types import TracebackType
from typing import Literal, Self

from xla_pcache import _core
from xla_pcache._text import package_logger

logger = package_logger("xla_pcache")

Rule = Literal["refuse", "repair", "named"]

_said: set[str] = set()
_said_lock = threading.Lock()


def _first_time(what: str) -> bool:
    with _said_lock:
        if what in _said:
            return False
        _said.add(what)
        return True


class OwnDir:
    """A checked directory: ``fd`` (opened for reading, closed by ``close``) and ``path``
    (for messages). ``repaired``: it was made 0700 and emptied when opened."""

    def __init__(self, fd: int, path: str, repaired: bool = False) -> None:
        self.fd = fd
        self.path = path
        self.repaired = repaired

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, os may be gone
            self.close()


def open_own(
    path: str,
    *,
    rule: Rule,
    parent: OwnDir | None = None,
    refetched: str = "",
) -> OwnDir:
    """Opens ``path`` (with ``parent``, the name ``path`` has beneath that directory) as a
    directory of this user's own under ``rule`` (``_core.own_directory``). ``refetched``
    says, in the repair warning, where what was discarded comes from again. ``CacheError``
    naming it when it is refused."""
    if parent is not None:
        path = os.path.join(parent.path, os.path.basename(path))
    d = _core.own_directory(path, dir_fd=None if parent is None else parent.fd, rule=rule)
    shown = os.fspath(d.path)
    if d.found == "repaired" and _first_time(f"repaired:{shown}"):
        logger.warning(
            "xla_pcache: %s was this user's but writable by others (mode %o: an earlier "
            "release made it under umask 002); it is now mode 0700, and what it held (%d "
            "names) was discarded, since others could have written there%s",
            shown,
            d.mode or 0,
            d.discarded,
            f" ({refetched})" if refetched else "",
        )
    if d.open_root is not None and _first_time(f"named:{shown}"):
        logger.info(
            "xla_pcache: %s is writable by others (mode %o): it is left as it is, and this "
            "user's copies are kept in %s (mode 0700) beneath it",
            os.path.dirname(shown),
            d.open_root,
            shown,
        )
    return OwnDir(d.fd, shown, repaired=d.found == "repaired")


def pinned_path(fd: int, path: str) -> str:
    """A path to the directory ``fd`` refers to that no rename can redirect:
    ``/proc/self/fd/<fd>`` where the system has it (Linux), else ``path``. Valid while
    ``fd`` stays open."""
    proc = f"/proc/self/fd/{fd}"
    try:
        via, real = os.stat(proc), os.fstat(fd)
    except OSError:
        return path
    return proc if (via.st_dev, via.st_ino) == (real.st_dev, real.st_ino) else path


__all__ = ["OwnDir", "Rule", "open_own", "pinned_path"]
