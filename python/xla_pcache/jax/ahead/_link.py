"""The program's side of its compiler process (``_compiler``): started when the first record
is to be compiled, fed jobs in the plan's order a few at a time, read back, and killed.

One thread of the program's (a daemon: it only moves bytes, nothing of XLA runs on it)
starts the process and then serves its pipes until it ends: it writes the target and the
jobs, reads the frames back through ``_protocol.Reader`` (bounded: a serialized executable of
at most ``_compiler.MAX_EXECUTABLE_BYTES``; a reply for a key it was not given, a status it
does not know, anything that is not a frame, is the process lost), keeps the last lines of the
process's standard error for the one warning that says it was lost, and watches that a
process compiling burns CPU time (one that burned none for ``STALL_S`` while compiling is
stuck: lost). Starting it on that thread ties ``PR_SET_PDEATHSIG`` to a thread that lives
as long as the process may.

At most ``window`` jobs are with the process at a time (its thread count): the rest wait
here, in the plan's order, so a key JAX reaches before its turn is taken back (``cancel``)
and compiled by JAX at once, and what the process holds is only what it is compiling.

``close`` kills the process (SIGKILL: XLA cannot stop a compile, a killed process ends at
once) and reaps it; so does the end of the program's interpreter (the session closes at
exit), and the process dies with its parent otherwise. A forked child of the program keeps
nothing of it (its copies of the pipes are closed in the child).
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import math
import os
import selectors
import site
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from xla_pcache._text import package_logger, shown
from xla_pcache.jax.ahead import _fleet, _plan, _protocol, _target
from xla_pcache.jax.ahead._compiler import MAX_EXECUTABLE_BYTES, PARENT_VAR
from xla_pcache.jax.ahead._record import Target

logger = package_logger("xla_pcache.jax")

MODULE = "xla_pcache.jax.ahead._compiler"
# Seconds a process compiling may burn no CPU time before it is taken as stuck.
STALL_S = 10.0
# How long ``close`` waits for the killed process to be reaped.
REAP_S = 5.0
_STDERR_KEEP = 16 << 10
_POLL_S = 1.0
_MAX_COMPILE_S = 1e6


@dataclass
class Done:
    """What the process said of a job: its status (``_protocol.STATUSES``), why, the
    compile's seconds and, compiled, the serialized executable."""

    key: str
    status: str
    detail: str
    compile_s: float
    executable: bytes
    # Precompiling: the key JAX computes for it with the fleet's settings.
    stored_as: str | None = None


class Events(Protocol):
    """What the link tells its owner, on the link's thread."""

    def started(self, key: str) -> None: ...

    def done(self, done: Done) -> None: ...

    def lost(self, link: Link, why: str, keys: list[str]) -> None: ...

    def idle(self) -> None: ...


class Keyed(Events, Protocol):
    """Precompiling: whether a record keyed ``stored_as`` is to be compiled (False: its
    executable is present)."""

    def keyed(self, key: str, stored_as: str) -> bool: ...


_links: weakref.WeakSet[Link] = weakref.WeakSet()
_fork_registered = False
_links_lock = threading.Lock()


def _forget_after_fork() -> None:
    """In a forked child of the program: the process and its pipes are the parent's."""
    for link in list(_links):
        link.forget()


