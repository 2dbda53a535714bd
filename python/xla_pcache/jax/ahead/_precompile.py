"""Precompiling a store's module records for a TPU fleet, on a host with JAX's TPU runtime and
no TPU (``xla-pcache precompile``): each record is compiled for a named topology on a
compile-only client, in the compiler process a program's compiling ahead uses (``_link``,
``_compiler``), with the fleet's flags and compression (``_fleet``), and its executable is
put into the store under the key and runtime build the TPU computes.

What is refused, per record, with its reason: one that is not of this format, or whose key is
not a JAX key; one a trusting store does not serve (unsigned); one of another jaxlib; one
that is not a TPU program, or whose devices do not fit the topology (another generation, a
device the topology lacks); one with host callbacks or custom partitioning (pointers of the
process that made it); one whose key parts name no readable flags or compression where the
command was given none; and, in the compiler process, one whose key JAX computes from what
it holds with its own parts is not the key it is stored under (a stale or planted record:
a parse and a hash, never a compile). A key whose executable is present is not compiled.

Every put goes through the store (its budget, its signing; a read-only path is refused
before anything is read). The work is bounded as a program's compiling ahead is: the
compiler process's threads, and the memory it leaves free
(``XLA_PCACHE_COMPILE_AHEAD_MEMORY``, else a quarter of the job's); a compile past
``Request.compile_timeout`` stops its compiler process (that record fails, the others go on
in a new one), so a run always ends. On a bucket path the records are also the bucket's
(``_bucket_records``), not only those of this host's copy.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import queue
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from xla_pcache._text import package_logger
from xla_pcache.jax.ahead import _fleet, _plan, _protocol
from xla_pcache.jax.ahead._link import Done, Link
from xla_pcache.jax.ahead._record import (
    ANY_PREFIX,
    CUSTOM_PARTITIONING,
    KEY_PREFIX,
    Record,
    RecordError,
    Target,
    decode,
    program_name,
)
from xla_pcache.misslog import META_COMPILE_TIME
from xla_pcache.store import Store

logger = package_logger("xla_pcache.jax")

# Records one run looks at, at most (a store's listing or a plan's entries).
MAX_RECORDS = 65536
# A bucket's entries whose first bytes one run reads to find its records, at most, and the
# reads at once.
MAX_BUCKET_ENTRIES = 4 * MAX_RECORDS
HEAD_READS = 16
# What a module calls that binds it to the process that made it.
_HOST_CALLBACKS = (
    b"xla_python_cpu_callback",
    b"xla_python_gpu_callback",
    b"xla_ffi_python_cpu_callback",
    b"xla_ffi_python_gpu_callback",
    b"xla_ffi_partial_python_cpu_callback",
    b"_xla_host_transfer",
    CUSTOM_PARTITIONING,
)

# A compile's seconds at most unless told (a large program compiles in minutes).
DEFAULT_COMPILE_TIMEOUT_S = 3600.0

COMPILED = "compiled"
PRESENT = "present"
REFUSED = "not compilable"
FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Request:
    """What to precompile: for ``topology``, with the fleet's ``flags`` and ``compression``
    (None: each record's own key parts), the records of ``keys`` (None: every record the
    store lists) whose program's name matches ``name`` (a shell pattern)."""

    topology: _fleet.Topology
    flags: tuple[str, ...] | None = None
    flags_source: str = ""
    compression: str | None = None
    compression_source: str = ""
    keys: tuple[str, ...] | None = None
    name: str | None = None
    threads: int = 1
    reserve: int = 0
    # A compile's seconds at most: past them its compiler process is stopped, the record
    # fails, and the others go on in a new one.
    compile_timeout: float = DEFAULT_COMPILE_TIMEOUT_S


@dataclasses.dataclass
class Outcome:
    """What became of one record: ``status`` (compiled, present, not compilable, failed),
    why, the key its executable is (or would be) stored under and the compile's time."""

    key: str
    status: str
    detail: str = ""
    stored_as: str | None = None
    compile_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Report:
    outcomes: list[Outcome]
    settings: list[dict[str, Any]]
    seconds: float
    build: str
    # Why the records looked at may not be all the store's (None: they are).
    cut_short: str | None = None

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys((COMPILED, PRESENT, REFUSED, FAILED), 0)
        for o in self.outcomes:
            out[o.status] += 1
        return out


def target_of(topology: _fleet.Topology) -> Target:
    return Target(
        platform="tpu",
        device_kind=topology.device_kind,
        device_count=topology.device_count,
        topology=topology.name,
        chip_config="default",
        chips_per_host=topology.chips_per_host,
        slices=1,
    )


