"""Copy the module records (and nothing else) of the store SRC into a new store DST."""

import sys

from xla_pcache import Store
from xla_pcache.config import Settings
from xla_pcache.jax.ahead._record import KEY_PREFIX

src, dst = sys.argv[1], sys.argv[2]
n = 0
with Store(src, read_only=True, settings=Settings()) as a, Store(dst, settings=Settings()) as b:
    for entry in a.entries():
        key = str(entry["key"])
        if key.startswith(KEY_PREFIX):
            blob = a.get(key, count=False)
            if blob is not None and b.put(key, bytes(blob), meta=dict(entry.get("meta") or {})):
                n += 1
print(f"{n} records copied into {dst}")
