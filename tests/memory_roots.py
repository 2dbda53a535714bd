"""Jobs limited in memory, for the tests of ``xla_pcache._memory`` and what reads it: trees of
files laid out as the kernel lays out ``/proc`` and the cgroup file systems (a root the
module reads in place of ``/``), and a real cgroup where this machine lets a test make one.

``limited_job`` gives a job of a given limit to start processes in: a real nested cgroup
(v2 where the memory controller can be delegated to it, else v1's memory controller) when
the tests run as root with one writable, else a laid-out root of the same shape that a test
build reads through the test hooks' directory (``_testhook.directory``). Either way the
same assertions hold, so a test of a limited job runs everywhere and never skips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import hooks_env

MIB = 1 << 20
GIB = 1 << 30
# v1's "unlimited": the largest page count its counters hold, in bytes.
V1_UNLIMITED = "9223372036854771712"

# Mount lines as a kernel writes them (``/proc/self/mountinfo``).
ROOT_FS = "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw,discard"
V2_HOST = (
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot"
)
V2_CONTAINER = (
    "612 603 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup "
    "rw,nsdelegate,memory_recursiveprot"
)
V2_HYBRID = (
    "30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 "
    "cgroup2 rw,nsdelegate"
)
V1_TMPFS = "25 21 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:4 - tmpfs tmpfs ro,mode=755"
V1_CPU = (
    "33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - "
    "cgroup cgroup rw,cpu,cpuacct"
)
V1_MEMORY = (
    "35 25 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup "
    "cgroup rw,memory"
)


def v1_memory_mount(root: str, point: str = "/sys/fs/cgroup/memory") -> str:
    """v1's memory controller mounted at ``point`` from ``root`` in its hierarchy."""
    return (
        f"1193 1186 0:32 {root} {point} ro,nosuid,nodev,noexec,relatime master:15 - cgroup "
        "cgroup rw,memory"
    )


def meminfo(total: int = 16 * GIB, available: int = 12 * GIB) -> str:
    return (
        f"MemTotal:       {total // 1024} kB\nMemFree:         {available // 2048} kB\n"
        f"MemAvailable:   {available // 1024} kB\nBuffers:          123456 kB\n"
    )


def v1_stat(hierarchical: int | str = V1_UNLIMITED, inactive: int = 0) -> str:
    return (
        f"cache 0\nrss 0\ninactive_file {inactive}\nhierarchical_memory_limit {hierarchical}\n"
        f"hierarchical_memsw_limit {V1_UNLIMITED}\ntotal_cache 0\n"
        f"total_inactive_file {inactive}\n"
    )


def v2_stat(inactive: int = 0) -> str:
    return f"anon 0\nfile 0\nactive_file 0\ninactive_file {inactive}\nslab 0\n"


def lay_out(root: Path, files: dict[str, str | bytes]) -> Path:
    """``files`` (absolute paths in the laid-out system, and their contents) under ``root``."""
    for name, content in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def proc(cgroup: str, mounts: list[str], memory: str | None = None) -> dict[str, str]:
    """``/proc``'s three files: this process's cgroups, its mounts, the host's memory."""
    return {
        "/proc/self/cgroup": cgroup,
        "/proc/self/mountinfo": "\n".join(mounts) + "\n",
        "/proc/meminfo": meminfo() if memory is None else memory,
    }


@dataclasses.dataclass(frozen=True)
class Job:
    """Where to start a process limited to ``limit`` bytes: ``argv(...)`` in the
    environment ``env``; the limit is found at ``cgroup`` (cgroup ``version``), and the host
    has ``host_total`` bytes. ``real``: a cgroup of this machine's kernel."""

    prefix: tuple[str, ...]
    env: dict[str, str]
    cgroup: str
    version: int
    limit: int
    host_total: int
    real: bool

    def argv(self, *argv: str) -> list[str]:
        return [*self.prefix, *argv]


