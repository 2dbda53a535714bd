"""Compiling ahead, the program's side: what the session of loading ahead finds absent from
the store is compiled from its module record in a compiler process (``_link``,
``_compiler``), and comes back as a serialized executable that the session loads and serves
as it serves one read from the store.

``submit`` (on a loading thread, for a planned key whose executable the store does not have)
reads the key's record through the store (its one gate: checksums, signatures, trust; a
record a trusting store would not serve is never seen), decodes it strictly, checks that it
is of a platform compiled ahead (CPU, TPU) and of the plan's compile options and devices, and
hands its bytes to the compiler process of its target, started then (before JAX's backend is
up: the first program JAX asks for is compiled too). The process compiles only what JAX's own
key gives back as the key (``_compiler``); what it says of each key comes back here: compiled
(to the session, ``Owner.compiled``), or refused (its key is not the key, it cannot be
decoded, it is over its bounds) or failed, each counted, one warning a kind, the key compiled
by JAX as before (``Owner.not_compiled``); a process lost (it could not start, ended, stuck,
or wrote what is not a reply) hands back every key it had, with one warning.

The session serves a compiled executable at JAX's read of its key, with the checks of a load
(options, devices, backend) and puts it into the store under the key (``entry_value``): JAX's own
value (the serialized executable after its compile time, compressed as JAX compresses), with
the compile time, only where JAX itself would have put it (process 0, its thresholds), never
in a read-only process; the store signs it when it signs. The program's own compiles record
what a later run compiles from (``_recording.Recorder``).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import threading
from collections.abc import Iterable
from typing import Any, Protocol

from xla_pcache._text import FirstWarning, package_logger
from xla_pcache.jax.ahead import _plan, _protocol, _target
from xla_pcache.jax.ahead._link import Done, Link
from xla_pcache.jax.ahead._record import RecordError, Target, decode, record_key
from xla_pcache.jax.ahead._recording import Recorder
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")

# Records touched at the end, at most (the keys a plan's variant holds).
MAX_TOUCHED = _plan.MAX_ENTRIES
# Compiler processes alive at once (one per target; a session has one target once its
# backend is up).
MAX_LINKS = 2


class Owner(Protocol):
    """What compiling ahead tells the session, from its compiler process's thread."""

    def compiled(self, key: str, serialized: bytes, compile_s: float) -> None: ...

    def not_compiled(self, keys: list[str]) -> None: ...

    def compile_idle(self) -> None: ...

    def may_compile(self) -> bool: ...


