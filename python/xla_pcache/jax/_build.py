"""JAX: which files make the runtime's build (``xla_pcache.builds``), found where JAX finds
them, without importing or loading any of them.

- **jaxlib**: every shared object of the jaxlib package (0.4.36: ``xla_extension.so``;
  0.10 and 0.12: ``libjax_common.so``, ``_jax.so`` and the extensions beside them;
  ``cpu/_lapack.so`` ...). The main one compiles, serializes and loads executables; the
  others hold the kernels an executable calls by name (custom calls: LAPACK, sparse), whose
  ABI it was compiled against. Python files are left out: they do not touch an executable.
- **PJRT plugins**, as JAX finds them: libtpu (``TPU_LIBRARY_PATH`` when it names a file,
  else the ``libtpu`` package's ``libtpu.so``, as ``jax._src.cloud_tpu_init`` does), every
  package under the ``jax_plugins`` namespace (the CUDA and ROCm plugins) with JAX's own
  kernel packages beside them (``jax_cuda12_plugin`` ...), and the libraries named in
  ``PJRT_NAMES_AND_LIBRARY_PATHS``.

Installed plugins count whether or not a process brings their backend up: so every process
of one environment, ``xla-pcache doctor`` and ``import --from-jax`` compute the same build.
The price is that installing or upgrading a plugin retires the entries of every platform of
that environment (they miss and age out), never that one build loads another's.
"""

from __future__ import annotations

import os
import threading

from xla_pcache import builds

FRAMEWORK = "jax"
# JAX's own kernel packages for GPUs (jax._src.lib imports them by these names).
_KERNEL_PACKAGES = (
    "jax_cuda12_plugin",
    "jax_cuda13_plugin",
    "jax_rocm6_plugin",
    "jax_rocm7_plugin",
)


def tpu_library() -> str | None:
    """The libtpu JAX would load: ``TPU_LIBRARY_PATH`` when it names a file, else the
    ``libtpu`` package's."""
    env = os.environ.get("TPU_LIBRARY_PATH")
    if env and os.path.isfile(env):
        return env
    for top in builds.package_dirs("libtpu"):
        path = os.path.join(top, "libtpu.so")
        if os.path.isfile(path):
            return path
    return None


def wanted() -> list[builds.Wanted]:
    """The files of JAX's runtime build here (see the module's docstring)."""
    out: list[builds.Wanted] = []
    for top in builds.package_dirs("jaxlib")[:1]:
        out += builds.shared_objects("jaxlib", top)
    tpu = tpu_library()
    if tpu is not None:
        out.append(("libtpu", tpu, os.path.basename(tpu)))
    for top in builds.package_dirs("jax_plugins"):
        try:
            names = sorted(os.listdir(top))
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            if name != "__pycache__" and os.path.isdir(path):
                out += builds.shared_objects(f"jax_plugins.{name}", path)
    for package in _KERNEL_PACKAGES:
        for top in builds.package_dirs(package)[:1]:
            out += builds.shared_objects(package, top)
    for item in os.environ.get("PJRT_NAMES_AND_LIBRARY_PATHS", "").split(","):
        name, sep, path = item.partition(os.path.pathsep)
        if sep and path and os.path.isfile(path):
            out.append((f"pjrt.{name}", path, os.path.basename(path)))
    return builds.unique(out)


_lock = threading.Lock()
_build: builds.Build | None = None


def build() -> builds.Build:
    """This process's JAX runtime build, computed once (a ``stat`` per file, and a hash of
    the files the user's record does not know yet)."""
    global _build
    with _lock:
        if _build is None:
            _build = builds.identify(FRAMEWORK, wanted())
        return _build
