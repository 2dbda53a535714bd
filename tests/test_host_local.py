"""Host-local copies are the host's own: torch_xla's pool and views and a bucket path's
host-local store are made mode 0700 whatever the umask, and a directory another user made,
or a link, is refused with one message naming it, never used: whoever could write there
would choose what this user's processes load.

The upgrade path: a directory an earlier release made under ``umask 002`` (this user's,
writable by the group) is repaired, made 0700 with everything in it discarded (others could
have written there), with one warning naming it, and caching goes on in the same process; a
root the user named that others can write is left alone and this user's own directory
beneath it used. Every use after the check goes through the handle it was checked on: a
directory renamed into the place of the local root later is never followed.

"Another user" is a real one where the tests run as root (the files are handed to uid 4242);
otherwise a link stands in its place, which is refused the same way."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from xla_pcache import Store, _core, bucket, explain
from xla_pcache.config import Settings
from xla_pcache.torch_xla._host_mirror import HostMirror, store_key

from tests.helpers import tree_state

OTHER_UID = 4242
MINE = f"xla_pcache-{os.geteuid()}"


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def umask_002() -> Iterator[None]:
    """The umask docs/reliability.md recommends for the writers of a shared cache."""
    with _umask(0o002):
        yield


def _hand_to_someone_else(path: Path, mode: int = 0o755) -> str:
    """Makes ``path`` another user's (root only), else puts a link to it in its place;
    returns what the refusal says."""
    if os.geteuid() == 0:
        for dirpath, dirnames, filenames in os.walk(path):
            for n in [".", *dirnames, *filenames]:
                os.chown(os.path.join(dirpath, n), OTHER_UID, OTHER_UID)
        os.chmod(path, mode)
        return "belongs to"
    real = path.with_name(path.name + ".real")
    path.rename(real)
    path.symlink_to(real)
    return "without following a link"


def _store_with_graph(root: Path, graph: str, payload: bytes) -> Store:
    with Store(root, settings=Settings()) as w:
        assert w.put(store_key(graph), payload, meta={"framework": "torch_xla"})
    return Store(root, settings=Settings(), read_only=True)


def _modes(top: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(top.lstat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(top))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def _warnings(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_torch_xla_host_directories_are_private_under_umask_002(
    tmp_path: Path, umask_002: None
) -> None:
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    local = tmp_path / "local"
    mirror = HostMirror(store, str(local))
    mirror.refresh_pool()
    view = mirror.open_view()
    try:
        assert os.listdir(view) == ["123"]
        modes = _modes(local)
        dirs = [p for p in modes if (local / p).is_dir()]
        assert len(dirs) >= 5, modes  # local root, host, pool, views, the view
        assert {p: modes[p] for p in dirs} == dict.fromkeys(dirs, 0o700), modes
        # No file there is writable by group or others either (the lock, the copies).
        assert not [p for p, m in modes.items() if m & 0o022], modes
    finally:
        mirror.close_view()
        store.close()


def _earlier_release(mirror: HostMirror, open_to_group: str) -> None:
    """The host directories as an earlier release left them: ``open_to_group`` (or every
    one, "all") mode 0775 as made under ``umask 002``, the others 0700. While it was open a
    group member wrote there: below an open local root, host directory or pool, an
    executable of theirs in the pool under the graph's name (or one of this user's copies
    renamed to it: a regular file of this user's either way), and a manifest; in open views,
    a view of theirs."""
    local = Path(mirror.local_root)
    dirs = {"local": local, "host": Path(mirror.root), "pool": Path(mirror.pool)}
    dirs["views"] = Path(mirror.views)
    for name, d in dirs.items():
        d.mkdir()
        os.chmod(d, 0o775 if open_to_group in (name, "all") else 0o700)
    with _umask(0o002):
        if open_to_group != "views":
            (dirs["pool"] / "123").write_bytes(b"the group member's executable")
            (dirs["host"] / "manifest.json").write_text('{"version": 1, "names": {}}')
        else:
            (dirs["views"] / "999-0000").mkdir()
            (dirs["views"] / "999-0000" / "123").write_bytes(b"theirs")


@pytest.mark.parametrize("open_to_group", ["all", "local", "host", "pool", "views"])
def test_an_earlier_releases_host_directories_are_repaired_and_emptied(
    tmp_path: Path, open_to_group: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Host directories this user's earlier release made under ``umask 002`` (the whole
    tree, or one of them) with a group member's file in the pool under the graph's name:
    main refused them, so torch_xla ran uncached on every start until someone ran chmod.
    Now the directory open to the group is made 0700 and emptied, with one warning naming
    it; the planted file is never linked, and the graph is served from the store in the
    same process, which publishes what torch_xla writes."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    local = tmp_path / "local"
    mirror = HostMirror(store, str(local))
    _earlier_release(mirror, open_to_group)
    repaired = {
        "all": local,
        "local": local,
        "host": Path(mirror.root),
        "pool": Path(mirror.pool),
        "views": Path(mirror.views),
    }[open_to_group]
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        mirror.refresh_pool()
        view = mirror.open_view()
    try:
        assert mirror.counters.errors == 0 and mirror.counters.repaired == 1
        warned = _warnings(caplog)
        assert len(warned) == 1 and f"{repaired} was this user's" in warned[0], warned
        assert "now mode 0700" in warned[0] and "discarded" in warned[0]
        checked = [local, Path(mirror.root), Path(mirror.pool), Path(mirror.views)]
        assert {stat.S_IMODE(d.stat().st_mode) for d in checked} == {0o700}
        assert os.listdir(view) == ["123"]
        assert (Path(view) / "123").read_bytes() == b"the executable"
        assert b"the group member's executable" not in [
            p.read_bytes() for p in local.rglob("*") if p.is_file()
        ]
        # Only this process's view and its lock: a view planted there was discarded.
        name = os.path.basename(view)
        assert sorted(os.listdir(mirror.views)) == [name, f"{name}.lock"]
        # Caching works: what torch_xla writes is published and shared with the host.
        with Store(tmp_path / "store", settings=Settings()) as writer:
            mirror.store = writer
            (Path(view) / "456").write_bytes(b"a new graph")
            mirror.publish(final=True)
            blob = writer.get(store_key("456"))
            assert blob is not None and bytes(blob) == b"a new graph"
        assert (Path(mirror.pool) / "456").read_bytes() == b"a new graph"
    finally:
        mirror.close_view()
        store.close()


def test_another_users_directory_inside_is_still_refused(tmp_path: Path) -> None:
    """A pool another user put in place of this user's (as root: uid 4242's, mode 0775;
    otherwise a link) is refused, naming it, and left as it is: only this user's own
    directories are repaired."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    local = tmp_path / "local"
    mirror = HostMirror(store, str(local))
    Path(mirror.pool).mkdir(parents=True)
    (Path(mirror.pool) / "123").write_bytes(b"their executable")
    why = _hand_to_someone_else(Path(mirror.pool), 0o775)
    before = tree_state(Path(mirror.root))
    before.pop("views", None)
    try:
        mirror.refresh_pool()  # a refused pool is one counted failure, never an exception
        assert mirror.counters.errors == 1 and mirror.counters.repaired == 0
        with pytest.raises(_core.CacheError, match=rf"{mirror.pool} {why}"):
            mirror.open_view()
        after = tree_state(Path(mirror.root))
        after.pop("views", None)  # made before the pool was refused
        assert after == before
    finally:
        mirror.close_view()
        store.close()


