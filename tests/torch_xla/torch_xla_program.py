"""A torch_xla program that knows nothing of xla_pcache, for test_torch_xla_hits.py.

argv[1] is a JSON object: ``init`` ([path, readonly]: call torch_xla's own
``torch_xla.runtime.initialize_cache`` first, as vLLM's TPU worker does), ``graphs``
(names from GRAPHS, run in order), ``ranks`` (run the graphs in that many processes,
started as ``torch_xla.distributed.xla_multiprocessing.spawn`` starts one per device),
``info`` (log the ``xla_pcache`` logger at INFO on stderr), ``init_after`` (calls of
``initialize_cache`` after the graphs ran, each reported as ``ok`` or ``AssertionError``).
The last stdout line is a JSON report: results and torch_xla's own persistent-cache
counters, per rank when ``ranks``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import os
import sys
from typing import Any

import torch
import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr

COUNTERS = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheDeserializeFailure")


def add(x: torch.Tensor) -> torch.Tensor:
    return x * 3 + 1


def square(x: torch.Tensor) -> torch.Tensor:
    return x * x - 2


GRAPHS = {"add": add, "square": square}


def counters() -> dict[str, int]:
    return {name: int(met.counter_value(name) or 0) for name in COUNTERS}


def run_graphs(names: list[str]) -> dict[str, Any]:
    device = torch_xla.device()
    results = {}
    for name in names:
        y = GRAPHS[name](torch.arange(16, dtype=torch.float32).to(device))
        torch_xla.sync()
        results[name] = float(y.cpu().sum())
    # torch_xla's own record of its compiles (nanoseconds), to check the store's figures.
    compile_time = met.metric_data("CompileTime")
    return {
        "results": results,
        "counters": counters(),
        "pid": os.getpid(),
        "compile_ns": float(compile_time[1]) if compile_time else 0.0,
    }


def rank_main(names: list[str]) -> dict[str, Any]:
    # What xmp.spawn's per-process function does before calling the user's function.
    from torch_xla._internal import pjrt

    return pjrt._run_thread_per_device(
        int(os.environ.get("XLA_PCACHE_TEST_RANK", "0")),
        1,
        functools.partial(run_graphs, names),
        initializer_fn=pjrt.initialize_multiprocess,
    )[0]


def _rank(names: list[str], rank: int) -> dict[str, Any]:
    os.environ["XLA_PCACHE_TEST_RANK"] = str(rank)
    return rank_main(names)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("info"):
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        logging.getLogger("xla_pcache").setLevel(logging.INFO)
    if spec.get("init") is not None:
        path, readonly = spec["init"]
        xr.initialize_cache(path, readonly=readonly)
    names = spec.get("graphs", ["add"])
    ranks = spec.get("ranks")
    if not ranks:
        report = run_graphs(names)
        # initialize_cache again after the first execution: torch_xla's own rule applies.
        report["init_after"] = []
        for path, readonly in spec.get("init_after", []):
            try:
                xr.initialize_cache(path, readonly=readonly)
                report["init_after"].append("ok")
            except AssertionError:
                report["init_after"].append("AssertionError")
        print(json.dumps(report))
        return
    # As xmp.spawn does: a pool of processes from torch.multiprocessing's "spawn" context
    # (fresh interpreters that inherit this environment), one per device; on CPU it starts
    # only one, so the pool is made here with as many as asked.
    ctx = torch.multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=ranks, mp_context=ctx, max_tasks_per_child=1
    ) as pool:
        reports = list(pool.map(functools.partial(_rank, names), range(ranks)))
    print(json.dumps({"ranks": reports, "counters": counters()}))


if __name__ == "__main__":
    main()
