"""Adopting the entries a directory JAX's own cache filled: every rule of it, in one place,
for the adapter (lazily, on a miss: ``Adopter``) and for ``xla-pcache import --from-jax``
(``import_directory``). Reading the directory under bounds is ``_cache_dir.py``'s.

The rules:

- **Trust.** A store with trusted keys serves only entries a trusted key signed; JAX's
  files carry no signature, so such a store never serves nor adopts one (``refusal``).
- **Signing means "I compiled this".** An adopted value was compiled by another process:
  it is put unsigned (``sign=False``), whatever signing key the store holds.
- **Size.** A file is read only up to one bound: the store's budget (``Store.max_size``,
  the stored budget or the process's own, whichever is smaller) capped by the entry cap
  (``entry_bound``).
- **Keys.** Before jax 0.11 JAX's keys hold its cache directory's path
  (``keys_hold_the_path``): only the adapter, which sees the program, can compute the key
  an entry is filed under there (``KeyAliases``); the command refuses.
- **What is recorded** (``adopted_meta``): ``adopted_from``, and the compile time from
  JAX's own figure, which is whole seconds rounded down. A figure of 0 says only "under a
  second": the compile time is then ``unknown``, and hits of the entry count nothing saved
  (never 0, never a guess).
- **Builds.** JAX's files name no build of the runtime (``xla_pcache.builds``), and an
  entry is filed under the build of the process that adopts it: so a file is taken only if
  JAX wrote it after every binary of that build was installed (its mtime at or after their
  newest ctime, ``Build.installed_ns``). One written before (by the jaxlib a downgrade or a
  rebuild replaced, say) is left where it is, never served (``PREDATES``), and JAX's key
  for it misses as any other.
- **Counts.** A lookup served from JAX's files is a hit, and adopted
  (``Store.count_adopted``), with no miss counted.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pathlib
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from xla_pcache import _core
from xla_pcache._text import package_logger
from xla_pcache._url import names_directory
from xla_pcache.builds import Build
from xla_pcache.cache_path import route
from xla_pcache.jax import _cache_dir as jcd
from xla_pcache.misslog import META_COMPILE_TIME, META_COMPONENTS, encode, module_name

logger = package_logger("xla_pcache.jax")

ADOPTED_FROM = "jax_cache"
UNKNOWN = "unknown"

# From 0.11 JAX leaves the autotune cache directory out of its cache keys (cache_key.py).
KEYS_PATH_INDEPENDENT_SINCE = (0, 11)
# The option that, before 0.11, puts that directory into JAX's keys, and its default.
XLA_CACHES_DEFAULT = "xla_gpu_per_fusion_autotune_cache_dir"


def version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def keys_hold_the_path(version: str) -> bool:
    """Whether JAX ``version``'s own cache keys hold the path of its cache directory."""
    parsed = version_tuple(version)
    return bool(parsed) and parsed < KEYS_PATH_INDEPENDENT_SINCE


def jax_formats(cc: Any) -> frozenset[str]:
    """The one format the running JAX (``jax._src.compilation_cache``) decompresses: zstd
    when it found a zstd module, else zlib. An entry in the other format would fail in JAX,
    so it is not adopted."""
    if getattr(cc, "zstd", None) is not None or getattr(cc, "zstandard", None) is not None:
        return frozenset({jcd.ZSTD})
    return frozenset({jcd.ZLIB})


def importer_formats() -> tuple[frozenset[str], str | None]:
    """What ``import --from-jax`` checks: the format the ``jax`` it can import reads (and
    that jax's version), or without jax every format it can read."""
    try:
        import jax
        from jax._src import compilation_cache as cc
    except Exception:
        return jcd.decodable_formats(), None
    return jax_formats(cc), str(jax.__version__)


def refusal(trusting: bool) -> str | None:
    """Why a store takes nothing from JAX's files, or None when it may."""
    if trusting:
        return (
            "this cache trusts signed entries only (XLA_PCACHE_TRUSTED_KEYS), and JAX's own "
            "cache files carry no signature"
        )
    return None


def _trusting(store: _core.Store) -> bool:
    return store.trusted_key_names is not None


