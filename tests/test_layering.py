"""The package's import layering: levels only ever imported downwards, and no import circles.

A module may import modules of its own level or below, at the top of the file, inside a
function or under ``TYPE_CHECKING`` alike: an upward import, even a lazy one, would tie a
lower layer to what is built on it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "xla_pcache"

# Modules by dotted name below the package (``tiers.chain``); a subpackage by its own name
# (``jax`` is ``jax/__init__.py``), the package's own ``__init__`` as ``__init__``.
LEVELS = {
    # The extension, and what every layer may read: sizes and the settings.
    "_core": 0,
    "_reports": 0,
    "sizes": 0,
    # The variables: their names and table, a value parsed by its kind, the key files, the
    # settings read at once.
    "config.variables": 0,
    "config.values": 0,
    "config.keys": 0,
    "config.settings": 0,
    "config": 0,
    # The gates every layer passes what it read through: names, and text shown to people.
    "_names": 0,
    # The one test of whether a cache path is a URL, and the schemes of buckets.
    "_url": 0,
    "_text": 0,
    # A store key with the runtime build that compiled it: the one module that joins and
    # parses a key's build (see the test below).
    "build_key": 0,
    # The miss log: explain writes it for the adapters and reads it back.
    "misslog": 0,
    # Points a test waits on (XLA_PCACHE_TEST_HOOKS).
    "_testhook": 0,
    # The memory this job may use: the host's and its cgroups' limits.
    "_memory": 0,
    # Which build of a framework's runtime made an entry (the package ``builds``): which
    # files make a runtime, the build and its digest, the files' identities over the
    # extension's record, another build's entry after a miss.
    "builds.files": 0,
    "builds.build": 0,
    "builds.identities": 0,
    "builds.others": 0,
    "builds": 0,
    # Host-local directories of this user's own, as handles.
    "_owndir": 0,
    # What a `with` block does with an object that closes.
    "_closing": 0,
    # Leaves the store and the tools use: the remote tiers (one package), bundles, metrics.
    "tiers.base": 1,
    "tiers.read_only": 1,
    # A file: URL as a cache path: the directory it names (its options parsed as a tier's).
    "_file_url": 1,
    "tiers.redis": 1,
    "tiers.objstore": 1,
    "tiers.chain": 1,
    "tiers": 1,
    # A bucket's upkeep (the package ``bucket``, over the objstore tier): its objects' names,
    # the requests, a listing's bounded pages, the one reader and its listings, the budget,
    # a use record, the prune lease, what a prune reads, what a prune cut short reaches by
    # name and the prune, under the one door, ``bucket.upkeep.Bucket``; the hosts' records of
    # their uses; the markers a host start lists. It names no framework (see the test below).
    "bucket.pages": 1,
    "bucket.listing": 1,
    "bucket.reader": 1,
    "bucket.layout": 1,
    "bucket.objects": 1,
    "bucket.stored_budget": 1,
    "bucket.use_record": 1,
    "bucket.prune_lease": 1,
    "bucket.prune_fold": 1,
    "bucket.prune_reach": 1,
    "bucket.prune_markers": 1,
    "bucket.prune": 1,
    "bucket.marker_listing": 1,
    "bucket.upkeep": 1,
    "bucket.recorder": 1,
    "bundle": 1,
    "metrics": 1,
    "store": 2,
    # A bucket as the cache path: its host-local store, over the store (the package's
    # ``__init__`` names it).
    "bucket.store": 2,
    "bucket": 2,
    # A cache path routed, and the one door to its store (a directory's or a bucket's).
    "cache_path": 2,
    "caches": 3,
    # The framework adapters, each with its helpers, and explain, which records their misses
    # and reads them back.
    "jax": 4,
    "jax._keyparts": 4,
    "jax._build": 4,
    "jax._thresholds": 4,
    "jax._cache_dir": 4,
    "jax._adopt": 4,
    # What one compile keeps on its thread between the cache's read and its put.
    "jax._compile_context": 4,
    "jax._single_flight": 4,
    "jax._store_cache": 4,
    "jax._patch": 4,
    "jax._module_diff": 4,
    "jax._hooks": 4,
    # Loading and compiling ahead, one wing (``jax/ahead``): the plan, which of its variants a
    # run is, its writing; a module record's format, the target a program was compiled for,
    # the frames a program and its compiler process exchange, the compiler process and the
    # program's side of it, the records written at JAX's put, what the session hands the
    # compiler; loading one executable, the order of loading, JAX's backend once up, the
    # session (the one scheduler and pool of both) in its parts: what it holds, its hand-over
    # to compiling ahead, its loading pool, its life, its report, JAX's read; the hook on
    # JAX's cache read.
    "jax.ahead": 4,
    "jax.ahead._plan": 4,
    "jax.ahead._plan_name": 4,
    "jax.ahead._recognition": 4,
    "jax.ahead._plan_writer": 4,
    "jax.ahead._record": 4,
    "jax.ahead._target": 4,
    "jax.ahead._fleet": 4,
    "jax.ahead._protocol": 4,
    "jax.ahead._compiler": 4,
    "jax.ahead._link": 4,
    "jax.ahead._recording": 4,
    "jax.ahead._compiling": 4,
    "jax.ahead._precompile": 4,
    "jax.ahead._loads": 4,
    "jax.ahead._schedule": 4,
    "jax.ahead._backend_wait": 4,
    "jax.ahead._session_state": 4,
    "jax.ahead._handover": 4,
    "jax.ahead._pool": 4,
    "jax.ahead._session_life": 4,
    "jax.ahead._session_report": 4,
    "jax.ahead._prefetch": 4,
    "jax.ahead._read_hook": 4,
    # What install() sets up in JAX, step by step, and keeps to undo it.
    "jax._installation": 4,
    # torch_xla's package holds the ways in (install(), activation, initialize_cache); its
    # modules: torch_xla itself as the adapter uses it, the variables torch_xla and children
    # read, the store and host mirror a process is served from, and what install() set up.
    "torch_xla": 4,
    "torch_xla._keyparts": 4,
    "torch_xla._build": 4,
    "torch_xla._runtime": 4,
    "torch_xla._environment": 4,
    "torch_xla._serve": 4,
    # torch_xla's start on a bucket path (what it fetches, in what order) and what it
    # removes of the garbage it proved, through the bucket's typed BucketStore.
    "torch_xla._bucket_start": 4,
    "torch_xla._bucket_garbage": 4,
    "torch_xla._cache": 4,
    # The host mirror (torch_xla's directory kept in step with the store) and its parts:
    # file names and keys, counters, the host's directories, store -> pool, the view,
    # view -> store.
    "torch_xla._host_mirror": 4,
    "torch_xla._keys": 4,
    "torch_xla._mirror_counters": 4,
    "torch_xla._mirror_dirs": 4,
    "torch_xla._mirror_pool": 4,
    "torch_xla._mirror_view": 4,
    "torch_xla._mirror_publish": 4,
    "torch_xla._opens": 4,
    "explain": 4,
    "on_miss": 4,
    "_activate": 4,
    # The command and its tools, on top of everything.
    "cli": 5,
    "cli._common": 5,
    "cli._stats": 5,
    "cli._ls": 5,
    "cli._prune": 5,
    "cli._config": 5,
    "cli._verify": 5,
    "cli._bundle": 5,
    # doctor: its report put together and printed, over its parts: each framework's probe,
    # what the environment asks, the report for people.
    "cli._doctor": 5,
    "cli._doctor.frameworks": 5,
    "cli._doctor.environment": 5,
    "cli._doctor.render": 5,
    "cli._doctor.key_settings": 5,
    "cli._doctor.bucket_check": 5,
    "cli._demo": 5,
    "cli._precompile": 5,
    "__main__": 5,
    "__init__": 5,
}


def _modules() -> dict[str, Path]:
    """Every module of the package, subpackages included, by its name in ``LEVELS``."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(dotted: str) -> str | None:
    """The module ``xla_pcache.<dotted>`` names, or the deepest of its packages that is one
    (``tiers.chain.Chain`` -> ``tiers.chain``)."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in LEVELS:
            return name
        parts.pop()
    return None


def _imported(tree: ast.AST) -> set[str]:
    """The package's modules that ``tree`` imports (``xla_pcache.x.y``, ``from xla_pcache.x
    import y`` and ``from xla_pcache import x`` alike). Importing ``x.y`` runs the package
    ``x`` first, as Python does; that is counted as an import of ``x.y`` alone, since a
    package's ``__init__`` importing its own modules is the package's own business."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head, _, rest = alias.name.partition(".")
                if head == "xla_pcache" and rest and (name := _resolve(rest)):
                    found.add(name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, "the package imports absolutely"
            head, _, rest = node.module.partition(".")
            if head != "xla_pcache":
                continue
            for alias in node.names:
                name = _resolve(f"{rest}.{alias.name}" if rest else alias.name)
                if name is None and rest:
                    name = _resolve(rest)
                if name is not None:
                    found.add(name)
    return found


def test_every_module_has_a_level() -> None:
    assert set(_modules()) | {"_core"} == set(LEVELS)


def test_no_module_imports_one_above_it() -> None:
    upward = []
    for here, path in _modules().items():
        for name in sorted(_imported(ast.parse(path.read_text()))):
            if LEVELS[name] > LEVELS[here]:
                upward.append(f"{here} (level {LEVELS[here]}) imports {name} ({LEVELS[name]})")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_imports() -> None:
    # It must find what it checks, or the test above could never fail.
    tree = ast.parse(
        "import xla_pcache.jax\nfrom xla_pcache import caches\n"
        "def f():\n    from xla_pcache.store import Store\n"
        "from xla_pcache.tiers import chain, Tier\nimport xla_pcache.cli._doctor\n"
        "from xla_pcache.jax import _keyparts as k\n"
    )
    assert _imported(tree) == {
        "jax",
        "caches",
        "store",
        "tiers.chain",
        "tiers",
        "cli._doctor",
        "jax._keyparts",
    }


def _graph() -> dict[str, set[str]]:
    return {
        name: _imported(ast.parse(path.read_text())) - {name} for name, path in _modules().items()
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


def _tier_modules_importing_the_bucket(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a bucket module (``bucket``, ``bucket.*``) by a tier module."""
    return [
        f"{here} imports {name}"
        for here, names in sorted(graph.items())
        if here == "tiers" or here.startswith("tiers.")
        for name in sorted(names)
        if name == "bucket" or name.startswith("bucket.")
    ]


def test_no_tier_imports_the_bucket() -> None:
    # The bucket (a cache path, and its upkeep) is built on the tiers: it uses the objstore
    # tier's client and names. A tier that imported it back would make the two one module
    # again, whatever their levels say.
    found = _tier_modules_importing_the_bucket(_graph())
    assert not found, "\n".join(found)
    assert any(n.startswith("tiers") for n in _graph()["bucket.upkeep"]), "the check sees none"


def test_the_tier_check_sees_a_tier_importing_the_bucket() -> None:
    graph = {"tiers.chain": {"bucket.upkeep", "tiers.base"}, "bucket.upkeep": {"tiers"}}
    assert _tier_modules_importing_the_bucket(graph) == ["tiers.chain imports bucket.upkeep"]
    assert _tier_modules_importing_the_bucket({"tiers": {"bucket"}}) == ["tiers imports bucket"]


# The framework adapters (``xla_pcache.jax``, ``xla_pcache.torch_xla``), and the frameworks
# they adapt, which the bucket and the tiers serve without knowing: neither imports nor
# names one. What is checked is code, not prose: an import (absolute, from the package, or of
# the framework), a name or attribute ``jax`` / ``torch_xla``, a string naming a module of
# either (``importlib.import_module``, ``sys.modules[...]``). The bucket's object names are
# data (its markers' directory keeps the name the buckets that hold markers have).
ADAPTERS = ("jax", "torch_xla")
NEUTRAL = ("bucket", "tiers")


def _adapter_named(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that import or name an adapter or its framework."""
    prose = _docstrings(tree)

    def adapter(dotted: str) -> bool:
        head, _, rest = dotted.partition(".")
        if head == "xla_pcache":
            head = rest.partition(".")[0]
        return head in ADAPTERS

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            lines += [node.lineno for a in node.names if adapter(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if adapter(node.module) or (
                node.module == "xla_pcache" and any(a.name in ADAPTERS for a in node.names)
            ):
                lines.append(node.lineno)
        elif (
            (isinstance(node, ast.Name) and node.id in ADAPTERS)
            or (isinstance(node, ast.Attribute) and node.attr in ADAPTERS)
            or (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in prose
                and (
                    node.value in ADAPTERS
                    or (node.value.startswith("xla_pcache.") and adapter(node.value))
                )
            )
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_bucket_or_tier_module_names_an_adapter() -> None:
    found = {
        here: lines
        for here, path in _modules().items()
        if here.partition(".")[0] in NEUTRAL
        and (lines := _adapter_named(ast.parse(path.read_text())))
    }
    assert not found, f"the bucket and the tiers know no framework: {found}"
    # The checker sees what an adapter names of itself.
    assert _adapter_named(ast.parse(_modules()["torch_xla._serve"].read_text()))


def test_the_adapter_checker_sees_namings() -> None:
    tree = ast.parse(
        '"""Serves torch_xla and jax alike."""\n'
        "import xla_pcache.torch_xla\n"
        "from xla_pcache import jax\n"
        "from xla_pcache.torch_xla._keys import KEY_PREFIX\n"
        "import torch_xla.core.xla_model\n"
        'm = importlib.import_module("xla_pcache.jax._plan")\n'
        "n = xla_pcache.torch_xla\n"
        'o = sys.modules["jax"]\n'
        "def f():\n    from jax import numpy\n"
        'p = f"{ROOT}/torch_xla"\n'
        "from xla_pcache import bucket, tiers\n"
    )
    assert _adapter_named(tree) == [2, 3, 4, 5, 6, 7, 8, 10]


def _rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` between rooms: a subpackage with its modules is one room (``tiers``,
    ``bucket``, ``jax``), a module of the package's top another."""

    def room(name: str) -> str:
        return name.partition(".")[0]

    out: dict[str, set[str]] = {}
    for here, names in graph.items():
        out.setdefault(room(here), set()).update(room(n) for n in names)
    return {r: names - {r} for r, names in out.items()}


def test_no_circles_between_rooms() -> None:
    # A module-level check lets two packages import each other through different modules
    # (``tiers.chain`` -> ``bucket.upkeep`` -> ``tiers.objstore``): no circle either way.
    cycles = _cycles(_rooms(_graph()))
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
    assert _cycles(_rooms({"a.x": {"b.y"}, "b.y": set(), "b.z": {"a.w"}})) == [["a", "b", "a"]]


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"x": {"y"}, "y": {"x"}}) == [["x", "y", "x"]]


# The one place the package turns a path into a store: ``cache_path.open_store``. A store is
# made by calling its class (``Store(``, ``BucketStore(``, ``_core.Store(``) or the class's
# constructor for settled options (``Store._open(``); ``store.py`` defines them.
DOOR = "cache_path"
_CLASSES = frozenset({"Store", "BucketStore"})


def _stores_built(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that build a store: a call of ``Store`` or ``BucketStore``, by
    name or as an attribute (``_core.Store(...)``), or of their ``_open``."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "_open":
            f = f.value
        name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
        if name in _CLASSES:
            lines.append(node.lineno)
    return lines


def _found_outside(
    find: Callable[[ast.AST], list[int]], owner: str, *allowed: str
) -> dict[str, list[int]]:
    """The lines where ``find`` sees it in each module but ``owner`` and ``allowed`` (after
    checking ``find`` sees it in ``owner``, so a checker that sees nothing cannot pass)."""
    found = {here: find(ast.parse(path.read_text())) for here, path in _modules().items()}
    assert found[owner], f"{owner} does it, and the checker sees it"
    return {m: lines for m, lines in found.items() if lines and m not in (owner, *allowed)}


def test_one_module_builds_a_store_from_a_path() -> None:
    # store.py builds one in Store() itself (for a caller of the public class).
    others = _found_outside(_stores_built, DOOR, "store")
    assert not others, f"only {DOOR}.open_store builds a store from a path: {others}"


def test_the_door_checker_sees_constructors() -> None:
    tree = ast.parse(
        "Store(p)\nbucket.BucketStore(p)\n_core.Store(p, max_size=1)\nStore._open(p, o)\n"
        "open_store(p)\nStoreOptions()\nreader._open(p)\n"
    )
    assert _stores_built(tree) == [1, 2, 3, 4]


# The one module that joins a key and a runtime build and parses them apart: every other
# module goes through its functions (``build_key.join``, ``split``, ``strip``; ``Build``'s
# ``store_key``), so the format and its checks live in one place.
KEY_OWNER = "build_key"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants in ``tree`` (prose may show a key's format)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _build_suffix_spelled(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that spell a key's build suffix themselves: a string (f-strings'
    parts included, docstrings not) holding ``@build``, or a build separator named (the
    owner's ``_SEPARATOR``, or any ``*BUILD_SEP*``)."""
    prose = _docstrings(tree)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "@build" in node.value and id(node) not in prose:
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute | ast.Name | ast.alias):
            name = {ast.Attribute: "attr", ast.Name: "id", ast.alias: "name"}[type(node)]
            named = str(getattr(node, name)).rpartition(".")[2]
            if named == "_SEPARATOR" or "BUILD_SEP" in named.upper():
                lines.append(getattr(node, "lineno", 0))
    return sorted(lines)


def test_one_module_joins_and_parses_a_keys_build() -> None:
    others = _found_outside(_build_suffix_spelled, KEY_OWNER)
    assert not others, f"only {KEY_OWNER} joins or parses a key's build: {others}"


def test_the_build_suffix_checker_sees_spellings() -> None:
    tree = ast.parse(
        '"""A key is ``<key>@build-<32 hex>``."""\n'
        'a = key + "@build-" + b\n'
        'head, _, tail = stored.rpartition("@build-")\n'
        'c = f"{key}@build-{digest}"\n'
        "from xla_pcache.build_key import _SEPARATOR\n"
        "d = build_key._SEPARATOR + b\n"
        "e = stored.partition(BUILD_SEPARATOR)[0]\n"
        'def f():\n    """``k@build-d``"""\n    return k\n'
        "g = build_key.join(key, b)\n"
    )
    assert _build_suffix_spelled(tree) == [2, 3, 4, 5, 6, 7]