def test_a_local_root_swapped_after_the_check_is_never_followed(tmp_path: Path) -> None:
    """Whoever can write the local root's parent renames it away once the process checked
    it, and puts a tree of theirs in its place with the same names (as root: uid 4242's),
    their executable where the view was. torch_xla reads and writes through the path it
    was given, the process publishes and shares with the host: all of it reaches this
    user's own directory (moved, still the one checked), none of it theirs."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    local = tmp_path / "local"
    mirror = HostMirror(store, str(local))
    mirror.refresh_pool()
    view = mirror.open_view()
    # What torch_xla is given (main: the view's path).
    torch_dir = Path(getattr(mirror, "torch_path", lambda: view)() or view)
    theirs_view = Path(view)
    os.rename(local, tmp_path / "moved")
    theirs_view.mkdir(parents=True)
    (theirs_view / "123").write_bytes(b"their executable")
    Path(mirror.pool).mkdir()
    if os.geteuid() == 0:
        _hand_to_someone_else(local, 0o777)
    before = tree_state(local)
    try:
        with Store(tmp_path / "store", settings=Settings()) as writer:
            mirror.store = writer
            # torch_xla loads the graph, compiles another and writes it.
            assert (torch_dir / "123").read_bytes() == b"the executable"
            (torch_dir / "456").write_bytes(b"a new graph")
            mirror.publish(final=True)
            blob = writer.get(store_key("456"))
            assert blob is not None and bytes(blob) == b"a new graph"
        assert tree_state(local) == before
        moved_pool = tmp_path / "moved" / Path(mirror.pool).relative_to(local)
        assert (moved_pool / "456").read_bytes() == b"a new graph"
    finally:
        mirror.close_view()
        store.close()


def test_a_named_local_dir_others_can_write_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``XLA_PCACHE_TORCH_XLA_LOCAL_DIR`` (``install(local_dir=)``) naming a team's scratch
    directory of this user's that the group can write on purpose (setgid, 2775): it is not
    changed, nor is anything in it; this user's own ``xla_pcache-<uid>`` (0700) beneath it
    holds the host's directory, said once at info level, and caching works there."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "the team's").write_bytes(b"data")
    os.chmod(scratch, 0o2775)
    before = tree_state(scratch)
    with caplog.at_level(logging.INFO, logger="xla_pcache"):
        for _ in range(2):
            mirror = HostMirror(store, str(scratch), named_root=True)
            mirror.refresh_pool()
            view = mirror.open_view()
            assert (Path(view) / "123").read_bytes() == b"the executable"
            assert Path(view).is_relative_to(scratch / MINE)
            mirror.close_view()
    store.close()
    said = [m for m in _warnings(caplog, logging.INFO) if "writable by others" in m]
    assert len(said) == 1 and f"{scratch} is writable by others" in said[0], said
    assert str(scratch / MINE) in said[0]
    assert not _warnings(caplog)
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o2775
    assert stat.S_IMODE((scratch / MINE).stat().st_mode) & 0o777 == 0o700
    after = tree_state(scratch)
    assert {k: v for k, v in after.items() if k.split("/")[0] != MINE} == before


def test_a_local_dir_someone_else_made_first_is_refused(tmp_path: Path) -> None:
    """``XLA_PCACHE_TORCH_XLA_LOCAL_DIR`` on a scratch disk whose directory another user made
    (and filled) first: refused before anything is read from it or written to it."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    scratch = tmp_path / "scratch"
    theirs = HostMirror(store, str(scratch))
    Path(theirs.pool).mkdir(parents=True)
    (Path(theirs.pool) / "123").write_bytes(b"their executable")
    why = _hand_to_someone_else(scratch)
    before = tree_state(tmp_path)
    try:
        for named in (False, True):
            mirror = HostMirror(store, str(scratch), named_root=named)
            mirror.refresh_pool()  # one counted failure
            assert mirror.counters.errors == 1
            with pytest.raises(_core.CacheError, match=rf"{scratch} {why}"):
                mirror.open_view()
            mirror.close_view()
        assert tree_state(tmp_path) == before
    finally:
        store.close()


