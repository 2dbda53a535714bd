"""Bundles: export, import, damage, budget, filters (library and CLI)."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

import pytest
from xla_pcache import Store

from tests.helpers import cli


def _filled(path: Path, n: int = 5, size: int = 10_000) -> Store:
    s = Store(path)
    for i in range(n):
        fw = "jax" if i % 2 == 0 else "torch_xla"
        assert s.put(f"k{i}", bytes([i]) * size, meta={"framework": fw})
    return s


def test_round_trip_and_present(tmp_path: Path) -> None:
    src = _filled(tmp_path / "a")
    bundle = tmp_path / "b.tar.gz"
    assert src.export_bundle(bundle) == 5
    assert tarfile.is_tarfile(bundle)
    dst = Store(tmp_path / "q")
    r = dst.import_bundle(bundle)
    assert (r.imported, r.present, r.rejected, r.unreadable) == (5, 0, 0, False)
    blob = dst.get("k3")
    assert blob is not None and bytes(blob) == bytes([3]) * 10_000
    assert blob.meta["framework"] == "torch_xla"
    assert dst.import_bundle(bundle).present == 5


def test_filters(tmp_path: Path) -> None:
    src = _filled(tmp_path / "a")
    assert src.export_bundle(tmp_path / "j.tgz", framework="jax") == 3
    assert src.export_bundle(tmp_path / "n.tgz", newer_than="1h") == 5
    time.sleep(1.1)
    assert src.export_bundle(tmp_path / "o.tgz", newer_than=1) == 0


def test_min_hits(tmp_path: Path) -> None:
    src = _filled(tmp_path / "a")
    src.close()
    # hit_interval=0 records every hit; by default a process records one per entry a minute.
    with Store(tmp_path / "a", hit_interval=0.0) as s:
        for key, n in (("k1", 3), ("k2", 1), ("k4", 2)):
            for _ in range(n):
                assert s.get(key) is not None
    with Store(tmp_path / "a") as s:
        assert s.get("k1") is not None and s.get("k1") is not None  # one more, not two
    src = Store(tmp_path / "a")
    assert {e["key"]: e["hits"] for e in src.entries()} == {
        "k0": 0,
        "k1": 4,
        "k2": 1,
        "k3": 0,
        "k4": 2,
    }
    assert src.export_bundle(tmp_path / "all.tgz", min_hits=0) == 5
    assert src.export_bundle(tmp_path / "h2.tgz", min_hits=2) == 2
    dst = Store(tmp_path / "q")
    dst.import_bundle(tmp_path / "h2.tgz")
    assert len(dst) == 2 and "k1" in dst and "k4" in dst
    assert src.export_bundle(tmp_path / "h5.tgz", min_hits=5) == 0
    with pytest.raises(ValueError, match="min_hits"):
        src.export_bundle(tmp_path / "bad.tgz", min_hits=-1)
    out = cli(
        *("export", "--path", str(tmp_path / "a")),
        *("-o", str(tmp_path / "cli.tgz"), "--min-hits", "3"),
    )
    assert out.returncode == 0, out.stderr
    assert "exported 1 entries" in out.stdout


def test_truncated_bundle_imports_what_verifies(tmp_path: Path) -> None:
    src = _filled(tmp_path / "a", n=8, size=200_000)
    bundle = tmp_path / "b.tar.gz"
    src.export_bundle(bundle)
    data = bundle.read_bytes()
    bundle.write_bytes(data[: len(data) // 2])
    dst = Store(tmp_path / "q")
    r = dst.import_bundle(bundle)
    assert r.unreadable and 0 < r.imported < 8
    published = list(dst.keys())
    assert published
    for k in published:
        assert dst.get(k) is not None  # every published entry verifies


def test_tampered_member_is_rejected(tmp_path: Path) -> None:
    src = _filled(tmp_path / "a", n=3)
    bundle = tmp_path / "b.tar"
    src.export_bundle(tmp_path / "b.tar.gz")
    # Re-pack with one member's payload byte flipped but a valid archive around it.
    with (
        tarfile.open(tmp_path / "b.tar.gz") as tin,
        tarfile.open(bundle, "w:gz", format=tarfile.PAX_FORMAT) as tout,
    ):
        for i, m in enumerate(tin.getmembers()):
            f = tin.extractfile(m)
            assert f is not None
            data = bytearray(f.read())
            if i == 1:
                data[-1] ^= 0xFF
            import io

            tout.addfile(m, io.BytesIO(bytes(data)))
    dst = Store(tmp_path / "q")
    r = dst.import_bundle(bundle)
    assert (r.imported, r.rejected) == (2, 1)
    assert len(dst) == 2


def test_budget_on_import(tmp_path: Path) -> None:
    src = _filled(tmp_path / "a", n=10, size=100_000)
    bundle = tmp_path / "b.tar.gz"
    src.export_bundle(bundle)
    dst = Store(tmp_path / "q", max_size=400_000)
    dst.import_bundle(bundle)
    assert dst.stats()["bytes"] <= 400_000  # type: ignore[operator]


def test_cli_export_import(tmp_path: Path) -> None:
    _filled(tmp_path / "a").close()
    bundle = tmp_path / "b.tar.gz"
    out = cli("export", "--path", str(tmp_path / "a"), "-o", str(bundle), "--framework", "jax")
    assert out.returncode == 0, out.stderr
    out = cli("import", str(bundle), "--path", str(tmp_path / "q"))
    assert out.returncode == 0, out.stderr
    assert "imported 3, skipped as present 0, rejected as corrupt 0" in out.stdout
