"""After a miss: another build's entry of the same framework key (``other_build`` in
``stats``, and what ``xla-pcache explain`` says of the miss)."""

from __future__ import annotations

import threading
import time
from typing import Any

from xla_pcache import build_key
from xla_pcache._text import package_logger
from xla_pcache.builds.build import Build
from xla_pcache.misslog import read_misses

logger = package_logger("xla_pcache")

# What ``OtherBuilds.find`` answers for an entry from before keys carried a build.
UNRECORDED = "unrecorded"


class OtherBuilds:
    """After a miss: whether another build has an entry of the same framework key.

    A key holds its build, so the other builds' entries cannot be listed by key; their
    digests are learned from the cache's miss log (every build that wrote an entry missed
    it first, and its miss record's key names its build), read at most once a minute and
    only on a miss, and each then asked for the key (``contains``: one header read). An
    entry under the bare framework key is one from before keys carried a build."""

    REFRESH_S = 60.0
    MAX_BUILDS = 16

    def __init__(self, own: Build) -> None:
        self._own = own.digest
        self._lock = threading.Lock()
        self._known: list[str] = []
        self._read_at: float | None = None

    def _builds(self, store: Any) -> list[str]:
        now = time.monotonic()
        with self._lock:
            if self._read_at is not None and now - self._read_at < self.REFRESH_S:
                return self._known
            self._read_at = now
        seen: dict[str, None] = {}
        try:
            for record in reversed(read_misses(store.path)):
                digest = build_key.split(str(record["key"]))[1]
                if digest is not None and digest != self._own:
                    seen.setdefault(digest, None)
                    if len(seen) >= self.MAX_BUILDS:
                        break
        except (OSError, ValueError) as exc:
            logger.debug("xla_pcache: reading the miss log for other builds failed: %s", exc)
        with self._lock:
            self._known = list(seen)
            return self._known

    def find(self, store: Any, key: str) -> str | None:
        """The other build (its digest, or ``UNRECORDED``) whose entry of the framework's
        ``key`` the store holds; None when there is none. Never raises."""
        try:
            if key in store:
                return UNRECORDED
            for digest in self._builds(store):
                if build_key.join(key, digest) in store:
                    return digest
        except Exception as exc:
            logger.debug("xla_pcache: looking for other builds' entries failed: %s", exc)
        return None

    def count(self, store: Any, key: str) -> str | None:
        """``find``, and the miss counted as ``other_build`` when it finds one."""
        other = self.find(store, key)
        if other is not None:
            try:
                store.count_other_build()
            except Exception as exc:
                logger.debug("xla_pcache: counting another build's miss failed: %s", exc)
        return other
