"""Which build of a framework's runtime made an entry: the identity of the binaries that
produce and load executables, and the store key that carries it.

A serialized executable is safe to load only into the runtime that produced it, and the
frameworks' own keys name versions, not binaries: a jaxlib rebuilt from source, patched or
installed from another channel under the same version has the same JAX key. So every key an
adapter gives the store ends with the build of the runtime that compiled it
(``<framework key>@build-<32 hex>``, ``Build.store_key``): a process asks only for its own
build's entries, and another build's are other keys, never read, never replaced. Two builds
sharing a cache each keep their own entries side by side; neither thrashes the other.

A build is a digest over each file's identity (``_core.identify_binaries``: the GNU build-id
note where a file has one, else the BLAKE3 of its content, remembered in the user's record
under the file's device, inode, size, mtime and ctime, so a process start costs a ``stat``
per file) together with its role (``jaxlib``, ``libtpu``, ...) and its name within the
role's directory: the same binaries installed at another path are the same build. Which
files make a framework's build is the adapters' business (``jax/_build.py``,
``torch_xla/_build.py``).

A miss is explained (``component``: the build as one of the key's recorded components,
which ``xla-pcache explain`` compares) and counted: ``OtherBuilds`` finds, after a miss,
whether another build, or a release that did not record builds, has an entry of the same
framework key (``other_build`` in ``stats``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from xla_pcache import _core
from xla_pcache._text import package_logger
from xla_pcache.misslog import BUILD_SEPARATOR, META_COMPONENTS, encode, read_misses

logger = package_logger("xla_pcache")

# The key component a build is recorded as (in entries' metadata and the miss log).
COMPONENT = "runtime build"
DIGEST_HEX = 32
# What ``OtherBuilds.find`` answers for an entry from before keys carried a build.
UNRECORDED = "unrecorded"


@dataclasses.dataclass(frozen=True)
class FileIdentity:
    role: str  # "jaxlib", "libtpu", "torch_xla", "jax_plugins.xla_cuda12", ...
    name: str  # its path within the role's directory ("cpu/_lapack.so")
    path: str
    kind: str  # "build-id" or "blake3"
    id: str  # hex
    changed_ns: int  # its ctime: when it was installed
    computed: bool  # hashed or read by this call, not found in the user's record
    loaded: str  # "no", "same" or "replaced" (mapped here, but not the file at the path)
    size: int = 0


@dataclasses.dataclass(frozen=True)
class Build:
    """One framework's runtime build, as this process has it."""

    framework: str
    digest: str
    files: tuple[FileIdentity, ...] = ()
    # Files that could not be read (their message): they count in the digest as unreadable.
    unreadable: tuple[str, ...] = ()
    # How many times the user's record was refused (hostile or garbled) while reading it.
    record_problems: int = 0
    # Where the user's record of identities is (read from or written to), or None.
    record_dir: str | None = None
    # The directories tried before it that could not be used, each with why.
    record_skipped: tuple[str, ...] = ()
    # Why identities this process computed are remembered nowhere (every process then
    # computes them again), or None.
    record_unkept: str | None = None

    @property
    def suffix(self) -> str:
        """What the store's keys of this build end with."""
        return BUILD_SEPARATOR + self.digest

    def store_key(self, key: str) -> str:
        """The store's key for the framework's ``key`` compiled by this build."""
        return key + BUILD_SEPARATOR + self.digest

    @property
    def replaced(self) -> list[str]:
        """Files this process has loaded that are no longer the files at their path (an
        install over a running process): its executables are of a build nobody can name."""
        return [f.path for f in self.files if f.loaded == "replaced"]

    @property
    def installed_ns(self) -> int:
        """When the newest of its files was installed (its ctime), in ns since the epoch."""
        return max((f.changed_ns for f in self.files), default=0)

    @property
    def hashed(self) -> int:
        """Files hashed by this process (not found in the user's record)."""
        return sum(1 for f in self.files if f.computed)

    @property
    def hashed_bytes(self) -> int:
        """Bytes of the files this process hashed or read for their build-id."""
        return sum(f.size for f in self.files if f.computed)

    @property
    def rehashed(self) -> bool:
        """Whether this process computed identities it could keep nowhere: every process
        started as this one was pays their hash again."""
        return self.record_unkept is not None and self.hashed > 0

    def roles(self) -> dict[str, dict[str, Any]]:
        """Per role: its main file (the largest) and that file's identity, how many files,
        and a digest of them all. What explain and doctor show."""
        out: dict[str, dict[str, Any]] = {}
        for role in sorted({f.role for f in self.files}):
            mine = [f for f in self.files if f.role == role]
            main = max(mine, key=lambda f: (f.size, f.name))
            out[role] = {
                "file": main.name,
                "id": f"{main.kind} {main.id}",
                "files": len(mine),
                "digest": _digest(role, mine)[:16],
            }
        for message in self.unreadable:
            out.setdefault("unreadable", {"files": 0, "messages": []})
            out["unreadable"]["files"] += 1
            out["unreadable"]["messages"].append(message[:200])
        return out

    def component(self) -> dict[str, Any]:
        """This build as a key component (``misslog``'s format)."""
        return {"name": COMPONENT, "digest": self.digest, "value": self.roles()}


