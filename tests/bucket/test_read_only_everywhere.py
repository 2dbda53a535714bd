"""Read-only means read-only everywhere: a bucket path's ``?ro=1``,
``XLA_PERSISTENT_CACHE_READ_ONLY`` and ``--read-only`` (or ``read_only=True``) are one rule for
its entries, the hosts' records, torch_xla's markers, the budget and prune, in every command
and in the store the adapters open; and the variable and the flag are the rule for a
directory's commands. A matrix, read-only source x operation, against a real S3 service
(SeaweedFS on loopback) and a directory: each refused operation says so in one line with
exit status 2 (or raises ``ReadOnlyError``), and no object or file changes; ``stats`` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import obstore
import pytest
from typer.testing import CliRunner
from xla_pcache import Store, _core, open_store
from xla_pcache.bucket import upkeep
from xla_pcache.cli import app
from xla_pcache.config import Settings

from tests.helpers import tree_state
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix

RO_VAR = "XLA_PERSISTENT_CACHE_READ_ONLY"


def _objects(server: BucketServer, prefix: str) -> dict[str, tuple[int, str | None]]:
    return {
        str(o["path"]): (int(o["size"]), o["e_tag"])
        for o in obstore.list(bucket_client(server, prefix)).collect()
    }


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def filled(
    bucket_server: BucketServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    """A bucket prefix with what every operation below would change: entries past a small
    budget, a host's record, a torch_xla marker. (prefix, url)"""
    prefix = fresh_prefix()
    url = bucket_server.url(prefix)
    home = tmp_path_factory.mktemp("writer")
    with pytest.MonkeyPatch.context() as m:
        for k, v in bucket_server.env().items():
            m.setenv(k, v)
        settings = Settings.from_env().replace(xdg_cache_home=str(home))
        with open_store(url, settings=settings) as w:
            for i in range(4):
                assert w.put(f"k{i}", bytes(20_000))
            w.mark("torch_xla/123", "123")
        upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=30_000))
    objects = _objects(bucket_server, prefix)
    assert [p for p in objects if "/records/" in p] and [p for p in objects if "/torch_xla/" in p]
    return prefix, url


# The read-only sources of a bucket path: (how the path is written, the environment, whether
# the command's --read-only / the API's read_only=True is given).
BUCKET_SOURCES = {
    "?ro=1": ("?ro=1", {}, False),
    RO_VAR: ("", {RO_VAR: "1"}, False),
    "--read-only": ("", {}, True),
}
# Each command that writes to a bucket, and whether it takes --read-only.
BUCKET_COMMANDS = {
    "prune": (["prune", "--max-size", "1"], True),
    "prune by age": (["prune", "--older-than", "1s"], True),
    "prune --untrusted": (["prune", "--untrusted"], True),
    "config": (["config", "--max-size", "1K"], False),
}