class CompileAhead:
    """Compiling ahead for one session of loading ahead."""

    def __init__(
        self,
        store: Store,
        owner: Owner,
        *,
        threads: int,
        reserve: int,
        writes: bool,
        meta: dict[str, str] | None = None,
    ) -> None:
        self._store = store
        self._owner = owner
        self._threads = max(1, threads)
        self._reserve = max(0, reserve)
        self._lock = threading.Lock()
        self._links: dict[Target, Link] = {}
        self._platform: str | None = None
        self._closed = False
        # Keys handed to a compiler process, by link; what became of the records refused.
        self._given: dict[str, Link] = {}
        self._refused: dict[str, str] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._warned: set[str] = set()
        self._lost: list[str] = []
        self._skipped_platforms: set[str] = set()
        self._warn = FirstWarning(
            logger, "compiling {key} ahead failed ({what}); it is compiled as before"
        )
        # A read-only store (or one told so) records nothing and puts nothing.
        self.writes = writes and not store.read_only
        self.recorder = Recorder(store, meta or {}, self.was_refused) if self.writes else None

    # -------------------------------------------------------------- from the session

    def submit(self, entry: _plan.Entry, place: int, options_digest: bytes) -> bool:
        """``entry``'s executable is absent from the store: compile it ahead from its record
        (``place``: its place in the plan's order; ``options_digest``: the plan's compile
        options as JAX's key sees them). False when it is not compiled ahead."""
        key = entry.key
        try:
            blob = self._store.get(record_key(key), count=False)
        except Exception as exc:
            self._warn("reading its record", key, exc)
            return False
        if blob is None:
            return False  # never recorded, or not one this store would serve
        data = bytes(blob)
        del blob
        try:
            record = decode(data)
        except RecordError as exc:
            self._refuse(key, _protocol.UNDECODABLE, str(exc))
            return False
        target = record.target
        if target.platform not in _target.COMPILED_AHEAD_PLATFORMS:
            self._skip_platform(target.platform)
            return False
        # (A plan of JAX before 0.7 names no devices: they are in the options.)
        if (entry.devices and record.devices != entry.devices) or (
            hashlib.sha256(record.options).digest() != options_digest
            and record.options != options_digest
        ):
            self._refuse(key, _protocol.MISMATCH, "its options or devices are not the plan's")
            return False
        with self._lock:
            if self._closed or (self._platform is not None and target.platform != self._platform):
                return False
            link = self._links.get(target)
            if link is None:
                if len(self._links) >= MAX_LINKS:
                    return False
                link = self._links[target] = Link(
                    target,
                    self,
                    threads=self._threads,
                    reserve=self._reserve,
                    may_send=self._owner.may_compile,
                )
            self._given[key] = link
        return link.submit(key, data, place)

    def cancel(self, key: str) -> str | None:
        """JAX reads ``key``: ``"compiling"`` (wait for it), ``"taken back"`` (JAX compiles
        it) or None (not given)."""
        with self._lock:
            link = self._given.get(key)
        return None if link is None else link.cancel(key)

    def wake(self) -> None:
        """Memory was freed: the compiler processes may be sent more."""
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.wake()

    def backend_up(self, platform: str) -> None:
        """The backend is up: compiler processes of other platforms end."""
        with self._lock:
            self._platform = platform
            gone = [t for t in self._links if t.platform != platform]
            links = [self._links.pop(t) for t in gone]
        for link in links:
            link.close()

    def was_refused(self, key: str) -> bool:
        """Whether this run refused the record stored under ``key`` (the recorder replaces
        it)."""
        with self._lock:
            return self._refused.get(key) in (
                _protocol.MISMATCH,
                _protocol.UNDECODABLE,
                _protocol.OVER_BOUNDS,
            )

    def close(self) -> None:
        """Kill the compiler processes (nothing of a compile runs in this process: the exit
        waits for none). Idempotent."""
        with self._lock:
            self._closed = True
            links = list(self._links.values())
        for link in links:
            link.close()

    def touch(self, used: Iterable[str]) -> None:
        """Record a use of the records of the keys the run ``used`` (after its hits: a record
        is then younger than its executable, and is evicted after it); a read-only store
        records none."""
        if not self.writes:
            return
        try:
            for key in itertools.islice(used, MAX_TOUCHED):
                self._store.touch(record_key(key))
            self._store.flush()
        except Exception as exc:
            logger.debug("xla_pcache: touching the module records failed: %s", exc)

    # -------------------------------------------------------------- from a compiler process

    def started(self, key: str) -> None:
        """Nothing: whether a key is compiling is the link's to say (``cancel``)."""

    def done(self, done: Done) -> None:
        if done.status == _protocol.COMPILED:
            self._count("compiled")
            self._owner.compiled(done.key, done.executable, done.compile_s)
            return
        if done.status == _protocol.FAILED:
            self._count("errors")
            self._warn("compiling", done.key, RuntimeError(done.detail))
        else:
            self._refuse(done.key, done.status, done.detail)
        self._owner.not_compiled([done.key])

    def lost(self, link: Link, why: str, keys: list[str]) -> None:
        with self._lock:
            self._lost.append(why)
        tail = link.stderr_tail().strip()
        logger.warning(
            "xla_pcache: the compiler process for %s is lost: %s; what it was to compile is "
            "compiled as before%s",
            link.target.platform,
            why,
            f"; the end of its output:\n{tail}" if tail else "",
        )
        self._count("errors")
        if keys:
            self._owner.not_compiled(keys)

    def idle(self) -> None:
        self._owner.compile_idle()

    # -------------------------------------------------------------- counting

    def _refuse(self, key: str, reason: str, detail: str) -> None:
        """A record not compiled: counted, one warning a reason (then debug)."""
        with self._lock:
            self._refused[key] = reason
            first = reason not in self._warned
            self._warned.add(reason)
            self._counts[f"refused: {reason}"] += 1
        logger.log(
            30 if first else 10,
            "xla_pcache: the module record of %r in %s is refused (%s: %s); its program is "
            "compiled as before%s",
            key,
            self._store.path,
            reason,
            detail,
            " (further refusals of this kind are logged at debug level)" if first else "",
        )
        self._count("modules_refused")

    def _skip_platform(self, platform: str) -> None:
        with self._lock:
            first = platform not in self._skipped_platforms
            self._skipped_platforms.add(platform)
        if first:
            logger.debug("xla_pcache: programs of %s are not compiled ahead", platform)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1
        try:
            self._store.add_prefetch_counters([(name, 1)])
        except Exception as exc:
            logger.debug("xla_pcache: counting %s failed: %s", name, exc)

    def report(self) -> dict[str, Any]:
        """What compiling ahead did in this process (for tests and the bench)."""
        with self._lock:
            links = list(self._links.values())
            return {
                # The memory a compile leaves free (``XLA_PCACHE_COMPILE_AHEAD_MEMORY``).
                "reserve": self._reserve,
                "given": len(self._given),
                "counts": dict(self._counts),
                "refused": dict(collections.Counter(self._refused.values())),
                "lost": list(self._lost),
                "processes": [
                    {"pid": link.pid, "platform": link.target.platform, "ready": link.ready}
                    for link in links
                ],
            }


def entry_value(cc: Any, serialized: bytes, compile_s: float) -> bytes:
    """JAX's own value of an executable: its compile time, then the serialized executable,
    compressed as JAX compresses (``put_executable_and_time``)."""
    return bytes(cc.compress_executable(cc.combine_executable_and_time(serialized, int(compile_s))))
