"""Test beds for the reliability suite: two sshfs "hosts", a small tmpfs, a read-only mount.

Each bed is a context manager that undoes everything it did on exit, even when the body
raises. The pytest fixtures (``conftest.py``) and ``bench/reliability_report.py`` both use
them. Mounting needs root, ``/dev/fuse``, ``sshfs`` and ``sshd``
(``tests/reliability/setup_testbed.sh`` installs them).

When a bed cannot be built, :class:`TestbedUnavailable` is raised with the reason; the
fixtures turn it into a skip on a developer's machine and a loud failure under ``CI``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

SSHD = "/usr/sbin/sshd"

# sshfs keeps its own attribute/directory cache, 20 s unless told otherwise. A shorter one
# keeps most of the suite quick while each mount still serves stale views for a while, as an
# NFS client does; the stale-view tests also run with sshfs's default and with 60 s (what an
# NFS client may keep attributes for: acregmax).
SSHFS_CACHE_TIMEOUT_S = 2
SSHFS_DEFAULT_CACHE_TIMEOUT_S = 20


class TestbedUnavailable(RuntimeError):
    """This machine cannot build the requested test bed (no root, no FUSE, no sshfs...)."""

    __test__ = False  # not a test class, despite the name


class TwoHosts(NamedTuple):
    """One exported directory (the server's disk) and two client mounts of it; unpacks as
    ``(export, host_a, host_b)``."""

    export: Path
    host_a: Path
    host_b: Path


def _run(cmd: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise TestbedUnavailable(f"{what} needs root (mount); running as uid {os.geteuid()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TestbedUnavailable(f"sshd exited with status {proc.returncode} at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TestbedUnavailable(f"sshd did not listen on 127.0.0.1:{port} within {timeout} s")


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point. Read from the mount table: ``os.path.ismount``
    misses bind mounts of the same filesystem."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        for line in table:
            fields = line.split()
            # Field 5 is the mount point, with spaces and the like escaped as octal.
            point = fields[4].encode().decode("unicode_escape")
            if point == target:
                return True
    return False


def unmount(path: Path) -> None:
    """Unmounts ``path`` if it is a mount point: normally, then lazily as a last resort."""
    if not is_mounted(path):
        return
    for cmd in (["fusermount3", "-u"], ["umount"], ["umount", "-l"]):
        cmd = [*cmd, str(path)]
        if shutil.which(cmd[0]) is None:
            continue
        _run(cmd)
        if not is_mounted(path):
            return
    raise RuntimeError(f"could not unmount {path}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def two_hosts(base: Path, cache_timeout: int | None = SSHFS_CACHE_TIMEOUT_S) -> Iterator[TwoHosts]:
    """Exports ``base/export`` through an sshd on a free loopback port (throwaway keys) and
    mounts it twice with sshfs at ``base/a`` and ``base/b``: two client "hosts" with their
    own caches, whose fcntl locks exclude only processes using the same mount.

    ``cache_timeout`` is how long (s) each mount's sshfs keeps attributes and listings;
    None mounts with sshfs's default (``SSHFS_DEFAULT_CACHE_TIMEOUT_S``), no option given."""
    _require_root("the two-host test bed")
    missing = [p for p in ("sshfs", "ssh-keygen", "fusermount3") if shutil.which(p) is None]
    if not os.path.exists(SSHD):
        missing.append(SSHD)
    if missing:
        raise TestbedUnavailable(
            f"missing {', '.join(missing)}: run tests/reliability/setup_testbed.sh"
        )
    if not os.path.exists("/dev/fuse"):
        raise TestbedUnavailable("no /dev/fuse on this machine")

    export, host_a, host_b, keys = (base / n for n in ("export", "a", "b", "ssh"))
    for d in (export, host_a, host_b, keys):
        d.mkdir(parents=True, exist_ok=True)
    keys.chmod(0o700)
    # sshd's privilege separation wants this directory to exist.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    for name in ("host", "client"):
        done = _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)])
        if done.returncode != 0:
            raise TestbedUnavailable(f"ssh-keygen failed: {done.stderr.strip()}")
    authorized = keys / "authorized_keys"
    shutil.copy(keys / "client.pub", authorized)
    authorized.chmod(0o600)

    port = _free_port()
    sshd_log = (base / "sshd.log").open("wb")
    sshd = subprocess.Popen(
        [
            SSHD,
            "-D",  # stay in the foreground: we own the process and stop it ourselves
            "-e",
            "-f",
            "/dev/null",
            "-p",
            str(port),
            "-o",
            "ListenAddress=127.0.0.1",
            "-o",
            f"HostKey={keys / 'host'}",
            "-o",
            f"AuthorizedKeysFile={authorized}",
            "-o",
            "PermitRootLogin=prohibit-password",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "StrictModes=no",
            "-o",
            "PidFile=none",
            "-o",
            "Subsystem=sftp internal-sftp",
        ],
        stdin=subprocess.DEVNULL,
        stdout=sshd_log,
        stderr=subprocess.STDOUT,
    )
    mounted: list[Path] = []
    try:
        _wait_for_port(port, sshd, timeout=10.0)
        ssh_opts = ",".join(
            [
                "StrictHostKeyChecking=no",
                "UserKnownHostsFile=/dev/null",
                f"IdentityFile={keys / 'client'}",
                "BatchMode=yes",
                "LogLevel=ERROR",
            ]
            + ([] if cache_timeout is None else [f"dcache_timeout={cache_timeout}"])
        )
        for mount in (host_a, host_b):
            done = _run(
                ["sshfs", "-p", str(port), "-o", ssh_opts, f"root@127.0.0.1:{export}", str(mount)]
            )
            if done.returncode != 0 or not is_mounted(mount):
                log = (base / "sshd.log").read_text(errors="replace")[-2000:]
                raise TestbedUnavailable(
                    f"sshfs mount of {mount} failed ({done.returncode}): "
                    f"{done.stderr.strip()}\nsshd log:\n{log}"
                )
            mounted.append(mount)
        yield TwoHosts(export=export, host_a=host_a, host_b=host_b)
    finally:
        errors: list[str] = []
        for mount in mounted:
            try:
                unmount(mount)
            except RuntimeError as exc:
                errors.append(str(exc))
        _stop(sshd)
        sshd_log.close()
        shutil.rmtree(keys, ignore_errors=True)
        if errors:
            raise RuntimeError("; ".join(errors))


@contextlib.contextmanager
def tmpfs(mount: Path, size: str = "16m") -> Iterator[Path]:
    """A ``size`` tmpfs mounted at ``mount`` (a full disk once it fills)."""
    _require_root("a tmpfs test bed")
    mount.mkdir(parents=True, exist_ok=True)
    done = _run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount)])
    if done.returncode != 0:
        raise TestbedUnavailable(f"cannot mount a tmpfs at {mount}: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        unmount(mount)


@contextlib.contextmanager
def read_only_bind(source: Path, mount: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``mount``."""
    _require_root("a read-only bind mount")
    mount.mkdir(parents=True, exist_ok=True)
    done = _run(["mount", "--bind", str(source), str(mount)])
    if done.returncode != 0:
        raise TestbedUnavailable(f"cannot bind-mount {source}: {done.stderr.strip()}")
    try:
        done = _run(["mount", "-o", "remount,bind,ro", str(mount)])
        if done.returncode != 0:
            raise TestbedUnavailable(f"cannot remount {mount} read-only: {done.stderr.strip()}")
        yield mount
    finally:
        unmount(mount)
