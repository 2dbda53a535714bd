"""Points a test can wait on (the Python side of the core's ``testhook.rs``): a test that
signals a process, or needs it to be at a given step, reaches that state because the
process said it is there, never because the machine was slow (or fast) enough.

Off unless ``XLA_PCACHE_TEST_HOOKS`` names a directory: then, at a point, the process
creates ``<dir>/<point>.<pid>``; at a point that holds, it then waits (at most two
minutes) until the test creates ``<dir>/<point>.go``, or for a signal, whose handler
raises where the process stands. For tests only.
"""

from __future__ import annotations

import os
import time

VAR = "XLA_PCACHE_TEST_HOOKS"
_PAUSE_MAX_S = 120.0


def reached(point: str) -> bool:
    """Says that this process reached ``point``; False when hooks are off."""
    where = os.environ.get(VAR)
    if not where:
        return False
    try:
        with open(os.path.join(where, f"{point}.{os.getpid()}"), "wb"):
            pass
    except OSError:
        return False
    return True


def hold(point: str) -> None:
    """Says that this process reached ``point`` and waits there for ``<point>.go``."""
    if reached(point):
        go = os.path.join(os.environ[VAR], f"{point}.go")
        deadline = time.monotonic() + _PAUSE_MAX_S
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.001)


def hold_for_signal(point: str) -> None:
    """Says that this process reached ``point`` and waits there for a signal."""
    if reached(point):
        deadline = time.monotonic() + _PAUSE_MAX_S
        while time.monotonic() < deadline:
            time.sleep(0.001)
