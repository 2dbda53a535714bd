"""The pieces of a torch_xla host start and of a prune's markers that need no bucket
(``torch_xla/_bucket_start.py``, ``bucket/layout.py``): the key an entry file names read
from its first bytes (by the core: ``_core.entry_head_key``), and torch_xla's file name
and a marker's tag from a key. The start itself is tested against real S3 and GCS services
in ``tests/bucket/``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from xla_pcache import Store, _core
from xla_pcache.bucket.layout import HEAD_BYTES, marker_tag
from xla_pcache.torch_xla._bucket_start import graph_reader
from xla_pcache.torch_xla._keys import store_key


@pytest.fixture
def entry_file(tmp_path: Path) -> bytes:
    with Store(str(tmp_path / "c")) as s:
        assert s.put("torch_xla/12345-build", b"payload" * 100, meta={"m": "x" * 500})
        data = s.get_entry_file("torch_xla/12345-build")
    assert data is not None
    return data


def test_the_key_an_entry_file_names_is_read_from_its_first_bytes(entry_file: bytes) -> None:
    assert _core.entry_head_key(entry_file[:HEAD_BYTES]) == "torch_xla/12345-build"
    assert _core.entry_head_key(entry_file) == "torch_xla/12345-build"
    # A later release's entry names no key this release reads: a verdict, never a key.
    newer = entry_file[:4] + (2).to_bytes(2, "little") + entry_file[6:HEAD_BYTES]
    got = _core.entry_head_key(newer)
    assert isinstance(got, _core.Refusal) and got.kind == "newer_format" and got.version == 2


@pytest.mark.parametrize(
    "spoil",
    [
        lambda b: b[:63],  # shorter than the fixed header
        lambda b: b"XPCF" + b[4:],  # another magic
        lambda b: b[:6] + b"\0\0" + b[8:],  # a key that is not text
        lambda b: b[:12] + (10_000).to_bytes(4, "little") + b[16:],  # past what was read
        lambda b: b[:12] + b"\0\0\0\0" + b[16:],  # no key
        lambda b: b[:64] + b"\xff" + b[65:],  # not UTF-8
    ],
)
def test_first_bytes_that_name_no_key_name_none(
    entry_file: bytes, spoil: Callable[[bytes], bytes]
) -> None:
    got = _core.entry_head_key(spoil(entry_file[:HEAD_BYTES]))
    assert not isinstance(got, str), got


def test_torch_xla_file_names_are_read_back_only_from_keys_of_the_same_maker() -> None:
    suffix = "@build-0123abcd"
    graph_of = graph_reader(lambda g: f"torch_xla/{g}{suffix}")
    assert graph_of(f"torch_xla/987{suffix}") == "987"
    assert graph_of("torch_xla/987") is None  # another build (none)
    assert graph_of(f"torch_xla/987{suffix}x") is None
    assert graph_of(f"torch_xla/98a7{suffix}") is None  # no torch_xla file name
    assert graph_of(f"torch_xla/{'1' * 41}{suffix}") is None  # longer than a marker holds
    assert graph_of(f"jax/987{suffix}") is None
    assert graph_of(f"torch_xla/{suffix}") is None
    plain = graph_reader(lambda g: store_key(g, build=None))
    assert plain(store_key("4242", build=None)) == "4242"
    assert plain(f"{store_key('4242', build=None)}-x") is None


def test_the_graph_a_key_names_whatever_its_build() -> None:
    # The bucket knows no framework: a marker's tag is the last segment of the key without
    # its build, which for the adapter's keys is torch_xla's file name.
    assert marker_tag(store_key("12345")) == "12345"
    assert marker_tag(f"torch_xla/987@build-{'a' * 32}") == "987"
    assert marker_tag("jax/abc") is None
    assert marker_tag(f"jit_f-{'a' * 64}@build-{'a' * 32}") is None
    assert marker_tag(b"torch_xla/987") is None
    assert marker_tag(None) is None
