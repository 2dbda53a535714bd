"""JAX's TPU runtime on a host without a TPU (``tests/jax/tpu.py``): the runtime's build named
as on the TPU, and a user's own ahead-of-time step for a compile-only TPU topology stored
under the key the TPU computes, with the module record beside it, by the environment alone.

What the TPU itself computes is not here to compare with: the keys' parts that differ between
hosts (the runtime build, the flags, the compression, the platform's version and devices) are
checked against what a TPU VM has, and docs/jax.md gives the TPU run that compares the keys."""

from __future__ import annotations

import shutil
from pathlib import Path

from xla_pcache import Store, build_key
from xla_pcache.jax import _build as jax_build
from xla_pcache.jax.ahead import _record as _module_record

from tests.jax.tpu import (
    TPU_TOPOLOGY,
    TPU_VM_FLAG,
    V5E_KIND,
    build_here,
    executables_of,
    record_keys,
    run_aot,
    tpu_vm_env,
)
from tests.rebuild import rebuilt_copy

pytestmark = TPU_TOPOLOGY


def test_the_tpu_runtime_is_named_by_its_file_wherever_it_is_installed(tmp_path: Path) -> None:
    libtpu = jax_build.tpu_library()
    assert libtpu is not None and Path(libtpu).name == "libtpu.so"
    here = build_here(tpu_vm_env(tmp_path / "a", None))
    assert here["roles"]["libtpu"]["file"] == "libtpu.so"
    assert here["roles"]["libtpu"]["id"].startswith("build-id ")

    # The same file at another path (as another machine installs the same wheel), found as
    # JAX finds it there, by a process with no record of identities: the same build.
    elsewhere = tmp_path / "elsewhere" / "lib"
    elsewhere.mkdir(parents=True)
    shutil.copyfile(libtpu, elsewhere / "libtpu.so")
    moved = build_here(
        tpu_vm_env(tmp_path / "b", None, TPU_LIBRARY_PATH=str(elsewhere / "libtpu.so"))
    )
    assert moved == here
    # A path that names no file is passed over, as JAX passes it over: the package's.
    missing = build_here(
        tpu_vm_env(tmp_path / "c", None, TPU_LIBRARY_PATH=str(tmp_path / "none.so"))
    )
    assert missing == here

    # Another build of libtpu (another build-id): another build, jaxlib's part unchanged.
    assert rebuilt_copy(Path(libtpu), elsewhere / "libtpu.so") == "build-id"
    other = build_here(
        tpu_vm_env(tmp_path / "d", None, TPU_LIBRARY_PATH=str(elsewhere / "libtpu.so"))
    )
    assert other["digest"] != here["digest"]
    assert other["roles"]["libtpu"]["id"] != here["roles"]["libtpu"]["id"]
    assert other["roles"]["jaxlib"] == here["roles"]["jaxlib"]


def test_an_aot_step_for_a_tpu_topology_is_stored_under_the_tpus_key(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = tpu_vm_env(tmp_path, cache)
    assert run_aot(env) == "Compiled"

    (key,) = executables_of(cache)
    entry = executables_of(cache)[key]
    jax_key, digest = build_key.split(key)
    # The runtime build of this host, which is the TPU's for the same files.
    assert digest == build_here(env)["digest"]
    parts = entry["components"]
    # Every part of JAX's key that differs between hosts is the TPU VM's.
    assert parts["XLA flags"] == TPU_VM_FLAG
    assert parts["compression"] == "zlib"
    assert parts["accelerator_config"] == {"platform": "tpu", "device_kind": V5E_KIND, "count": 1}
    assert "TPU v5 lite" in parts["backend version"]
    assert set(parts["runtime build"]) == {"jaxlib", "libtpu"}

    # The module record beside it: what compiling it again takes.
    assert record_keys(cache) == {_module_record.record_key(jax_key)}
    with Store(cache, read_only=True) as store:
        blob = store.get(_module_record.record_key(jax_key))
        assert blob is not None
        record = _module_record.decode(bytes(blob))
    assert record.module.startswith(_module_record.MLIR_BYTECODE_MAGIC)
    assert record.devices == (0,)
    assert record.options


def test_the_tpu_vms_keys_are_had_from_its_settings_alone(tmp_path: Path) -> None:
    """JAX's own set-up (``JAX_FORCE_TPU_INIT=1``) and its flag written out give one key;
    zstandard installed, or no TPU VM flag, another each: the settings a CPU host must share
    with the fleet."""
    keys = {}
    for name, zstandard, extra in (
        ("set-up", False, {}),
        ("flag", False, {"JAX_FORCE_TPU_INIT": "", "LIBTPU_INIT_ARGS": TPU_VM_FLAG}),
        ("zstandard", True, {}),
        ("no flag", False, {"JAX_FORCE_TPU_INIT": ""}),
    ):
        cache = tmp_path / name / "cache"
        env = tpu_vm_env(tmp_path / name, cache, zstandard=zstandard, **extra)
        env = {k: v for k, v in env.items() if v}
        run_aot(env)
        ((key, entry),) = executables_of(cache).items()
        keys[name] = key
        if name == "zstandard":
            assert entry["components"]["compression"] == "zstandard"
        if name == "no flag":
            assert entry["components"]["XLA flags"] == ""
    assert keys["set-up"] == keys["flag"]
    assert len({keys["set-up"], keys["zstandard"], keys["no flag"]}) == 3


def test_a_host_of_four_chips_records_its_devices(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run_aot(tpu_vm_env(tmp_path, cache), "v5e:2x2", "2,2,1")
    ((key, entry),) = executables_of(cache).items()
    assert entry["components"]["accelerator_config"]["count"] == 4
    jax_key, _ = build_key.split(key)
    with Store(cache, read_only=True) as store:
        blob = store.get(_module_record.record_key(jax_key))
        assert blob is not None
        assert _module_record.decode(bytes(blob)).devices == (0, 1, 2, 3)
