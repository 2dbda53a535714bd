"""Which entries of a bucket this host used and wrote, recorded cheaply for the bucket's
pruning (``upkeep.py``), and the writers' own pruning.

A hit costs a dictionary look-up: each process notes an entry at most once per interval.
Every interval (and at exit) the process writes what it noted, with the entries and bytes it
wrote to the bucket since, to a spool file in its host-local store
(``<store>/bucket-records/``); the process that then holds the host's upload lock, at most
once per interval (and every process at exit), uploads everything the host's processes
spooled as one record object and removes those files. So a host writes one small object
per interval in which its processes used the bucket, whatever their number, and none when
idle.

A host that wrote entries then checks the bucket's budget, at most once per interval: one
GET of the budget, one of the last prune's totals and one listing of the records (which
carry what each host wrote since); when that estimate is past the budget it prunes, under
the bucket's prune lease (one host at a time). That prune runs in the program's process,
within ``upkeep.WRITER_LIMITS``: at most 250,000 entries held (in a bucket with more it
prunes among those it listed and says it was cut short, for cron to finish) and two
minutes, after which it stops where it is, so that what it costs the program does not
depend on what anyone planted in the bucket (docs/remote.md says why in the process rather
than in a child). ``XLA_PCACHE_BUCKET_AUTO_PRUNE=0`` leaves
pruning to ``xla-pcache prune`` (cron).

The spool directory is opened beneath the store's root without following links, and every
file in it is read as untrusted (bounded, regular files only, names checked). Nothing here
raises into the program: a failure is logged once and the record waits for the next try.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from xla_pcache._names import entry_name_or_none
from xla_pcache._text import package_logger
from xla_pcache.bucket import upkeep
from xla_pcache.tiers import objstore

log = package_logger("xla_pcache")

SPOOL_DIR = "bucket-records"
LOCK_NAME = "upload.lock"
# Touched by each upload: when this host last uploaded.
LAST_UPLOAD = "last-upload"
# Spool files of this process: "s-<pid>-<random>"; a temp name starts with ".".
_SPOOL_PREFIX = "s-"
_MAX_SPOOL = 16 << 20
# At exit, how long a process waits for another of its host that is uploading.
EXIT_WAIT_S = 5.0
# With a max age only, writers prune when the last prune is older than this; and when the
# last prune was cut short and the estimate is within the budget (what it could not see may
# be seen again once the keys that hid it are gone).
AGE_PRUNE_EVERY_S = 86400.0
# Entry names an uploaded record holds at most (about 20 bytes each, gzip: 2 MB, well within
# a record's cap, ``reader.MAX_USE_RECORD``); more go in further records.
RECORD_NAMES = 100_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UseRecorder:
    """Records this host's uses of a bucket's entries, and prunes it from writers.

    ``root_fd``: a descriptor of the host-local store's directory (``Store.root_fd``: the
    spool lives beneath the directory the store works in), the recorder's from then on,
    closed by ``close`` (the store closes first: its last writes count in the record);
    ``open_bucket``: makes the bucket's ``upkeep.Bucket`` (on first upload);
    ``written``: this process's cumulative (entries, bytes) written to the bucket;
    ``interval``: seconds between uploads, and between two notes of one entry."""

    def __init__(
        self,
        root_fd: int,
        open_bucket: Callable[[], upkeep.Bucket],
        written: Callable[[], tuple[int, int]],
        *,
        interval: float,
        auto_prune: bool,
    ) -> None:
        self._root_fd = root_fd
        self._root_lock = threading.Lock()
        self.interval = interval
        self.auto_prune = auto_prune
        self._open_bucket = open_bucket
        self._bucket: upkeep.Bucket | None = None
        self._written = written
        self._spooled = (0, 0)
        self._noted: dict[Any, float] = {}
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # The process whose client this is: a forked child spools, never uploads (obstore's
        # runtime does not survive fork: a request there would wait for ever).
        self._origin = os.getpid()
        self._warned: set[str] = set()
        self._checked_at = -float("inf")
        self._used = False
        self._closed = False
        self.uploads = 0
        self.prunes = 0
        # Of them, prunes whose listing of entries was cut short.
        self.prunes_cut_short = 0
        # Before the tier's own exit hook (a tier opens after its store), so run after it:
        # the last record then counts every write the tier finished.
        atexit.register(self.close)

    # ---------------------------------------------------------------- on a hit
    def note(self, key: Any, names: Callable[[], Iterable[str]]) -> None:
        """A hit of ``key``; ``names`` gives its entry names in the bucket (called only when
        the key was not noted within the interval)."""
        now = time.monotonic()
        last = self._noted.get(key)
        if last is not None and now - last < self.interval:
            return
        with self._lock:
            if len(self._noted) > 1 << 20:
                self._noted.clear()
            self._noted[key] = now
            self._pending.update(names())
        self._start()

    def wrote(self, names: Iterable[str] = ()) -> None:
        """This process wrote ``names`` (entry names) to the bucket: its record names them
        (a put is a use), so that every entry a host wrote is named somewhere for a prune
        whose listing cannot see it, and counts the write; it goes out with the next
        upload."""
        with self._lock:
            self._pending.update(names)
        self._start()

    def _start(self) -> None:
        self._used = True
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                # A forked child: the parent's thread is not here (the client is not
                # usable here either: the child spools, another process uploads).
                self._pid, self._thread = os.getpid(), None
                self._stop = threading.Event()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="xla_pcache-bucket-records", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def close(self) -> None:
        """The last record of this process: spooled, and uploaded unless another process
        of the host is uploading for longer than ``EXIT_WAIT_S``."""
        self._stop.set()
        atexit.unregister(self.close)
        if self._used and not self._closed:
            self._closed = True
            self.flush(final=True)
        with self._root_lock:
            root, self._root_fd = self._root_fd, -1
        if root >= 0:
            with contextlib.suppress(OSError):
                os.close(root)

    # ---------------------------------------------------------------- the spool
    def _warn(self, what: str, e: BaseException) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(
                "xla_pcache: bucket records: %s failed (%s: %s); retried at the next interval",
                what,
                type(e).__name__,
                objstore.scrub(str(e)),
            )

    def _spool_fd(self) -> int:
        with self._root_lock:
            if self._root_fd < 0:
                raise OSError(errno.EBADF, "the recorder is closed")
            with contextlib.suppress(FileExistsError):
                os.mkdir(SPOOL_DIR, 0o700, dir_fd=self._root_fd)
            return os.open(SPOOL_DIR, _DIR_FLAGS, dir_fd=self._root_fd)

    def flush(self, final: bool = False) -> None:
        """Spools what this process noted and wrote since the last call, then uploads the
        host's spool if it is this process's turn."""
        with self._lock:
            names, self._pending = self._pending, set()
        try:
            puts, put_bytes = self._written()
        except Exception:
            puts, put_bytes = self._spooled
        new = (puts - self._spooled[0], put_bytes - self._spooled[1])
        if not names and new == (0, 0) and not final:
            return
        try:
            spool = self._spool_fd()
        except OSError as e:
            self._warn("opening the spool", e)
            with self._lock:
                self._pending |= names
            return
        try:
            if names or new != (0, 0):
                self._write_spool(spool, names, new)
                self._spooled = (puts, put_bytes)
            self._upload(spool, final)
        except OSError as e:
            self._warn("spooling", e)
        finally:
            os.close(spool)

    def _write_spool(self, spool: int, names: set[str], new: tuple[int, int]) -> None:
        body = f"# {new[0]} {new[1]}\n" + "".join(f"{n}\n" for n in sorted(names))
        final = f"{_SPOOL_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        tmp = "." + final
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=spool)
        try:
            os.write(fd, body.encode())
        finally:
            os.close(fd)
        os.rename(tmp, final, src_dir_fd=spool, dst_dir_fd=spool)

    def _lock_host(self, spool: int, final: bool) -> int | None:
        fd = os.open(
            LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=spool
        )
        deadline = time.monotonic() + (EXIT_WAIT_S if final else 0.0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    os.close(fd)
                    return None
            time.sleep(0.05)

    def _upload(self, spool: int, final: bool) -> None:
        lock = self._lock_host(spool, final)
        if lock is None:
            return  # another process of this host uploads, or will
        try:
            if not final and not self._due(spool):
                return
            if os.getpid() != self._origin:
                return  # a forked child: its parent, or the host's next process, uploads
            files, names, puts, put_bytes = self._gather(spool)
            if not files:
                return
            bucket = self._bucket_client()
            if names or puts:
                # At most RECORD_NAMES names an object, within a record's cap; what the host
                # wrote counted in the first.
                ordered = sorted(names)
                for i in range(0, max(1, len(ordered)), RECORD_NAMES):
                    counts = (puts, put_bytes) if i == 0 else (0, 0)
                    bucket.put(
                        upkeep.new_use_record_name(*counts),
                        upkeep.use_record_body(ordered[i : i + RECORD_NAMES]),
                    )
                    self.uploads += 1
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=spool)
            self._mark_uploaded(spool)
            if puts and self.auto_prune:
                self._maybe_prune(final)
        except Exception as e:
            self._warn("uploading the host's record", e)
        finally:
            os.close(lock)

    def _due(self, spool: int) -> bool:
        """Whether this host's last upload (the mtime of ``LAST_UPLOAD``) is an interval old."""
        try:
            st = os.stat(LAST_UPLOAD, dir_fd=spool, follow_symlinks=False)
        except FileNotFoundError:
            return True
        return time.time() - st.st_mtime >= self.interval * 0.9

    def _mark_uploaded(self, spool: int) -> None:
        fd = os.open(
            LAST_UPLOAD,
            os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=spool,
        )
        try:
            os.utime(fd)
        finally:
            os.close(fd)

    def _gather(self, spool: int) -> tuple[list[str], set[str], int, int]:
        files: list[str] = []
        names: set[str] = set()
        puts = put_bytes = 0
        for name in os.listdir(spool):
            if not name.startswith(_SPOOL_PREFIX):
                if name.startswith(".") and self._old(spool, name):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=spool)  # a temp file a killed process left
                continue
            data = self._read(spool, name)
            files.append(name)
            if data is None:
                continue
            lines = data.split(b"\n")
            head = lines[0].split()
            if len(head) == 3 and head[0] == b"#" and head[1].isdigit() and head[2].isdigit():
                puts += int(head[1])
                put_bytes += int(head[2])
            for line in lines[1:]:
                checked = entry_name_or_none(line.decode("ascii", "replace"))
                if checked is not None:
                    names.add(checked)
        return files, names, puts, put_bytes

    def _old(self, spool: int, name: str) -> bool:
        try:
            return time.time() - os.stat(name, dir_fd=spool, follow_symlinks=False).st_mtime > 3600
        except OSError:
            return False

    def _read(self, spool: int, name: str) -> bytes | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=spool)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_SPOOL:
                return None
            return os.read(fd, st.st_size)
        finally:
            os.close(fd)

    def _bucket_client(self) -> upkeep.Bucket:
        if self._bucket is None:
            self._bucket = self._open_bucket()
        return self._bucket

    # ---------------------------------------------------------------- writers prune
    def _maybe_prune(self, final: bool) -> None:
        """After this host uploaded a record of writes: prune the bucket if it is past its
        budget (or, with a max age only, not pruned for a day), at most once an interval."""
        now = time.monotonic()
        if now - self._checked_at < self.interval * 0.9 and not final:
            return
        self._checked_at = now
        bucket = self._bucket_client()
        budget = bucket.read_stored_budget()
        if budget.max_size is None and budget.max_age_s is None:
            return
        estimate = bucket.estimate()
        last = estimate.last_prune
        over = False
        if budget.max_size is not None:
            # An estimate that cannot tell the size: only a prune can.
            told = estimate.known or estimate.lower
            over = estimate.bytes > budget.max_size if told else True
            if estimate.lower and not over:
                # The last prune was cut short (keys the client refuses hid entries from it)
                # and what can be seen is within the budget: once a day a prune looks
                # again, in case the keys are gone.
                over = last is None or time.time() - last > AGE_PRUNE_EVERY_S
        if not estimate.known and last is not None and time.time() - last < self.interval:
            # The size cannot be told, or only what can be seen of it (the last prune was
            # cut short, or the records cannot all be listed), and a prune ran less than an
            # interval ago (another host's, or this one's): one an interval does what can be
            # done, not every writer host of the fleet one after another.
            over = False
        aged = False
        if budget.max_age_s is not None and not final:
            state = bucket.read_state()
            aged = state is None or time.time() - state["time"] > AGE_PRUNE_EVERY_S
        if not (over or aged):
            return
        try:
            report = bucket.prune(limits=upkeep.WRITER_LIMITS)
        except upkeep.BlockedError as e:
            bucket.reader.warn_once("blocked", f"not pruning here: {e}")
            return
        except upkeep.BusyError as e:
            log.debug("xla_pcache: bucket %s: not pruning here: %s", bucket.url, e)
            return
        if report.busy:
            return  # a limit stopped it (warned once by the bucket)
        if report.cut_short:
            # It removed what the budget required among the entries it listed (warned once
            # by the bucket's reader); the bucket's state says so, so the next check prunes
            # again.
            self.prunes_cut_short += 1
        self.prunes += 1
        log.info(
            "xla_pcache: pruned the bucket %s: removed %d entries (%d bytes), %d left "
            "(%d bytes); %d requests in %.1f s",
            bucket.url,
            report.removed,
            report.removed_bytes,
            report.entries,
            report.bytes,
            sum(report.requests.values()),
            report.seconds,
        )
