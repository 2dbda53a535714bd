"""``file:`` URLs as cache paths (python/xla_pcache/_file_url.py, through
``cache_path.route``): served as the directory they name on this host, percent-decoded,
``?ro=1`` read-only as a bucket's, or refused with a reason; never a directory named after
the URL. The parser's matrix, then every place a path is taken (``Store``, ``open_store``,
``XLA_PERSISTENT_CACHE_PATH`` in a JAX program, the command's ``--path``, doctor), each
where a refused URL is an error (an API argument, the command) or a warning and no cache
(a program's variable)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from xla_pcache import Store, open_store
from xla_pcache.cache_path import route
from xla_pcache.config import Settings

from tests.helpers import clean_env, cli, tree_state

# (URL, the directory it names, read-only); the last few are plain paths, as controls.
SERVED = [
    ("file:///srv/cache", "/srv/cache", False),
    ("file://localhost/srv/cache", "/srv/cache", False),
    ("file://LocalHost/srv/cache", "/srv/cache", False),
    ("FILE:///srv/cache", "/srv/cache", False),
    ("file:/srv/cache", "/srv/cache", False),
    ("  file:///srv/cache  ", "/srv/cache", False),
    ("file:///srv/my%20cache", "/srv/my cache", False),
    ("file:///srv/my cache", "/srv/my cache", False),
    ("file:///srv/a%23b%3Fc%25d", "/srv/a#b?c%d", False),
    ("file:///srv/caf%C3%A9", "/srv/caf\u00e9", False),
    ("file:///srv/%FF", os.fsdecode(b"/srv/\xff"), False),
    ("file:///srv/a+b", "/srv/a+b", False),
    ("file:///srv/a/../b/./c/", "/srv/b/c", False),
    ("file:///srv/cache?ro=1", "/srv/cache", True),
    ("file://localhost/srv/cache?ro=true", "/srv/cache", True),
    ("file:///srv/cache?ro=", "/srv/cache", True),
    ("file:///srv/cache?read_only=yes", "/srv/cache", True),
    ("file:///srv/cache?ro=0", "/srv/cache", False),
    ("file:///srv/cache?", "/srv/cache", False),
    ("file:/srv/cache?ro=1", "/srv/cache", True),
    # Not URLs: a plain path is the directory of that name, '%', '?' and ':' and all.
    ("/srv/cache%20x", "/srv/cache%20x", False),
    ("/srv/a?ro=1", "/srv/a?ro=1", False),
    ("/srv/filex:y", "/srv/filex:y", False),
    ("/srv/file:y", "/srv/file:y", False),
]

# (URL, what the reason says)
REFUSED = [
    ("file://server/srv/cache", "host 'server'"),
    ("file://127.0.0.1/srv/cache", "host '127.0.0.1'"),
    ("file://user@localhost/srv/cache", "a user or a port"),
    ("file://user:secret@localhost/srv/cache", "a user or a port"),
    ("file://localhost:8080/srv/cache", "a user or a port"),
    ("file:cache", "relative path"),
    ("file:./cache", "relative path"),
    ("file:~/cache", "relative path"),
    ("file:", "names no directory"),
    ("file://", "names no directory"),
    ("file://localhost", "names no directory"),
    ("file:///srv/a%2Fb", "%2F"),
    ("file:///srv/a%2fb", "%2F"),
    ("file:///srv/a%00b", "%00"),
    ("file:///srv/a%zzb", "no escape"),
    ("file:///srv/100%", "no escape"),
    ("file:///srv/cache?RO=1", "other than ro and read_only"),
    ("file:////server/share", "network share"),
    ("file:///srv/cache?token=s3cr3t", "other than ro and read_only"),
    ("file:///srv/cache?ro=1&mode=rw", "other than ro and read_only"),
    ("file:///srv/cache?ro=maybe", "ro"),
    ("file:///srv/cache?ro=1&ro=0", "given twice"),
    ("file:///srv/cache?ro=1&read_only=0", "given twice"),
    ("file:///srv/cache?trust=required", "trust=required"),
    ("file:///srv/cache#frag", "'#'"),
    ("file:///srv/cache#", "'#'"),
    ("file:///srv/a\tb", "control character"),
    ("file:///srv/a\nb", "control character"),
]


@pytest.mark.parametrize(("url", "path", "ro"), SERVED)
def test_a_file_url_is_the_directory_it_names(url: str, path: str, ro: bool) -> None:
    where = route(url)
    assert (where.kind, where.path, getattr(where, "read_only", False)) == ("local", path, ro)


@pytest.mark.parametrize(("url", "why"), REFUSED)
def test_a_file_url_naming_no_directory_here_is_refused(url: str, why: str) -> None:
    where = route(url)
    assert where.kind == "unserved", where
    assert why in where.reason, where.reason
    # An option's value is never quoted: it may be a token pasted by mistake.
    assert "s3cr3t" not in where.reason and "secret" not in where.reason


@pytest.mark.parametrize("url", [u for u, _ in REFUSED])
def test_nothing_is_made_under_a_url(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every refused URL, as an API argument: a ValueError naming the argument, and not a
    directory made anywhere under the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^path "):
        Store(url, settings=Settings())
    with pytest.raises(ValueError, match=r"^cache_dir .* cannot be served"):
        open_store(url, Settings(), name="cache_dir")
    assert list(tmp_path.iterdir()) == []


def test_store_and_open_store_serve_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    named = tmp_path / "my cache"
    url = "file://localhost" + str(named).replace(" ", "%20")
    with Store(url, settings=Settings()) as s:
        assert s.path == str(named) and not s.read_only
        assert s.put("k", b"v" * 100)
    with open_store(url + "?ro=1", Settings()) as s:
        assert s.read_only and bytes(s.get("k") or b"") == b"v" * 100
        assert not s.put("k2", b"w")
    # ?ro=1 can only add: read_only=False does not take it back.
    with Store(url + "?ro=1", settings=Settings(), read_only=False) as s:
        assert s.read_only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my cache"]


def test_the_command_takes_a_file_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "the cache"
    with Store(cache, settings=Settings()) as s:
        assert s.put("k", b"v" * 100)
    url = "file://" + str(cache).replace(" ", "%20")
    out = cli("stats", "--path", url, "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["entries"] == 1
    listed = cli("ls", "--path", url, "--json", cwd=tmp_path)
    assert listed.returncode == 0 and "k" in listed.stdout, listed.stderr
    # Read-only by its URL: what writes is refused, as --read-only is.
    pruned = cli("prune", "--path", url + "?ro=1", "--max-size", "1", cwd=tmp_path)
    assert pruned.returncode == 2 and "read-only" in pruned.stderr, pruned.stderr
    cleared = cli("clear", "--yes", "--path", url + "?ro=1", cwd=tmp_path)
    assert cleared.returncode == 2 and "read-only" in cleared.stderr, cleared.stderr
    # Naming no directory here: one line, exit 2, nothing made.
    for bad in ("file://nas/srv/cache", "file:cache", url + "?ro=1&x=2"):
        proc = cli("stats", "--path", bad, cwd=tmp_path)
        assert proc.returncode == 2, (bad, proc.stdout, proc.stderr)
        assert "cannot be served" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["the cache"]


def test_doctor_reports_the_directory(tmp_path: Path) -> None:
    cache = tmp_path / "d cache"
    url = "file://localhost" + str(cache).replace(" ", "%20") + "?ro=1"
    proc = cli("doctor", "--path", url, "--json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert report["config"]["path"] == str(cache), report["config"]
    assert report["config"]["read_only"] is True
    assert "bucket" not in report["config"]
    bad = cli("doctor", "--path", "file://nas/x", "--json", cwd=tmp_path)
    assert any("cannot be served" in p for p in json.loads(bad.stdout)["problems"])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# Knows nothing of xla_pcache: one program, its value, and JAX's own hit count.
PROGRAM = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax._src import monitoring
    hits = []
    monitoring.register_event_listener(
        lambda event, **kw: hits.append(event)
        if event == "/jax/compilation_cache/cache_hits" else None)
    print(float(jax.jit(lambda x: jnp.sin(x).sum() * 3)(jnp.arange(8.0))), len(hits))
    """
)


