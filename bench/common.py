# ruff: noqa: RUF001  (the report uses the multiplication sign and the en dash on purpose)
"""Shared helpers: statistics, self-identifying values, scratch directories, machine facts."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KB = 1000
MB = 1000 * 1000
GB = 1000 * 1000 * 1000
MIB = 1024 * 1024


@dataclass
class Summary:
    """Median and spread of repeated measurements (seconds unless said otherwise)."""

    n: int
    median: float
    q1: float
    q3: float
    lo: float
    hi: float
    mean: float

    def as_dict(self) -> dict[str, float]:
        return {
            "n": self.n,
            "median": self.median,
            "q1": self.q1,
            "q3": self.q3,
            "min": self.lo,
            "max": self.hi,
            "mean": self.mean,
        }


def summarize(xs: Sequence[float]) -> Summary:
    if not xs:
        raise ValueError("no samples")
    s = sorted(xs)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4, method="inclusive")
        q1, q3 = q[0], q[2]
    else:
        q1, q3 = s[0], s[-1]
    return Summary(len(s), statistics.median(s), q1, q3, s[0], s[-1], statistics.fmean(s))


def percentile(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def fmt_time(sec: float) -> str:
    """Human time with a unit that keeps 3 significant digits."""
    if sec != sec:  # NaN
        return "n/a"
    if sec < 1e-6:
        return f"{sec * 1e9:.0f} ns"
    if sec < 1e-3:
        return f"{sec * 1e6:.3g} µs"
    if sec < 1:
        return f"{sec * 1e3:.3g} ms"
    return f"{sec:.3g} s"


def fmt_ratio(r: float) -> str:
    if r != r:
        return "n/a"
    if r >= 100:
        return f"{r:,.0f}×"
    return f"{r:.3g}×"


# --------------------------------------------------------------- self-identifying values
#
# value = digest(16) | body length (8, little endian) | body
# digest = blake2b-128 over key + body, so a reader can tell a torn, truncated or foreign
# value from the right one.

HEADER = 24


def make_value(key: str, size: int, body: bytes | None = None) -> bytes:
    body = os.urandom(size - HEADER) if body is None else body
    h = hashlib.blake2b(key.encode(), digest_size=16)
    h.update(body)
    return h.digest() + len(body).to_bytes(8, "little") + body


def check_value(key: str, value: object) -> bool:
    mv = memoryview(value)  # type: ignore[arg-type]
    if mv.nbytes < HEADER:
        return False
    n = int.from_bytes(mv[16:24], "little")
    if mv.nbytes != HEADER + n:
        return False
    h = hashlib.blake2b(key.encode(), digest_size=16)
    h.update(mv[HEADER:])
    return h.digest() == bytes(mv[:16])


# --------------------------------------------------------------- scratch space


class Scratch:
    """Fresh directories under one parent (one filesystem for every peer)."""

    def __init__(self, parent: str | None) -> None:
        base = parent or tempfile.gettempdir()
        self.root = Path(tempfile.mkdtemp(prefix="xla-pcache-bench-", dir=base))
        self._n = 0

    def new(self, label: str) -> Path:
        self._n += 1
        p = self.root / f"{self._n:04d}-{label}"
        p.mkdir()
        return p

    @contextmanager
    def dir(self, label: str, set_aside: bool = False) -> Iterator[Path]:
        """A fresh directory, deleted when done, or with ``set_aside`` renamed and deleted
        only by ``cleanup`` at the end of the run. Set aside directories of many files:
        deleting many files slows every file creation after it on a journal-less ext4 (see
        ``ext4_without_journal``). Delete directories of a few large files: keeping them
        makes later writes land in never-touched memory, which costs far more than reused
        memory in a virtual machine (64 MiB writes measured 250-330 ms instead of 16-20)."""
        p = self.new(label)
        try:
            yield p
        finally:
            if set_aside:
                done = self.root / "done"
                done.mkdir(exist_ok=True)
                p.rename(done / p.name)
            else:
                rmtree(p)

    def cleanup(self) -> None:
        rmtree(self.root)


def rmtree(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)


def filesystem_of(path: Path) -> str:
    """Filesystem type, device and mount options of the mount holding path."""
    try:
        out = subprocess.run(
            ["findmnt", "-T", str(path), "-no", "FSTYPE,SOURCE,OPTIONS"],
            capture_output=True,
            text=True,
            check=True,
        )
        fs, dev, opts = [*out.stdout.split(), "", "", ""][:3]
        return f"{fs} ({dev}, {opts})"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def ext4_without_journal(path: Path) -> bool:
    """True when path is on ext4 mounted without a journal (no /proc/fs/jbd2 entry for its
    device). There ext4's inode allocator skips inodes freed in the last 60-300 s, reading
    each one's inode-table block, so file creation gets CPU-expensive after mass deletes."""
    try:
        out = subprocess.run(
            ["findmnt", "-T", str(path), "-no", "FSTYPE,SOURCE"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return False
    if len(out) < 2 or out[0] != "ext4":
        return False
    dev = Path(out[1]).name
    jbd2 = Path("/proc/fs/jbd2")
    return jbd2.is_dir() and not any(e.name.startswith(dev + "-") for e in jbd2.iterdir())


def settle() -> None:
    """Write back dirty pages (ours and anyone's) so that one peer's writes do not slow the
    next peer's timed operations. Never timed."""
    os.sync()


def drop_page_cache_hint(path: Path) -> None:
    """Ask the kernel to drop cached pages of one file (best effort, no root needed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def meminfo_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kb = int(line.split()[1])
                return f"{kb / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for dist in ["xla-pcache", "jax", "jaxlib", "diskcache", "filelock", "numpy", "matplotlib"]:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def machine(scratch_root: Path) -> dict[str, str]:
    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": meminfo_total(),
        "kernel": platform.release(),
        "filesystem": filesystem_of(scratch_root),
        "scratch": str(scratch_root.parent),
        "load_start": loadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def rotate(items: Sequence[object], k: int) -> list[object]:
    """items rotated by k: interleaves peers so none always runs first or last."""
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])
