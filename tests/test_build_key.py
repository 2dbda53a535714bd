"""A store key with its runtime build (``xla_pcache.build_key``): joined and read back the one
way, and nothing read back as a build that is not one."""

from __future__ import annotations

import pytest
from xla_pcache import build_key, builds
from xla_pcache.torch_xla import _keys

DIGEST = "0123456789abcdef" * 2
KEY = "jit_step-" + "ab" * 32


def test_a_joined_key_splits_back_into_its_key_and_build() -> None:
    stored = build_key.join(KEY, DIGEST)
    assert stored == KEY + build_key.suffix(DIGEST) == builds.Build("jax", DIGEST).store_key(KEY)
    assert build_key.split(stored) == (KEY, DIGEST)
    assert build_key.strip(stored) == KEY
    assert build_key.join(KEY, None) == KEY and build_key.split(KEY) == (KEY, None)
    # The last build is the key's: a framework key may hold anything before it.
    inner = build_key.join(build_key.join(KEY, "f" * 32), DIGEST)
    assert build_key.split(inner) == (build_key.join(KEY, "f" * 32), DIGEST)


@pytest.mark.parametrize(
    "tail",
    [
        DIGEST.upper(),
        DIGEST[:-1],
        DIGEST + "0",
        DIGEST + "\n",
        DIGEST[:-1] + "g",
        "",
        "\u0660" * 32,  # digits, but not ASCII hex
    ],
)
def test_a_tail_that_is_no_build_is_part_of_the_key(tail: str) -> None:
    # What only looks like a build (any writer of the directory names keys) is not read as one.
    stored = KEY + build_key.suffix(DIGEST)[: -len(DIGEST)] + tail
    assert not build_key.is_build(tail)
    assert build_key.split(stored) == (stored, None)
    assert build_key.strip(stored) == stored


def test_a_build_is_checked_where_it_is_made() -> None:
    with pytest.raises(ValueError, match="digest"):
        builds.Build("jax", DIGEST.upper())
    with pytest.raises(ValueError, match="digest"):
        builds.Build("jax", "")


def test_torch_xla_names_only_its_own_builds_keys() -> None:
    own, other = builds.Build("torch_xla", DIGEST), builds.Build("torch_xla", "e" * 32)
    key = _keys.store_key("123", own)
    assert key == build_key.join("torch_xla/123", DIGEST)
    assert _keys.name_of(key, own) == "123"
    assert _keys.name_of(key, other) == ""
    assert _keys.name_of(key, None) == ""
    assert _keys.name_of(_keys.store_key("123"), None) == "123"
    assert _keys.name_of(_keys.store_key("123"), own) == ""
    assert _keys.name_of(build_key.join("jax/123", DIGEST), own) == ""
    assert _keys.name_of(build_key.join("torch_xla/12a", DIGEST), own) == ""