def _program(url: str, cwd: Path) -> tuple[float, int, str]:
    env = clean_env(
        ("JAX_",),
        JAX_PLATFORMS="cpu",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        XLA_PERSISTENT_CACHE_PATH=url,
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    value, count = proc.stdout.split()
    return float(value), int(count), proc.stderr


def _entries(root: Path) -> int:
    return sum(1 for _ in (root / "entries").glob("*/*")) if (root / "entries").is_dir() else 0


def test_a_jax_program_writes_where_the_url_names(tmp_path: Path) -> None:
    """XLA_PERSISTENT_CACHE_PATH=file://localhost/<dir>/my%20cache: entries land in
    '<dir>/my cache', read back by the next process; with ?ro=1 the next one hits and writes
    nothing. Nothing is made under the working directory (on 6b856ec: ./localhost/...,
    'my%20cache', 'cache?ro=1')."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    named = tmp_path / "my cache"
    url = "file://localhost" + str(named).replace(" ", "%20")
    value, hits, err = _program(url, cwd)
    assert hits == 0 and _entries(named) >= 1, err
    again, hits, _ = _program(url, cwd)
    assert again == value and hits >= 1
    before = sorted(p.relative_to(named) for p in named.rglob("*"))
    ro_value, ro_hits, err = _program(url + "?ro=1", cwd)
    assert (ro_value, ro_hits) == (value, hits), err
    assert sorted(p.relative_to(named) for p in named.rglob("*")) == before
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "my cache"]


@pytest.mark.parametrize("url", ["file://nas/srv/cache", "file:cache", "file:///x?ro=1&rw=1"])
def test_a_refused_url_leaves_the_program_running_uncached(url: str, tmp_path: Path) -> None:
    """The variable names no directory here: one warning naming it, the program runs and
    compiles (no persistent cache), and no directory is made."""
    value, hits, err = _program(url, tmp_path)
    assert hits == 0 and value == pytest.approx(3 * sum(math.sin(i) for i in range(8)))
    lines = [line for line in err.splitlines() if "cannot be served" in line]
    assert len(lines) == 1 and "XLA_PERSISTENT_CACHE_PATH=" in lines[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("var", ["XLA_PCACHE_TORCH_XLA_LOCAL_DIR", "XLA_PCACHE_LOCAL_PATH"])
@pytest.mark.parametrize("url", ["file:///srv/x", "file:/srv/x", "s3://b/x"])
def test_a_host_local_directory_is_never_a_url(var: str, url: str) -> None:
    """The host-local directories (torch_xla's, a bucket path's store) are directories only:
    a URL there is refused naming the variable, never made into a directory of that name
    (on 6b856ec torch_xla's was taken as it was: './file:/srv/x')."""
    with pytest.raises(ValueError, match=f"invalid {var}: a local directory, not a URL"):
        Settings.from_env({var: url})


def test_torch_xla_install_refuses_a_url_as_its_local_dir() -> None:
    """``local_dir`` is a host-local directory: a URL there is refused by name before
    torch_xla is touched, never made into a directory named after it."""
    import xla_pcache.torch_xla as xt

    with pytest.raises(ValueError, match="local_dir"):
        xt.install("/tmp/unused-cache", local_dir="file:///tmp/x")


def test_the_demo_refuses_a_read_only_url(tmp_path: Path) -> None:
    """The demo writes to the cache: a ``?ro=1`` path is one error line, exit status 2."""
    r = subprocess.run(
        [sys.executable, "-m", "xla_pcache", "demo", "--path", f"file://{tmp_path}/c?ro=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r
    assert "?ro=1" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "command",
    [
        ("config", "--max-size", "1M"),
        ("verify", "--repair"),
        ("import", "BUNDLE"),
        ("prune", "--older-than", "1s"),
    ],
)
def test_a_read_only_url_stays_read_only_whatever_the_environment_says(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    """``?ro=1`` on the cache's URL, with ``XLA_PERSISTENT_CACHE_READ_ONLY=0`` in the
    environment, and the URL itself in ``XLA_PERSISTENT_CACHE_PATH`` too: every command
    that writes refuses (exit 2, saying read-only) and the directory is left as it was."""
    cache = tmp_path / "c"
    with Store(cache, settings=Settings()) as s:
        for i in range(3):
            assert s.put(f"k{i}", bytes(500 + i))
        s.export_bundle(str(tmp_path / "b.tgz"))
    with Store(tmp_path / "other", settings=Settings()) as s:
        assert s.put("new", bytes(700))
        s.export_bundle(str(tmp_path / "new.tgz"))
    url = f"file://{cache}?ro=1"
    args = [str(tmp_path / "new.tgz") if a == "BUNDLE" else a for a in command]
    before = tree_state(cache)
    for where in (["--path", url], []):
        proc = cli(
            *args,
            *where,
            cwd=tmp_path,
            XLA_PERSISTENT_CACHE_READ_ONLY="0",
            XLA_PERSISTENT_CACHE_PATH=url,
        )
        assert proc.returncode == 2 and "read-only" in proc.stderr, (where, proc.stderr)
    assert tree_state(cache) == before