# -------------------------------------------------------------- a bucket path's local store

URL = "s3://bucket/prefix"


def _bucket_settings(home: Path, **changes: object) -> Settings:
    # Nothing reaches the bucket: no hits recorded, and read-only, so that a put stays in
    # the local store (which is what is tested) and a miss is never asked of the bucket
    # here (only what the local store holds is looked at: ``in``, and gets of its keys).
    return Settings().replace(
        xdg_cache_home=str(home), bucket_record_interval=0.0, read_only=True, **changes
    )


def test_a_bucket_paths_local_store_is_private_under_umask_002(
    tmp_path: Path, umask_002: None
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    settings = _bucket_settings(home)
    with bucket.open_store(URL, settings=settings) as store:
        assert store.path == bucket.local_path(URL, settings)
    remote = Path(settings.remote_store_root())
    for d in (home / "xla_pcache", remote, Path(bucket.local_path(URL, settings))):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.parametrize("open_to_group", ["remote_root", "store"])
def test_an_earlier_releases_local_store_is_repaired_and_emptied(
    tmp_path: Path, open_to_group: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bucket path's host-local store (or its default root) that an earlier release made
    under ``umask 002``, with an entry a group member put there (a valid entry: its checksum
    proves nothing about who wrote it, and a host that trusts no key would serve it): main
    refused it, so JAX and torch_xla ran uncached on that host. Now it is made 0700 and
    emptied (the bucket still holds the entries: fetched again on a miss), with one warning
    naming it, and the store works in the same process."""
    home = tmp_path / "home"
    settings = _bucket_settings(home)
    path = Path(bucket.local_path(URL, settings))
    remote = Path(settings.remote_store_root())
    with _umask(0o002):
        with Store(path, settings=Settings()) as planted:
            assert planted.put("planted", b"a group member's entry")
        os.chmod(remote, 0o775 if open_to_group == "remote_root" else 0o700)
        os.chmod(path, 0o775 if open_to_group == "store" else 0o700)
    repaired = remote if open_to_group == "remote_root" else path
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        store = bucket.open_store(URL, settings=settings)
    with store:
        warned = _warnings(caplog)
        assert len(warned) == 1 and f"{repaired} was this user's" in warned[0], warned
        assert "planted" not in store
        assert store.put("ours", b"compiled here")
        blob = store.get("ours")
        assert blob is not None and bytes(blob) == b"compiled here"
    for d in (remote, path):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    with Store(path, settings=Settings(), read_only=True) as again:
        assert "planted" not in again and "ours" in again


def test_a_local_store_swapped_after_the_check_is_never_followed(tmp_path: Path) -> None:
    """Whoever can write the default root's parent (``$XDG_CACHE_HOME/xla_pcache``, the
    default cache directory, group-writable under ``umask 002``) renames ``remote`` away
    once a process opened its store, and puts theirs in place: a store at the same name
    holding an entry of theirs and their bytes under this host's key (as root: uid 4242's).
    The open store serves, writes and logs only in its own directory, moved or not."""
    home = tmp_path / "home"
    settings = _bucket_settings(home)
    store = bucket.open_store(URL, settings=settings)
    path = Path(store.path)
    remote = Path(settings.remote_store_root())
    try:
        assert store.put("ours", b"compiled here")
        os.rename(remote, remote.with_name("moved"))
        with Store(path, settings=Settings()) as theirs:
            assert theirs.put("planted", b"their entry")
            assert theirs.put("ours", b"their bytes")
        if os.geteuid() == 0:
            _hand_to_someone_else(remote, 0o777)
        before = tree_state(remote)
        assert "planted" not in store
        blob = store.get("ours")
        assert blob is not None and bytes(blob) == b"compiled here"
        assert store.put("more", b"also ours")
        explain.record_miss(store, "more", None, "jax")
        assert tree_state(remote) == before
        moved = remote.with_name("moved") / path.name
        with Store(moved, settings=Settings(), read_only=True) as ours:
            assert "more" in ours
        assert (moved / "misses.log").exists()
    finally:
        store.close()


def test_a_named_local_path_others_can_write_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``XLA_PCACHE_LOCAL_PATH`` naming a team's scratch directory of this user's that the
    group can write on purpose: not changed, nor anything in it; the store is this user's
    own ``xla_pcache-<uid>`` (0700) beneath it, said once at info level."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "the team's").write_bytes(b"data")
    os.chmod(scratch, 0o2775)
    before = tree_state(scratch)
    settings = _bucket_settings(tmp_path / "home", local_path=str(scratch))
    with caplog.at_level(logging.INFO, logger="xla_pcache"):
        for _ in range(2):
            with bucket.open_store(URL, settings=settings) as store:
                assert store.path == str(scratch / MINE)
                assert store.put("ours", b"compiled here") or "ours" in store
    said = [m for m in _warnings(caplog, logging.INFO) if "writable by others" in m]
    assert len(said) == 1 and f"{scratch} is writable by others" in said[0], said
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o2775
    assert stat.S_IMODE((scratch / MINE).stat().st_mode) & 0o777 == 0o700
    after = tree_state(scratch)
    assert {k: v for k, v in after.items() if k.split("/")[0] != MINE} == before


@pytest.mark.parametrize("which", ["local_path", "remote_root", "store"])
def test_a_bucket_paths_local_store_someone_else_made_is_refused(
    tmp_path: Path, which: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``XLA_PCACHE_LOCAL_PATH`` another user made first, or the default root or the store's
    own directory under it: ``open_store`` raises naming it (the adapters then run uncached,
    with one warning), and nothing is created or changed there."""
    home = tmp_path / "home"
    settings = _bucket_settings(home)
    if which == "local_path":
        settings = settings.replace(local_path=str(tmp_path / "scratch"))
    target = {
        "local_path": tmp_path / "scratch",
        "remote_root": Path(settings.remote_store_root()),
        "store": Path(bucket.local_path(URL, settings)),
    }[which]
    target.mkdir(parents=True)
    why = _hand_to_someone_else(target, 0o775)
    before = tree_state(tmp_path)
    with pytest.raises(_core.CacheError, match=rf"{target} {why}.*XLA_PCACHE_LOCAL_PATH"):
        bucket.open_store(URL, settings=settings)
    assert tree_state(tmp_path) == before
    # Through the public API: a clear error naming the directory, never a store there.
    with pytest.raises(_core.CacheError, match=str(target)):
        bucket.open_path(URL, settings=settings)
    assert tree_state(tmp_path) == before
