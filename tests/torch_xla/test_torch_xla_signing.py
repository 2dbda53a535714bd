"""Trusted writers with torch_xla, zero code: a process holding the signing key compiles,
and a read-only worker that trusts only that key is served its entry; a worker that trusts
another key is not. Same program and helpers as test_torch_xla_hits.py (torch_xla 2.7 loads
its executables back on CPU: a hit; later versions: the diagnosed cannot-load outcome)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xla_pcache import Store

from tests.helpers import keygen
from tests.torch_xla.helpers import NEEDS_THE_HOOK, cold, entries, run_program, served

pytestmark = NEEDS_THE_HOOK


@pytest.mark.torch_xla
def test_a_signed_entry_is_served_to_a_trusting_read_only_worker(tmp_path: Path) -> None:
    ci_file, ci_public = keygen(tmp_path, "ci-1")
    _, other_public = keygen(tmp_path, "other-1")
    store = tmp_path / "store"
    path = {"XLA_PERSISTENT_CACHE_PATH": str(store)}
    ci = {**path, "XLA_PCACHE_SIGNING_KEY": ci_file, "XLA_PCACHE_TRUSTED_KEYS": ci_public}
    first = run_program(tmp_path, {"graphs": ["add"]}, ci, host="ci")
    cold(first)
    (entry,) = entries(store).values()
    assert entry["signer"] == "ci-1"
    ro = {"XLA_PERSISTENT_CACHE_READ_ONLY": "1"}
    # A cold host (its pool filled from the store, through trusting gets).
    worker = run_program(
        tmp_path,
        {"graphs": ["add"]},
        {**path, **ro, "XLA_PCACHE_TRUSTED_KEYS": ci_public},
        host="w",
    )
    served(worker)
    assert worker["results"] == first["results"]
    stranger = run_program(
        tmp_path,
        {"graphs": ["add"]},
        {**path, **ro, "XLA_PCACHE_TRUSTED_KEYS": other_public},
        host="s",
    )
    cold(stranger)
    assert stranger["results"] == first["results"]
    with Store(str(store), read_only=True) as s:
        assert len(s) == 1
