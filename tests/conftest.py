"""Shared fixtures. In CI a skipped test is a failure: every test must run there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from xla_pcache.config import VARIABLE_NAMES

REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {report.longrepr}"


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def _no_cache_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variable ``Settings`` reads is unset for each test (and the processes it starts,
    which inherit ``os.environ``): a test sets what it means to test, and never depends on
    the shell that runs it."""
    for name in VARIABLE_NAMES:
        monkeypatch.delenv(name, raising=False)
