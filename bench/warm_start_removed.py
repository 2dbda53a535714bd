"""The start after the entries are removed, a section of ``bench/warm_start.py`` (``--removed``):
the store the cold process filled, its executables deleted (as a budget's eviction or a prune
would) and its plan and module records kept, started from in fresh processes:

- ``removed``: compiling ahead off (``XLA_PCACHE_COMPILE_AHEAD=0``): each program compiled
  when the run reaches it, one after another, as in a cold start;
- ``ahead``: compiling ahead on (as installed): the plan's programs compiled from their
  records on a thread pool from the session's start, each handed to JAX's compile of it;
- ``jax_cold``: JAX's own cache, empty (``XLA_PCACHE_DISABLE=1``): JAX's cold start.

Each process starts from its own copy of that store (a run puts its executables back) or an
empty directory, made before it starts and removed after; the rows run round-robin. The
ratios are of the first steps (from the backend's being up), as in the warm rows.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import fmt_time

ROWS = {
    "removed": "entries removed, compiling ahead off",
    "ahead": "entries removed, compiling ahead",
    "jax_cold": "JAX's own cache, empty (cold)",
}


def template(store: Path, dst: Path) -> tuple[int, int]:
    """A copy of ``store`` at ``dst`` without its executables: how many were removed, and
    how many module records stay."""
    from xla_pcache import Store
    from xla_pcache.config import Settings
    from xla_pcache.jax._module_record import KEY_PREFIX as RECORD
    from xla_pcache.jax._plan import KEY_PREFIX as PLAN

    shutil.copytree(store, dst, symlinks=True)
    removed = records = 0
    with Store(dst, settings=Settings()) as s:
        keys = s.keys()
        for key in keys:
            text = str(key)
            if text.startswith(RECORD):
                records += 1
            elif not text.startswith(PLAN) and s.delete(key):
                removed += 1
    return removed, records


def run_rows(
    run_process: Callable[[str, Path, Path], dict[str, Any]],
    kept: Path,
    scratch: Path,
    repeats: int,
    note: Callable[[dict[str, Any]], None],
) -> dict[str, list[dict[str, Any]]]:
    """Each row ``repeats`` times, round-robin, each process from a fresh copy of ``kept``
    (or an empty JAX cache): ``run_process(case, store, jax_dir)``."""
    rows: dict[str, list[dict[str, Any]]] = {case: [] for case in ROWS}
    order = list(ROWS)
    for i in range(repeats):
        for case in order[i % 3 :] + order[: i % 3]:
            store, jax_dir = scratch / f"{case}-{i}", scratch / f"{case}-{i}-jax"
            if case != "jax_cold":
                shutil.copytree(kept, store, symlinks=True)
            jax_dir.mkdir(parents=True)
            try:
                row = run_process(case, store, jax_dir)
            finally:
                shutil.rmtree(store, ignore_errors=True)
                shutil.rmtree(jax_dir, ignore_errors=True)
            rows[case].append(row)
            note(row)
    return rows


def _med(rows: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(float(r[field]) for r in rows))


def table(rows: dict[str, list[dict[str, Any]]], removed: int, records: int) -> str:
    base = _med(rows["removed"], "first_calls_s")
    jax = _med(rows["jax_cold"], "first_calls_s")
    lines = [
        f"The start after the entries are removed: {removed} executables deleted, the plan "
        f"and {records} module records kept; {len(rows['ahead'])} process(es) per row, "
        "medians.",
        "",
        "| row | first steps | from the process's start | process wall | CPU time "
        "| compiled ahead: used / compiled | first steps vs ahead off | vs JAX's cold |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for case, label in ROWS.items():
        rs = rows[case]
        steps = _med(rs, "first_calls_s")
        pf = rs[0].get("prefetch") or {}
        ahead = (
            f"{pf.get('prefetch_compiled_used', 0)} / {pf.get('prefetch_compiled', 0)}"
            if case == "ahead"
            else ""
        )
        lines.append(
            f"| {label} | {fmt_time(steps)} | {fmt_time(_med(rs, 'ready_s'))} "
            f"| {fmt_time(_med(rs, 'wall_s'))} | {fmt_time(_med(rs, 'cpu_s'))} | {ahead} "
            f"| {steps / base:.2f} | {steps / jax:.2f} |"
        )
    steps = _med(rows["ahead"], "first_calls_s")
    spread = [r["first_calls_s"] / base for r in rows["removed"]]
    lines += [
        "",
        f"Compiling ahead: first steps {steps / base:.2f}x the start with it off "
        f"(whose own spread is {min(spread):.2f}-{max(spread):.2f}x), "
        f"{steps / jax:.2f}x JAX's own cold start.",
    ]
    return "\n".join(lines)


def check(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    failures = []
    if any(r.get("prefetch", {}).get("prefetch_compiled_used", 0) == 0 for r in rows["ahead"]):
        failures.append("ahead: nothing compiled ahead was used")
    if any(r.get("prefetch", {}).get("prefetch_compiled", 0) for r in rows["removed"]):
        failures.append("removed: compiled ahead with compiling ahead off")
    for case in ROWS:
        if any(r["hits"] for r in rows[case]):
            failures.append(f"{case}: a process hit (its entries were to be gone)")
    return failures
