"""Fixtures of the reliability suite: two sshfs "hosts", a full disk, a read-only cache.

A bed that cannot be built (no root, no FUSE, no sshfs) skips the test on a developer's
machine but FAILS it when ``CI`` is set: CI installs the tools
(``tests/reliability/setup_testbed.sh``) and runs as root, so a skip there would hide a
broken test bed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import scenarios
import testbed

T = TypeVar("T")


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"reliability test bed unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"reliability test bed unavailable: {reason}")


def _set_up(make: Callable[[], AbstractContextManager[T]]) -> Iterator[T]:
    """For a fixture to ``yield from``: the bed ``make()`` builds, entered, and torn down
    after the test even when it fails; a bed that cannot be built is ``unavailable``."""
    try:
        bed = make()
        value = bed.__enter__()
    except testbed.TestbedUnavailable as exc:
        unavailable(str(exc))
    try:
        yield value
    finally:
        bed.__exit__(None, None, None)


def _two_hosts(
    tmp_path_factory: pytest.TempPathFactory, cache_timeout: int | None
) -> Iterator[testbed.TwoHosts]:
    base = tmp_path_factory.mktemp("two-hosts")
    yield from _set_up(lambda: testbed.two_hosts(base, cache_timeout=cache_timeout))


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testbed.TwoHosts]:
    """(export, host_a, host_b): one directory exported by an sshd on 127.0.0.1 (free port,
    throwaway keys) and mounted twice through sshfs, each mount caching attributes and
    listings for 2 s (testbed.SSHFS_CACHE_TIMEOUT_S). Unmounted and sshd stopped afterwards,
    even when a test fails."""
    yield from _two_hosts(tmp_path_factory, testbed.SSHFS_CACHE_TIMEOUT_S)


@pytest.fixture(scope="module")
def two_hosts_default_cache(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[testbed.TwoHosts]:
    """The two-host bed mounted with sshfs's own cache timeout (no option: 20 s), as a new
    user would mount it."""
    yield from _two_hosts(tmp_path_factory, None)


@pytest.fixture(scope="module")
def two_hosts_60s_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testbed.TwoHosts]:
    """The two-host bed with a 60 s cache: as long as an NFS client may keep attributes."""
    yield from _two_hosts(tmp_path_factory, 60)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs mount point."""
    yield from _set_up(lambda: testbed.tmpfs(tmp_path / "full", size="16m"))


@pytest.fixture
def readonly_cache(tmp_path: Path) -> Iterator[scenarios.ReadOnlyCache]:
    """A populated cache behind a read-only bind mount."""
    yield from _set_up(lambda: scenarios.readonly_cache(tmp_path))
