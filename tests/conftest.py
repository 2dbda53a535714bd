"""Shared fixtures. In CI (and under scripts/test.sh, which sets ``CI``) a skip of any kind is a
failure: a test skipped at run time, a module skipped at collection (``importorskip``), and,
as a last guard, any skip the terminal counted by the end of the session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from xla_pcache.config import VARIABLE_NAMES

# Importing torch_xla starts torch inductor's pool of compile workers (two Python processes
# that import torch): about 4 s of CPU in each fresh torch_xla process the tests start, and
# nothing here compiles with inductor. One compile thread starts no pool.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def _skips_fail() -> bool:
    return bool(os.environ.get("CI"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if _skips_fail() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    # A module-level ``pytest.importorskip`` skips the whole module while collecting it, before
    # any test report exists: turned into a collection error, which fails the run.
    outcome = yield
    report = outcome.get_result()
    if _skips_fail() and report.skipped:
        report.outcome = "failed"
        report.longrepr = (
            f"skipped at collection in CI, where every test must run: {report.longrepr}"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if _skips_fail() and skipped and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
