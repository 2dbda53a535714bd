"""What the state fuzzers (``tests/dirstate_fuzz.py``, ``tests/bucketstate_fuzz.py``) share
about the processes they run: each operation's own peak memory, the CLI as a child under an
address-space limit, and the escape sequences no output may carry.

A child's peak is its own: it reports it as it exits (``PEAK_PRELUDE``), since
``os.wait4``'s ``ru_maxrss`` of a child keeps the high-water mark of the address space it
was spawned from, which is the harness's (it holds the planted states in memory).
"""

from __future__ import annotations

from pathlib import Path

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
