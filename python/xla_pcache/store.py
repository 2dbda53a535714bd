"""``Store``: the Rust store, with budgets accepted as size strings."""

from __future__ import annotations

import os
from typing import Literal

from xla_pcache import _core
from xla_pcache.sizes import parse_size


class Store(_core.Store):
    """A persistent key -> blob store rooted at ``path`` (see ``xla_pcache._core.Store``).

    ``max_size`` may be a byte count or a string such as ``"500M"``, ``"50G"``, ``"1.5T"``.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        max_size: int | str | None = None,
        read_only: bool = False,
        durable: bool = False,
        lock_mode: Literal["auto", "fcntl", "lease"] | None = None,
        lock_timeout: float = 0.5,
        lease_time: float = 30.0,
        hit_interval: float = 60.0,
        trash_grace: float = 300.0,
        tmp_grace: float = 3600.0,
    ) -> Store:
        return super().__new__(
            cls,
            path,
            max_size=parse_size(max_size, name="max_size"),
            read_only=read_only,
            durable=durable,
            lock_mode=lock_mode,
            lock_timeout=lock_timeout,
            lease_time=lease_time,
            hit_interval=hit_interval,
            trash_grace=trash_grace,
            tmp_grace=tmp_grace,
        )
