"""A function of JAX's that a hook replaces with a wrapper of its own: the wrapper keeps the
original under a marker attribute, which is how the hook knows it is in place and how it is
put back."""

from __future__ import annotations

from typing import Any


def restore(owner: Any, target: str, marker: str) -> None:
    """Put ``owner.<target>`` back to the original its wrapper keeps under ``marker``; nothing
    when no wrapper with that marker is in place."""
    current = getattr(owner, target, None)
    original = getattr(current, marker, None)
    if original is not None:
        setattr(owner, target, original)
