"""The job's memory (``xla_pcache._memory``): the host's and every cgroup limit over the
process, read from roots laid out exactly as the kernel lays out ``/proc`` and the cgroup
file systems (cgroup v2 in its own namespace, v2 nested without one as under Slurm or
systemd, v1's memory controller nested and in a container that mounts only its own cgroup, a
hybrid machine), hostile ones (garbage numbers, huge files, links, FIFOs, paths outside the
namespace), and a real cgroup where the machine lets a test make one; what loading and
compiling ahead take of it by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from xla_pcache import _memory
from xla_pcache._memory import Limit
from xla_pcache.config import Settings

from tests.helpers import clean_env, hooks_env
from tests.memory_roots import (
    GIB,
    MIB,
    ROOT_FS,
    V1_CPU,
    V1_MEMORY,
    V1_TMPFS,
    V1_UNLIMITED,
    V2_CONTAINER,
    V2_HOST,
    V2_HYBRID,
    lay_out,
    limited_job,
    proc,
    v1_memory_mount,
    v1_stat,
    v2_stat,
)

HOST_TOTAL, HOST_AVAILABLE = 16 * GIB, 12 * GIB


def v2_namespace(root: Path) -> Path:
    """A container with its own cgroup namespace (Docker's default on v2): its cgroup is
    ``/`` and its limit in the files at the mount point."""
    return lay_out(
        root,
        {
            **proc("0::/\n", [ROOT_FS, V2_CONTAINER]),
            "/sys/fs/cgroup/memory.max": f"{900 * MIB}\n",
            "/sys/fs/cgroup/memory.high": "max\n",
            "/sys/fs/cgroup/memory.current": f"{400 * MIB}\n",
            "/sys/fs/cgroup/memory.stat": v2_stat(inactive=100 * MIB),
        },
    )


def test_v2_in_its_own_namespace_reads_the_mount_points_files(tmp_path: Path) -> None:
    memory = _memory.read(str(v2_namespace(tmp_path)))
    limit = Limit(2, "/", "/sys/fs/cgroup", "memory.max", 900 * MIB, 300 * MIB)
    assert memory == _memory.Memory(HOST_TOTAL, HOST_AVAILABLE, (limit,))
    # The inactive file cache is not counted as used: the kernel reclaims it first.
    assert memory.tightest() == limit and limit.room == 600 * MIB
    assert (memory.available(), memory.total()) == (600 * MIB, 900 * MIB)


def test_v2_nested_without_a_namespace_counts_every_ancestor(tmp_path: Path) -> None:
    """A Slurm task (or a systemd unit) sees the whole hierarchy: its limits are on
    ancestors. Each counts with its own use: the least room is not the least limit."""
    job = "/system.slice/slurmstepd.scope/job_42"
    task = f"{job}/step_0/user/task_0"
    base = "/sys/fs/cgroup"
    root = lay_out(
        tmp_path,
        {
            **proc(f"0::{task}\n", [ROOT_FS, V2_HOST]),
            f"{base}{task}/memory.max": "max\n",
            f"{base}{task}/memory.current": f"{1 * GIB}\n",
            f"{base}{job}/step_0/user/memory.max": f"{2 * GIB}\n",
            f"{base}{job}/step_0/user/memory.current": f"{1 * GIB}\n",
            f"{base}{job}/step_0/memory.max": "max\n",
            f"{base}{job}/step_0/memory.high": f"{3 * GIB}\n",
            f"{base}{job}/step_0/memory.current": f"{1 * GIB + 512 * MIB}\n",
            f"{base}{job}/memory.max": f"{4 * GIB}\n",
            f"{base}{job}/memory.current": f"{3 * GIB + 512 * MIB}\n",
            f"{base}{job}/memory.stat": v2_stat(inactive=0),
            f"{base}/system.slice/memory.max": "max\n",
            f"{base}/system.slice/memory.current": f"{9 * GIB}\n",
        },
    )
    memory = _memory.read(str(root))
    assert memory.limits == (
        Limit(2, f"{job}/step_0/user", f"{base}{job}/step_0/user", "memory.max", 2 * GIB, GIB),
        Limit(2, f"{job}/step_0", f"{base}{job}/step_0", "memory.high", 3 * GIB, 3 * GIB // 2),
        Limit(2, job, f"{base}{job}", "memory.max", 4 * GIB, 7 * GIB // 2),
    )
    assert memory.tightest() == memory.limits[2]
    assert (memory.available(), memory.total()) == (GIB // 2, 2 * GIB)


def test_v1_nested_reads_the_memory_controller_up_the_tree(tmp_path: Path) -> None:
    """v1: ``memory.limit_in_bytes`` of each cgroup up to the mount (unlimited is a number
    near 2^63), use less ``total_inactive_file``."""
    job = "/slurm/uid_0/job_7"
    base = "/sys/fs/cgroup/memory"
    root = lay_out(
        tmp_path,
        {
            **proc(
                f"12:pids:{job}/step_0\n5:memory:{job}/step_0\n1:cpu,cpuacct:{job}/step_0\n",
                [ROOT_FS, V1_TMPFS, V1_CPU, V1_MEMORY],
            ),
            f"{base}{job}/step_0/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            f"{base}{job}/step_0/memory.usage_in_bytes": f"{200 * MIB}\n",
            f"{base}{job}/step_0/memory.stat": v1_stat(900 * MIB, inactive=50 * MIB),
            f"{base}{job}/memory.limit_in_bytes": f"{900 * MIB}\n",
            f"{base}{job}/memory.usage_in_bytes": f"{300 * MIB}\n",
            f"{base}{job}/memory.stat": v1_stat(900 * MIB, inactive=100 * MIB),
            f"{base}/slurm/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            f"{base}/memory.limit_in_bytes": V1_UNLIMITED + "\n",
        },
    )
    memory = _memory.read(str(root))
    # The step's hierarchical limit is its job's, read above: not counted twice.
    assert memory.limits == (
        Limit(1, job, f"{base}{job}", "memory.limit_in_bytes", 900 * MIB, 200 * MIB),
    )
    assert (memory.available(), memory.total()) == (700 * MIB, 900 * MIB)


def test_v1_in_a_container_that_mounts_its_own_cgroup_takes_the_hierarchical_limit(
    tmp_path: Path,
) -> None:
    """Docker on v1 without a cgroup namespace mounts the container's own cgroup: a limit on
    an ancestor is not there to read, but ``hierarchical_memory_limit`` says it."""
    own = "/docker/0a1b2c"
    root = lay_out(
        tmp_path,
        {
            **proc(f"4:memory:{own}\n0::/\n", [ROOT_FS, v1_memory_mount(own)]),
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GIB}\n",
            "/sys/fs/cgroup/memory/memory.stat": v1_stat(2 * GIB),
        },
    )
    memory = _memory.read(str(root))
    assert memory.limits == (
        Limit(1, own, "/sys/fs/cgroup/memory", "hierarchical_memory_limit", 2 * GIB, GIB),
    )
    assert (memory.available(), memory.total()) == (GIB, 2 * GIB)


def test_a_hybrid_machine_is_read_in_both_hierarchies(tmp_path: Path) -> None:
    """v1's controllers and a v2 hierarchy mounted side by side: the memory controller is
    v1's (the v2 cgroup has no memory files), and a v2 limit, where there is one, counts."""
    files = {
        **proc(
            "5:memory:/user.slice\n1:name=systemd:/user.slice/session-1.scope\n"
            "0::/user.slice/session-1.scope\n",
            [ROOT_FS, V1_TMPFS, V2_HYBRID, V1_CPU, V1_MEMORY],
        ),
        "/sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes": f"{900 * MIB}\n",
        "/sys/fs/cgroup/memory/user.slice/memory.usage_in_bytes": f"{100 * MIB}\n",
        "/sys/fs/cgroup/unified/user.slice/session-1.scope/cgroup.procs": "1\n",
    }
    v1 = Limit(
        1,
        "/user.slice",
        "/sys/fs/cgroup/memory/user.slice",
        "memory.limit_in_bytes",
        900 * MIB,
        100 * MIB,
    )
    assert _memory.read(str(lay_out(tmp_path / "a", files))).limits == (v1,)
    scope = "/sys/fs/cgroup/unified/user.slice/session-1.scope"
    both = lay_out(
        tmp_path / "b",
        {**files, f"{scope}/memory.max": f"{GIB}\n", f"{scope}/memory.current": f"{512 * MIB}\n"},
    )
    memory = _memory.read(str(both))
    v2 = Limit(2, "/user.slice/session-1.scope", scope, "memory.max", GIB, 512 * MIB)
    assert memory.limits == (v2, v1)
    assert memory.tightest() == v2 and memory.total() == 900 * MIB


def test_no_limit_is_the_hosts_memory_and_no_proc_is_nothing_known(tmp_path: Path) -> None:
    host = lay_out(
        tmp_path / "host",
        proc("0::/user.slice/user-0.slice\n", [ROOT_FS, V2_HOST]),
    )
    (host / "sys/fs/cgroup/user.slice/user-0.slice").mkdir(parents=True)
    memory = _memory.read(str(host))
    assert memory == _memory.Memory(HOST_TOTAL, HOST_AVAILABLE, ())
    assert (memory.tightest(), memory.available(), memory.total()) == (
        None,
        HOST_AVAILABLE,
        HOST_TOTAL,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _memory.read(str(empty)) == _memory.Memory(None, None, ())
    assert _memory.available(str(empty)) is None and _memory.total(str(empty)) is None


def _big(n: int) -> bytes:
    return b"1" * n


# Each case corrupts the namespaced v2 tree's one limit or its way there: the limit is then
# not known (the host's memory stands), and nothing raises or hangs.
HOSTILE_LIMITS: dict[str, dict[str, str | bytes]] = {
    "letters after digits": {"/sys/fs/cgroup/memory.max": "943718400abc\n"},
    "negative": {"/sys/fs/cgroup/memory.max": "-943718400\n"},
    "hex": {"/sys/fs/cgroup/memory.max": "0x38400000\n"},
    "exponent": {"/sys/fs/cgroup/memory.max": "9.4e8\n"},
    "other digits": {"/sys/fs/cgroup/memory.max": "\uff19\uff10\uff10\n"},
    "too many digits": {"/sys/fs/cgroup/memory.max": "9" * 40 + "\n"},
    "empty": {"/sys/fs/cgroup/memory.max": ""},
    "binary": {"/sys/fs/cgroup/memory.max": b"\xff\xfe\x00\x01\n"},
    "huge limit file": {"/sys/fs/cgroup/memory.max": _big(8 << 20)},
    "huge mount table": {"/proc/self/mountinfo": (V2_CONTAINER + "\n").encode() * 60000},
    "huge cgroup file": {"/proc/self/cgroup": b"0::/\n" * 20000},
    "no v2 line": {"/proc/self/cgroup": "1:memory\n0:/\n::\n"},
    "garbage mount table": {"/proc/self/mountinfo": b"\x00\xff - - -\n1 2 3\n- cgroup2\n"},
    "mount without separator": {"/proc/self/mountinfo": V2_CONTAINER.replace(" - ", " + ") + "\n"},
    "outside the namespace": {"/proc/self/cgroup": "0::/../sibling\n"},
    "deleted": {"/proc/self/cgroup": "0::/gone (deleted)\n"},
    "dot dot inside": {"/proc/self/cgroup": "0::/a/../..\n"},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_LIMITS))
def test_a_hostile_limit_is_no_limit_known(tmp_path: Path, case: str) -> None:
    root = v2_namespace(tmp_path)
    lay_out(root, HOSTILE_LIMITS[case])
    memory = _memory.read(str(root))
    assert memory.limits == () and memory.available() == HOST_AVAILABLE, memory


def test_links_fifos_and_directories_in_place_of_files_are_not_read(tmp_path: Path) -> None:
    """The kernel's files are regular files: a link at one is not followed (even to a good
    number), a FIFO is not waited on, a directory is nothing."""
    outside = tmp_path / "outside"
    outside.write_text(f"{100 * MIB}\n")
    for name, make in {
        "link": lambda p: p.symlink_to(outside),
        "fifo": os.mkfifo,
        "directory": lambda p: p.mkdir(),
    }.items():
        root = v2_namespace(tmp_path / name)
        limit = root / "sys/fs/cgroup/memory.max"
        limit.unlink()
        make(limit)
        read: list[_memory.Memory] = []
        thread = threading.Thread(target=lambda r=root, out=read: out.append(_memory.read(str(r))))
        thread.start()
        thread.join(30)
        assert read and read[0].limits == (), (name, read)
    # /proc/self/cgroup as a link to a file naming a limited cgroup: not read either.
    root = v2_namespace(tmp_path / "proc-link")
    (tmp_path / "cgroup").write_text("0::/\n")
    (root / "proc/self/cgroup").unlink()
    (root / "proc/self/cgroup").symlink_to(tmp_path / "cgroup")
    assert _memory.read(str(root)).limits == ()


def test_an_unreadable_use_keeps_the_limit_and_odd_stats_are_bounded(tmp_path: Path) -> None:
    root = v2_namespace(tmp_path / "use")
    lay_out(root, {"/sys/fs/cgroup/memory.current": "lots\n"})
    (limit,) = _memory.read(str(root)).limits
    assert (limit.limit, limit.use, limit.room) == (900 * MIB, None, 900 * MIB)
    # More inactive cache than charged (a stat read at another instant): used is 0, not
    # negative; garbage lines of the stat are skipped.
    root = v2_namespace(tmp_path / "stat")
    lay_out(root, {"/sys/fs/cgroup/memory.stat": f"junk\ninactive_file x\n{v2_stat(GIB)}"})
    (limit,) = _memory.read(str(root)).limits
    assert (limit.use, limit.room) == (0, 900 * MIB)
    # A /proc/meminfo of garbage: the host's memory is unknown, the limit still counts.
    root = v2_namespace(tmp_path / "meminfo")
    lay_out(root, {"/proc/meminfo": "MemTotal: lots kB\nMemAvailable: -1 kB\n"})
    memory = _memory.read(str(root))
    assert (memory.host_total, memory.host_available) == (None, None)
    assert (memory.total(), memory.available()) == (900 * MIB, 600 * MIB)


def test_a_mount_point_with_escaped_spaces_and_a_deep_tree(tmp_path: Path) -> None:
    """The mount table escapes a space as ``\\040``; a cgroup 100 levels down is past the
    bound of levels read and gives no limit (its ancestors' limits are not guessed at)."""
    mount = V2_HOST.replace("/sys/fs/cgroup", "/mnt/cg\\040two")
    root = lay_out(
        tmp_path / "space",
        {
            **proc("0::/job\n", [ROOT_FS, mount]),
            "/mnt/cg two/job/memory.max": f"{GIB}\n",
            "/mnt/cg two/job/memory.current": f"{GIB // 4}\n",
        },
    )
    assert _memory.read(str(root)).limits == (
        Limit(2, "/job", "/mnt/cg two/job", "memory.max", GIB, GIB // 4),
    )
    deep = "/" + "/".join(["d"] * 100)
    root = lay_out(
        tmp_path / "deep",
        {**proc(f"0::{deep}\n", [ROOT_FS, V2_HOST]), "/sys/fs/cgroup/d/memory.max": f"{GIB}\n"},
    )
    (root / f"sys/fs/cgroup{deep}").mkdir(parents=True, exist_ok=True)
    assert _memory.read(str(root)).limits == ()


def test_what_loading_and_compiling_ahead_take_is_a_quarter_of_the_jobs_memory() -> None:
    default = Settings()
    # A job of 900 MiB: a quarter of it, not of the host's.
    assert default.compile_ahead_reserve(900 * MIB) == 225 * MIB
    assert default.prefetch_memory_bound(900 * MIB) == 225 * MIB
    # A large host: loading ahead holds 1 GiB at most.
    assert default.compile_ahead_reserve(64 * GIB) == 16 * GIB
    assert default.prefetch_memory_bound(64 * GIB) == GIB
    # Set, the variables win whatever the job's memory.
    set_ = Settings(compile_ahead_memory=GIB, prefetch_memory=2 * GIB)
    assert set_.compile_ahead_reserve(900 * MIB) == GIB
    assert set_.prefetch_memory_bound(900 * MIB) == 2 * GIB
    # Read from this machine when not given: at most a quarter of its memory.
    total = _memory.total()
    assert total is not None and default.compile_ahead_reserve() == total // 4


# Prints what the module reads in this process, and what it takes from it, as JSON.
READ_PROGRAM = """
import dataclasses, json
from xla_pcache import _memory
from xla_pcache.config import Settings
memory = _memory.read()
print(json.dumps({
    "limits": [dataclasses.asdict(lim) for lim in memory.limits],
    "tightest": None if memory.tightest() is None else dataclasses.asdict(memory.tightest()),
    "host_total": memory.host_total,
    "reserve": Settings().compile_ahead_reserve(),
}))
"""


def test_a_process_in_a_limited_job_finds_its_limit(tmp_path: Path) -> None:
    """A fresh process in a job limited to 900 MiB (a real nested cgroup where this machine
    allows: the process in one without a limit inside the limited one) finds the limit on
    its ancestor and keeps a quarter of it free."""
    with limited_job(tmp_path, 900 * MIB) as job:
        out = subprocess.run(
            job.argv(sys.executable, "-c", READ_PROGRAM),
            env=clean_env(**job.env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    tightest = found["tightest"]
    assert tightest is not None, (job, found)
    assert (tightest["version"], tightest["cgroup"], tightest["limit"]) == (
        job.version,
        job.cgroup,
        900 * MIB,
    ), (job, found)
    assert 0 < tightest["use"] < 900 * MIB and found["host_total"] == job.host_total
    assert found["reserve"] == 225 * MIB


def test_the_laid_out_root_is_read_only_under_the_test_hooks(tmp_path: Path) -> None:
    """A test build reads the hooks' ``memory-root`` in place of ``/``; without the hooks
    variable the same process reads this machine."""
    from tests.memory_roots import fake_job_root

    hooks = tmp_path / "hooks"
    fake_job_root(hooks / _memory.ROOT_HOOK, 512 * MIB, 100 * MIB)
    code = "from xla_pcache import _memory; print(_memory.total())"
    for env, expected in ((hooks_env(hooks), 512 * MIB), ({}, _memory.total("/"))):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=clean_env(**env),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert int(out.stdout) == expected


# What doctor reports of loading and compiling ahead (``collect``'s "prefetch"), as JSON.
DOCTOR_PROGRAM = """
import json
from xla_pcache.cli._doctor import _prefetch_settings, _settings
print(json.dumps(_prefetch_settings(_settings())))
"""


def test_doctor_says_which_limit_it_found_and_the_reserve_in_force(tmp_path: Path) -> None:
    """In a job limited to 900 MiB: the cgroup (path, version, the file, limit, use) of
    least room, and a quarter of the limit kept free and held loaded ahead at most; with
    the variable set, its value and name."""
    with limited_job(tmp_path, 900 * MIB) as job:
        reports = []
        for env in ({}, {"XLA_PCACHE_COMPILE_AHEAD_MEMORY": "100M"}):
            out = subprocess.run(
                job.argv(sys.executable, "-c", DOCTOR_PROGRAM),
                env=clean_env(**job.env, **env),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert out.returncode == 0, out.stderr
            reports.append(json.loads(out.stdout))
    default, set_ = reports
    found = default["job_memory"]
    lim = found["limits"][found["tightest"]]
    assert (lim["version"], lim["cgroup"], lim["limit"]) == (job.version, job.cgroup, job.limit)
    assert lim["source"] == "memory.limit_in_bytes" and 0 < lim["use"] < job.limit, lim
    assert lim["room"] == job.limit - lim["use"] and found["total"] == job.limit
    assert found["host_total"] == job.host_total
    assert default["compile_ahead"]["memory_kept_free"] == 225 * MIB
    assert default["compile_ahead"]["memory_kept_free_from"] == "a quarter of the job's memory"
    assert default["memory"] == 225 * MIB
    assert set_["compile_ahead"]["memory_kept_free"] == 100 * MIB
    assert set_["compile_ahead"]["memory_kept_free_from"] == "XLA_PCACHE_COMPILE_AHEAD_MEMORY"