def entry_bound(store: _core.Store, cap: int | None = None) -> int:
    """The largest file read: the store's budget, capped by the entry cap (``cap``, else
    ``_cache_dir.MAX_ENTRY_BYTES``)."""
    bound = cap or jcd.MAX_ENTRY_BYTES
    budget = store.max_size
    return min(bound, int(budget)) if budget else bound


def compile_time_s(read: jcd.Read) -> float | None:
    """The compile time an adopted entry records: JAX's own whole seconds when it wrote at
    least one, else None (unknown: under a second, or unreadable)."""
    secs = read.jax_seconds
    return float(secs) if secs is not None and secs >= 1 else None


def adopted_meta(base: Mapping[str, str], read: jcd.Read) -> dict[str, str]:
    """The metadata of an adopted entry: ``base`` (the producer's, and the key's components
    when the adapter knows them), ``adopted_from`` and the compile time (above)."""
    secs = compile_time_s(read)
    return {
        **base,
        "adopted_from": ADOPTED_FROM,
        META_COMPILE_TIME: UNKNOWN if secs is None else f"{secs:.6f}",
    }


# What adopt() did with one file.
ADOPTED = "adopted"  # published (or found present) and removed from JAX's directory
PRESENT = "present"  # the store already had the key; JAX's duplicate removed
SERVED = "served"  # valid and returned, but left in place (read-only store or put refused)
REJECTED = "rejected"
MISSING = "missing"
REFUSED = "refused"  # the store takes nothing from JAX's files (trust)
PREDATES = "predates"  # written before this build's binaries were installed: left there


@dataclasses.dataclass
class Outcome:
    status: str
    read: jcd.Read | None = None
    reason: str | None = None
    name: str | None = None  # the JAX key the value came from

    @property
    def value(self) -> bytearray | None:
        return None if self.read is None else self.read.value


def adopt(
    store: _core.Store,
    source: jcd.JaxCacheDir,
    key: str,
    *,
    names: Iterable[str] = (),
    formats: frozenset[str],
    meta: Mapping[str, str] | Callable[[jcd.Read], Mapping[str, str]] | None = None,
    cap: int | None = None,
    store_key: str | None = None,
    not_before_ns: int = 0,
) -> Outcome:
    """Adopt JAX's entry for ``key`` (or, failing it, the first of ``names``: the keys JAX
    alone gave the same program) from ``source`` into ``store`` under ``store_key`` (JAX's
    key with the build, ``Build.store_key``; default ``key``), if JAX wrote it at or after
    ``not_before_ns`` (``Build.installed_ns``; one written before is ``PREDATES``).

    A valid value is put into the store, unsigned; once the store holds the key (this put
    or an earlier one), JAX's file is removed, so it is kept once. A read-only store, or a
    put the store refuses (over budget, a failed write), serves the value but leaves the
    file. A file that is not a valid value is left in place and reported as rejected. A
    trusting store takes nothing. Never raises for what is in the directory; ``OSError``
    only if the directory cannot be opened."""
    why = refusal(_trusting(store))
    if why is not None:
        return Outcome(REFUSED, reason=why)
    bound = entry_bound(store, cap)
    skey = key if store_key is None else store_key
    rejected: Outcome | None = None
    predates: Outcome | None = None
    for name in (key, *[n for n in names if n != key]):
        if not jcd.valid_key(name):
            continue  # not a name JAX gives a file: no such file in its directory
        try:
            read = source.read(name, bound, formats)
        except jcd.Rejected as exc:
            if rejected is None:
                rejected = Outcome(REJECTED, reason=str(exc), name=name)
            continue
        if read is None:
            continue
        if read.ident[3] < not_before_ns:
            predates = predates or Outcome(
                PREDATES,
                reason="JAX wrote it before this runtime's binaries were installed",
                name=name,
            )
            continue
        if store.read_only:
            return Outcome(SERVED, read, name=name)
        base = meta(read) if callable(meta) else meta or {}
        stored = store.put(skey, read.value, meta=adopted_meta(base, read), sign=False)
        if not stored and skey not in store:
            return Outcome(SERVED, read, "the store did not take it", name=name)
        try:
            source.remove(name, read)
        except OSError as exc:
            logger.debug("xla_pcache: could not remove %s from %s: %s", name, source.path, exc)
        return Outcome(ADOPTED if stored else PRESENT, read, name=name)
    return rejected or predates or Outcome(MISSING)


