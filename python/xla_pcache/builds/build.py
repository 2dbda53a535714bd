"""One build of a framework's runtime: its files' identities and the digest over them, and
the build as one of a key's recorded components (what ``xla-pcache explain`` compares).

The digest is over each file's identity (the GNU build-id note, else the BLAKE3 of its
content: ``identities``) together with its role (``jaxlib``, ``libtpu``, ...) and its name
within the role's directory: the same binaries installed at another path are the same build.
It is as long as a key carries (``build_key``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from xla_pcache import build_key
from xla_pcache.misslog import META_COMPONENTS, encode

# The key component a build is recorded as (in entries' metadata and the miss log).
COMPONENT = "runtime build"


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

    def __post_init__(self) -> None:
        # Every key of this build carries its digest: one that is not a build's would
        # make keys nothing can read back.
        if not build_key.is_build(self.digest):
            raise ValueError(f"digest must be a build's ({build_key.DIGEST_HEX} lowercase hex)")

    @property
    def suffix(self) -> str:
        """What the store's keys of this build end with (``build_key.suffix``)."""
        return build_key.suffix(self.digest)

    def store_key(self, key: str) -> str:
        """The store's key for the framework's ``key`` compiled by this build
        (``build_key.join``)."""
        return build_key.join(key, self.digest)

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
                "digest": digest_of(role, mine)[:16],
            }
        for message in self.unreadable:
            out.setdefault("unreadable", {"files": 0, "messages": []})
            out["unreadable"]["files"] += 1
            out["unreadable"]["messages"].append(message[:200])
        return out

    def component(self) -> dict[str, Any]:
        """This build as a key component (``misslog``'s format)."""
        return {"name": COMPONENT, "digest": self.digest, "value": self.roles()}


def digest_of(framework: str, files: Iterable[FileIdentity], unreadable: Iterable[str] = ()) -> str:
    """The build of ``framework`` made of ``files`` (and of files that could not be read)."""
    h = hashlib.sha256(f"xla_pcache build v1\0{framework}\0".encode())
    for f in sorted(files, key=lambda f: (f.role, f.name)):
        h.update(f"{f.role}\0{f.name}\0{f.kind}\0{f.id}\n".encode())
    for message in sorted(unreadable):
        h.update(f"unreadable\0{message}\n".encode())
    return h.hexdigest()[: build_key.DIGEST_HEX]


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
