"""Helpers of the tests that compile for a compile-only TPU topology on this host, which has
no TPU: JAX with its TPU runtime (``jax[tpu]``, libtpu from the package index), run under
``JAX_PLATFORMS=cpu`` in fresh processes, activated by the environment alone.

A TPU VM's JAX differs from this host's in two things its keys hold, and the processes here
are made to differ in neither: JAX's own set-up there (``jax._src.cloud_tpu_init``, at
``import jax``) adds ``--xla_tpu_use_enhanced_launch_barrier=true`` to ``LIBTPU_INIT_ARGS``,
which ``JAX_FORCE_TPU_INIT=1`` makes it do on a host without TPU chips; and the TPU machine has
no zstandard (JAX then compresses with zlib), which a directory first on ``PYTHONPATH`` whose
``zstandard`` fails to import stands in for."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.jax.ahead._record import KEY_PREFIX
from xla_pcache.misslog import META_COMPONENTS

from tests.helpers import clean_env
from tests.jax.helpers import JAX_ONLY, run_python, without_zstandard

# The tests of this group: marked, and failing (never skipped: tests/conftest.py) where
# libtpu is not installed.
TPU_TOPOLOGY = [
    *JAX_ONLY,
    pytest.mark.tpu_topology,
    pytest.mark.skipif(
        importlib.util.find_spec("libtpu") is None,
        reason="libtpu is not installed (scripts/test.sh runs these in the venv of jax[tpu])",
    ),
]

# libtpu takes a host-wide lock file when it loads: these tests' processes (and the test
# workers' beside them) load it at once, as a compiler process does beside its program
# (``ahead._target``). It is no key-relevant setting.
LIBTPU_SHARED = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
# What JAX's set-up adds to LIBTPU_INIT_ARGS on a TPU VM (and so to every key there).
TPU_VM_FLAG = "--xla_tpu_use_enhanced_launch_barrier=true"
# The one chip of a v5e, as JAX names it (its devices' device_kind).
V5E_KIND = "TPU v5 lite"

# A user's ahead-of-time step, as MaxText's train_compile.py takes it: a compile-only
# topology's devices, a mesh over them, shapes sharded on it, lowered and compiled. It knows
# nothing of xla_pcache and prints nothing but the compiled program's name.
AOT_PROGRAM = textwrap.dedent(
    """
    import sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    chips_per_host = tuple(int(n) for n in sys.argv[2].split(","))
    topology = topologies.get_topology_desc(
        sys.argv[1], platform="tpu", chips_per_host_bounds=chips_per_host
    )
    mesh = Mesh(np.array(topology.devices), ("data",))
    shape = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P()))

    def step(w, x):
        for _ in range(3):
            x = jnp.tanh(x @ w)
        return x.sum()

    compiled = jax.jit(step).lower(shape, shape).compile()
    print(type(compiled).__name__)
    """
)


def tpu_vm_env(
    tmp: Path, cache: Path | str | None, *, zstandard: bool = False, **extra: str
) -> dict[str, str]:
    """A fresh process's environment on this host with the TPU VM's key-relevant settings
    (its flag, by JAX's own set-up; zlib unless ``zstandard``); the cache at ``cache``;
    the user's record of binaries' identities in ``tmp``."""
    env = clean_env(
        ("JAX_", "LIBTPU_", "TPU_", "XLA_FLAGS"),
        JAX_PLATFORMS="cpu",
        JAX_FORCE_TPU_INIT="1",
        XDG_CACHE_HOME=str(tmp / "xdg"),
        **LIBTPU_SHARED,
    )
    if cache is not None:
        env["XLA_PERSISTENT_CACHE_PATH"] = str(cache)
    if not zstandard:
        env = without_zstandard(env, tmp)
    env.update(extra)
    return env


def run_aot(env: dict[str, str], topology: str = "v5e:1x1", chips_per_host: str = "1,1,1") -> str:
    """``AOT_PROGRAM`` for ``topology`` (one host's chips ``chips_per_host``) in a fresh
    process; what it printed."""
    proc = run_python([sys.executable, "-c", AOT_PROGRAM, topology, chips_per_host], env)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc.stdout.strip()


def stored(cache: Path) -> dict[str, dict[str, Any]]:
    """Every entry of the store at ``cache``, by key: its metadata, and its key components by
    name (``components``) where it recorded them."""
    out = {}
    with Store(cache, read_only=True) as store:
        for entry in store.entries():
            meta = dict(entry.get("meta") or {})
            raw = meta.get(META_COMPONENTS)
            parts = json.loads(raw)["components"] if raw else []
            out[str(entry["key"])] = {
                "meta": meta,
                "components": {p["name"]: p.get("value") for p in parts},
            }
    return out


def executables_of(cache: Path) -> dict[str, dict[str, Any]]:
    """``stored`` less the records and plans."""
    from tests.helpers import is_beside

    return {k: v for k, v in stored(cache).items() if not is_beside(k)}


def record_keys(cache: Path) -> set[str]:
    return {k for k in stored(cache) if k.startswith(KEY_PREFIX)}


def build_here(env: dict[str, str]) -> dict[str, Any]:
    """The JAX runtime build a fresh process of this environment computes (its digest and
    suffix, and each role's main file and identity)."""
    code = (
        "import json\n"
        "from xla_pcache.jax import _build\n"
        "b = _build.build()\n"
        "print(json.dumps({'digest': b.digest, 'suffix': b.suffix, 'roles': b.roles()}))\n"
    )
    proc = run_python([sys.executable, "-c", code], env)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
