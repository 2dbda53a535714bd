"""What a later release leaves in a shared cache directory is left alone by this one
(ARCHITECTURE.md, "Formats of other releases"): its entries (format version one higher,
every checksum valid) are misses counted ``newer_format`` with one warning naming the
version, never removed nor replaced by a get, a put, a replace, a delete, ``verify
--repair`` or ``clear`` (``clear --all`` removes them), and are budgeted and evicted by LRU
like any entry; its index snapshot is not replaced by this release's compaction, nor its
CONFIG by ``xla-pcache config``. And what a writer without a key plants as "later" stops no
signer, and leaves with the LRU."""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
from pathlib import Path

import pytest
from xla_pcache import Store, entry_name
from xla_pcache._core import generate_signing_key, signed_entry_name, signing_public_key
from xla_pcache.metrics import prometheus_text

from tests.helpers import cli
from tests.later_format import as_version, entry_files, snapshot_as_version

KEY = "jit_f-" + "a" * 64
MINE = "jit_g-" + "b" * 64


def _entry_path(root: Path, name: str) -> Path:
    return root / "entries" / name[:2] / name


def _later_cache(root: Path, version: int = 2) -> bytes:
    """A cache at ``root`` holding this release's entry of ``MINE`` and a later release's of
    ``KEY`` (format ``version``); the later one's bytes."""
    with Store(root) as s:
        assert s.put(KEY, b"later" * 200) and s.put(MINE, b"mine" * 200)
    path = _entry_path(root, entry_name(KEY))
    later = as_version(path.read_bytes(), version)
    path.write_bytes(later)
    return later


