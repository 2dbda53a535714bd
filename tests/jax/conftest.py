"""Fixtures of the JAX tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jax import scripts


@pytest.fixture
def cache(filled: scripts.Filled, tmp_path: Path) -> Path:
    """A copy of the cache a module's ``filled`` fixture filled, this test's to change."""
    return scripts.copy(filled, tmp_path)
