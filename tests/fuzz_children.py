"""What the state fuzzers (``tests/dirstate_fuzz.py``, ``tests/bucketstate_fuzz.py``) share
about the processes they run: each operation's own peak memory, a child's start under an
address-space limit (the CLI's, and the operations' prelude), the wait for them that kills
one hung, the escape sequences no output may carry, and how a failure is kept and told.

A child's peak is its own: it reports it as it exits (``PEAK_PRELUDE``), since
``os.wait4``'s ``ru_maxrss`` of a child keeps the high-water mark of the address space it
was spawned from, which is the harness's (it holds the planted states in memory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

ESC_MARKERS = (b"\x1b", b"\xc2\x9b")  # ESC, and CSI as a C1 control in UTF-8

# Prepended to every child's code: as it exits (atexit, registered first so it runs last), the
# child writes its own peak to $FUZZ_PEAK_FILE: VmHWM (the high-water mark of its own address
# space, which exec started afresh) and the largest ru_maxrss of the children it waited for
# (a doctor probe, say; what they inherited from it is its own). A child killed by a signal
# reports nothing; one past its deadline is read from /proc before it is killed.
PEAK_FILE_VAR = "FUZZ_PEAK_FILE"
PEAK_PRELUDE = r"""
import atexit as _fz_atexit
def _fz_report_peak():
    import os, resource
    try:
        with open("/proc/self/status") as f:
            hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        with open(os.environ["FUZZ_PEAK_FILE"], "w") as f:
            f.write(f"{hwm} {kids}")
    except Exception:
        pass
_fz_atexit.register(_fz_report_peak)
del _fz_atexit
"""

# The CLI as `xla-pcache` runs it, under an address-space limit set in the child itself
# (a preexec hook would run between fork and exec of a process with threads).
CLI_CHILD = (
    "import resource, runpy, sys\n"
    "lim = int(sys.argv.pop(1))\n"
    "resource.setrlimit(resource.RLIMIT_AS, (lim, lim))\n"
    "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    "sys.argv[0] = 'xla-pcache'\n"
    "runpy.run_module('xla_pcache', run_name='__main__', alter_sys=True)\n"
)


# An operation's child begins so: its arguments (JSON, argv[1]) as ``args``, the address
# space limited to ``args["rlimit_as"]``, no core file, warnings logged.
CHILD_PRELUDE = r"""
import json, logging, resource, sys
args = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (args["rlimit_as"], args["rlimit_as"]))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
logging.basicConfig(level=logging.WARNING)
"""


@dataclasses.dataclass
class Failure:
    """One failure a fuzzer found: at which step, of which kind (the fuzzer's own words:
    outside, hang, abort, ...), in which operation, and what was seen."""

    step: int
    kind: str
    op: str
    detail: str


def first_failures(failures: Iterable[Failure], width: int) -> list[str]:
    """A line for the first failure of each kind in each operation, its detail shortened to
    ``width``."""
    seen: set[tuple[str, str]] = set()
    lines = []
    for fl in failures:
        if (fl.kind, fl.op) in seen:
            continue
        seen.add((fl.kind, fl.op))
        lines.append(
            f"  first {fl.kind} in {fl.op} at step {fl.step}: {textwrap.shorten(fl.detail, width)}"
        )
    return lines


class Child(Protocol):
    popen: subprocess.Popen[bytes]
    out: Any
    err: Any
    peak_file: Path


C = TypeVar("C", bound=Child)
F = TypeVar("F")


def pick_weighted(rng: random.Random, table: list[tuple[str, F, float]]) -> tuple[str, F]:
    """One row of ``table`` (name, thing, weight), drawn by weight: its name and thing."""
    name, thing, _ = rng.choices(table, weights=[w for _, _, w in table])[0]
    return name, thing


def wait_children(
    pending: list[C],
    judge: Callable[[C, int | None, bool], None],
    hung: Callable[[C], bool],
    *,
    poll: float,
) -> None:
    """Waits for the children in ``pending`` (each removed as it ends), each in a process
    group of its own: one that exits is judged with the peak it reported, one ``hung`` says
    is stuck is killed with its group, its peak read from /proc first, and judged hung
    (``judge(child, peak, hung)``). Interrupted (Ctrl-C, a test's timeout), no child is left
    running."""
    try:
        while pending:
            for p in list(pending):
                pid, status = os.waitpid(p.popen.pid, os.WNOHANG)
                if pid:
                    p.popen.returncode = os.waitstatus_to_exitcode(status)
                    pending.remove(p)
                    judge(p, reported_peak(p.peak_file), False)
                elif hung(p):
                    peak = vm_hwm_kib(p.popen.pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.popen.pid, signal.SIGKILL)
                    _, status = os.waitpid(p.popen.pid, 0)
                    p.popen.returncode = os.waitstatus_to_exitcode(status)
                    pending.remove(p)
                    judge(p, peak, True)
            if pending:
                time.sleep(poll)
    finally:
        for p in pending:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()
            p.out.close()
            p.err.close()


def vm_hwm_kib(pid: int) -> int | None:
    """A live process's own peak resident set (KiB), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def reported_peak(peak_file: Path) -> int | None:
    """The peak (KiB) a child wrote to ``peak_file`` as it exited, or None; the file is
    removed."""
    try:
        hwm, kids = peak_file.read_text().split()
        return max(int(hwm), int(kids))
    except (OSError, ValueError):
        return None
    finally:
        peak_file.unlink(missing_ok=True)
