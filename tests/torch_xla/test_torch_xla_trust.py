"""The trust matrix's torch_xla host-pool column (rows and plants: tests/trust_matrix.py),
with real torch_xla: one process compiles a graph signed by ci-1, one worker process
(tests/torch_xla/torch_xla_trust_worker.py) runs every cell and then one real execution.

In each cell ci-1's entry of the ``add`` graph is under its own name for the key and the
attacker's plant at the plain name, over other bytes. Host processes trusting ci-1 and trusting no
key fill the host's pools first. The reader's view must hold ci-1's executable or nothing
when it trusts ci-1, nothing when it trusts ci-2 only (ci-1 revoked), and a process
trusting ci-1 on that host afterwards still gets ci-1's executable or nothing. The real
execution: the host's pool holds ci-1's copy, the process trusts ci-2 only: torch_xla
misses and compiles, and loads nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store, _core, build_key
from xla_pcache.config import Settings

from tests.helpers import clean_env, run_worker
from tests.torch_xla.helpers import NEEDS_THE_HOOK, run_program
from tests.trust_matrix import (
    PLANTS,
    READERS,
    Keys,
    entry_file,
    plant_in_dir,
    with_payload,
)

pytestmark = NEEDS_THE_HOOK

WORKER = Path(__file__).with_name("torch_xla_trust_worker.py")


def _key_file(tmp: Path, pair: tuple[str, bytes]) -> str:
    path = tmp / f"{pair[0]}.key"
    path.write_text(f"{pair[0]}:{base64.b64encode(pair[1]).decode()}\n")
    path.chmod(0o600)
    return str(path)


def _public(pair: tuple[str, bytes]) -> str:
    return f"{pair[0]}:{base64.b64encode(pair[1]).decode()}"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.torch_xla
def test_torch_xla_pool_column(tmp_path: Path) -> None:
    keys = Keys.make()
    compiled = tmp_path / "compiled"
    ci_env = {
        "XLA_PERSISTENT_CACHE_PATH": str(compiled),
        "XLA_PCACHE_SIGNING_KEY": _key_file(tmp_path, keys.ci[0]),
        "XLA_PCACHE_TRUSTED_KEYS": _public(keys.ci[1]),
    }
    setup = run_program(tmp_path, {"graphs": ["add"]}, ci_env, host="ci")
    assert setup["results"]["add"] == 376.0
    with Store(compiled, settings=Settings(), read_only=True) as s:
        (add,) = s.entries()
        key = add["key"]
        assert isinstance(key, str) and add["signer"] == "ci-1"
        good_file = s.get_entry_file(key)
        assert good_file is not None
        good = bytes(s.get(key) or b"")
    # The attacker's executable: any other bytes (no cell loads what it links).
    evil = bytes(b ^ 0x5A for b in good[: len(good) // 2])
    tx_name = build_key.split(key)[0].removeprefix("torch_xla/")
    plain, own = _core.entry_name(key), _core.signed_entry_name(key, "ci-1")
    planted = {
        "unsigned": entry_file(key, evil, None),
        "mallory": entry_file(key, evil, keys.mallory[0]),
        # ci's header over other bytes of another length (the signature, which covers the
        # length, no longer verifies; `changed` keeps the length).
        "copied_header": with_payload(good_file, evil),
    }
    # For `changed`: the other executable cut or repeated to the length of ci's.
    evil_same = (evil * (len(good) // len(evil) + 1))[: len(good)]
    cells = []
    for reader_name, reader in READERS.items():
        for plant in PLANTS:
            cell = tmp_path / "cells" / f"{reader_name}-{plant}"
            store = cell / "store"
            Store(store, settings=Settings()).close()
            change = None
            if plant == "changed":
                # ci's entry at the plain name; changed (same length, checksums made right)
                # after the host's processes verified and copied it.
                plant_in_dir(store, plain, good_file)
                path = store / "entries" / plain[:2] / plain
                change = [str(path), with_payload(good_file, evil_same).hex()]
            else:
                plant_in_dir(store, own, good_file)
                plant_in_dir(store, plain, None if plant == "directory" else planted[plant])
            cells.append(
                {
                    "id": f"{reader_name}-{plant}",
                    "store": str(store),
                    "local": str(cell / "host"),
                    "reader": {
                        "trusts": reader.trusts,
                        "read_only": reader.read_only,
                        "signs": reader.signs,
                    },
                    "change": change,
                }
            )
    spec: dict[str, Any] = {
        "keys": {pair[0][0]: [pair[0][1].hex(), pair[1][1].hex()] for pair in (keys.ci, keys.ci2)},
        "cells": cells,
        "real": {"store": str(compiled), "local": str(tmp_path / "real-host")},
    }
    env = clean_env(("XLA_", "PJRT_", "JAX_"))
    env.update(
        PJRT_DEVICE="CPU",
        TF_CPP_MIN_LOG_LEVEL="1",
        XLA_PCACHE_TRUSTED_KEYS=_public(keys.ci2[1]),
    )
    report = run_worker(str(WORKER), json.dumps(spec), env=env)

    allowed = {
        "ci": {None, _sha(good)},
        "other": {None},
        None: {None, _sha(good), _sha(evil), _sha(evil_same)},
    }
    for reader_name, reader in READERS.items():
        for plant in PLANTS:
            got = report["cells"][f"{reader_name}-{plant}"]
            seen, later = got["seen"].get(tx_name), got["later"].get(tx_name)
            where = (reader_name, plant, got)
            assert seen in allowed[reader.trusts], where
            if reader.trusts == "ci":
                assert seen == _sha(good), where
            assert later in (None, _sha(good)), where
    # The real execution: ci-1's copy on the host, ci-1 revoked here: compiled, not loaded.
    c = report["counters"]
    assert (c["PersistentCacheMiss"], c["PersistentCacheHit"]) == (1, 0), c
    assert c["PersistentCacheDeserializeFailure"] == 0, c
    assert report["result"] == 376.0
    assert tx_name in report["view"], report["view"]  # the same graph was looked up
