"""The memory this job may use: the host's (``/proc/meminfo``) and the limit of every cgroup
over this process, wherever the job's limit is set.

A job's limit is often not on the cgroup a process sees as its own root: a Slurm step, a
systemd unit's ``MemoryMax=``, a container started without its own cgroup namespace
(``docker --cgroupns=host``) or any cgroup v1 machine put the process in a cgroup nested in
the hierarchy, and the limit on any ancestor applies. So the process's own cgroup is read
from ``/proc/self/cgroup`` (the v2 line ``0::<path>``, v1's line naming ``memory``), found
under the mounts of ``/proc/self/mountinfo`` (a mount's root is where in the hierarchy it
starts: ``/`` for a whole hierarchy or inside a cgroup namespace, the job's own cgroup when
only that was mounted), and every cgroup from it up to the mount is read: v2's
``memory.max`` and ``memory.high``, v1's ``memory.limit_in_bytes`` (unlimited is a number
near 2^63 there), and v1's ``hierarchical_memory_limit`` (``memory.stat``), which also
covers ancestors above the mount. A hybrid machine (v1 controllers and a v2 hierarchy both
mounted) is read in both. A cgroup's use is what it is charged less its inactive file cache
(which the kernel reclaims before it fails an allocation, as ``MemAvailable`` counts it).

What is available is the least of the host's ``MemAvailable`` and each limit less its use;
the job's memory is the least of the host's and each limit. Everything is read as untrusted
text (a tree laid out under another root is one a test wrote): regular files only, never
through a link at the file, at most a bounded number of bytes each; a file that is not one,
too long, or not parsed is "no limit known" from it, never an exception.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterator

from xla_pcache import _testhook

# Where a test build reads its tree from, under the test hooks' directory (``_testhook``).
ROOT_HOOK = "memory-root"

# Bytes read of a file at most: a number, ``memory.stat`` (about 1.5 KB on 6.x kernels),
# ``/proc/meminfo``, ``/proc/self/cgroup``, and the mount table (thousands of mounts on a
# busy host are some hundreds of KB). A longer file is refused, not cut short.
_MAX_NUMBER = 64
_MAX_STAT = 64 << 10
_MAX_CGROUP = 64 << 10
_MAX_MOUNTS = 4 << 20
# Cgroups read up one hierarchy at most, and the lines of /proc/self/cgroup kept.
_MAX_DEPTH = 64
_MAX_CGROUP_LINES = 64
# At or above this a limit is none: v1 writes "unlimited" as the largest page count its
# counters hold, in bytes (2^63 less a page); no machine has 4 EiB.
_UNLIMITED = 1 << 62


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """One cgroup's memory limit over this process.

    ``version``: 1 or 2. ``cgroup``: its path in its hierarchy, as this process's cgroup
    namespace shows it (``/`` at the namespace's root). ``directory``: where its files were
    read. ``source``: the file the limit is from. ``limit``, ``use``: bytes; ``use`` is
    what the cgroup is charged less its inactive file cache, None when unreadable."""

    version: int
    cgroup: str
    directory: str
    source: str
    limit: int
    use: int | None

    @property
    def room(self) -> int:
        """The limit less the use (the limit when the use is unknown), at least 0."""
        return max(0, self.limit - (self.use or 0))


@dataclasses.dataclass(frozen=True, slots=True)
class Memory:
    """The host's memory (bytes; None when unknown) and the cgroup limits over this process
    (every one found, from the process's own cgroup up, v2's before v1's)."""

    host_total: int | None
    host_available: int | None
    limits: tuple[Limit, ...]

    def tightest(self) -> Limit | None:
        """The limit with the least room, or None when no cgroup limits this process."""
        return min(self.limits, key=lambda lim: lim.room, default=None)

    def available(self) -> int | None:
        """What this process may still take: the least of the host's ``MemAvailable`` and
        every limit's room; None when none of them is known."""
        found = [lim.room for lim in self.limits]
        if self.host_available is not None:
            found.append(self.host_available)
        return min(found, default=None)

    def total(self) -> int | None:
        """The job's memory: the least of the host's and every limit; None when unknown."""
        found = [lim.limit for lim in self.limits]
        if self.host_total is not None:
            found.append(self.host_total)
        return min(found, default=None)


def default_root() -> str:
    """``/``; in a test build with the test hooks on, their ``memory-root`` when it exists."""
    return _testhook.directory(ROOT_HOOK) or "/"


def read(root: str | None = None) -> Memory:
    """What ``root`` (default ``default_root()``) says of this process's memory."""
    base = default_root() if root is None else root
    total, available = _host(base)
    return Memory(total, available, tuple(_limits(base)))


def available(root: str | None = None) -> int | None:
    """``read(root).available()``."""
    return read(root).available()


def total(root: str | None = None) -> int | None:
    """``read(root).total()``."""
    return read(root).total()


# ---- reading files


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _read(path: str, limit: int) -> bytes | None:
    """The whole of a regular file of at most ``limit`` bytes (not through a link at it);
    None for anything else."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        # Procfs and cgroupfs files say size 0: read to the end, one more byte than allowed.
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 16))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _number(data: bytes | None) -> int | None:
    """A count of bytes as the kernel writes it (decimal digits and a newline); None for
    anything else, ``max`` included."""
    if data is None:
        return None
    text = data.strip()
    if not text.isdigit() or len(text) > 20:  # bytes.isdigit: ASCII digits only
        return None
    return int(text)


def _fields(data: bytes | None) -> dict[bytes, int]:
    """``name value`` lines (``memory.stat``; ``/proc/meminfo``'s ``Name: value kB``) whose
    value is a number; the first of each name."""
    out: dict[bytes, int] = {}
    for line in (data or b"").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit() and len(parts[1]) <= 20:
            out.setdefault(parts[0].rstrip(b":"), int(parts[1]))
    return out


def _host(root: str) -> tuple[int | None, int | None]:
    """The host's ``MemTotal`` and ``MemAvailable`` (bytes); the total from ``sysconf`` where
    there is no ``/proc/meminfo``."""
    info = _fields(_read(_under(root, "/proc/meminfo"), _MAX_STAT))
    total = info.get(b"MemTotal")
    avail = info.get(b"MemAvailable")
    if total is not None:
        return total * 1024, None if avail is None else avail * 1024
    if root != "/":
        return None, None
    try:
        return max(0, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) or None, None
    except (AttributeError, ValueError, OSError):
        return None, None


# ---- where this process's cgroups are


def _unescape(field: bytes) -> str:
    """A path of the mount table, whose spaces, tabs, newlines and backslashes are written
    as octal escapes (``\\040``)."""
    out = bytearray()
    i = 0
    while i < len(field):
        octal = field[i + 1 : i + 4]
        if field[i] == 0x5C and len(octal) == 3 and all(0x30 <= c <= 0x37 for c in octal):
            out.append(int(octal, 8) & 0xFF)
            i += 4
        else:
            out.append(field[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


@dataclasses.dataclass(frozen=True, slots=True)
class _Mount:
    version: int
    root: str
    point: str


def _mounts(root: str) -> list[_Mount]:
    """The cgroup2 mounts and cgroup v1 mounts of the memory controller."""
    data = _read(_under(root, "/proc/self/mountinfo"), _MAX_MOUNTS)
    out: list[_Mount] = []
    for line in (data or b"").splitlines():
        # id parent major:minor root point options [optional...] - type source super
        fields = line.split()
        try:
            sep = fields.index(b"-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 4:
            continue
        kind, supers = fields[sep + 1], fields[sep + 3].split(b",")
        if kind == b"cgroup2":
            version = 2
        elif kind == b"cgroup" and b"memory" in supers:
            version = 1
        else:
            continue
        out.append(_Mount(version, _unescape(fields[3]), _unescape(fields[4])))
    return out


def _own_cgroups(root: str) -> dict[int, str]:
    """This process's cgroup path in each hierarchy that may limit memory: 2 for the
    unified one, 1 for v1's memory controller."""
    data = _read(_under(root, "/proc/self/cgroup"), _MAX_CGROUP)
    out: dict[int, str] = {}
    for line in (data or b"").splitlines()[:_MAX_CGROUP_LINES]:
        parts = line.split(b":", 2)
        if len(parts) != 3:
            continue
        ident, controllers, path = parts
        if ident == b"0" and controllers == b"":
            version = 2
        elif b"memory" in controllers.split(b","):
            version = 1
        else:
            continue
        out.setdefault(version, path.decode("utf-8", "surrogateescape"))
    return out


def _parts(path: str) -> list[str] | None:
    """The names of an absolute cgroup path; None for one that is not plainly below its
    root (``/../x``: a cgroup outside this process's namespace; `` (deleted)``)."""
    if not path.startswith("/") or "\0" in path:
        return None
    names = [n for n in path.split("/") if n]
    if any(n in (".", "..") for n in names) or path.endswith(" (deleted)"):
        return None
    return names


def _levels(mount: _Mount, cgroup: str) -> list[tuple[str, str]] | None:
    """Each cgroup from ``cgroup`` up to ``mount``'s root, as (path in the hierarchy,
    directory under the mount point); None when ``cgroup`` is not under the mount."""
    names, top = _parts(cgroup), _parts(mount.root)
    if names is None or top is None or names[: len(top)] != top:
        return None
    below = names[len(top) :]
    if len(below) > _MAX_DEPTH:
        return None
    return [
        ("/" + "/".join(names[: len(top) + i]), "/".join([mount.point.rstrip("/"), *below[:i]]))
        for i in range(len(below), -1, -1)
    ]


def _limits(root: str) -> Iterator[Limit]:
    own = _own_cgroups(root)
    mounts = _mounts(root)
    for version in (2, 1):
        cgroup = own.get(version)
        if cgroup is None:
            continue
        # The mount whose root is deepest in the hierarchy above this cgroup (a bind mount
        # of the job's own cgroup over one of the whole hierarchy).
        candidates = [
            (len(m.root), levels)
            for m in mounts
            if m.version == version and (levels := _levels(m, cgroup)) is not None
        ]
        for _, levels in sorted(candidates, key=lambda c: -c[0]):
            if os.path.isdir(_under(root, levels[0][1])):
                yield from (_v2 if version == 2 else _v1)(root, levels)
                break


def _v2(root: str, levels: list[tuple[str, str]]) -> Iterator[Limit]:
    for cgroup, directory in levels:
        where = _under(root, directory)
        found = [
            (name, value)
            for name in ("memory.max", "memory.high")
            if (value := _number(_read(os.path.join(where, name), _MAX_NUMBER))) is not None
            and value < _UNLIMITED
        ]
        if not found:
            continue
        source, limit = min(found, key=lambda f: f[1])
        use = _use(where, "memory.current", b"inactive_file")
        yield Limit(2, cgroup, directory, source, limit, use)


def _v1(root: str, levels: list[tuple[str, str]]) -> Iterator[Limit]:
    seen: list[int] = []
    for cgroup, directory in levels:
        where = _under(root, directory)
        limit = _number(_read(os.path.join(where, "memory.limit_in_bytes"), _MAX_NUMBER))
        if limit is None or limit >= _UNLIMITED:
            continue
        seen.append(limit)
        use = _use(where, "memory.usage_in_bytes", b"total_inactive_file")
        yield Limit(1, cgroup, directory, "memory.limit_in_bytes", limit, use)
    # The least limit of every ancestor, those above the mount included: counted when no
    # cgroup read above says as much (its use then is the process's own cgroup's).
    cgroup, directory = levels[0]
    where = _under(root, directory)
    hierarchical = _fields(_read(os.path.join(where, "memory.stat"), _MAX_STAT)).get(
        b"hierarchical_memory_limit"
    )
    if hierarchical is not None and hierarchical < min(seen, default=_UNLIMITED):
        use = _use(where, "memory.usage_in_bytes", b"total_inactive_file")
        yield Limit(1, cgroup, directory, "hierarchical_memory_limit", hierarchical, use)


def _use(where: str, charged: str, inactive: bytes) -> int | None:
    """What a cgroup is charged less its inactive file cache (v2's ``memory.stat`` counts
    its children's, v1's under ``total_``)."""
    used = _number(_read(os.path.join(where, charged), _MAX_NUMBER))
    if used is None:
        return None
    cache = _fields(_read(os.path.join(where, "memory.stat"), _MAX_STAT)).get(inactive, 0)
    return max(0, used - min(cache, used))