def _own_cgroup_dirs() -> Iterator[tuple[int, Path, str]]:
    """(version, directory, path in its hierarchy) of this process's cgroups that could
    limit memory, v2 first, where its hierarchy is mounted from its root."""
    own: dict[int, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        ident, controllers, path = line.split(":", 2)
        if ident == "0" and not controllers:
            own.setdefault(2, path)
        elif "memory" in controllers.split(","):
            own.setdefault(1, path)
    mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for version in (2, 1):
        for fields in mounts:
            sep = fields.index("-")
            kind, supers = fields[sep + 1], fields[sep + 3].split(",")
            if (kind == "cgroup2") != (version == 2) or (version == 1 and "memory" not in supers):
                continue
            if version in own and fields[3] == "/" and kind in ("cgroup", "cgroup2"):
                yield version, Path(fields[4] + own[version]), own[version]
                break


def _remove(*dirs: Path) -> None:
    for d in dirs:
        for _ in range(100):  # its processes exited: the kernel lets it go within moments
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


def _real_job(limit: int) -> Iterator[Job | None]:
    """A nested cgroup of this machine (an outer one limited to ``limit``, the process in
    one inside it, which has no limit of its own), or None where it cannot be made."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        yield None
        return
    for version, own, path in _own_cgroup_dirs():
        name = f"xla-pcache-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        outer, inner = own / name, own / name / "step"
        try:
            outer.mkdir()
        except OSError:
            continue
        try:
            if version == 2:
                if not (outer / "memory.max").exists():
                    (own / "cgroup.subtree_control").write_text("+memory")
                (outer / "memory.max").write_text(str(limit))
                (outer / "cgroup.subtree_control").write_text("+memory")
            else:
                (outer / "memory.limit_in_bytes").write_text(str(limit))
            inner.mkdir()
            prefix = ("/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(inner / "cgroup.procs"))
            moved = subprocess.run(
                [*prefix, "cat", "/proc/self/cgroup"], capture_output=True, text=True, check=False
            )
            if moved.returncode != 0 or f"{path.rstrip('/')}/{name}/step" not in moved.stdout:
                raise OSError(f"a process is not moved into {inner}: {moved.stderr}")
        except OSError:
            _remove(inner, outer)
            continue
        try:
            host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            yield Job(prefix, {}, f"{path.rstrip('/')}/{name}", version, limit, host, True)
        finally:
            _remove(inner, outer)
        return
    yield None


def fake_job_root(root: Path, limit: int, use: int, host_total: int = 16 * GIB) -> str:
    """A laid-out v1 host of ``host_total`` bytes whose process is in a cgroup without a
    limit inside one limited to ``limit`` with ``use`` used (a Slurm step in its job); the
    limit's cgroup path."""
    job = "/slurm/uid_0/job_7"
    lay_out(
        root,
        {
            **proc(
                f"12:pids:{job}/step_0\n5:memory:{job}/step_0\n1:cpu,cpuacct:{job}/step_0\n",
                [ROOT_FS, V1_TMPFS, V1_CPU, V1_MEMORY],
                meminfo(host_total, host_total * 3 // 4),
            ),
            f"/sys/fs/cgroup/memory{job}/memory.limit_in_bytes": f"{limit}\n",
            f"/sys/fs/cgroup/memory{job}/memory.usage_in_bytes": f"{use}\n",
            f"/sys/fs/cgroup/memory{job}/memory.stat": v1_stat(limit),
            f"/sys/fs/cgroup/memory{job}/step_0/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            f"/sys/fs/cgroup/memory{job}/step_0/memory.usage_in_bytes": f"{use}\n",
            f"/sys/fs/cgroup/memory{job}/step_0/memory.stat": v1_stat(limit),
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
        },
    )
    return job


@contextlib.contextmanager
def limited_job(tmp: Path, limit: int, fake_use: int = 300 * MIB) -> Iterator[Job]:
    """A job limited to ``limit`` bytes: a real cgroup where this machine allows it, else a
    laid-out one (``fake_use`` bytes used) read through the test hooks of ``tmp/hooks``
    (every hold point there goes on at once)."""
    made = _real_job(limit)
    real = next(made)
    try:
        if real is not None:
            yield real
            return
        hooks = tmp / "hooks"
        shutil.rmtree(hooks, ignore_errors=True)
        hooks.mkdir(parents=True)
        for point in ("claimed", "compile-ahead-take", "bucket-claimed"):
            (hooks / f"{point}.go").touch()
        from xla_pcache._memory import ROOT_HOOK

        cgroup = fake_job_root(hooks / ROOT_HOOK, limit, fake_use)
        yield Job((), hooks_env(hooks), cgroup, 1, limit, 16 * GIB, False)
    finally:
        made.close()
