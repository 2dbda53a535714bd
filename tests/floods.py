"""The floods a writer of a bucket without a key can plant, by kind: thousands of keys of one
shape below a cache's prefix, for the bucket-state fuzzer (``tests/bucketstate_fuzz.py``) and
its long run's flood table (``bench/fuzz_bucket.py --floods``).

Each kind makes its keys (below the prefix) around what the bucket holds (``Scene``): keys the
client refuses (``//``, ``.`` and ``..`` segments, control characters) before, among and
right after the real entries, below names and as names, in one gap between names (a "shard"),
beside one refused name that makes a listing with a delimiter fail too; keys at the edges of
the ranges a listing gallops over; keys as long as S3 takes; objects below our names; markers
of made-up graphs (newer than the real ones), markers under a real entry's name, objects that
sort before every marker; records, claims, directories beside ours. They are planted on the
tests' relay (``tests/tiers/relay.py``), which lists them as S3 does and forgets those a
client deletes: none is written to the server, so ten thousand cost no PUT."""

from __future__ import annotations

import datetime
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from xla_pcache import entry_name

ROOT = "xla_pcache-1"
E = f"{ROOT}/entries"
M = f"{ROOT}/torch_xla"


@dataclass
class Scene:
    """What a flood is planted around: the real entries' names (sorted), the graphs of the
    real torch_xla markers, and the draw."""

    entries: list[str] = field(default_factory=list)
    graphs: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)

    def hex(self, below: int = 16**32) -> str:
        return f"{self.rng.randrange(max(1, below)):032x}"

    def low(self) -> int:
        """Where the first real entry is (keys below it sort before every entry)."""
        return int(self.entries[0], 16) if self.entries else 16**31


def _markers(graphs: list[str]) -> list[str]:
    return [f"{M}/{entry_name(f'torch_xla/{g}')}-{g}" for g in graphs]


def _boundaries(s: Scene, n: int) -> list[str]:
    """Keys at the edges of what a walk goes by: hex names cut to every length (where a
    gallop's 31-digit offsets fall), with a control character after them, and at both ends
    of the range."""
    out: list[str] = []
    while len(out) < n:
        h = s.hex()
        k = s.rng.randint(0, 32)
        out += [f"{E}/{h[:k]}", f"{E}/{h[:k]}\x01", f"{E}/{h[:k]}/x"]
    out += [f"{E}/{'f' * 32}\x01", f"{E}/{'f' * 32}//x", f"{E}/{'0' * 32}\x01", f"{E}/\x01"]
    return out[:n]


def _long(s: Scene, n: int) -> list[str]:
    """Keys as long as S3 takes (1,024 bytes with a prefix of about 30), in segments."""
    seg = "".join(s.rng.choice("abcdef0123456789-_") for _ in range(120))
    return [f"{E}/{s.hex()}/" + "/".join([seg] * 7) + f"/{i}" for i in range(n)]


FLOODS: dict[str, Callable[[Scene, int], list[str]]] = {
    # Keys the client refuses, below entries/.
    "refused before the entries": lambda s, n: [f"{E}/{s.hex(s.low())}//x" for _ in range(n)],
    "refused among the entries": lambda s, n: [f"{E}/{s.hex()}//x" for _ in range(n)],
    "refused ./.. below names": lambda s, n: [
        f"{E}/{s.hex()}/{s.rng.choice(['.', '..'])}/x" for _ in range(n)
    ],
    "refused controls below names": lambda s, n: [f"{E}/{s.hex()}/\x01{i}" for i in range(n)],
    "refused ./.. as names": lambda s, n: [
        f"{E}/{s.rng.choice(['.', '..'])}/{s.hex()}" for _ in range(n)
    ],
    "refused names with controls": lambda s, n: [f"{E}/{s.hex()}\x01" for _ in range(n)],
    "refused names before the entries": lambda s, n: [
        f"{E}/{s.hex(s.low())}\x1f" for _ in range(n)
    ],
    "refused right after each entry": lambda s, n: (
        [f"{E}/{e}\x01{i}" for e in s.entries for i in range(max(1, n // len(s.entries)))][:n]
        if s.entries
        else [f"{E}/{s.hex()}\x01" for _ in range(n)]
    ),
    "refused in one shard": lambda s, n: [f"{E}/{s.hex()[:2]}/{s.hex()}//x" for _ in range(n)],
    "refused below names, one as a name": lambda s, n: (
        [f"{E}/./x"] + [f"{E}/{s.hex()}//x" for _ in range(n - 1)]
    ),
    "refused under records/": lambda s, n: [
        f"{ROOT}/records/r-{int(time.time() * 1000)}-{s.hex()[:16]}-1-1/../x" for _ in range(n)
    ],
    "refused under torch_xla/": lambda s, n: [f"{M}/{s.hex()}-1//x" for _ in range(n)],
    "refused under claims/": lambda s, n: [f"{ROOT}/claims/{s.hex()}//x" for _ in range(n)],
    "at range edges": _boundaries,
    # Objects the client lists.
    "1,024-byte keys": _long,
    "junk names under entries/": lambda s, n: [f"{E}/j-{s.hex()[:20]}" for _ in range(n)],
    "objects below entry names": lambda s, n: [
        f"{E}/{s.rng.choice(s.entries) if s.entries and s.rng.random() < 0.3 else s.hex()}/x"
        for _ in range(n)
    ],
    "objects below the lease's name": lambda s, n: [f"{ROOT}/prune.lease/x{i}" for i in range(n)],
    "markers of made-up graphs": lambda s, n: _markers(
        [str(10**35 + s.rng.randrange(10**30)) for _ in range(n)]
    ),
    "markers under a real entry's name": lambda s, n: [
        f"{M}/{entry_name('torch_xla/' + s.rng.choice(s.graphs)) if s.graphs else s.hex()}-{i}"
        for i in range(1, n + 1)
    ],
    "objects before every marker": lambda s, n: [f"{M}/0000{i:028x}-{i}" for i in range(n)],
    "records": lambda s, n: [
        f"{ROOT}/records/r-{int(time.time() * 1000)}-{s.hex()[:16]}-1-100" for _ in range(n)
    ],
    "claims": lambda s, n: [f"{ROOT}/claims/{s.hex()}" for _ in range(n)],
    "directories beside ours": lambda s, n: [f"{ROOT}/d{i:05d}/x" for i in range(n)],
}

# Kinds planted newer than what hosts wrote (a start takes the newest markers first).
NEWER = {"markers of made-up graphs", "markers under a real entry's name"}


def when(kind: str) -> datetime.datetime | None:
    """When a flood of ``kind`` is dated (None: the relay's default, long before now)."""
    if kind in NEWER:
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=2)
    return None
