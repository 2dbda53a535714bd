"""JAX: which of a plan's variants this run is, told by what it reads, and what to load
before and after it is told.

A plan holds a variant per program that ran under its name (``_plan``): configurations of
one script chosen by a variable or a file, notebooks of one kind of kernel, test suites of
one runner. Nothing on the command line tells them apart (the arguments are the same, or
change at every start), so a run is recognised by its reads:

- the **candidates** are the plan's variants of the backend's platform and device count
  (before the backend is up, every variant);
- a read of a key some candidates hold and others do not leaves those that hold it; a key
  no candidate holds (a new or changed program) leaves them all;
- what is **wanted**, to load now, is what every candidate holds, in the order of the newest
  of them (the order its run first read them): with one candidate left, its whole list.

So a run of a program the plan knows loads only executables its own variant holds, and
once its reads have told it from the others, all of them. The bound on what a run can load
for nothing before it is recognised: the executables every known program of its entry point
read (with one variant, all of it). A run of a program the plan does not know yet can
waste those, once: its own variant is then written, and from its next run on it is a
candidate too.

Pure bookkeeping, no JAX: the session (``_prefetch``) calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from xla_pcache.jax.ahead._plan import Entry, Variant


class Recognition:
    """The candidates among ``variants`` for this run, narrowed by its reads."""

    def __init__(self, variants: Sequence[Variant]) -> None:
        self._variants = tuple(variants)
        self._keys = [v.keys() for v in self._variants]
        self._candidates = list(range(len(self._variants)))

    @property
    def variants(self) -> int:
        return len(self._variants)

    @property
    def candidates(self) -> int:
        return len(self._candidates)

    def restrict(self, platform: str, device_count: int) -> None:
        """The backend is up: only variants of its platform and device count remain."""
        self._candidates = [
            i for i in self._candidates if self._variants[i].runs_on(platform, device_count)
        ]

    def observe(self, key: str) -> bool:
        """A read of ``key``: whether it narrowed the candidates."""
        holding = [i for i in self._candidates if key in self._keys[i]]
        if holding and len(holding) < len(self._candidates):
            self._candidates = holding
            return True
        return False

    def _reference(self) -> int | None:
        if not self._candidates:
            return None
        return max(self._candidates, key=lambda i: self._variants[i].written)

    def reference(self) -> Variant | None:
        """The newest candidate: whose order is followed while several remain."""
        ref = self._reference()
        return None if ref is None else self._variants[ref]

    def wanted(self) -> list[Entry]:
        """What every candidate holds, in the reference's order."""
        ref = self._reference()
        if ref is None:
            return []
        others = [self._keys[i] for i in self._candidates if i != ref]
        return [e for e in self._variants[ref].entries if all(e.key in k for k in others)]

    def order(self) -> dict[str, int]:
        """Each key's place in the reference's list (for the order of loading)."""
        ref = self.reference()
        return {} if ref is None else {e.key: i for i, e in enumerate(ref.entries)}
