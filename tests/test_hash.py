"""Checksums and names are bit-identical to the C xxHash library (python-xxhash), on the
implementation chosen at run time (the AVX-512 loop where the CPU has it), on twox-hash alone
and on the forced portable one.

Each implementation runs in its own interpreter: ``XLA_PCACHE_HASH_IMPL`` is read once."""

from __future__ import annotations

import pytest

from tests.helpers import run_python

CHECK = r"""
import os, random, sys
from pathlib import Path
import xxhash
import xla_pcache
from xla_pcache import Store, _core

impl = _core.hash_impl()
want = sys.argv[1]
assert impl.startswith("portable-") == (want == "portable"), impl
if want == "twox":
    assert impl != "avx512", impl
elif want == "auto" and "avx512f" in Path("/proc/cpuinfo").read_text():
    assert impl == "avx512", impl

rng = random.Random(12)
def rand(n):
    return rng.randbytes(n)

def prefixed(*parts):
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)

# Every length 0..4096: names (xxh3-128 of the key), keys (length-prefixed parts), and the
# same bytes streamed through Hasher in uneven chunks.
for n in range(4097):
    b = rand(n)
    if n:
        assert _core.entry_name(b) == xxhash.xxh3_128_hexdigest(b), n
    assert xla_pcache.hash_key(b) == xxhash.xxh3_128_hexdigest(prefixed(b)), n
    step = 1 + n % 97
    h = xla_pcache.Hasher()
    for i in range(0, n, step):
        h.update(b[i : i + step])
    chunks = [b[i : i + step] for i in range(0, n, step)]
    assert h.hexdigest() == xxhash.xxh3_128_hexdigest(prefixed(*chunks)), n
    assert h.digest() == xxhash.xxh3_128_digest(prefixed(*chunks)), n

# Large buffers and odd tails, one part and streamed.
big = rand((64 << 20) + 255)
for n in (1 << 20, (1 << 20) + 1, 550_000, 64 << 20, (64 << 20) + 255):
    mv = memoryview(big)[:n]
    assert xla_pcache.hash_key(mv) == xxhash.xxh3_128_hexdigest(prefixed(mv)), n

# What the store writes: the payload checksum is hashed while writing (in chunks), the
# header checksum over two pieces; both must be the reference xxh3-64.
root = Path(sys.argv[2])
with Store(root) as s:
    for n in (0, 1, 240, 241, 1024, (256 << 10) + 1, (1 << 20) + 3, (5 << 20) + 17):
        payload = big[:n]
        key = f"k{n}"
        assert s.put(key, payload)
        f = root / "entries" / _core.entry_name(key)[:2] / _core.entry_name(key)
        data = f.read_bytes()
        hlen = int.from_bytes(data[8:12], "little")
        assert data[hlen:] == payload
        assert int.from_bytes(data[32:40], "little") == xxhash.xxh3_64_intdigest(payload), n
        head = data[:56] + data[64:hlen]
        assert int.from_bytes(data[56:64], "little") == xxhash.xxh3_64_intdigest(head), n
        blob = s.get(key)
        assert blob is not None and bytes(blob) == payload
print("ok", impl)
"""


@pytest.mark.parametrize("impl", ["auto", "twox", "portable"])
def test_matches_the_c_library(impl: str, tmp_path: object) -> None:
    r = run_python(CHECK, impl, str(tmp_path), env={"XLA_PCACHE_HASH_IMPL": impl}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok "), r.stdout


def test_unknown_impl_is_logged_and_ignored() -> None:
    code = """
    import logging
    logging.basicConfig(level=logging.WARNING)
    import xla_pcache
    from xla_pcache import _core
    print(_core.hash_impl(), xla_pcache.hash_key(b"x"))
    """
    r = run_python(code, env={"XLA_PCACHE_HASH_IMPL": "avx9000"})
    assert r.returncode == 0, r.stderr
    impl, digest = r.stdout.split()
    assert not impl.startswith("portable-")
    assert len(digest) == 32
    assert "XLA_PCACHE_HASH_IMPL" in r.stderr
