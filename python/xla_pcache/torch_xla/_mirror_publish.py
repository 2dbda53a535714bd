"""View -> store: each file torch_xla wrote into the view published once complete (no
descriptor of this process holds it, or, without ``/proc``, it stopped changing), with the
producer's metadata and the compile time torch_xla measured, then linked into the host's
pool for the host's later processes."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from xla_pcache._text import package_logger
from xla_pcache.builds import Build
from xla_pcache.misslog import META_COMPILE_TIME
from xla_pcache.store import Store
from xla_pcache.torch_xla._keys import is_torch_xla_name, store_key
from xla_pcache.torch_xla._mirror_counters import Counters
from xla_pcache.torch_xla._mirror_dirs import POOL, HostDirs
from xla_pcache.torch_xla._mirror_view import View
from xla_pcache.torch_xla._opens import open_inodes

logger = package_logger("xla_pcache.torch_xla")


@dataclass
class _Seen:
    """A new file of the view as last observed, for the no-/proc fallback."""

    size: int
    mtime_ns: int
    ino: int


class Publisher:
    """Publishes into ``store`` what torch_xla wrote into ``view``, under the keys of
    ``build``. ``meta`` is called at publish time for the producer metadata;
    ``compile_time`` gives the compile time (seconds) torch_xla measured for a view file
    just written, or None: recorded with the entry so that its hits count the compile time
    they saved; ``on_publish`` is called with the store key of each entry published (a
    graph this process missed)."""

    def __init__(
        self,
        store: Store,
        view: View,
        dirs: HostDirs,
        counters: Counters,
        *,
        build: Build | None,
        meta: Callable[[], dict[str, str]],
        compile_time: Callable[[os.stat_result], float | None] | None,
        on_publish: Callable[[str], None] | None,
    ) -> None:
        self.store = store
        self.view = view
        self.dirs = dirs
        self.counters = counters
        self.build = build
        self.meta = meta
        self.compile_time = compile_time
        self.on_publish = on_publish
        # inodes of view files already handled (published, or found already stored).
        self._handled: set[tuple[int, int]] = set()
        self._seen: dict[str, _Seen] = {}

    def publish(self, *, final: bool = False) -> None:
        """Publish every complete file torch_xla wrote into the view since the last call."""
        if self.view.fd is None or self.store.read_only:
            return
        try:
            self._publish(final)
        except Exception as exc:
            self.counters.warn("publishing torch_xla's new cache files", exc)

    def _candidates(self) -> Iterable[tuple[str, os.stat_result]]:
        assert self.view.fd is not None
        with os.scandir(self.view.fd) as it:
            for e in it:
                if not is_torch_xla_name(e.name):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                ident = (st.st_dev, st.st_ino)
                if not stat.S_ISREG(st.st_mode) or ident in self._handled:
                    continue
                if self.view.linked.get(e.name) == ident:
                    continue  # the store's own bytes, linked in at start
                yield e.name, st

    def _publish(self, final: bool) -> None:
        candidates = list(self._candidates())
        if not candidates:
            return
        busy = open_inodes()
        if busy is None and final:
            # Without /proc, completeness rests on the file not changing; at exit, look
            # twice a moment apart rather than waiting for the next poll.
            for name, st in candidates:
                self._settled(name, st)
            time.sleep(0.5)
            candidates = list(self._candidates())
        meta: dict[str, str] | None = None
        for name, st in candidates:
            ident = (st.st_dev, st.st_ino)
            if st.st_size == 0 or (busy is not None and ident in busy):
                self.counters.pending += 1
                continue  # torch_xla still holds it open: the next pass takes it
            if busy is None and not self._settled(name, st):
                self.counters.pending += 1
                continue
            key = store_key(name, self.build)
            if key in self.store:
                # First writer wins; on backends that cannot load, torch_xla rewrites every
                # entry it was given, and those rewrites land here.
                self._handled.add(ident)
                self.counters.already_stored += 1
                continue
            data = self._read_whole(name, st)
            if data is None:
                continue
            if meta is None:
                meta = self.meta()
            self._handled.add(ident)
            entry_meta = dict(meta, torch_xla_name=name)
            secs = self.compile_time(st) if self.compile_time is not None else None
            if secs is not None:
                entry_meta[META_COMPILE_TIME] = f"{secs:.6f}"
            if self.store.put(key, data, meta=entry_meta):
                self.counters.published += 1
                self._share_with_host(name)
                if self.on_publish is not None:
                    self.on_publish(key)
            elif key in self.store:
                self.counters.already_stored += 1
            else:
                self.counters.errors += 1
                logger.debug("xla_pcache.torch_xla: the store did not take %s", name)

    def _settled(self, name: str, st: os.stat_result) -> bool:
        now = _Seen(st.st_size, st.st_mtime_ns, st.st_ino)
        before = self._seen.get(name)
        self._seen[name] = now
        return before == now

    def _read_whole(self, name: str, st: os.stat_result) -> bytes | None:
        """The view file's bytes if it is the inode we judged complete and did not change
        while we read it; None otherwise (looked at again on the next pass)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.view.fd)
        except FileNotFoundError:
            return None
        try:
            before = os.fstat(fd)
            if (before.st_dev, before.st_ino) != (st.st_dev, st.st_ino):
                return None  # torch_xla replaced it since the listing
            chunks = []
            while chunk := os.read(fd, 1 << 24):
                chunks.append(chunk)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if (
            len(data) != before.st_size
            or after.st_size != before.st_size
            or after.st_mtime_ns != before.st_mtime_ns
        ):
            self.counters.pending += 1
            return None
        return data

    def _share_with_host(self, name: str) -> None:
        """Link a file just published into the pool, so later processes of this host get
        it without reading the store. The inode is final: torch_xla never writes an
        existing file again, it only creates new ones. Only into the unverified pool: a
        process with trusted keys leaves its pools to copies the store verified (the next
        refresh makes one)."""
        assert self.view.fd is not None
        if self.store.trusted_keys is not None:
            return
        with self.dirs.sub(POOL) as pool, contextlib.suppress(FileExistsError, FileNotFoundError):
            try:
                os.link(name, name, src_dir_fd=self.view.fd, dst_dir_fd=pool.fd)
            except OSError as exc:
                if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    return  # the next refresh copies it from the store
                raise
