"""Which build of a framework's runtime made an entry: the identity of the binaries that
produce and load executables.

A serialized executable is safe to load only into the runtime that produced it, and the
frameworks' own keys name versions, not binaries: a jaxlib rebuilt from source, patched or
installed from another channel under the same version has the same JAX key. So every key an
adapter gives the store ends with the build of the runtime that compiled it
(``<framework key>@build-<32 hex>``, made and read only by ``xla_pcache.build_key``; an
adapter holding a ``Build`` asks ``Build.store_key``): a process asks only for its own
build's entries, and another build's are other keys, never read, never replaced. Two builds
sharing a cache each keep their own entries side by side; neither thrashes the other.

The package's parts: which files make a runtime (``files``; which packages, the adapters'
``jax/_build.py`` and ``torch_xla/_build.py``), each file's identity and the user's record
of them (``identities``), the build and its digest over them, and the build as a key
component (``build``), and another build's entry after a miss (``others``).

A miss is explained (``component``: the build as one of the key's recorded components,
which ``xla-pcache explain`` compares) and counted: ``OtherBuilds`` finds, after a miss,
whether another build, or a release that did not record builds, has an entry of the same
framework key (``other_build`` in ``stats``).
"""

from __future__ import annotations

from xla_pcache.builds.build import (
    COMPONENT,
    Build,
    FileIdentity,
    meta_with_component,
    with_component,
)
from xla_pcache.builds.files import Wanted, package_dirs, shared_objects, unique
from xla_pcache.builds.identities import count_rehash, identify, usable
from xla_pcache.builds.others import UNRECORDED, OtherBuilds

__all__ = [
    "COMPONENT",
    "UNRECORDED",
    "Build",
    "FileIdentity",
    "OtherBuilds",
    "Wanted",
    "count_rehash",
    "identify",
    "meta_with_component",
    "package_dirs",
    "shared_objects",
    "unique",
    "usable",
    "with_component",
]
