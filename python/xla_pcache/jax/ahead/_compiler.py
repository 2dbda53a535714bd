"""The compiler process: compiles module records ahead of a program's own compiles, in a
process of its own, so that nothing of XLA's compile ever runs in a thread of the program's
interpreter, and the program exits on time: XLA cannot stop a compile, but its parent can
kill this process (``_link``), at its exit or when it dies.

Started by its parent as ``python -P -m xla_pcache.jax.ahead._compiler`` with the parent's
environment, JAX's CPU client only, and ``XLA_PCACHE_DISABLE=1`` (``_target.environment``).
Stdin brings frames (``_protocol``): first the target, then jobs, each a JAX key and the
bytes of the record stored under it, and cancels. What it writes goes to a descriptor of its
own (standard output is pointed at standard error, so that no stray print or native log can
corrupt a frame). It ends at once when stdin ends (the parent closed it, or died), when its
parent dies (``PR_SET_PDEATHSIG`` on Linux, and the parent's id looked at after), or when
killed.

For each job, on one of ``threads`` threads, while the job has more memory available than the
reserve the target frame gives (``_memory``: the host's, and its cgroups' limits less their
use; this process is in its parent's cgroups): the record is decoded strictly
(``_record.decode``), its module parsed in a context of the thread's own, and JAX's own key
function (``compilation_cache.get_cache_key``, as ``compile_or_get_cached`` calls it)
computes its key on this client with the record's devices and options. Only when that key
is the job's key is the module compiled, by JAX's own compile function
(``backend_compile_and_load``, or ``backend_compile`` on JAX before 0.6.2: ``FORMS``), which
handles compile-only clients as JAX does; the executable is serialized as JAX's
``put_executable_and_time`` serializes it. So a stale or planted record costs a parse and a
hash, never a compile, and what is handed back for a key is what JAX would compile for it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from xla_pcache import _memory, _testhook
from xla_pcache.jax.ahead import _fleet, _protocol, _record, _target

# The parent's process id, which the child checks is still its parent.
PARENT_VAR = "XLA_PCACHE_COMPILER_PARENT"
# A serialized executable's bound (what the parent reads back), and a job's (a record).
MAX_EXECUTABLE_BYTES = 2 << 30
MAX_JOB_BYTES = _record.MAX_RECORD_BYTES
# How often a thread waiting for memory looks again.
MEMORY_POLL_S = 0.5
_DETAIL_CHARS = 500

# (function name, its parameters) -> form: 1 without devices, 2 with.
FORMS: dict[tuple[str, tuple[str, ...]], int] = {
    ("backend_compile", ("backend", "module", "options", "host_callbacks")): 1,
    (
        "backend_compile_and_load",
        ("backend", "module", "executable_devices", "options", "host_callbacks"),
    ): 2,
}


def read_form(compiler: Any) -> tuple[str, int] | str:
    """The function this JAX compiles through and its form, or why there is none a compiler
    process can call."""
    name = "backend_compile_and_load"
    fn = getattr(compiler, name, None)
    if fn is None:
        name = "backend_compile"
        fn = getattr(compiler, name, None)
    fn = inspect.unwrap(fn) if callable(fn) else fn
    if not callable(fn):
        return "jax._src.compiler has neither backend_compile_and_load nor backend_compile"
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        return f"the signature of {name} cannot be read ({exc})"
    form = FORMS.get((name, params))
    if form is None:
        return f"{name}{params} is not a form this release knows"
    return name, form


# ----------------------------------------------------------------------- the process


def _die_with_parent(parent: int) -> None:
    """Killed when the parent dies (Linux), and gone at once if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if parent and os.getppid() != parent:
        os._exit(0)


