"""torch_xla: which files make the runtime's build (``xla_pcache.builds``), found where
torch_xla finds them, without importing or loading any of them.

- **torch_xla's extension**: ``_XLAC`` (the C++ runtime: it compiles the graphs, serializes
  the executables into its cache files and loads them back) and ``_XLAC_cuda_functions``
  beside it, and any shared object under ``torch_xla/lib``.
- **libtpu**, as torch_xla looks for it: ``TPU_LIBRARY_PATH`` when it names a file, else the
  one bundled in ``torch_xla/lib`` (already among the above), else the ``libtpu`` package's.
- **PJRT plugins** torch_xla loads through its ``torch_xla.plugins`` entry points: the
  shared objects of the ``torch_xla_cuda_plugin`` package.

As for JAX, installed plugins count whether or not a process uses them, so every process of
one environment and ``xla-pcache doctor`` compute the same build. torch itself is left out:
it neither writes nor loads an executable (its version is among the recorded components).
"""

from __future__ import annotations

import importlib.util
import os
import threading

from xla_pcache import builds

FRAMEWORK = "torch_xla"
_EXTENSIONS = ("_XLAC", "_XLAC_cuda_functions")
_PLUGIN_PACKAGES = ("torch_xla_cuda_plugin",)


def _origin(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None or not spec.origin else str(spec.origin)


def _package_dir(name: str) -> str | None:
    found = builds.package_dirs(name)
    return found[0] if found else None


def wanted() -> list[builds.Wanted]:
    """The files of torch_xla's runtime build here (see the module's docstring)."""
    out: list[builds.Wanted] = []
    for name in _EXTENSIONS:
        path = _origin(name)
        if path is not None and os.path.isfile(path):
            out.append(("torch_xla", path, os.path.basename(path)))
    top = _package_dir("torch_xla")
    bundled = None
    if top is not None:
        lib = os.path.join(top, "lib")
        if os.path.isdir(lib):
            out += builds.shared_objects("torch_xla", lib, prefix="lib")
        candidate = os.path.join(lib, "libtpu.so")
        bundled = candidate if os.path.isfile(candidate) else None
    env = os.environ.get("TPU_LIBRARY_PATH")
    if env and os.path.isfile(env):
        out.append(("libtpu", env, os.path.basename(env)))
    elif bundled is None:
        libtpu = _package_dir("libtpu")
        if libtpu is not None and os.path.isfile(os.path.join(libtpu, "libtpu.so")):
            out.append(("libtpu", os.path.join(libtpu, "libtpu.so"), "libtpu.so"))
    for package in _PLUGIN_PACKAGES:
        path = _package_dir(package)
        if path is not None:
            out += builds.shared_objects(package, path)
    return builds.unique(out)


_lock = threading.Lock()
_build: builds.Build | None = None


def build() -> builds.Build:
    """This process's torch_xla runtime build, computed once."""
    global _build
    with _lock:
        if _build is None:
            _build = builds.identify(FRAMEWORK, wanted())
        return _build
