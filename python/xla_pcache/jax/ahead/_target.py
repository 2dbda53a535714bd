"""What a program was compiled for (``Target``), told from JAX's backend and devices, and the
client a compiler process makes of it: on a CPU, JAX's CPU client with as many devices; on a
TPU, a compile-only client of the same topology (``jax.experimental.topologies``), which
needs no chip and compiles while the program's own process holds the TPU. Other platforms
(GPU) are not compiled ahead: their compile-only clients need the devices' own libraries and
options this package cannot check against the key.

A TPU's topology is told from its devices as JAX shows them: the generation from the device
kind, the chips' extent from their coordinates, the chips of one host from the first process's
devices, one device per chip (megacore) or per core. Nothing here has to be right for the
program to be safe: a compile is made only when JAX's own key of the record on that client is
the key the record is stored under (``_compiler``); a wrong topology is a key mismatch, a
refusal counted, never a wrong executable.

This module imports nothing from JAX at import time.
"""

from __future__ import annotations

from typing import Any

from xla_pcache.jax.ahead._record import Target

# JAX's device kind of each TPU generation, and its name in a topology.
_TPU_GENERATIONS = {
    "TPU v2": "v2",
    "TPU v3": "v3",
    "TPU v4": "v4",
    "TPU v4 lite": "v4i",
    "TPU v5 lite": "v5e",
    "TPU v5e": "v5e",
    "TPU v5": "v5p",
    "TPU v5p": "v5p",
    "TPU v6 lite": "v6e",
    "TPU v6e": "v6e",
}
# Generations whose topology is named in three dimensions (the others in two).
_THREE_D = frozenset({"v4", "v5p"})
# Generations of two cores per chip, one device per chip when JAX joins them (megacore).
_MEGACORE = frozenset({"v4", "v5p"})

COMPILED_AHEAD_PLATFORMS = frozenset({"cpu", "tpu"})


def describe(backend: Any) -> Target | None:
    """The target of a program compiled by ``backend`` (a JAX client, or a compile-only one
    made of a topology); None when it cannot be told."""
    try:
        platform = str(backend.platform)
        devices = list(backend.devices())
        kinds = {str(d.device_kind) for d in devices}
        if not devices or len(kinds) != 1:
            return None
        kind = kinds.pop()
        found = _tpu(kind, devices) if platform == "tpu" else Target(platform, kind, len(devices))
        return found if found is not None and found.valid() else None
    except Exception:
        return None


def _tpu(kind: str, devices: list[Any]) -> Target | None:
    generation = _TPU_GENERATIONS.get(kind)
    if generation is None:
        return None
    coords = [tuple(int(c) for c in d.coords) for d in devices]
    if any(len(c) != 3 for c in coords):
        return None
    extent = tuple(max(c[i] for c in coords) + 1 for i in range(3))
    first = min(int(d.process_index) for d in devices)
    local = [c for c, d in zip(coords, devices, strict=True) if int(d.process_index) == first]
    per_host = tuple(max(c[i] for c in local) - min(c[i] for c in local) + 1 for i in range(3))
    slices = len({getattr(d, "slice_index", 0) or 0 for d in devices})
    per_chip = len(devices) // max(1, len(set(coords)))
    dims = extent if generation in _THREE_D else extent[:2]
    chip_config = "megacore" if generation in _MEGACORE and per_chip == 1 else "default"
    if generation == "v5p":
        chip_config = "default"  # one device per chip is v5p's own configuration
    return Target(
        platform="tpu",
        device_kind=kind,
        device_count=len(devices),
        topology=f"{generation}:{'x'.join(map(str, dims))}",
        chip_config=chip_config,
        chips_per_host=(per_host[0], per_host[1], per_host[2]),
        slices=max(1, slices),
    )


def environment(target: Target) -> dict[str, str]:
    """What a compiler process for ``target`` adds to its parent's environment: JAX's CPU
    client only (a TPU's compile-only client comes from its topology, and the parent may
    hold the chips), and libtpu let load beside the parent's."""
    env = {"JAX_PLATFORMS": "cpu"}
    if target.platform == "tpu":
        env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return env


def make_client(target: Target) -> tuple[Any, list[Any]]:
    """In a compiler process: the client ``target`` names and its devices (JAX imported)."""
    import jax

    if target.platform == "cpu":
        config: Any = jax.config
        if "jax_num_cpu_devices" in config.values:
            config.update("jax_num_cpu_devices", target.device_count)
        devices = list(jax.devices("cpu"))
        return devices[0].client, devices
    if target.platform == "tpu":
        if target.topology is None or target.chips_per_host is None:
            raise ValueError("a TPU target without its topology")
        from jax.experimental import topologies

        topology = topologies.get_topology_desc(
            platform="tpu",
            topology_name=target.topology,
            chip_config_name=target.chip_config or "default",
            chips_per_host_bounds=target.chips_per_host,
            num_slices=target.slices,
        )
        devices = list(topology.devices)
        return devices[0].client, devices
    raise ValueError(f"{target.platform} is not compiled ahead")
