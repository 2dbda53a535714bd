"""The docs name files that exist: every path in ARCHITECTURE.md's file tree, and every module
of the package or source of the core the docs name. (That the tree lists every source file
is `rust/core/src/layering_tests.rs`'s check.)"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "python" / "xla_pcache"
CORE = REPO / "rust" / "core" / "src"
DOCS = [REPO / "ARCHITECTURE.md", REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# A path as the docs write it: from the repository's root, or from the package (its
# subpackages: `bucket/prune.py`), the core (its folders: `store/read.rs`) or tests/.
_PATH = re.compile(r"(?<![\w./-])([A-Za-z_][\w.-]*(?:/[\w.-]+)+\.(?:py|pyi|rs))(?![\w/])")


def tree() -> list[str]:
    """The paths ARCHITECTURE.md's file tree lists, each from the repository's root."""
    text = (REPO / "ARCHITECTURE.md").read_text()
    block = text.split("## Files", 1)[1].split("```", 2)[1]
    out: list[str] = []
    base = None
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            base = line.split()[0]
            out.append(base)
        elif line.startswith("  ") and not line.startswith("   ") and base is not None:
            out.append(base + line.split()[0])
    return out


def named(text: str) -> list[str]:
    """The paths of ours that ``text`` names, each from the repository's root."""
    out = []
    for m in _PATH.finditer(text):
        path = m.group(1)
        first = path.split("/", 1)[0]
        if path.startswith(("python/xla_pcache/", "rust/", "tests/")):
            out.append(path)
        elif path.rsplit("/", 1)[1].startswith("test_"):
            out.append(f"tests/{path}")  # a test, named from tests/ (bucket/test_prune.py)
        elif "/_src/" in path:
            continue  # JAX's own sources (jax/_src/compiler.py)
        elif path.endswith(".py") and (PACKAGE / first).is_dir():
            out.append(f"python/xla_pcache/{path}")
        elif path.endswith(".rs") and (CORE / first).is_dir():
            out.append(f"rust/core/src/{path}")
    return out


def test_the_file_tree_lists_only_files_that_exist() -> None:
    listed = tree()
    assert len(listed) > 200, f"found only {len(listed)} paths in the file tree"
    assert [p for p in listed if not (REPO / p).exists()] == []


def test_the_docs_name_only_modules_that_exist() -> None:
    missing = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            missing += [
                f"{doc.relative_to(REPO)}:{n}: {p}" for p in named(line) if not (REPO / p).exists()
            ]
    assert missing == []


def test_the_checks_see_paths() -> None:
    assert named("see `bucket/prune.py` and store/read.rs, not jax/_src/compiler.py") == [
        "python/xla_pcache/bucket/prune.py",
        "rust/core/src/store/read.rs",
    ]
    assert named("python/xla_pcache/jax/_gone.py") == ["python/xla_pcache/jax/_gone.py"]
    assert named("`tiers/test_objstore.py`") == ["tests/tiers/test_objstore.py"]
    assert "python/xla_pcache/bucket/prune.py" in tree()
    assert "rust/core/src/store/gate.rs" in tree()