def test_a_later_entry_is_a_miss_counted_apart_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "c"
    later = _later_cache(root)
    caplog.set_level(logging.WARNING, logger="xla_pcache")
    with Store(root) as s:
        assert s.get(KEY) is None and s.get(KEY) is None
        assert s.get(MINE) is not None
        stats = s.stats()
    assert stats["newer_format"] == 2 and stats["misses"] == 2 and stats["corrupt"] == 0
    (warning,) = [r.getMessage() for r in caplog.records if "later release" in r.getMessage()]
    assert "format version 2" in warning, warning
    assert _entry_path(root, entry_name(KEY)).read_bytes() == later, "never removed"
    # In the command's counters and Prometheus text, apart from corrupt entries.
    assert "xla_pcache_newer_format_total" in prometheus_text(stats)
    shown = cli("stats", "--path", str(root), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["newer_format"] == 2


def test_no_put_replace_or_delete_replaces_a_later_entry(tmp_path: Path) -> None:
    root = tmp_path / "c"
    later = _later_cache(root)
    with Store(root) as s:
        # First writer wins: the name is taken by the later release's entry.
        assert not s.put(KEY, b"this release's")
        # A plan's way (delete, then put): neither touches it.
        assert not s.replace(KEY, b"this release's")
        assert not s.delete(KEY)
        assert s.stats()["put_exists"] == 2
    assert _entry_path(root, entry_name(KEY)).read_bytes() == later


def test_repair_keeps_a_later_entry_and_clear_leaves_it_until_clear_all(tmp_path: Path) -> None:
    root = tmp_path / "c"
    later = _later_cache(root, version=3)
    path = _entry_path(root, entry_name(KEY))
    repaired = cli("verify", "--repair", "--json", "--path", str(root))
    assert repaired.returncode == 0, repaired.stderr
    report = json.loads(repaired.stdout)
    assert report["newer_format"] == [str(path)] and report["corrupt"] == [], report
    assert path.read_bytes() == later
    with Store(root, read_only=True) as s:
        assert len(s) == 2, "indexed: the budget holds it"
    cleared = cli("clear", "--yes", "--path", str(root))
    assert cleared.returncode == 0 and "removed 1 entries" in cleared.stdout, cleared
    assert "left 1 entries of a later release's format" in cleared.stderr, cleared.stderr
    assert path.read_bytes() == later
    with Store(root, read_only=True) as s:
        assert len(s) == 1 and s.get(MINE) is None
    everything = cli("clear", "--all", "--yes", "--path", str(root))
    assert everything.returncode == 0 and "removed 1 entries" in everything.stdout
    assert entry_files(root) == []


def test_the_lru_evicts_a_later_entry_as_any_other(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _later_cache(root)
    path = _entry_path(root, entry_name(KEY))
    # Written a day before this release's (what a later host wrote and no one read since).
    day_ago = path.stat().st_mtime - 86_400
    os.utime(path, (day_ago, day_ago))
    with Store(root) as s:
        s.verify(repair=True)  # indexes it at its time
        one = s.entries()[0]["disk_bytes"]
        report = s.evict(max_size=one)
    assert report["removed"] == 1 and not path.exists()
    assert _entry_path(root, entry_name(MINE)).exists()


def test_compaction_never_replaces_a_later_snapshot(tmp_path: Path) -> None:
    root = tmp_path / "c"
    with Store(root) as s:
        s.put(MINE, b"x" * 100)
        s.verify(repair=True)  # compacts: this release's snapshot
    later = snapshot_as_version(root, 7)
    with Store(root) as s:
        s.put(KEY, b"y" * 100)
        s.verify(repair=True)
        s.evict(max_size=10**9)
        assert s.get(KEY) is not None and s.get(MINE) is not None
    assert (root / "index" / "snapshot").read_bytes() == later


def test_config_never_replaces_a_later_config(tmp_path: Path) -> None:
    root = tmp_path / "c"
    Store(root).close()
    later = "xla_pcache-config 2\nmax-size 1000000\nsomething-new 1\n"
    (root / "CONFIG").write_text(later)
    refused = cli("config", "--max-size", "1G", "--path", str(root))
    assert refused.returncode != 0 and "version 2" in refused.stderr, refused
    assert (root / "CONFIG").read_text() == later
    # Removed by hand, this release's is written as before.
    (root / "CONFIG").unlink()
    assert cli("config", "--max-size", "1G", "--path", str(root)).returncode == 0


def test_a_planted_later_file_blocks_no_signer_and_goes_with_the_lru(tmp_path: Path) -> None:
    """A writer of the directory without a key plants a file of a made-up later format at a
    key's plain name and at a signer's own name. The signer's own name belongs to this
    format: its put replaces what is there, and its trusting readers hit. A process without
    keys misses that key and cannot publish it (as with any planted file: such a writer can
    serve it worse), until the LRU removes the file no release ever used."""
    root = tmp_path / "c"
    Store(root).close()
    seed = generate_signing_key()
    trusted = [("ci-1", signing_public_key(seed))]
    with Store(tmp_path / "scratch") as scratch:
        scratch.put(KEY, b"planted")
        fake = as_version(_entry_path(tmp_path / "scratch", entry_name(KEY)).read_bytes(), 9999)
    plain = _entry_path(root, entry_name(KEY))
    own = _entry_path(root, signed_entry_name(KEY, "ci-1"))
    plain.write_bytes(fake)
    own.write_bytes(fake)
    with Store(root, signing_key=("ci-1", seed), trusted_keys=trusted) as ci:
        assert ci.put(KEY, b"compiled")
    with Store(root, trusted_keys=trusted, read_only=True) as reader:
        blob = reader.get(KEY)
        assert blob is not None and bytes(blob) == b"compiled"
    assert plain.read_bytes() == fake
    with Store(root) as keyless:
        assert keyless.get(KEY) is None and not keyless.put(KEY, b"mine")
    # Never used by any release: the oldest (an explicit evict indexes what it finds at its
    # time, no later than now), evicted first when the budget needs room.
    day_ago = plain.stat().st_mtime - 86_400
    os.utime(plain, (day_ago, day_ago))
    with Store(root) as s:
        report = s.evict(max_size=s.stats()["bytes"])
    assert report["removed"] >= 1 and not plain.exists()
    with Store(root) as keyless:
        assert keyless.put(KEY, b"mine") and keyless.get(KEY) is not None


def test_a_bundles_later_entry_is_counted_apart_not_imported_nor_a_failure(
    tmp_path: Path,
) -> None:
    """A bundle a later release exported: its members of that release's format are counted
    ``newer_format``, not imported, and the import exits 0 (nothing was damaged)."""
    src = tmp_path / "src"
    with Store(src) as s:
        assert s.put(KEY, b"later" * 200) and s.put(MINE, b"mine" * 200)
        s.export_bundle(tmp_path / "b.tar.gz")
    later_name = entry_name(KEY)
    with (
        tarfile.open(tmp_path / "b.tar.gz", "r:gz") as old,
        tarfile.open(tmp_path / "later.tar.gz", "w:gz", format=tarfile.PAX_FORMAT) as new,
    ):
        for member in old:
            f = old.extractfile(member)
            assert f is not None
            data = f.read()
            if later_name in member.name:
                data = as_version(data, 2)
            member.size = len(data)
            new.addfile(member, io.BytesIO(data))
    dst = tmp_path / "dst"
    Store(dst).close()
    imported = cli("import", str(tmp_path / "later.tar.gz"), "--path", str(dst))
    assert imported.returncode == 0, imported
    said = " ".join(imported.stdout.split())
    assert "imported 1," in said and "later release's format (not imported) 1" in said, said
    with Store(dst, read_only=True) as s:
        assert s.get(MINE) is not None and s.get(KEY) is None
        assert s.stats()["newer_format"] == 1