class Link:
    """One compiler process for ``target``, started on first ``submit``."""

    def __init__(
        self,
        target: Target,
        events: Events,
        *,
        threads: int,
        reserve: int,
        may_send: Callable[[], bool] = lambda: True,
        environment: dict[str, str | None] | None = None,
        precompile: dict[str, Any] | None = None,
    ) -> None:
        global _fork_registered
        self.target = target
        self._events = events
        self._threads = max(1, threads)
        self._reserve = max(0, reserve)
        self._may_send = may_send
        # Precompiling (``_precompile``): the process's environment changed so (None
        # removes a variable), and what its target frame says of the fleet.
        self._changes = dict(environment or {})
        self._precompile = precompile
        self._lock = threading.Lock()
        self._queue: list[tuple[int, int, str, bytes]] = []
        self._order = 0
        # Keys with the process: sent and not answered, and of those, compiling.
        self._sent: set[str] = set()
        self._started: set[str] = set()
        self._given: set[str] = set()
        self._out = bytearray()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._lost: str | None = None
        self._forked = False
        self._stderr: collections.deque[bytes] = collections.deque()
        self._stderr_bytes = 0
        self.ready: dict[str, Any] | None = None
        self.pid: int | None = None
        with _links_lock:
            _links.add(self)
            if not _fork_registered:
                _fork_registered = True
                os.register_at_fork(after_in_child=_forget_after_fork)

    # -------------------------------------------------------------- the owner's side

    def submit(self, key: str, record: bytes, place: int) -> bool:
        """Compile ``key`` from ``record`` in its turn (``place``: lower first). False when
        the process is lost or closed (nothing will be compiled)."""
        with self._lock:
            if self._closed or self._lost is not None or key in self._given:
                return False
            self._given.add(key)
            heapq.heappush(self._queue, (place, self._order, key, record))
            self._order += 1
            start = self._thread is None
            if start:
                self._thread = threading.Thread(
                    target=self._run, name="xla_pcache-compiler", daemon=True
                )
        if start:
            assert self._thread is not None
            try:
                self._thread.start()
            except RuntimeError as exc:  # the interpreter is shutting down
                self._lose(f"no thread to start it on ({exc})")
                return False
        else:
            self.wake()
        return True

    def cancel(self, key: str) -> str | None:
        """JAX reads ``key``: ``"compiling"`` when the process compiles it (wait for it);
        ``"taken back"`` when it was not started (JAX compiles it; whatever the process
        makes of it later is ignored); None when it is not the link's."""
        with self._lock:
            if key in self._started:
                return "compiling"
            for i, (_, _, queued, _) in enumerate(self._queue):
                if queued == key:
                    self._queue.pop(i)
                    heapq.heapify(self._queue)
                    return "taken back"
            if key in self._sent:
                self._sent.discard(key)
                self._out += _protocol.frame(_protocol.CANCEL, {"key": key})
            else:
                return None
        self.wake()
        return "taken back"

    def compiling(self, key: str) -> bool:
        with self._lock:
            return key in self._started

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def stderr_tail(self) -> str:
        with self._lock:
            text = b"".join(self._stderr).decode("utf-8", "replace")
        return shown(text[-2000:], keep="\n")

    def close(self) -> None:
        """Kill the process (if any) and reap it; idempotent."""
        with self._lock:
            if self._closed or self._forked:
                return
            self._closed = True
            proc = self._proc
        self._kill(proc)
        self.wake()

    def forget(self) -> None:
        """In a forked child: drop the parent's pipes, touch nothing else."""
        self._forked = True
        self._closed = True
        proc = self._proc
        fds = [self._wake_r, self._wake_w]
        if proc is not None:
            fds += [f.fileno() for f in (proc.stdin, proc.stdout, proc.stderr) if f is not None]
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -------------------------------------------------------------- the link's thread

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(_target.environment(self.target))
        env = _fleet.applied(env, self._changes)
        env["XLA_PCACHE_DISABLE"] = "1"
        env[PARENT_VAR] = str(os.getpid())
        # Where this process found the package and JAX, first, unless the interpreter finds
        # them there itself (a site directory ahead of the standard library would shadow it):
        # the child imports the same.
        sites = {os.path.realpath(p) for p in site.getsitepackages()}
        sites.add(os.path.realpath(site.getusersitepackages()))
        roots = []
        for name in ("xla_pcache", "jax"):
            module = sys.modules.get(name)
            where = getattr(module, "__file__", None)
            if where:
                root = os.path.dirname(os.path.dirname(os.path.abspath(where)))
                if os.path.realpath(root) not in sites:
                    roots.append(root)
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*roots, *rest]))
        return env

    def _spawn(self) -> subprocess.Popen[bytes]:
        if not sys.executable:
            raise OSError("this interpreter names no Python executable")
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._environment(),
            close_fds=True,
            start_new_session=True,
        )
        for f in (proc.stdin, proc.stdout, proc.stderr):
            assert f is not None
            os.set_blocking(f.fileno(), False)
        return proc

    def _run(self) -> None:
        try:
            proc = self._spawn()
        except Exception as exc:
            self._lose(f"it could not be started ({type(exc).__name__}: {exc})")
            return
        with self._lock:
            self._proc, self.pid = proc, proc.pid
            closed = self._closed
            header: dict[str, Any] = {
                "target": self.target.to_json(),
                "threads": self._threads,
                "reserve": self._reserve,
            }
            if self._precompile is not None:
                header["precompile"] = self._precompile
            self._out += _protocol.frame(_protocol.TARGET, header)
        if closed:
            self._kill(proc)
            return
        try:
            self._serve(proc)
        except Exception as exc:
            self._lose(f"{type(exc).__name__}: {exc}")
        finally:
            self._kill(proc)

    def _serve(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        reader = _protocol.Reader(_protocol.TO_PARENT, MAX_EXECUTABLE_BYTES)
        stdin, stdout, stderr = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        sel = selectors.DefaultSelector()
        sel.register(stdout, selectors.EVENT_READ, "out")
        sel.register(stderr, selectors.EVENT_READ, "err")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        writing = False
        cpu, cpu_at = _cpu_time(proc.pid), time.monotonic()
        try:
            while True:
                with self._lock:
                    if self._closed or self._lost is not None:
                        return
                    self._fill()
                    want = bool(self._out)
                    compiling = bool(self._started)
                if want != writing:
                    if want:
                        sel.register(stdin, selectors.EVENT_WRITE, "in")
                    else:
                        sel.unregister(stdin)
                    writing = want
                for key, _ in sel.select(_POLL_S):
                    if key.data == "out":
                        data = _read(stdout)
                        if data == b"":
                            self._lose(f"it ended (status {proc.wait()})")
                            return
                        for frame in reader.feed(data or b""):
                            self._frame(*frame)
                    elif key.data == "err":
                        err = _read(stderr)
                        if err == b"":
                            sel.unregister(stderr)
                        self._keep_stderr(err or b"")
                    elif key.data == "wake":
                        _read(self._wake_r)
                    elif key.data == "in":
                        self._write(stdin)
                # A compile burns CPU time: a process compiling that burned none is stuck.
                now_cpu, now = _cpu_time(proc.pid), time.monotonic()
                if not compiling or now_cpu is None or now_cpu != cpu:
                    cpu, cpu_at = now_cpu, now
                elif now - cpu_at > STALL_S:
                    self._lose(f"it compiled and burned no CPU time for {STALL_S:.0f} s")
                    return
        except _protocol.ProtocolError as exc:
            self._lose(f"it wrote what is not a reply ({exc})")
        finally:
            sel.close()

    def _fill(self) -> None:
        """Send jobs while fewer than the process's threads are with it (under the lock)."""
        while self._queue and len(self._sent) < self._threads and self._may_send():
            _, _, key, record = heapq.heappop(self._queue)
            self._sent.add(key)
            self._out += _protocol.frame(_protocol.JOB, {"key": key}, record)

    def _write(self, fd: int) -> None:
        with self._lock:
            if not self._out:
                return
            try:
                n = os.write(fd, self._out[: 1 << 20])
            except BlockingIOError:
                return
            except OSError as exc:
                raise _protocol.ProtocolError(f"its input is closed ({exc})") from None
            del self._out[:n]

    def _keep_stderr(self, data: bytes) -> None:
        if not data:
            return
        for line in data.splitlines():
            logger.debug("xla_pcache: compiler process: %s", line.decode("utf-8", "replace"))
        with self._lock:
            self._stderr.append(data)
            self._stderr_bytes += len(data)
            while self._stderr_bytes > _STDERR_KEEP and len(self._stderr) > 1:
                self._stderr_bytes -= len(self._stderr.popleft())

    def _frame(self, kind: bytes, header: dict[str, Any], payload: bytes) -> None:
        if kind == _protocol.READY:
            self.ready = {
                k: header.get(k) for k in ("platform", "platform_version", "devices", "flags")
            }
            return
        if kind == _protocol.FATAL:
            raise _protocol.ProtocolError(f"it could not make its client: {header.get('detail')}")
        key = header.get("key")
        if not isinstance(key, str):
            raise _protocol.ProtocolError("a reply without its key")
        with self._lock:
            if key not in self._given:
                raise _protocol.ProtocolError("a reply for a key it was not given")
            mine = key in self._sent
            if kind == _protocol.STARTED:
                if mine:
                    self._started.add(key)
                return
        if kind == _protocol.KEYED:
            self._keyed(key, header, mine)
            return
        with self._lock:
            self._sent.discard(key)
            self._started.discard(key)
            idle = not self._sent and not self._queue
        done = _done(key, header, payload)
        if mine:
            self._events.done(done)
        if idle:
            self._events.idle()

    def _keyed(self, key: str, header: dict[str, Any], mine: bool) -> None:
        stored_as = header.get("as")
        if self._precompile is None or not _plan.valid_key(stored_as):
            raise _protocol.ProtocolError("a key to store under where none was asked")
        events: Any = self._events
        go = bool(mine and events.keyed(key, stored_as))
        with self._lock:
            self._out += _protocol.frame(_protocol.GO if go else _protocol.CANCEL, {"key": key})

    def _lose(self, why: str) -> None:
        """The process is gone or not to be trusted: every key with it or waiting is
        handed back, once."""
        with self._lock:
            if self._lost is not None:
                return
            self._lost = why
            closed = self._closed
            keys = [k for _, _, k, _ in self._queue] + sorted(self._sent)
            self._queue.clear()
            self._sent.clear()
            self._started.clear()
            proc = self._proc
        self._kill(proc)
        if not closed:
            self._events.lost(self, why, keys)

    def _kill(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None or self._forked:
            return
        with contextlib.suppress(OSError):
            if proc.poll() is None:
                proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(REAP_S)


def _done(key: str, header: dict[str, Any], payload: bytes) -> Done:
    status, detail, secs = header.get("status"), header.get("detail"), header.get("compile_s")
    if status not in _protocol.STATUSES:
        raise _protocol.ProtocolError("a status it does not know")
    if not isinstance(detail, str) or len(detail) > 1000:
        raise _protocol.ProtocolError("a detail that is not a short text")
    if (
        isinstance(secs, bool)
        or not isinstance(secs, int | float)
        or not math.isfinite(secs)
        or not 0 <= secs < _MAX_COMPILE_S
    ):
        raise _protocol.ProtocolError("a compile time that is not one")
    if (status == _protocol.COMPILED) != bool(payload):
        raise _protocol.ProtocolError("an executable where none belongs, or none")
    stored_as = header.get("as")
    if stored_as is not None and not _plan.valid_key(stored_as):
        raise _protocol.ProtocolError("a key to store under that is not a JAX key")
    return Done(key, str(status), detail, float(secs), payload, stored_as)


def _read(fd: int) -> bytes | None:
    """What ``fd`` has: None when nothing now, empty at its end."""
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _cpu_time(pid: int) -> int | None:
    """The process's CPU time in clock ticks (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None
