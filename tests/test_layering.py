"""The package's import layering: levels only ever imported downwards, and no import circles.

A module may import modules of its own level or below, at the top of the file, inside a
function or under ``TYPE_CHECKING`` alike: an upward import, even a lazy one, would tie a
lower layer to what is built on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "xla_pcache"

LEVELS = {
    # The extension, and what every layer may read: sizes and the settings.
    "_core": 0,
    "_reports": 0,
    "sizes": 0,
    "config": 0,
    # The gates every layer passes what it read through: names, and text shown to people.
    "_names": 0,
    "_text": 0,
    # Leaves the store and the tools use: the remote tiers, bundles, metrics.
    "remote": 1,
    "chain": 1,
    "objstore": 1,
    "bundle": 1,
    "metrics": 1,
    "store": 2,
    "caches": 3,
    # The framework adapters and their helpers (key parts, and the misses they record for
    # explain, which reads them back).
    "_keyparts": 4,
    "_jax_thresholds": 4,
    "jax_cache_dir": 4,
    "_torch_xla_keyparts": 4,
    "explain": 4,
    "on_miss": 4,
    "_single_flight": 4,
    "_torch_xla_sync": 4,
    "jax": 4,
    "torch_xla": 4,
    "_activate": 4,
    # The tools, on top of everything.
    "demo": 5,
    "doctor": 5,
    "cli": 5,
    "__main__": 5,
    "__init__": 5,
}


def _imported(tree: ast.AST) -> set[str]:
    """The package's modules that ``tree`` imports (``xla_pcache.x`` and ``from
    xla_pcache import x`` alike)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "xla_pcache" and len(parts) > 1:
                    found.add(parts[1])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "xla_pcache":
                continue
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found.update(a.name for a in node.names if a.name in LEVELS)
    return found


def test_every_module_has_a_level() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {"_core"}
    assert modules == set(LEVELS)


def test_no_module_imports_one_above_it() -> None:
    upward = []
    for path in sorted(PACKAGE.glob("*.py")):
        here = path.stem
        for name in sorted(_imported(ast.parse(path.read_text()))):
            if LEVELS[name] > LEVELS[here]:
                upward.append(f"{here} (level {LEVELS[here]}) imports {name} ({LEVELS[name]})")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_imports() -> None:
    # It must find what it checks, or the test above could never fail.
    tree = ast.parse(
        "import xla_pcache.jax\nfrom xla_pcache import caches\n"
        "def f():\n    from xla_pcache.store import Store\n"
    )
    assert _imported(tree) == {"jax", "caches", "store"}


def _graph() -> dict[str, set[str]]:
    return {
        path.stem: _imported(ast.parse(path.read_text())) - {path.stem}
        for path in sorted(PACKAGE.glob("*.py"))
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as the path that closes it (depth-first, each found once)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_no_import_circles_even_within_a_level() -> None:
    # Levels only forbid importing upwards: two modules of one level importing each other
    # (lazily or not) would pass that check and still be one tangled module.
    cycles = _cycles(_graph())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"x": {"y"}, "y": {"x"}}) == [["x", "y", "x"]]
