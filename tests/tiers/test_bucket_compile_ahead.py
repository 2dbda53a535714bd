"""Compiling ahead on a bucket path (``s3://`` on SeaweedFS, ``gs://`` on the tests' GCS
server, each on loopback): hosts are fresh processes with only the environment set, each with
a host-local store of its own, running the program of ``tests/jax/test_compile_ahead.py``.

A cold host fills the bucket (executables, plan, module records); its executables are then
removed from the bucket, as a bucket's prune would. A new host, its local store empty, fetches
the plan and the records from the bucket, compiles every program ahead, its reads take them,
and its puts go back to the bucket: a third host, empty too, starts warm from them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import obstore
import pytest

from tests.helpers import entry_file_key, is_beside
from tests.jax import scripts
from tests.jax.test_compile_ahead import PROGRAM, N, counted
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix

pytestmark = pytest.mark.jax


def _entries(server: BucketServer, prefix: str) -> dict[str, str]:
    """The bucket's entries: object path -> the key in its header."""
    client = bucket_client(server, prefix)
    out = {}
    for o in obstore.list(client).collect():
        path = str(o["path"])
        if path.startswith("xla_pcache-1/entries/"):
            out[path] = entry_file_key(bytes(obstore.get(client, path).bytes()))
    return out


def _run(
    script: Path, url: str, home: Path, server: BucketServer, hooks: Path | None = None
) -> dict[str, Any]:
    """The program as one host: its host-local store under ``home``; with ``hooks``, its
    reads held as ``test_compile_ahead.run_held`` holds them."""
    env = scripts.environment(
        Path(url),
        hooks,
        **server.env(),
        XLA_PERSISTENT_CACHE_PATH=url,
        XLA_PCACHE_LOCAL_PATH=str(home / "local"),
        XLA_PCACHE_COMPILE_AHEAD_THREADS=str(N),
        XLA_PCACHE_REMOTE_TIMEOUT="10",
    )
    if hooks is None:
        with scripts.started(script, env) as proc:
            report, _ = scripts.finish(proc)
        return report
    shutil.rmtree(hooks, ignore_errors=True)
    hooks.mkdir()
    (hooks / "claimed.go").touch()
    with scripts.started(script, env) as proc:
        scripts.wait_for_hook(proc, hooks, "compile-ahead-idle.*", "compiling never went idle")
        (hooks / "compile-ahead-take.go").touch()
        report, _ = scripts.finish(proc)
    return report


def test_a_host_compiles_ahead_from_the_records_in_the_bucket(
    tmp_path: Path, bucket_server: BucketServer
) -> None:
    script = tmp_path / "workload.py"
    script.write_text(PROGRAM)
    prefix = fresh_prefix()
    url = bucket_server.url(prefix)
    cold = _run(script, url, tmp_path / "a", bucket_server)
    assert cold["misses"] == N
    entries = _entries(bucket_server, prefix)
    executables = [p for p, key in entries.items() if not is_beside(key)]
    assert len(executables) == N and len(entries) == 2 * N + 1, entries
    # Removed from the bucket, as its prune would remove entries no host used lately.
    client = bucket_client(bucket_server, prefix)
    for path in executables:
        obstore.delete(client, path)

    held = _run(script, url, tmp_path / "b", bucket_server, tmp_path / "hooks")
    assert held["out"] == cold["out"]
    assert counted(held) == {"compiled": N, "compiled_used": N, "modules_refused": 0, "errors": 0}
    # What it compiled and JAX's reads took is in the bucket again: a third host, its own
    # store empty, starts warm from it.
    assert len([k for k in _entries(bucket_server, prefix).values() if not is_beside(k)]) == N
    warm = _run(script, url, tmp_path / "c", bucket_server)
    assert warm["out"] == cold["out"] and warm["hits"] == N
