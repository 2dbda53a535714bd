"""One torch_xla process for tests/torch_xla/test_torch_xla_trust.py: every cell of the trust
matrix's torch_xla host-pool column, then one real execution.

argv[1] is a JSON object: ``keys`` (name -> [private hex, public hex]), ``cells`` (each:
``id``, ``store``, ``local``, ``reader`` {trusts, read_only, signs}, ``change`` [path, hex
bytes] or null), ``real`` {store, local}. For each cell, on a host of its own (``local``):
a process trusting ci-1 and one trusting no key fill the host's pools first, the store's
file is changed if asked, then the reader's view is made; then one more process trusting
ci-1 makes its view (what the reader left in the pools, read later). Each view is reported
as name -> sha256. Then the real cell: the host's pool filled by a process trusting ci-1,
this process installs the adapter trusting only what the environment says (ci-2: ci-1
revoked) and runs the graph ci-1 compiled. The last stdout line is the JSON report.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch
import torch_xla
import torch_xla.debug.metrics as met
from xla_pcache import Store
from xla_pcache import torch_xla as xt
from xla_pcache.config import Settings
from xla_pcache.torch_xla import _build as torch_xla_build
from xla_pcache.torch_xla._host_mirror import HostMirror

COUNTERS = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheDeserializeFailure")


def open_store(path: str, keys: dict[str, list[str]], reader: dict[str, Any]) -> Store:
    trusted = {
        "ci": [("ci-1", bytes.fromhex(keys["ci-1"][1]))],
        "other": [("ci-2", bytes.fromhex(keys["ci-2"][1]))],
        None: None,
    }[reader["trusts"]]
    signer = ("ci-1", bytes.fromhex(keys["ci-1"][0])) if reader["signs"] else None
    return Store(
        path,
        settings=Settings(),
        read_only=reader["read_only"],
        signing_key=signer,
        trusted_keys=trusted,
    )


def view(path: str, local: str, keys: dict[str, list[str]], reader: dict[str, Any]) -> dict:
    """The view a process of ``reader`` gets on host ``local``: name -> sha256."""
    with open_store(path, keys, reader) as store:
        # The build of this process's torch_xla, as install() gives it: the keys it asks.
        mirror = HostMirror(store, local, build=torch_xla_build.build())
        mirror.refresh_pool()
        directory = mirror.open_view()
        try:
            out = {}
            for name in sorted(os.listdir(directory)):
                with open(os.path.join(directory, name), "rb") as f:
                    out[name] = hashlib.sha256(f.read()).hexdigest()
            return out
        finally:
            mirror.close_view()


def main() -> None:
    spec = json.loads(sys.argv[1])
    keys = spec["keys"]
    trusting = {"trusts": "ci", "read_only": True, "signs": False}
    untrusting = {"trusts": None, "read_only": True, "signs": False}
    report: dict[str, Any] = {"cells": {}}
    for cell in spec["cells"]:
        store, local = cell["store"], cell["local"]
        view(store, local, keys, trusting)
        view(store, local, keys, untrusting)
        if cell["change"] is not None:
            path, data = cell["change"]
            with open(path, "r+b") as f:
                f.write(bytes.fromhex(data))
        seen = view(store, local, keys, cell["reader"])
        later = view(store, local, keys, trusting)
        report["cells"][cell["id"]] = {"seen": seen, "later": later}
    real = spec["real"]
    view(real["store"], real["local"], keys, trusting)
    # The environment names ci-2 only: ci-1's copy in this host's pool is never linked.
    # Writable, so that torch_xla writes what it compiles into the view: under the name of
    # the graph asked for, which shows the same graph was looked up.
    cache = xt.install(real["store"], local_dir=real["local"], read_only=False)
    assert cache is not None
    device = torch_xla.device()
    y = torch.arange(16, dtype=torch.float32).to(device) * 3 + 1
    torch_xla.sync()
    report["result"] = float(y.cpu().sum())
    report["counters"] = {n: int(met.counter_value(n) or 0) for n in COUNTERS}
    report["view"] = sorted(os.listdir(cache.local_dir or ""))
    cache.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