def record_keys(store: Store, request: Request) -> tuple[list[str], str | None]:
    """The record keys to look at, and why that may not be all of them (None: it is)."""
    cut: str | None = None
    if request.keys is not None:
        wanted: Iterable[str] = (KEY_PREFIX + k for k in request.keys)
    else:
        wanted = (k for k in store.keys() if isinstance(k, str) and k.startswith(ANY_PREFIX))  # noqa: SIM118 - a listing
        from xla_pcache.bucket import BucketStore

        if isinstance(store, BucketStore):
            # The host-local store holds only what this host fetched or wrote: the
            # bucket's own records are found by its listing.
            found, cut = _bucket_records(store)
            wanted = itertools.chain(wanted, found)
    keys = list(itertools.islice(wanted, MAX_RECORDS + 1))
    if len(keys) > MAX_RECORDS:
        cut = f"only the first {MAX_RECORDS} records were looked at"
    return sorted(set(keys[:MAX_RECORDS])), cut


def _bucket_records(store: Any) -> tuple[list[str], str | None]:
    """The record keys the first bytes of the bucket's entries name (the first
    ``MAX_BUCKET_ENTRIES`` it lists), and why that may not be all of them. A key read so
    is untrusted: the record is then fetched under the names this host reads that key
    under and verified whole (a header forged under another name leads to the key's own
    entry, or to nothing)."""
    from concurrent.futures import ThreadPoolExecutor

    from xla_pcache import _core
    from xla_pcache.bucket.layout import HEAD_BYTES
    from xla_pcache.tiers.objstore import ENTRY_DIR

    bucket = store.bucket()
    names, listing = bucket.listed_entries(limit=MAX_BUCKET_ENTRIES)

    def key_of(name: str) -> str | bool:
        try:
            head = bucket.reader.first_bytes(f"{ENTRY_DIR}/{name}", HEAD_BYTES)
        except Exception as exc:
            logger.debug("xla_pcache: the head of entry %s is unread: %s", name, exc)
            return False
        key = None if head is None else _core.entry_head_key(head)
        return key if isinstance(key, str) and key.startswith(ANY_PREFIX) else True

    keys: list[str] = []
    unread = 0
    with ThreadPoolExecutor(HEAD_READS, thread_name_prefix="xla_pcache-precompile") as pool:
        for key in pool.map(key_of, sorted(names)):
            if key is False:
                unread += 1
            elif isinstance(key, str):
                keys.append(key)
    why = [] if listing.complete else [f"the bucket's listing: {listing.cut_short()}"]
    if unread:
        why.append(f"{unread} of the bucket's entries could not be read")
    return keys, "; ".join(why) or None


def plan_keys(store: Store, name: str, jax_version: str, process: int = 0) -> list[str]:
    """The keys every variant of the plan ``name`` names (``XLA_PCACHE_PREFETCH_NAME``, or
    a plan's own key); ``ValueError`` when there is none this store serves."""
    from xla_pcache.jax.ahead import _plan_name

    key = (
        name
        if name.startswith(_plan.KEY_PREFIX)
        else _plan.plan_key(_plan_name.workload(name, jax_version, process))
    )
    blob = store.get(key, count=False)
    if blob is None:
        raise ValueError(f"no plan {name!r} in this store (or none it serves)")
    try:
        plan = _plan.decode(bytes(blob))
    except _plan.PlanError as exc:
        raise ValueError(f"the plan {name!r} is refused: {exc}") from None
    keys = dict.fromkeys(e.key for v in plan.variants for e in v.entries)
    return list(keys)


def _host_callbacks(module: bytes) -> bytes | None:
    for name in _HOST_CALLBACKS:
        if name in module:
            return name
    return None