def _digest(framework: str, files: Iterable[FileIdentity], unreadable: Iterable[str] = ()) -> str:
    h = hashlib.sha256(f"xla_pcache build v1\0{framework}\0".encode())
    for f in sorted(files, key=lambda f: (f.role, f.name)):
        h.update(f"{f.role}\0{f.name}\0{f.kind}\0{f.id}\n".encode())
    for message in sorted(unreadable):
        h.update(f"unreadable\0{message}\n".encode())
    return h.hexdigest()[:DIGEST_HEX]


# (role, path, name within the role's directory)
Wanted = tuple[str, str, str]

_SKIP_DIRS = frozenset({"include", "__pycache__"})
# A package holding more shared objects than this is not one of the frameworks': the rest is
# ignored.
_MAX_FILES = 512


def package_dirs(name: str) -> list[str]:
    """The directories of the package ``name``, found as ``import`` would find them, without
    importing it; empty when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [str(p) for p in spec.submodule_search_locations]


def shared_objects(role: str, top: str, prefix: str = "") -> list[Wanted]:
    """Every shared object under ``top`` (headers and caches left out), named by its path
    below ``top`` (after ``prefix``)."""
    out: list[Wanted] = []
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for f in sorted(files):
            if f.endswith(".so") or ".so." in f:
                path = os.path.join(root, f)
                out.append((role, path, os.path.join(prefix, os.path.relpath(path, top))))
                if len(out) >= _MAX_FILES:
                    return out
    return out


def unique(wanted: list[Wanted]) -> list[Wanted]:
    """``wanted`` without a path named twice (the first kept)."""
    seen: set[str] = set()
    out = []
    for item in wanted:
        if item[1] not in seen:
            seen.add(item[1])
            out.append(item)
    return out


def identify(framework: str, wanted: list[Wanted], record_dir: str | None = None) -> Build:
    """The build made of the files ``wanted``. Never raises for what is on disk: a file that
    cannot be read counts as unreadable (a warning). ``record_dir``: the user's record of
    identities, and no other (default ``$XDG_CACHE_HOME/xla_pcache-builds``, else a
    directory of this user's own on this host where that cannot be written). Identities
    computed that can be remembered nowhere are one warning per framework and process."""
    found, problems, (kept_in, skipped, unkept) = _core.identify_binaries(
        [path for _, path, _ in wanted], record_dir
    )
    files: list[FileIdentity] = []
    unreadable: list[str] = []
    for (role, path, name), got in zip(wanted, found, strict=True):
        if isinstance(got, str):
            unreadable.append(f"{role}/{name}: {got}")
            continue
        kind, hexid, changed_ns, computed, loaded, size = got
        files.append(
            FileIdentity(role, name, path, kind, hexid, int(changed_ns), computed, loaded, size)
        )
    if unreadable:
        logger.warning(
            "xla_pcache: %d file(s) of %s's runtime could not be read (%s); they count as "
            "unreadable in its build",
            len(unreadable),
            framework,
            "; ".join(unreadable[:3]),
        )
    if not files:
        logger.warning(
            "xla_pcache: no binary of %s's runtime was found; its entries are kept under a "
            "build that names none (every such installation shares them)",
            framework,
        )
    build = Build(
        framework,
        _digest(framework, files, unreadable),
        tuple(files),
        tuple(unreadable),
        int(problems),
        kept_in,
        tuple(skipped),
        unkept,
    )
    if build.rehashed and not problems:
        # A refusal warned already (the core's warning names the record and why).
        _warn_unkept(build)
    return build


_warned_unkept: set[str] = set()


def _warn_unkept(build: Build) -> None:
    """One warning per framework and process: identities were computed and could be kept
    nowhere, so every process pays this again."""
    if build.framework in _warned_unkept:
        return
    _warned_unkept.add(build.framework)
    logger.warning(
        "xla_pcache: %s's runtime binaries (%d files, %.0f MB) were hashed to name its build, "
        "and their identities cannot be remembered (%s): every process hashes them again at "
        "its first compile. Set XDG_CACHE_HOME, XDG_RUNTIME_DIR or TMPDIR to a directory "
        "this user can write (xla-pcache doctor shows where the record is looked for).",
        build.framework,
        build.hashed,
        build.hashed_bytes / 1e6,
        build.record_unkept,
    )


_counted_rehash: set[str] = set()


def count_rehash(build: Build, store: Any) -> None:
    """Counts ``build_rehashes`` in ``store`` once per framework and process, when this
    process hashed the runtime with no record to keep it in. Never raises."""
    if not build.rehashed or build.framework in _counted_rehash:
        return
    _counted_rehash.add(build.framework)
    try:
        store.count_build_rehash()
    except Exception as exc:
        logger.debug("xla_pcache: counting a rehash of the runtime failed: %s", exc)


def usable(build: Callable[[], Build]) -> tuple[Build | None, str]:
    """This process's build by ``build`` (an adapter's ``_build.build``), or None and why
    it cannot key entries: its files could not be read, or a binary this process loaded was
    replaced on disk since (an install over a running program), so its executables are of a
    build nothing names; an entry filed under the wrong build is the one thing not to write."""
    try:
        found = build()
    except Exception as exc:
        return None, f"its runtime's build could not be identified ({type(exc).__name__}: {exc})"
    if not found.replaced:
        return found, ""
    return None, (
        "this process runs binaries replaced on disk since it loaded them ("
        + ", ".join(found.replaced[:3])
        + "): its executables are of a build nothing names"
    )


def split_key(key: str) -> tuple[str, str | None]:
    """(the framework's key, the build's digest) of a store key; None: no build (an entry
    written before keys carried one)."""
    head, sep, digest = key.rpartition(BUILD_SEPARATOR)
    if sep and len(digest) == DIGEST_HEX and all(c in "0123456789abcdef" for c in digest):
        return head, digest
    return key, None


def with_component(parts: dict[str, Any] | None, build: Build) -> dict[str, Any] | None:
    """Recorded components (``misslog``'s format) with the build's added; None stays None
    (nothing was recorded to compare with)."""
    if parts is None:
        return None
    components = [c for c in parts.get("components", []) if c.get("name") != COMPONENT]
    return {**parts, "components": [*components, build.component()]}


def meta_with_component(meta: dict[str, str], build: Build) -> dict[str, str]:
    """Entry metadata with the build added to its recorded components (when it has any)."""
    raw = meta.get(META_COMPONENTS)
    if raw is None:
        return meta
    try:
        parts = json.loads(raw)
        added = with_component(parts, build)
    except (ValueError, AttributeError, TypeError):
        return meta
    return {**meta, META_COMPONENTS: encode(added)} if added is not None else meta


class OtherBuilds:
    """After a miss: whether another build has an entry of the same framework key.

    A key holds its build, so the other builds' entries cannot be listed by key; their
    digests are learned from the cache's miss log (every build that wrote an entry missed
    it first, and its miss record's key names its build), read at most once a minute and
    only on a miss, and each then asked for the key (``contains``: one header read). An
    entry under the bare framework key is one from before keys carried a build."""

    REFRESH_S = 60.0
    MAX_BUILDS = 16

    def __init__(self, own: Build) -> None:
        self._own = own.digest
        self._lock = threading.Lock()
        self._known: list[str] = []
        self._read_at: float | None = None

    def _builds(self, store: Any) -> list[str]:
        now = time.monotonic()
        with self._lock:
            if self._read_at is not None and now - self._read_at < self.REFRESH_S:
                return self._known
            self._read_at = now
        seen: dict[str, None] = {}
        try:
            for record in reversed(read_misses(store.path)):
                digest = split_key(str(record["key"]))[1]
                if digest is not None and digest != self._own:
                    seen.setdefault(digest, None)
                    if len(seen) >= self.MAX_BUILDS:
                        break
        except (OSError, ValueError) as exc:
            logger.debug("xla_pcache: reading the miss log for other builds failed: %s", exc)
        with self._lock:
            self._known = list(seen)
            return self._known

    def find(self, store: Any, key: str) -> str | None:
        """The other build (its digest, or ``UNRECORDED``) whose entry of the framework's
        ``key`` the store holds; None when there is none. Never raises."""
        try:
            if key in store:
                return UNRECORDED
            for digest in self._builds(store):
                if f"{key}{BUILD_SEPARATOR}{digest}" in store:
                    return digest
        except Exception as exc:
            logger.debug("xla_pcache: looking for other builds' entries failed: %s", exc)
        return None

    def count(self, store: Any, key: str) -> str | None:
        """``find``, and the miss counted as ``other_build`` when it finds one."""
        other = self.find(store, key)
        if other is not None:
            try:
                store.count_other_build()
            except Exception as exc:
                logger.debug("xla_pcache: counting another build's miss failed: %s", exc)
        return other