# --- the adapter: lazily, on a miss ---------------------------------------------------------


class Warn(Protocol):
    def __call__(self, what: str, key: str, exc: BaseException) -> None: ...


class Adopter:
    """Serving and adopting the entries of directories JAX's own cache filled, lazily, as
    programs ask for them.

    Lazy because it then costs nothing when there is no such directory (install() looks
    once for one JAX entry name and builds no adopter without it), one ``stat`` of the
    store's file and one failed ``openat`` per source on a lookup the store cannot serve
    when there is, and an entry moves only when a program asks for it: no start-up pause
    over a large directory. ``xla-pcache import --from-jax`` moves a whole directory at once.
    """

    # Bounds the keys remembered between computing a key and looking it up.
    _MAX_ALIASES = 4096

    def __init__(self, sources: list[jcd.JaxCacheDir], cc: Any) -> None:
        self.sources = sources
        self._formats = jax_formats(cc)
        self._aliases: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self.counts = {ADOPTED: 0, SERVED: 0, REJECTED: 0, PREDATES: 0}

    def note_aliases(self, key: str, names: list[str]) -> None:
        """The keys JAX alone gave the program now keyed ``key`` (see KeyAliases)."""
        with self._lock:
            self._aliases.pop(key, None)
            self._aliases[key] = names
            while len(self._aliases) > self._MAX_ALIASES:
                self._aliases.pop(next(iter(self._aliases)))

    def take(
        self,
        store: _core.Store,
        key: str,
        meta: Callable[[jcd.Read], Mapping[str, str]],
        warn: Warn,
        *,
        jax_key: str | None = None,
        not_before_ns: int = 0,
    ) -> bytearray | None:
        """JAX's value for ``jax_key`` (default ``key``) when the store has no file of
        ``key``: adopted under ``key`` (or served), and counted as a hit; None otherwise
        (the store is then asked as usual). Files JAX wrote before ``not_before_ns`` are
        left (see the module's rules)."""
        try:
            if key in store:
                return None
        except Exception:
            return None
        name = key if jax_key is None else jax_key
        with self._lock:
            names = self._aliases.pop(name, [])
        for source in self.sources:
            try:
                outcome = adopt(
                    store,
                    source,
                    name,
                    names=names,
                    formats=self._formats,
                    meta=meta,
                    store_key=key,
                    not_before_ns=not_before_ns,
                )
            except Exception as exc:
                warn(f"adoption from {source.path}", key, exc)
                continue
            if outcome.status == REJECTED:
                with self._lock:
                    self.counts[REJECTED] += 1
                warn(
                    f"adoption from JAX's cache at {source.path}",
                    outcome.name or key,
                    jcd.Rejected(outcome.reason or "rejected"),
                )
                continue
            if outcome.status == PREDATES:
                with self._lock:
                    first = not self.counts[PREDATES]
                    self.counts[PREDATES] += 1
                logger.log(
                    logging.INFO if first else logging.DEBUG,
                    "xla_pcache: JAX's cache at %s holds %r from before this jaxlib was "
                    "installed: left there, not served (it may be another build's)",
                    source.path,
                    outcome.name,
                )
                continue
            read = outcome.read
            if read is None:
                continue
            with self._lock:
                self.counts[SERVED if outcome.status == SERVED else ADOPTED] += 1
            try:
                store.count_adopted(len(read.value), compile_time_s(read))
            except Exception as exc:  # a count must never fail the lookup
                logger.debug("xla_pcache: counting an adopted entry failed: %s", exc)
            logger.debug(
                "xla_pcache: %s %r from JAX's cache at %s", outcome.status, key, source.path
            )
            return read.value
        return None


