"""Trust where bytes are received rather than compiled: JAX's own cache files (served on a
miss, adopted, or moved by ``import --from-jax``), bundle members and a tier's values.

Two promises, in every cell: a process that trusts keys never runs a byte no trusted key
signed, and a store signs only what its own process compiled; what it received keeps the
signature it carries only once the store's keys verify it.

The attack the JAX cells stand in for: a writer of JAX's old cache directory puts, under
the file name of program ``sin``, the executable of program ``cos``. Real JAX, fresh
processes, the cache configured by the environment alone; several checks per process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from xla_pcache import Store
from xla_pcache.bundle import export_bundle
from xla_pcache.config import Settings, read_signing_key
from xla_pcache.jax import _build as jax_build

from tests.helpers import clean_env, executables, keygen, run_worker
from tests.jax.helpers import value_and_hits

requires_jax = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="jax is not installed"
)

# JAX alone (xla_pcache disabled) fills one directory per program, in one process.
FILL = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax._src import compilation_cache as cc
    f = {"sin": lambda x: jnp.sin(x).sum() * 3, "cos": lambda x: jnp.cos(x).sum() * 5}
    values = {}
    for name, d in json.loads(sys.argv[1]).items():
        jax.config.update("jax_compilation_cache_dir", d)
        cc.reset_cache()
        values[name] = float(jax.jit(f[name])(np.arange(8.0, dtype=np.float32)))
    print(json.dumps(values))
    """
)


