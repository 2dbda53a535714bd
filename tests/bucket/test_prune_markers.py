"""Which torch_xla markers a prune keeps when an entry has more than one not older than it
(``bucket/prune_markers.py``), on a real S3 service (SeaweedFS on loopback): the one of
the graph the entry's own header names, whatever was planted beside it and whenever; all
of them past the headers a prune reads (until a later prune); none under an entry of
another kind."""

from __future__ import annotations

from pathlib import Path

import obstore
import pytest
from xla_pcache import entry_name, open_store
from xla_pcache.bucket import prune_markers, upkeep
from xla_pcache.config import Settings

from tests.bucket.test_bucket_floods import _key, _torch_xla_bucket
from tests.tiers.servers import BucketServer, bucket_client, put_objects


def _markers_held(server: BucketServer, prefix: str) -> set[str]:
    """The markers the server holds."""
    listed = obstore.list(bucket_client(server, prefix), upkeep.MARKER_DIR).collect()
    return {str(m["path"]).rpartition("/")[2] for m in listed}


def _plant(server: BucketServer, prefix: str, markers: list[str]) -> None:
    """Markers written now (after the entries: none is older than its entry)."""
    put_objects(bucket_client(server, prefix), {f"{upkeep.MARKER_DIR}/{m}": b"" for m in markers})


def test_the_marker_of_the_graph_the_header_names_stays(
    server: BucketServer, tmp_path: Path
) -> None:
    """Beside each of three real entries' markers, markers planted after them under the
    same entry names, naming graphs that sort before and after the real one: the prune
    reads each entry's header once and keeps exactly the real marker."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    real = {f"{entry_name(_key(g))}-{g}" for g in graphs}
    planted = [f"{entry_name(_key(g))}-{p}" for g in graphs[:3] for p in ("0", "9" * 39)]
    _plant(server, prefix, planted)
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed == len(planted), report
    assert _markers_held(server, prefix) == real


def test_past_the_reads_every_candidate_stays_until_a_later_prune(
    server: BucketServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one header to read a prune, two entries with a planted marker each: the first
    listed is judged and its planted marker goes; the second keeps both (the real one is
    never removed for want of a read), and the next prune judges it."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    real = {f"{entry_name(_key(g))}-{g}" for g in graphs}
    first, second = sorted(entry_name(_key(g)) for g in graphs[:2])
    _plant(server, prefix, [f"{first}-0", f"{second}-0"])
    monkeypatch.setattr(prune_markers, "MARKER_READS", 1)
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed == 1, report
    assert _markers_held(server, prefix) == real | {f"{second}-0"}
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed == 1, report
    assert _markers_held(server, prefix) == real


def test_markers_under_an_entry_of_another_kind_all_go(
    server: BucketServer, tmp_path: Path
) -> None:
    """Two markers planted under a JAX entry's name (no torch_xla entry has a marker
    there): its header names no torch_xla graph, so neither stays; the entry does."""
    prefix, url, graphs = _torch_xla_bucket(server, tmp_path)
    settings = Settings.from_env().replace(xdg_cache_home=str(tmp_path / "jax"))
    with open_store(url, settings=settings) as w:
        assert w.put("jax/abc", b"x" * 300)
    name = entry_name("jax/abc")
    _plant(server, prefix, [f"{name}-1", f"{name}-2"])
    report = upkeep.Bucket(url).prune(max_size=10**9)
    assert report.markers_removed == 2, report
    assert _markers_held(server, prefix) == {f"{entry_name(_key(g))}-{g}" for g in graphs}
    assert name in set(upkeep.Bucket(url).entries())
