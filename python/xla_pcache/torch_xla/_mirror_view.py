"""A process's view: the directory torch_xla reads and writes, made before torch_xla starts
with hard links to the host's pool, into which torch_xla writes what it compiles. A lock
file held for the life of the process tells the host's other processes it is alive, and an
inotify watch which linked files torch_xla opened (the hits the pool served).

Why a view per process rather than pointing torch_xla at the pool: torch_xla checks that a
file is absent and then opens it with truncation, with no lock between the two. In a
directory several processes share, two of them compiling the same graph interleave their
writes, and a reader can load a half-written file. In a private view only this process's
torch_xla creates files, so a new inode there is written by exactly one writer, ours to
inspect, and never one the pool or another process uses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import stat
import time

from xla_pcache._owndir import OwnDir, pinned_path
from xla_pcache._text import package_logger
from xla_pcache.torch_xla._keys import is_torch_xla_name
from xla_pcache.torch_xla._mirror_counters import Counters
from xla_pcache.torch_xla._mirror_dirs import O_DIR, VIEWS, HostDirs
from xla_pcache.torch_xla._opens import opened_names, watch_opens

logger = package_logger("xla_pcache.torch_xla")

# A view whose lock file is younger than this is left alone by sweepers even if its lock
# is free: its owner may be between creating the file and locking it.
VIEW_GRACE_S = 60.0


class View:
    """This process's view beneath the views' directory of ``dirs``, once ``open``."""

    def __init__(self, dirs: HostDirs, counters: Counters) -> None:
        self.dirs = dirs
        self.counters = counters
        self.path: str | None = None
        # The views' directory and this process's view, open while the view lives.
        self._views: OwnDir | None = None
        self.fd: int | None = None
        self._handed_out = False
        self._lock_fd: int | None = None
        self._watch_fd: int | None = None
        # name -> (dev, ino) of the pool file linked into the view at open: not torch_xla's.
        self.linked: dict[str, tuple[int, int]] = {}

    def open(self) -> str:
        """Create this process's torch_xla directory, linked to every pool file; its path
        (``torch_path`` is the one to give torch_xla)."""
        self.dirs.check()
        views = self.dirs.sub(VIEWS)
        try:
            self._sweep(views)
            ident = f"{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(
                f"{ident}.lock",
                os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=views.fd,
            )
            # Where locks fail the view is still ours; sweepers just cannot tell it is alive.
            with contextlib.suppress(OSError):
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock_fd = fd
            os.mkdir(ident, 0o700, dir_fd=views.fd)
            self.fd = os.open(ident, O_DIR, dir_fd=views.fd)
        except BaseException:
            views.close()
            raise
        self._views = views
        self.path = os.path.join(views.path, ident)
        self._link_pool()
        self._watch()
        return self.path

    def torch_path(self) -> str | None:
        """The path to give torch_xla for the view: ``/proc/self/fd/<n>`` of the handle it
        was made through, so that no directory renamed into the local root's place later
        is ever read or written (the path itself where there is no ``/proc``). The handle
        then stays open for the life of the process (``close`` removes the view but keeps
        it): torch_xla keeps the path, and a number closed could come back for another
        directory."""
        if self.fd is None or self.path is None:
            return None
        self._handed_out = True
        return pinned_path(self.fd, self.path)

    def _link_pool(self) -> None:
        """Links every copy of the pools this process may use now (``HostDirs.pools``: the
        keys it trusts at this moment) into its view; the first pool holding a name wins."""
        assert self.fd is not None
        for rel in self.dirs.pool_rels():
            with self.dirs.sub(rel) as pool, os.scandir(pool.fd) as it:
                for e in it:
                    if not is_torch_xla_name(e.name) or e.name in self.linked:
                        continue
                    self._link_one(e, pool)

    def _link_one(self, e: os.DirEntry[str], pool: OwnDir) -> None:
        view = self.fd
        assert view is not None
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                # Not a copy this user made (the pool is its own): never torch_xla's to load.
                self.counters.errors += 1
                logger.debug(
                    "xla_pcache.torch_xla: %s is not this user's copy",
                    os.path.join(pool.path, e.name),
                )
                return
            os.link(e.name, e.name, src_dir_fd=pool.fd, dst_dir_fd=view, follow_symlinks=False)
        except FileNotFoundError:
            return  # dropped from the pool meanwhile
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            self._copy_in(e.name, pool)  # no hard links here: a private copy
        st = os.stat(e.name, dir_fd=view, follow_symlinks=False)
        self.linked[e.name] = (st.st_dev, st.st_ino)
        self.counters.linked += 1

    def _copy_in(self, name: str, pool: OwnDir) -> None:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pool.fd)
        try:
            dst = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=self.fd,
            )
            with open(src, "rb", closefd=False) as fin, open(dst, "wb") as fout:
                shutil.copyfileobj(fin, fout)
        finally:
            os.close(src)

    def adopt(self, other: View) -> None:
        """Take over ``other``'s view (the directory torch_xla already reads) for this
        view's pools: drop the links ``other`` made, link this pool in. Only before the
        first execution, when every file of the view is one of ``other``'s links."""
        assert other.path is not None and self.path is None
        other._unwatch()
        self.path, self._lock_fd = other.path, other._lock_fd
        self._views, self.fd = other._views, other.fd
        self._handed_out = other._handed_out
        other.path, other._lock_fd, other._views, other.fd = None, None, None, None
        other.dirs.close()
        assert self.fd is not None
        for name, ident in other.linked.items():
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == ident:
                    os.unlink(name, dir_fd=self.fd)
        other.linked.clear()
        self._link_pool()
        self._watch()

    # -- which pool files torch_xla opened: hits the store did not serve ---------------

    def _watch(self) -> None:
        """Watch the view for opens: torch_xla opens a linked file only to load it, so the
        names it opens are the store's entries it used, to be counted as hits (the pool
        served them, the store never saw a read). Linux only; elsewhere nothing is counted."""
        if self.path is not None and self.fd is not None:
            self._watch_fd = watch_opens(pinned_path(self.fd, self.path))

    def _unwatch(self) -> None:
        if self._watch_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._watch_fd)
            self._watch_fd = None

    def written_names(self) -> set[str]:
        """Names of the files torch_xla wrote into the view itself (graphs it compiled)."""
        if self.fd is None:
            return set()
        out: set[str] = set()
        with contextlib.suppress(OSError), os.scandir(self.fd) as it:
            for e in it:
                if not is_torch_xla_name(e.name):
                    continue
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    if self.linked.get(e.name) != (st.st_dev, st.st_ino):
                        out.add(e.name)
        return out

    def opened_links(self) -> set[str]:
        """Names of linked (store) files opened since the last call."""
        if self._watch_fd is None:
            return set()
        return {name for name in opened_names(self._watch_fd) if name in self.linked}

    def _sweep(self, views: OwnDir) -> None:
        """Remove views whose owner died (its lock is free). Their new files are dropped,
        not published: a process killed mid-write leaves a file nobody can vouch for."""
        try:
            names = os.listdir(views.fd)
        except OSError:
            return
        now = time.time()
        for name in names:
            if not name.endswith(".lock"):
                continue
            try:
                st = os.stat(name, dir_fd=views.fd, follow_symlinks=False)
                if now - st.st_mtime < VIEW_GRACE_S:
                    continue
                fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=views.fd)
            except OSError:
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # alive, or locks do not work here
            try:
                shutil.rmtree(name[: -len(".lock")], ignore_errors=True, dir_fd=views.fd)
                os.unlink(name, dir_fd=views.fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def close(self) -> None:
        """Remove the view (after the last publish)."""
        if self.path is not None and self._views is not None:
            name = os.path.basename(self.path)
            shutil.rmtree(name, ignore_errors=True, dir_fd=self._views.fd)
            with contextlib.suppress(OSError):
                os.unlink(f"{name}.lock", dir_fd=self._views.fd)
        self.path = None
        if self._views is not None:
            self._views.close()
            self._views = None
        if self.fd is not None and not self._handed_out:
            # One torch_xla was given stays open (``torch_path``), on a removed directory.
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.fd = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        self._unwatch()
        self.dirs.close()
