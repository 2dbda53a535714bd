"""What a ``with`` block does with an object that has ``close()``: gives the object itself,
and closes it on the way out, whatever ended the block."""

from __future__ import annotations

from typing import Self


class Closing:
    """Mixed into a class with a ``close()`` that may run more than once."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
