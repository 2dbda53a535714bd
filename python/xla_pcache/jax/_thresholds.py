"""Which of JAX's two caching thresholds the JAX adapter sets, and where each value comes from.

JAX stores a compiled program only when its compile took at least
``jax_persistent_cache_min_compile_time_secs`` (JAX's default: 1 s) and its entry is at least
``jax_persistent_cache_min_entry_size_bytes`` long. JAX's 1 s suits a slow remote cache;
reading an entry back from the store costs far less than compiling it again, so with
xla_pcache active the adapter applies the store's own thresholds (``Settings.min_compile_time``,
``Settings.min_entry_size``) instead, unless the program chose JAX's own: by JAX's
environment variable, or by ``jax.config.update`` to a value other than JAX's default before
activation. A later ``jax.config.update`` simply replaces what the adapter set.

No jax import here: ``doctor`` uses this module to tell where a setting comes from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from xla_pcache.config import MIN_COMPILE_TIME_VAR, MIN_ENTRY_SIZE_VAR, Settings


@dataclasses.dataclass(frozen=True)
class Threshold:
    """One JAX option the adapter manages, with JAX's own default (the same in every JAX of
    the supported range; a test checks it against each JAX in CI)."""

    option: str
    jax_default: float | int
    ours: str  # the Settings field
    ours_var: str

    @property
    def jax_var(self) -> str:
        """JAX reads each option's upper-cased name from the environment at import."""
        return self.option.upper()


THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "jax_persistent_cache_min_compile_time_secs", 1.0, "min_compile_time", MIN_COMPILE_TIME_VAR
    ),
    Threshold("jax_persistent_cache_min_entry_size_bytes", 0, "min_entry_size", MIN_ENTRY_SIZE_VAR),
)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What is in force for one option: ``value``, and ``source`` as people read it.
    ``apply`` is True when the adapter sets the value (it is ours)."""

    option: str
    value: float | int | str | None
    source: str
    apply: bool


def decide(
    settings: Settings,
    environ: Mapping[str, str],
    config_values: Mapping[str, Any] | None = None,
    explicit: Mapping[str, float | int] | None = None,
) -> list[Decision]:
    """For each threshold, the first that applies: ``explicit`` (the arguments of
    ``install()``, the caller's own choice), JAX's variable, a value other than JAX's default
    already in ``config_values`` (a ``jax.config.update`` by the program), the store's setting
    (from its variable or its default).

    ``config_values`` is None where no JAX runs (``doctor``): that source is then unknown.
    """
    out: list[Decision] = []
    for t in THRESHOLDS:
        if explicit and t.ours in explicit:
            out.append(Decision(t.option, explicit[t.ours], "install() argument", True))
            continue
        raw = environ.get(t.jax_var, "").strip()
        if raw:
            current: Any = raw if config_values is None else config_values.get(t.option, raw)
            out.append(Decision(t.option, current, f"JAX's variable {t.jax_var}", False))
            continue
        if config_values is not None:
            current = config_values.get(t.option, t.jax_default)
            if current != t.jax_default:
                out.append(Decision(t.option, current, "jax.config.update by the program", False))
                continue
        value = getattr(settings, t.ours)
        source = (
            f"xla_pcache's {t.ours_var}"
            if environ.get(t.ours_var, "").strip()
            else "xla_pcache's default"
        )
        out.append(Decision(t.option, value, source, True))
    return out
