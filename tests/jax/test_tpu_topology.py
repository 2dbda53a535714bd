"""JAX's TPU runtime on a host without a TPU (``tests/jax/tpu.py``): the runtime's build named
as on the TPU."""

from __future__ import annotations

import shutil
from pathlib import Path

from xla_pcache.jax import _build as jax_build

from tests.jax.tpu import (
    TPU_TOPOLOGY,
    build_here,
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
