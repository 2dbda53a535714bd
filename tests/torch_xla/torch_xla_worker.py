"""One torch_xla process for tests/torch_xla/test_torch_xla.py.

argv[1] is a JSON object: ``install`` (kwargs for install(), or null to skip it),
``before`` (graphs to run BEFORE install, to show a late install is refused), ``graphs``
(names from GRAPHS, run after install), ``barrier`` ([dir, n]: wait until n workers are
ready, so concurrent workers compile at the same moment). The last stdout line is a JSON
report: torch_xla's counters, the files of torch_xla's directory (name -> sha256) before
the first execution and at the end, results, and the adapter's stats after a final sync.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
import traceback
from typing import Any

import torch
import torch_xla
import torch_xla.debug.metrics as met
from xla_pcache import CacheError
from xla_pcache import torch_xla as xt


def add_graph(device: Any) -> list[float]:
    t = torch.arange(16, dtype=torch.float32)
    x = t.to(device)
    y = x + x
    torch_xla.sync()
    return [float(v) for v in y.cpu()[:4]]


def mlp_graph(device: Any) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32).to(device)
    target = torch.randn(16, 8).to(device)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        # A sync after the forward pass, the backward pass and the update makes three
        # graphs, as a training loop with logging or gradient clipping does.
        loss = torch.nn.functional.mse_loss(model(x), target)
        torch_xla.sync()
        loss.backward()  # type: ignore[no-untyped-call]
        torch_xla.sync()
        opt.step()
        torch_xla.sync()
        losses.append(float(loss.cpu()))
    return losses


GRAPHS = {"add": add_graph, "mlp": mlp_graph}


def listing(directory: str | None) -> dict[str, str]:
    if directory is None or not os.path.isdir(directory):
        return {}
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def barrier(directory: str, n: int) -> None:
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(directory)) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    spec = json.loads(sys.argv[1])
    report: dict[str, Any] = {"results": {}, "errors": []}
    device = torch_xla.device()
    for name in spec.get("before", []):
        report["results"][name] = GRAPHS[name](device)
    inst = None
    if spec.get("install") is not None:
        try:
            inst = xt.install(**spec["install"])
        except CacheError as exc:
            report["install_error"] = str(exc)
    view = inst.local_dir if inst is not None else None
    report["view"] = view
    report["view_before"] = listing(view)
    report["env_path"] = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
    if "barrier" in spec:
        barrier(*spec["barrier"])
    for name in spec.get("graphs", []):
        try:
            report["results"][name] = GRAPHS[name](device)
        except Exception:
            report["errors"].append(traceback.format_exc())
    report["counters"] = xt.torch_xla_counters()
    report["view_after"] = listing(view)
    if inst is not None:
        report["sync"] = inst.sync()
        report["capability"] = xt.capability()
        inst.close()
        report["view_exists_after_close"] = os.path.exists(view or "")
        report["stats"] = inst.stats()
    report["metrics_tail"] = met.short_metrics_report()[-2000:]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
