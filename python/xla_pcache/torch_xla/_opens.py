"""Which files this process holds open (``/proc/self/fd``), and which files of a directory
were opened (inotify, Linux only): how the torch_xla adapter tells a file torch_xla finished
writing, and an entry of the pool torch_xla loaded, without any hook in torch_xla."""

from __future__ import annotations

import ctypes
import os
import stat
import struct
import sys
from typing import Any

_IN_OPEN = 0x20
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


def open_inodes() -> set[tuple[int, int]] | None:
    """(st_dev, st_ino) of every file this process holds open, or None without /proc.

    torch_xla writes a cache file through a stream it opens just before serializing and
    closes when the write is done, in this process; so a file of our view that no
    descriptor of ours refers to has been closed by its writer and is complete.
    """
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    out: set[tuple[int, int]] = set()
    for fd in fds:
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, or one closed meanwhile
        if stat.S_ISREG(st.st_mode):
            out.add((st.st_dev, st.st_ino))
    return out


def watch_opens(directory: str) -> int | None:
    """An inotify descriptor reporting each open of a file in ``directory`` (read with
    ``opened_names``), or None where that cannot be had."""
    if _LIBC is None:
        return None
    try:
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        if _LIBC.inotify_add_watch(fd, os.fsencode(directory), _IN_OPEN) < 0:
            os.close(fd)
            return None
    except (AttributeError, OSError):
        return None
    return int(fd)


def opened_names(fd: int) -> set[str]:
    """Names of the files opened since the last call, from ``watch_opens``' descriptor."""
    out: set[str] = set()
    while True:
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            break
        except OSError:
            break
        if not buf:
            break
        pos = 0
        while pos + 16 <= len(buf):
            _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, pos)
            raw = buf[pos + 16 : pos + 16 + length].split(b"\0", 1)[0]
            pos += 16 + length
            out.add(os.fsdecode(raw))
    return out