def check(
    rkey: str, record: Record, request: Request, jaxlib: str
) -> tuple[_fleet.Settings | None, str]:
    """The settings ``record`` (stored under ``rkey``) is precompiled with, or why it is
    not."""
    parts = dict(record.parts)
    made_by = parts.get(_fleet.JAXLIB_PART)
    if made_by != jaxlib:
        return None, f"made by jaxlib {made_by or 'unknown'}; this host's is {jaxlib}"
    t, want = record.target, request.topology
    if t.platform != "tpu" or t.topology is None:
        return None, f"not a TPU program (its target is {t.platform})"
    if t.device_kind != want.device_kind:
        return None, f"made for {t.device_kind} ({t.topology}), not {want.device_kind}"
    if len(record.devices) > want.device_count or any(
        d >= want.device_count for d in record.devices
    ):
        return None, (
            f"its {len(record.devices)} devices (ids up to {max(record.devices, default=0)}) "
            f"do not fit {want.name} ({want.device_count} devices)"
        )
    callback = _host_callbacks(record.module)
    if callback is not None:
        return None, f"it has host callbacks ({callback.decode()})"
    if request.flags is not None:
        flags, flags_from = request.flags, request.flags_source
    else:
        found = _fleet.record_flags(parts)
        if isinstance(found, str):
            return None, f"{found}; pass --libtpu-init-args"
        flags, flags_from = found, "the record's key parts"
    if request.compression is not None:
        compression, compression_from = request.compression, request.compression_source
    else:
        named = _fleet.record_compression(parts)
        if named is None:
            return None, "its key parts name no compression; pass --compression"
        compression, compression_from = named, "the record's key parts"
    source = f"flags from {flags_from}, compression from {compression_from}"
    return _fleet.Settings(_fleet.keyed(flags), compression, source), ""


class _Events:
    """What one compiler process says, handed to the command's thread."""

    def __init__(self, present: Callable[[str], bool]) -> None:
        self.queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._present = present
        # When each key was let compile (the answer GO: its compile starts then).
        self.began: dict[str, float] = {}

    def started(self, key: str) -> None:
        pass

    def keyed(self, key: str, stored_as: str) -> bool:
        try:
            present = self._present(stored_as)
        except Exception as exc:  # a store that cannot say: compile it, the put decides
            logger.debug("xla_pcache: whether %r is present is unknown: %s", stored_as, exc)
            present = False
        if not present:
            self.began[key] = time.monotonic()
            # The command's thread then waits no longer than this compile may take.
            self.queue.put(("began", key))
        return not present

    def done(self, done: Done) -> None:
        self.queue.put(("done", done))

    def lost(self, link: Link, why: str, keys: list[str]) -> None:
        self.queue.put(("lost", (why, link.stderr_tail(), keys)))

    def idle(self) -> None:
        pass


def entry_value(serialized: bytes, compile_s: float, compression: str) -> bytes:
    """JAX's value of an executable (its compile time in whole seconds, then the serialized
    executable), compressed as a host of ``compression`` compresses it."""
    raw = int(compile_s).to_bytes(4, "big") + serialized
    if compression == _fleet.ZLIB:
        return zlib.compress(raw)
    import zstandard

    return bytes(zstandard.ZstdCompressor().compress(raw))


def precompile(
    store: Store,
    request: Request,
    *,
    build: Any,
    meta: dict[str, str],
    jaxlib: str,
    shown: Callable[[Outcome, int, int], None] = lambda o, i, n: None,
) -> Report:
    """Precompile what ``request`` names into ``store`` (which is writable); ``build``:
    this host's JAX runtime build (``_build.build()``), whose suffix the TPU's keys end
    with; ``shown`` is told of each outcome as it comes."""
    start = time.monotonic()
    rkeys, cut_short = record_keys(store, request)
    outcomes: list[Outcome] = []
    groups: dict[_fleet.Settings, list[tuple[str, bytes]]] = {}
    selected: list[str] = []
    for rkey in rkeys:
        key = rkey[len(KEY_PREFIX) :] if rkey.startswith(KEY_PREFIX) else rkey
        if request.name is not None and not fnmatch.fnmatchcase(program_name(key), request.name):
            continue
        selected.append(key)
    total = len(selected)

    def out(o: Outcome) -> None:
        outcomes.append(o)
        shown(o, len(outcomes), total)

    for key in selected:
        rkey = KEY_PREFIX + key
        if key.startswith(ANY_PREFIX):
            out(Outcome(key, REFUSED, "a record of another release's format"))
            continue
        if not _plan.valid_key(key):
            out(Outcome(key, REFUSED, "its key is not a JAX key"))
            continue
        try:
            blob = store.get(rkey, count=False)
        except Exception as exc:
            out(Outcome(key, FAILED, f"reading it failed ({exc})"))
            continue
        if blob is None:
            why = (
                "no record of it"
                if request.keys is not None
                else "the store does not serve it (unsigned where only signed entries are "
                "trusted, or unreadable)"
            )
            out(Outcome(key, REFUSED, why))
            continue
        data = bytes(blob)
        try:
            record = decode(data)
        except RecordError as exc:
            out(Outcome(key, REFUSED, f"undecodable: {exc}"))
            continue
        settings, why = check(rkey, record, request, jaxlib)
        if settings is None:
            out(Outcome(key, REFUSED, why))
            continue
        groups.setdefault(settings, []).append((key, data))
    used = []
    for settings, jobs in groups.items():
        used.append(
            {
                "flags": " ".join(settings.flags),
                "compression": settings.compression,
                "source": settings.source,
                "records": len(jobs),
            }
        )
        _run_group(store, request, settings, jobs, build, meta, out)
    return Report(outcomes, used, time.monotonic() - start, build.suffix, cut_short)


