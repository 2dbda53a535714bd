"""Host-local copies are the host's own: torch_xla's pool and views and a bucket path's
host-local store are made mode 0700 whatever the umask, and a directory another user made,
or that others can write, is refused with one message naming it, never used: whoever could
write there would choose what this user's processes load.

"Another user" is a real one where the tests run as root (the files are handed to uid 4242);
otherwise the directory is left writable by others, which is refused the same way."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from xla_pcache import Store, _core, bucket
from xla_pcache.config import Settings
from xla_pcache.torch_xla._host_mirror import HostMirror, store_key

from tests.helpers import tree_state

OTHER_UID = 4242


@pytest.fixture
def umask_002() -> Iterator[None]:
    """The umask docs/reliability.md recommends for the writers of a shared cache."""
    old = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(old)


def _hand_to_someone_else(path: Path, mode: int = 0o755) -> str:
    """Makes ``path`` another user's (root only), else writable by others; returns what the
    refusal says."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
        os.chmod(path, mode)
        return "belongs to"
    os.chmod(path, 0o777)
    return "writable by others"


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


def test_a_pool_others_can_write_is_refused_and_never_linked(tmp_path: Path) -> None:
    """CI's pool left group-writable (an earlier release under ``umask 002``) and a group
    member's file in it in place of CI's copy: the mirror refuses the directory, naming it;
    nothing of it reaches a view."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    local = tmp_path / "local"
    mirror = HostMirror(store, str(local))
    for d in (local, Path(mirror.root), Path(mirror.pool)):
        d.mkdir(mode=0o700)
    os.chmod(mirror.pool, 0o775)
    planted = Path(mirror.pool) / "123"
    planted.write_bytes(b"the group member's executable")
    try:
        mirror.refresh_pool()  # a refused pool is one counted failure, never an exception
        assert mirror.counters.errors == 1
        with pytest.raises(_core.CacheError, match=r"pool is writable by others"):
            mirror.open_view()
        assert planted.read_bytes() == b"the group member's executable"
    finally:
        mirror.close_view()
        store.close()


def test_a_copy_that_is_not_this_users_is_never_linked(tmp_path: Path) -> None:
    """Only a regular file of this user's in its own pool is linked: a link, or (as root) a
    file another user owns, is a miss for torch_xla, never its executable."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    local = tmp_path / "local"
    first = HostMirror(store, str(local))
    first.refresh_pool()  # makes the directories and CI's copy of 123
    first.close_view()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not a copy")
    os.symlink(elsewhere, Path(first.pool) / "456")
    foreign = Path(first.pool) / "789"
    foreign.write_bytes(b"another user's file")
    expected = ["123", "789"]
    if os.geteuid() == 0:
        os.chown(foreign, OTHER_UID, OTHER_UID)
        expected = ["123"]
    mirror = HostMirror(store, str(local))
    view = mirror.open_view()
    try:
        assert sorted(os.listdir(view)) == expected
        assert (Path(view) / "123").read_bytes() == b"the executable"
    finally:
        mirror.close_view()
        store.close()


def test_a_local_dir_someone_else_made_first_is_refused(tmp_path: Path) -> None:
    """``XLA_PCACHE_TORCH_XLA_LOCAL_DIR`` on a scratch disk whose directory another user made
    (and filled) first: refused before anything is read from it or written to it."""
    store = _store_with_graph(tmp_path / "store", "123", b"the executable")
    scratch = tmp_path / "scratch"
    theirs = HostMirror(store, str(scratch))
    Path(theirs.pool).mkdir(parents=True)
    (Path(theirs.pool) / "123").write_bytes(b"their executable")
    why = _hand_to_someone_else(scratch)
    before = tree_state(scratch)
    mirror = HostMirror(store, str(scratch))
    try:
        mirror.refresh_pool()  # one counted failure
        assert mirror.counters.errors == 1
        with pytest.raises(_core.CacheError, match=rf"{scratch} {why}"):
            mirror.open_view()
        assert tree_state(scratch) == before
    finally:
        mirror.close_view()
        store.close()


# -------------------------------------------------------------- a bucket path's local store

URL = "s3://bucket/prefix"


def _bucket_settings(home: Path, **changes: object) -> Settings:
    # No hits recorded: nothing here reaches the bucket, only the local store is opened.
    return Settings().replace(xdg_cache_home=str(home), bucket_record_interval=0.0, **changes)


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
    why = _hand_to_someone_else(target)
    before = tree_state(tmp_path)
    with pytest.raises(_core.CacheError, match=rf"{target} {why}.*XLA_PCACHE_LOCAL_PATH"):
        bucket.open_store(URL, settings=settings)
    assert tree_state(tmp_path) == before
    # Through the public API: a clear error naming the directory, never a store there.
    with pytest.raises(_core.CacheError, match=str(target)):
        bucket.open_path(URL, settings=settings)
    assert tree_state(tmp_path) == before