def cli(*args: str, no_jax: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    """The command in a fresh process; ``no_jax``: one that cannot import jax (the command
    then checks every format it reads, on any JAX version)."""
    code = "import sys\n"
    if no_jax:
        code += "sys.modules['jax'] = None\n"
    code += "from xla_pcache.cli import main\nsys.argv = ['xla-pcache', *sys.argv[1:]]\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    d = tmp_path_factory.mktemp("keys")
    return {n: keygen(d, n) for n in ("ci-1", "mallory-1")}


def private(key_file: str) -> tuple[str, bytes]:
    k = read_signing_key(key_file)
    return k.name, k.private


def public(text: str) -> tuple[str, bytes]:
    import base64

    name, b64 = text.split(":", 1)
    return name, base64.b64decode(b64)


def signer_of(cache: Path, key: object) -> str | None:
    """Who signed the entry of ``key`` as written (an untrusting look), or None."""
    with Store(cache, settings=Settings(), read_only=True) as s:
        blob = s.get(key)  # type: ignore[arg-type]
        assert blob is not None, f"no entry of {key!r}"
        return blob.signer


def trusted_get(cache: Path, key: object, pub: str) -> bytes | None:
    trusted = [public(pub)]
    with Store(cache, settings=Settings(), read_only=True, trusted_keys=trusted) as s:
        blob = s.get(key)  # type: ignore[arg-type]
        return None if blob is None else bytes(blob)


@pytest.fixture(scope="module")
def jax_filled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """JAX's old cache directory, holding ``cos``'s executable under ``sin``'s file name;
    and each program's true value. Before jax 0.11 JAX's keys hold the directory's path:
    it is used where JAX filled it, never copied."""
    base = tmp_path_factory.mktemp("planted")
    dirs = {"sin": str(base / "sin"), "cos": str(base / "cos")}
    env = clean_env(
        ("JAX_",),
        JAX_PLATFORMS="cpu",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        XLA_PCACHE_DISABLE="1",
    )
    values = run_worker("-c", FILL, json.dumps(dirs), env=env, timeout=300)
    assert values["sin"] != values["cos"]
    files = {n: [f for f in os.listdir(d) if f.endswith("-cache")] for n, d in dirs.items()}
    assert all(len(v) == 1 for v in files.values()), files
    cos_bytes = (Path(dirs["cos"]) / files["cos"][0]).read_bytes()
    (Path(dirs["sin"]) / files["sin"][0]).write_bytes(cos_bytes)
    return {
        "dir": dirs["sin"],
        "file": files["sin"][0],
        "cos_bytes": cos_bytes,
        "sin": values["sin"],
        "cos": values["cos"],
    }


@pytest.fixture
def planted(jax_filled: dict[str, object]) -> dict[str, object]:
    """``jax_filled`` as planted, whatever the test before did with it."""
    d = Path(str(jax_filled["dir"]))
    for name in os.listdir(d):
        if name.endswith("-cache") and name != jax_filled["file"]:
            (d / name).unlink()
    (d / str(jax_filled["file"])).write_bytes(bytes(jax_filled["cos_bytes"]))  # type: ignore[arg-type]
    return jax_filled


@pytest.mark.jax
@requires_jax
def test_a_trusting_process_never_serves_nor_adopts_a_jax_file(
    tmp_path: Path, keys: dict[str, tuple[str, str]], planted: dict[str, object]
) -> None:
    jax_dir = Path(str(planted["dir"]))
    planted_file = jax_dir / str(planted["file"])
    cache = tmp_path / "cache"
    Store(cache).close()
    trusting = {
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
        "JAX_COMPILATION_CACHE_DIR": str(jax_dir),
        "XLA_PCACHE_TRUSTED_KEYS": keys["ci-1"][1],
    }
    # A trusting read-only worker computes sin, not the planted cos, and moves nothing.
    ro = {**trusting, "XLA_PERSISTENT_CACHE_READ_ONLY": "1"}
    assert value_and_hits("sin", **ro) == (planted["sin"], 0)
    assert planted_file.read_bytes() == planted["cos_bytes"]
    # CI set up as documented (its signing key and the trusted keys) compiles sin itself:
    # the planted file is neither adopted nor signed, and stays where it was.
    ci = {**trusting, "XLA_PCACHE_SIGNING_KEY": keys["ci-1"][0]}
    assert value_and_hits("sin", **ci) == (planted["sin"], 0)
    assert planted_file.read_bytes() == planted["cos_bytes"]
    with Store(cache, settings=Settings(), read_only=True) as s:
        (entry,) = executables(s)
        assert entry["signer"] == "ci-1"
        assert entry["meta"].get("adopted_from") is None
        key = entry["key"]
    assert trusted_get(cache, key, keys["ci-1"][1]) != planted["cos_bytes"]
    # And trusting workers now hit CI's own compile.
    assert value_and_hits("sin", **ro) == (planted["sin"], 1)


@pytest.mark.jax
@requires_jax
def test_a_signer_without_trusted_keys_adopts_a_jax_file_unsigned(
    tmp_path: Path, keys: dict[str, tuple[str, str]], planted: dict[str, object]
) -> None:
    jax_dir = Path(str(planted["dir"]))
    cache = tmp_path / "cache"
    signer_only = {
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
        "JAX_COMPILATION_CACHE_DIR": str(jax_dir),
        "XLA_PCACHE_SIGNING_KEY": keys["ci-1"][0],
    }
    # It trusts every writer, so it serves JAX's file (the attacker's cos: that is what
    # trusting no key means) and takes it over, but never signs it.
    assert value_and_hits("sin", **signer_only) == (planted["cos"], 1)
    assert not (jax_dir / str(planted["file"])).exists()
    with Store(cache, settings=Settings(), read_only=True) as s:
        (entry,) = executables(s)
        assert entry["signer"] is None and entry["meta"]["adopted_from"] == "jax_cache"
        stats = s.stats()
    assert (stats["hits"], stats["adopted"], stats["misses"]) == (1, 1, 0), stats
    # So a trusting reader never loads it: it compiles sin.
    assert trusted_get(cache, entry["key"], keys["ci-1"][1]) is None
    ro = {
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
        "XLA_PERSISTENT_CACHE_READ_ONLY": "1",
        "XLA_PCACHE_TRUSTED_KEYS": keys["ci-1"][1],
    }
    assert value_and_hits("sin", **ro) == (planted["sin"], 0)


def test_import_from_jax_refuses_a_trusting_cache_and_never_signs(
    tmp_path: Path, keys: dict[str, tuple[str, str]]
) -> None:
    import zlib

    name = "jit_f-" + "ab" * 32
    jax_dir = tmp_path / "jax"
    jax_dir.mkdir()
    value = zlib.compress((2).to_bytes(4, "big") + b"an executable" * 40)
    (jax_dir / f"{name}-cache").write_bytes(value)
    cache = tmp_path / "cache"
    args = ("import", "--from-jax", str(jax_dir), "--path", str(cache))

    trusting = cli(*args, no_jax=True, XLA_PCACHE_TRUSTED_KEYS=keys["ci-1"][1])
    assert trusting.returncode == 2, trusting.stdout + trusting.stderr
    assert "trusts signed entries only" in trusting.stderr
    assert "nothing was imported" in trusting.stderr
    assert (jax_dir / f"{name}-cache").read_bytes() == value
    assert not cache.exists()
    both = cli(
        *args,
        no_jax=True,
        XLA_PCACHE_TRUSTED_KEYS=keys["ci-1"][1],
        XLA_PCACHE_SIGNING_KEY=keys["ci-1"][0],
    )
    assert both.returncode == 2 and "nothing was imported" in both.stderr

    signer_only = cli(*args, no_jax=True, XLA_PCACHE_SIGNING_KEY=keys["ci-1"][0])
    assert signer_only.returncode == 0, signer_only.stderr
    assert "adopted 1" in signer_only.stdout
    # Filed under the build of the jaxlib installed here (docs/jax.md).
    key = jax_build.build().store_key(name)
    assert signer_of(cache, key) is None
    assert trusted_get(cache, key, keys["ci-1"][1]) is None


def test_a_signer_publishes_received_entries_unsigned_unless_its_key_verifies_them(
    tmp_path: Path, keys: dict[str, tuple[str, str]]
) -> None:
    """A bundle imported by the command, and a tier's value published on a local miss, in
    a process holding a signing key and no trusted keys."""
    src = tmp_path / "src"
    with Store(src, settings=Settings()) as s:
        assert s.put("unsigned", b"u" * 1000, meta={"framework": "jax"})
    with Store(src, settings=Settings(), signing_key=private(keys["mallory-1"][0])) as s:
        assert s.put("mallory", b"m" * 1000, meta={"framework": "jax"})
    with Store(src, settings=Settings(), signing_key=private(keys["ci-1"][0])) as s:
        assert s.put("ci", b"c" * 1000, meta={"framework": "jax"})
    bundle = tmp_path / "b.tar.gz"
    with Store(src, settings=Settings(), read_only=True) as s:
        assert export_bundle(s, bundle) == 3
        files = {k: s.get_entry_file(k) for k in ("unsigned", "mallory", "ci")}

    dst = tmp_path / "dst"
    imported = cli(
        "import", str(bundle), "--path", str(dst), XLA_PCACHE_SIGNING_KEY=keys["ci-1"][0]
    )
    assert imported.returncode == 0, imported.stderr
    assert "imported 3" in imported.stdout
    # What its key verifies keeps its signature; the rest is unsigned, never ci-1's.
    assert signer_of(dst, "ci") == "ci-1"
    assert signer_of(dst, "unsigned") is None
    assert signer_of(dst, "mallory") is None
    assert trusted_get(dst, "unsigned", keys["ci-1"][1]) is None
    assert trusted_get(dst, "ci", keys["ci-1"][1]) == b"c" * 1000

    # A tier's value, as the store takes it on a local miss (the tiers hand it the whole
    # entry file: tests/tiers/ run the same path against real servers).
    tier_dst = tmp_path / "tier-dst"
    with Store(tier_dst, settings=Settings(), signing_key=private(keys["ci-1"][0])) as s:
        for k, data in files.items():
            assert data is not None
            assert s.take_entry_file(k, [data], True) is not None
    assert signer_of(tier_dst, "unsigned") is None
    assert signer_of(tier_dst, "mallory") is None
    assert signer_of(tier_dst, "ci") == "ci-1"
    assert trusted_get(tier_dst, "unsigned", keys["ci-1"][1]) is None