def _run_group(
    store: Store,
    request: Request,
    settings: _fleet.Settings,
    jobs: list[tuple[str, bytes]],
    build: Any,
    meta: dict[str, str],
    out: Callable[[Outcome], None],
) -> None:
    data_of = dict(jobs)
    waiting = set(data_of)
    while waiting:
        late = _run_link(store, request, settings, data_of, waiting, build, meta, out)
        for key in late:
            waiting.discard(key)
            out(
                Outcome(
                    key,
                    FAILED,
                    f"its compile ran past {request.compile_timeout:g} s "
                    "(--compile-timeout): its compiler process was stopped",
                )
            )


def _run_link(
    store: Store,
    request: Request,
    settings: _fleet.Settings,
    data_of: dict[str, bytes],
    waiting: set[str],
    build: Any,
    meta: dict[str, str],
    out: Callable[[Outcome], None],
) -> list[str]:
    """The keys of ``waiting`` through one compiler process, each removed as its outcome
    is told; the keys whose compile ran past the timeout (the process then stopped), the
    others left in ``waiting`` for the next."""
    events = _Events(lambda k: store.get(build.store_key(k), count=False) is not None)
    link = Link(
        target_of(request.topology),
        events,
        threads=request.threads,
        reserve=request.reserve,
        environment=settings.environment(),
        precompile={"compression": settings.compression},
    )
    try:
        for place, key in enumerate(sorted(waiting)):
            if not link.submit(key, data_of[key], place):
                break
        while waiting:
            running = [t for k, t in events.began.items() if k in waiting]
            wait = None
            if running:
                wait = max(0.0, min(running) + request.compile_timeout - time.monotonic())
            try:
                kind, item = events.queue.get(timeout=wait)
            except queue.Empty:
                now = time.monotonic()
                late = [
                    k
                    for k, t in events.began.items()
                    if k in waiting and now - t >= request.compile_timeout
                ]
                if late:
                    return late
                continue
            if kind == "began":
                continue
            if kind == "lost":
                why, tail, _ = item
                detail = f"the compiler process is lost: {why}"
                if tail.strip():
                    detail += f" ({tail.strip().splitlines()[-1]})"
                for key in sorted(waiting):
                    out(Outcome(key, FAILED, detail))
                waiting.clear()
                break
            done: Done = item
            if done.key not in waiting:
                continue
            waiting.discard(done.key)
            out(_stored(store, done, settings, build, meta, link))
    finally:
        link.close()
    return []


def _stored(
    store: Store,
    done: Done,
    settings: _fleet.Settings,
    build: Any,
    meta: dict[str, str],
    link: Link,
) -> Outcome:
    if done.status == _protocol.PRESENT:
        return Outcome(done.key, PRESENT, "", done.detail)
    if done.status == _protocol.FAILED:
        return Outcome(done.key, FAILED, done.detail)
    if done.status != _protocol.COMPILED:
        return Outcome(done.key, REFUSED, f"{done.status}: {done.detail}")
    stored_as = done.stored_as
    if stored_as is None:
        return Outcome(done.key, FAILED, "the compiler process named no key to store it under")
    ready = link.ready or {}
    if ready.get("flags") != " ".join(settings.flags):
        return Outcome(
            done.key,
            FAILED,
            f"the compiler process keyed flags {ready.get('flags')!r}, not the fleet's",
            stored_as,
        )
    value = entry_value(done.executable, done.compile_s, settings.compression)
    entry_meta = dict(meta)
    entry_meta[META_COMPILE_TIME] = f"{done.compile_s:.6f}"
    skey = build.store_key(stored_as)
    try:
        put = store.put(skey, value, meta=entry_meta)
    except Exception as exc:
        return Outcome(done.key, FAILED, f"storing it failed ({exc})", stored_as)
    if not put:
        if skey in store:
            return Outcome(done.key, PRESENT, "another writer stored it meanwhile", stored_as)
        return Outcome(
            done.key,
            FAILED,
            "the store did not keep it (over its budget, or the write failed: see the warning)",
            stored_as,
            done.compile_s,
        )
    return Outcome(done.key, COMPILED, "", stored_as, done.compile_s)