def _matrix(sources: dict[str, Any], commands: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (source, command) pair, less the flag for a command that has no such flag."""
    return [
        (source, command)
        for source in sorted(sources)
        for command in sorted(commands)
        if commands[command][1] or source != "--read-only"
    ]


@pytest.mark.parametrize(("source", "command"), _matrix(BUCKET_SOURCES, BUCKET_COMMANDS))
def test_a_read_only_bucket_command_writes_nothing(
    server: BucketServer,
    filled: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    command: str,
) -> None:
    prefix, url = filled
    query, env, flag = BUCKET_SOURCES[source]
    args, _ = BUCKET_COMMANDS[command]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = _objects(server, prefix)
    out = _cli(*args, "--path", url + query, *(["--read-only"] if flag else []))
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and "read-only" in lines[0] and "writes to the bucket" in lines[0]
    assert _objects(server, prefix) == before
    # Looking is no writing: stats runs under every source.
    looked = _cli("stats", "--path", url + query, "--json")
    assert looked.exit_code == 0, looked.output
    assert _objects(server, prefix) == before


@pytest.mark.parametrize("source", sorted(BUCKET_SOURCES))
def test_a_read_only_bucket_store_writes_nothing(
    server: BucketServer,
    filled: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
) -> None:
    """The store every adapter opens for a bucket path: a hit (a record), a put (an entry),
    a replace (a prefetch plan's write), torch_xla's marker of what it published, the
    writers' prune and the budget."""
    prefix, url = filled
    query, env, flag = BUCKET_SOURCES[source]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = _objects(server, prefix)
    settings = Settings.from_env().replace(xdg_cache_home=str(tmp_path))
    store = open_store(url + query, settings=settings, read_only=True if flag else None)
    assert store.get("k1") is not None  # served from the bucket
    assert store.put("new", bytes(1000))  # kept by this host
    assert store.replace("k2", bytes(500))  # this host's copy replaced, the bucket's kept
    store.mark("torch_xla/456", "456")
    with pytest.raises(_core.ReadOnlyError):
        store.bucket().prune()
    with pytest.raises(_core.ReadOnlyError):
        store.bucket().write_stored_budget(upkeep.BucketStoredBudget(max_size=1))
    assert store.bucket().stats()["entries"] == 4
    store.close()
    assert _objects(server, prefix) == before


def test_the_upkeep_of_a_read_only_url_refuses_every_write(
    server: BucketServer, filled: tuple[str, str]
) -> None:
    """``Bucket`` itself, for any caller: ``?ro=1`` in its URL refuses before a request."""
    prefix, url = filled
    before = _objects(server, prefix)
    b = upkeep.Bucket(f"{url}?ro=1")
    for write in (
        lambda: b.prune(max_size=1),
        lambda: b.write_stored_budget(upkeep.BucketStoredBudget(max_size=1)),
        lambda: b.mark(_core.entry_name("k0"), "1"),
        lambda: b.put(upkeep.STATE, b"{}"),
        lambda: b.delete([f"{upkeep.ROOT}/entries/x"]),
    ):
        with pytest.raises(_core.ReadOnlyError, match="read-only"):
            write()
    assert sum(b.requests.values()) == 0
    assert _objects(server, prefix) == before


# ----------------------------------------------------------------------------- a directory

DIR_SOURCES = {RO_VAR: ({RO_VAR: "1"}, False), "--read-only": ({}, True)}
# Each command that writes to a directory, and whether it takes --read-only.
DIR_COMMANDS = {
    "prune": (["prune", "--max-size", "1"], True),
    "clear": (["clear", "--yes"], True),
    "verify --repair": (["verify", "--repair"], True),
    "config": (["config", "--max-size", "1K"], False),
    "import": (["import", "BUNDLE"], False),
}


@pytest.fixture
def cache_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A cache with entries past any budget and one damaged entry (for --repair), and a
    bundle to import."""
    root = tmp_path / "cache"
    with Store(root) as s:
        for i in range(4):
            assert s.put(f"k{i}", bytes(20_000))
    files = [p for p in (root / "entries").rglob("*") if p.is_file()]
    with open(files[0], "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\xff")
    source = tmp_path / "other"
    with Store(source) as s:
        assert s.put("other", b"v")
    bundle = tmp_path / "b.tar.gz"
    assert _cli("export", "--path", str(source), "-o", str(bundle)).exit_code == 0
    return root, bundle


@pytest.mark.parametrize(("source", "command"), _matrix(DIR_SOURCES, DIR_COMMANDS))
def test_a_read_only_directory_command_writes_nothing(
    cache_dir: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    command: str,
) -> None:
    root, bundle = cache_dir
    env, flag = DIR_SOURCES[source]
    args, _ = DIR_COMMANDS[command]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = [str(bundle) if a == "BUNDLE" else a for a in args]
    before = tree_state(root)
    out = _cli(*args, "--path", str(root), *(["--read-only"] if flag else []))
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and "read-only" in lines[0], out.output
    assert tree_state(root) == before
    looked = _cli("stats", "--path", str(root), "--json")
    assert looked.exit_code == 0, looked.output
    assert tree_state(root) == before
