"""Points a test can wait on (the package's own, beside the core's in ``testhook.rs``): a
test that signals a process, or needs it to be at a given step, reaches that state because
the process said it is there, never because the machine was slow (or fast) enough.

The core makes the marks (``_core.test_hook_reached``), so there is one implementation and
one variable (``_core.TEST_HOOKS_VAR``), and both are off in a build without the cargo
feature ``test-hooks`` (``_core.TEST_HOOKS``): the wheel users install. In a test build,
with the variable naming a directory, the process creates ``<dir>/<point>.<pid>`` at a
point (exclusively, never through a link); at a point that holds, it then waits (at most two
minutes) until the test creates ``<dir>/<point>.go``, or for a signal, whose handler raises
where the process stands. A test may also lay out a tree there that the process reads in place
of the system's (``directory``). For tests only.
"""

from __future__ import annotations

import os
import time

from xla_pcache import _core

VAR = _core.TEST_HOOKS_VAR
_PAUSE_MAX_S = 120.0


def reached(point: str) -> bool:
    """Says that this process reached ``point``; False when hooks are off."""
    return _core.TEST_HOOKS and _core.test_hook_reached(point)


def hold(point: str) -> None:
    """Says that this process reached ``point`` and waits there for ``<point>.go``."""
    if reached(point):
        deadline = time.monotonic() + _PAUSE_MAX_S
        while not _core.test_hook_released(point) and time.monotonic() < deadline:
            time.sleep(0.001)


def hold_for_signal(point: str) -> None:
    """Says that this process reached ``point`` and waits there for a signal."""
    if reached(point):
        deadline = time.monotonic() + _PAUSE_MAX_S
        while time.monotonic() < deadline:
            time.sleep(0.001)


def directory(name: str) -> str | None:
    """``<dir>/<name>`` when hooks are on and the test made it a directory: a tree the
    process reads in place of the system's (``_memory``'s ``/proc`` and cgroups)."""
    if not _core.TEST_HOOKS:
        return None
    base = os.environ.get(VAR)
    if not base:
        return None
    path = os.path.join(base, name)
    return path if os.path.isdir(path) else None


def chosen(point: str) -> bool:
    """Whether the test asked for the branch ``point`` names, by creating ``<point>.go``
    before the process got there; False when hooks are off."""
    return _core.TEST_HOOKS and _core.test_hook_released(point)


def enabled() -> bool:
    """Whether this is a test build with hooks on (``XLA_PCACHE_TEST_HOOKS`` naming a
    directory is asked of each point)."""
    return bool(_core.TEST_HOOKS)