class KeyAliases:
    """On jax < 0.11 JAX's own keys hold the path of its cache directory (through
    ``xla_gpu_per_fusion_autotune_cache_dir``, which its default
    ``jax_persistent_cache_enable_xla_caches`` sets), and install() turns that option off:
    the same program has another key than the one JAX alone gave it. Wrapping
    ``compilation_cache.get_cache_key`` computes that key too, from the same arguments, with
    JAX's own function, for each directory being adopted; only while such a directory
    exists at install()."""

    def __init__(self, original: Callable[..., str], adopter: Adopter) -> None:
        self.original = original
        self.adopter = adopter
        # inspect.signature and _keyparts (which computes keys itself) see JAX's function.
        self.__wrapped__ = original

    def __call__(
        self, module: Any, devices: Any, compile_options: Any, backend: Any, *a: Any, **kw: Any
    ) -> str:
        key = self.original(module, devices, compile_options, backend, *a, **kw)
        try:
            names = []
            for source in self.adopter.sources:
                opts = copy.deepcopy(compile_options)
                opts.executable_build_options.debug_options.xla_gpu_per_fusion_autotune_cache_dir = str(  # noqa: E501
                    pathlib.Path(source.key_path) / XLA_CACHES_DEFAULT
                )
                names.append(self.original(module, devices, opts, backend, *a, **kw))
            self.adopter.note_aliases(key, names)
        except Exception as exc:
            logger.debug("xla_pcache: JAX's own key for %r not computed: %s", key, exc)
        return key


def sources(
    store: _core.Store,
    store_path: str,
    previous_dir: str | None,
) -> list[jcd.JaxCacheDir]:
    """The directories JAX's own cache may have filled for this process and ``store``
    (opened at the absolute ``store_path``): its own root (JAX_COMPILATION_CACHE_DIR or
    XLA_PERSISTENT_CACHE_PATH naming the old JAX directory) and the directory JAX was
    configured with before install() took it over; those holding at least one JAX entry
    name. None for a store that takes nothing from them (said at INFO when there were
    some)."""
    candidates: list[tuple[str, str]] = []
    prev = str(previous_dir) if previous_dir else None
    where = route(prev) if prev is not None and names_directory(prev) else None
    if prev is not None and where is not None and where.kind == "local":
        # A file: URL's directory as the one routing rule reads it; JAX hashed the text.
        prev = prev.removeprefix("file://")
        prev_abs = where.path
        candidates.append((store_path, prev if prev_abs == store_path else store_path))
        candidates.append((prev_abs, prev))
    else:
        candidates.append((store_path, store_path))
    found: list[jcd.JaxCacheDir] = []
    seen: set[str] = set()
    for path, key_path in candidates:
        if path in seen:
            continue
        seen.add(path)
        source = jcd.JaxCacheDir(path, key_path=key_path)
        if source.has_entries():
            found.append(source)
    why = refusal(_trusting(store))
    if found and why is not None:
        logger.info(
            "xla_pcache: JAX's own cache entries in %s are not served: %s",
            ", ".join(s.path for s in found),
            why,
        )
        return []
    return found


# --- the command: a whole directory ---------------------------------------------------------


def import_directory(
    store: _core.Store,
    source: jcd.JaxCacheDir,
    *,
    formats: frozenset[str],
    cap: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    build: Build | None = None,
) -> dict[str, int]:
    """Adopts every entry of ``source`` into ``store`` under the key JAX gave it with
    ``build`` (the runtime installed here, ``jax/_build.py``; None: JAX's key alone); how
    many ended in each outcome (``ADOPTED``, ``PRESENT``, ``REJECTED``, ``SERVED``,
    ``PREDATES``).
    ``progress(done, total)`` is called before the first key and after each."""
    keys = sorted(source.keys())
    if progress is not None:
        progress(0, len(keys))
    counts = {ADOPTED: 0, PRESENT: 0, REJECTED: 0, SERVED: 0, PREDATES: 0}
    base = {"framework": "jax"}
    for done, key in enumerate(keys, 1):
        skey = key if build is None else build.store_key(key)
        meta: dict[str, str] = base
        if build is not None:
            parts = {"module": module_name(key), "components": [build.component()]}
            meta = {**base, META_COMPONENTS: encode(parts)}
        outcome = adopt(
            store,
            source,
            key,
            formats=formats,
            meta=meta,
            cap=cap,
            store_key=skey,
            not_before_ns=0 if build is None else build.installed_ns,
        )
        if outcome.status in counts:
            counts[outcome.status] += 1
        if outcome.status == REJECTED and logger.isEnabledFor(logging.DEBUG):
            logger.debug("xla_pcache: %s not adopted: %s", key, outcome.reason)
        if progress is not None:
            progress(done, len(keys))
    return counts