class Compiler:
    """One compiler process's work: its client, its threads, its output."""

    def __init__(self, out: int) -> None:
        self._out = out
        self._out_lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._reserve = 0
        self._backend: Any = None
        self._by_id: dict[int, Any] = {}
        self._compile: Callable[..., Any] | None = None
        self._form = 0
        self._key_fn: Callable[..., str] | None = None
        self._ignore: list[Any] = []
        # Precompiling for a fleet (``_precompile``): the compression its keys name, else
        # None (a program's own compiling ahead: the record's key is the key).
        self._fleet_compression: str | None = None
        # Keys waiting for the parent's answer to KEYED: [answered, go].
        self._asks: dict[str, list[Any]] = {}

    def send(self, kind: bytes, header: dict[str, Any], payload: bytes = b"") -> None:
        data = memoryview(_protocol.frame(kind, header, payload))
        with self._out_lock:
            try:
                while data:
                    n = os.write(self._out, data)
                    data = data[n:]
            except OSError:
                os._exit(0)  # the parent is gone

    def serve(self) -> None:
        reader = _protocol.Reader(_protocol.TO_CHILD, MAX_JOB_BYTES)
        started = False
        while True:
            try:
                data = os.read(0, 1 << 20)
            except OSError:
                data = b""
            if not data:
                os._exit(0)
            try:
                frames = reader.feed(data)
            except _protocol.ProtocolError:
                os._exit(3)
            for kind, header, payload in frames:
                if kind == _protocol.TARGET and not started:
                    started = True
                    self._start(header)
                elif kind == _protocol.JOB and started:
                    key = header.get("key")
                    if isinstance(key, str):
                        self._jobs.put((key, payload))
                elif kind in (_protocol.CANCEL, _protocol.GO):
                    key = header.get("key")
                    if isinstance(key, str):
                        with self._lock:
                            ask = self._asks.get(key)
                            if ask is not None:
                                ask[1] = kind == _protocol.GO
                                ask[0].set()
                            elif kind == _protocol.CANCEL:
                                self._cancelled.add(key)

    def _start(self, header: dict[str, Any]) -> None:
        """Make the target's client and start the threads; ``FATAL`` and the end if the
        client cannot be made."""
        try:
            target = _record.target_from_json(header.get("target"))
            threads = header.get("threads")
            reserve = header.get("reserve")
            if type(threads) is not int or not 1 <= threads <= 256:
                raise ValueError("no thread count")
            if type(reserve) is not int or reserve < 0:
                raise ValueError("no memory reserve")
            self._reserve = reserve
            fleet = header.get("precompile")
            if fleet is not None:
                compression = fleet.get("compression") if isinstance(fleet, dict) else None
                if compression not in _fleet.COMPRESSIONS:
                    raise ValueError("no compression to precompile with")
                self._fleet_compression = compression
            self._backend, devices = _target.make_client(target)
            self._by_id = {int(d.id): d for d in devices}
            from jax._src import compilation_cache as cc
            from jax._src import compiler

            from xla_pcache.jax import _keyparts

            found = read_form(compiler)
            if isinstance(found, str):
                raise ValueError(found)
            name, self._form = found
            self._compile = inspect.unwrap(getattr(compiler, name))
            self._key_fn = inspect.unwrap(cc.get_cache_key)
            self._ignore = _keyparts.ignore_arg(cc)
            if self._fleet_compression is not None:
                _fleet.use_compression(cc, self._fleet_compression)
        except Exception as exc:
            self.send(_protocol.FATAL, {"detail": _detail(exc)})
            os._exit(0)
        self.send(
            _protocol.READY,
            {
                "platform": str(self._backend.platform),
                "platform_version": str(self._backend.platform_version)[:_DETAIL_CHARS],
                "devices": len(self._by_id),
                "flags": _fleet.keyed_flags(),
            },
        )
        _testhook.reached("compiler-ready")
        if _testhook.chosen("compiler-hold"):
            _testhook.hold_for_signal("compiler-held")  # until a test kills it
        for i in range(threads):
            threading.Thread(target=self._work, name=f"compiler-{i}", daemon=True).start()

    def _work(self) -> None:
        while True:
            key, data = self._jobs.get()
            self._wait_for_memory()
            with self._lock:
                if key in self._cancelled:
                    self._cancelled.discard(key)
                    continue
            status, detail, compile_s, payload, stored_as = self._job(key, data)
            header: dict[str, Any] = {
                "key": key,
                "status": status,
                "detail": detail,
                "compile_s": compile_s,
            }
            if stored_as is not None:
                header["as"] = stored_as
            self.send(_protocol.DONE, header, payload)

    def _wait_for_memory(self) -> None:
        while self._reserve:
            available = _memory.available()
            if available is None or available > self._reserve:
                return
            time.sleep(MEMORY_POLL_S)

    def _context(self) -> Any:
        ctx = getattr(self._local, "context", None)
        if ctx is None:
            from jax._src.interpreters import mlir

            ctx = self._local.context = mlir.make_ir_context()
        return ctx

    def _job(self, key: str, data: bytes) -> tuple[str, str, float, bytes, str | None]:
        """What became of ``key``'s record: a status, why, the compile's seconds, the
        serialized executable when compiled, and (precompiling) the key JAX computes for
        it with the fleet's settings, which it is stored under."""
        status, detail, compile_s, payload, stored_as = _protocol.UNDECODABLE, "", 0.0, b"", None
        try:
            record = _record.decode(data)
        except _record.RecordError as exc:
            return status, str(exc), compile_s, payload, stored_as
        try:
            status, detail, compile_s, payload, stored_as = self._compile_record(key, record)
        except _Refused as refused:
            status, detail = refused.status, refused.detail
        return status, detail, compile_s, payload, stored_as

    def _compile_record(
        self, key: str, record: _record.Record
    ) -> tuple[str, str, float, bytes, str | None]:
        import numpy as np

        xc = importlib.import_module("jax._src.lib").xla_client
        ir = importlib.import_module("jax._src.lib.mlir").ir
        unknown = [d for d in record.devices if d not in self._by_id]
        if unknown or not record.devices:
            raise _Refused(_protocol.MISMATCH, f"no device of id {unknown[:1]} here")
        devices = [self._by_id[d] for d in record.devices]
        assert self._key_fn is not None and self._compile is not None
        with self._context():
            try:
                options = xc.CompileOptions.ParseFromString(record.options)
                module = ir.Module.parse(record.module)
            except Exception as exc:
                raise _Refused(_protocol.UNDECODABLE, _detail(exc)) from None
            stored_as: str | None = None
            try:
                array = np.array(devices, dtype=object)
                if self._fleet_compression is not None:
                    stored_as = self._fleet_key(key, record, module, array, options)
                    if not self._ask(key, stored_as):
                        raise _Refused(_protocol.PRESENT, stored_as)
                else:
                    computed = self._key_fn(module, array, options, self._backend, *self._ignore)
                    if computed != key:
                        raise _Refused(_protocol.MISMATCH, f"its key here is {computed}")
                self.send(_protocol.STARTED, {"key": key})
                if _testhook.chosen("compiler-hang"):
                    # A compile that never ends and burns nothing (a test build's).
                    _testhook.reached("compiler-hung")
                    threading.Event().wait()
                start = time.perf_counter()
                if self._form == 1:
                    executable = self._compile(self._backend, module, options, ())
                else:
                    executable = self._compile(
                        self._backend, module, xc.DeviceList(tuple(devices)), options, ()
                    )
                compile_s = time.perf_counter() - start
                serialized = _serialize(executable, self._backend)
            except _Refused:
                raise
            except Exception as exc:
                raise _Refused(_protocol.FAILED, _detail(exc)) from None
        if len(serialized) > MAX_EXECUTABLE_BYTES:
            raise _Refused(_protocol.OVER_BOUNDS, f"{len(serialized)} bytes")
        if _testhook.chosen("compiler-garbage"):
            with self._out_lock:
                os.write(self._out, b"\xff" * 64)
        return _protocol.COMPILED, "", compile_s, serialized, stored_as

    def _ask(self, key: str, stored_as: str) -> bool:
        """Whether the parent wants ``key`` compiled now that it is keyed ``stored_as``."""
        ask: list[Any] = [threading.Event(), False]
        with self._lock:
            self._asks[key] = ask
        self.send(_protocol.KEYED, {"key": key, "as": stored_as})
        ask[0].wait()
        with self._lock:
            del self._asks[key]
        return bool(ask[1])

    def _fleet_key(
        self, key: str, record: _record.Record, module: Any, devices: Any, options: Any
    ) -> str:
        """Precompiling: JAX's key of the record on this client with the fleet's settings
        (this process's flags and compression), once JAX's key of it with the settings its
        own key parts name is ``key``, the key it is stored under (else ``_Refused``)."""
        from jax._src import cache_key as ck
        from jax._src import compilation_cache as cc

        from xla_pcache.jax import _keyparts

        args = {
            "computation": module,
            "devices": devices,
            "compile_options": options,
            "backend": self._backend,
        }
        fleet_key, sink = _keyparts._run_key(cc, ck, args)
        own = _fleet.key_with_parts(fleet_key, sink, dict(record.parts))
        if own != key:
            raise _Refused(
                _protocol.MISMATCH,
                f"what it holds is not the program of its key ({own or 'its parts unreadable'})",
            )
        return fleet_key


class _Refused(Exception):
    """A job not compiled: its status and why."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _serialize(executable: Any, backend: Any) -> bytes:
    """As JAX's ``put_executable_and_time`` serializes an executable."""
    if hasattr(executable, "serialize"):
        return bytes(executable.serialize())
    return bytes(backend.serialize_executable(executable))


def _detail(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "\u2026"


def main() -> None:
    out = os.dup(1)
    os.dup2(2, 1)
    try:
        parent = int(os.environ.get(PARENT_VAR, "0"))
    except ValueError:
        parent = 0
    _die_with_parent(parent)
    with contextlib.suppress(Exception):
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
    Compiler(out).serve()


if __name__ == "__main__":
    main()
