"""Store -> pool: a host mirror's pools brought up to date with the store, what is new
copied in (verified, and filed by the key that signed it), what the store evicted dropped.
The host's manifest says which store entry file holds which torch_xla name, so a warm host
reads directories only and no entry header."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time

from xla_pcache._core import FORMAT_VERSION, CacheError
from xla_pcache._owndir import OwnDir
from xla_pcache.builds import Build
from xla_pcache.store import Store
from xla_pcache.torch_xla._keys import is_torch_xla_name, name_of, store_key
from xla_pcache.torch_xla._mirror_counters import Counters
from xla_pcache.torch_xla._mirror_dirs import MANIFEST, O_DIR, HostDirs

MANIFEST_VERSION = 1
_TMP_PREFIX = ".tmp-"


class PoolRefresh:
    """Brings the pools of ``dirs`` up to date with ``store``, for the entries of ``build``."""

    def __init__(
        self, store: Store, dirs: HostDirs, counters: Counters, build: Build | None
    ) -> None:
        self.store = store
        self.dirs = dirs
        self.counters = counters
        self.build = build

    def refresh(self) -> None:
        """Bring the pool up to date with the store: copy in what is new, drop what the
        store evicted. Costs directory reads only when nothing changed."""
        try:
            self._refresh_pool()
        except Exception as exc:
            self.counters.warn("updating the host-local copy of the cache", exc)

    def _store_listing(self) -> set[str] | None:
        """Hex names of the store's entry files, by reading directories only.

        Relies on the store's format-1 layout (``entries/<2 hex>/<32 hex>``); on any other
        format returns None and the caller reads entry headers instead. Read beneath the
        directory the store itself works in (``Store.root_fd``).
        """
        if FORMAT_VERSION != 1:
            return None
        names: set[str] = set()
        try:
            root = self.store.root_fd()
        except (OSError, CacheError):
            return None  # its directory is gone: the entries' headers say what is left
        try:
            try:
                top = os.open("entries", O_DIR, dir_fd=root)
            except FileNotFoundError:
                return names
            except OSError:
                return None  # not a real directory: the store's own walk says what is there
        finally:
            os.close(root)
        try:
            with os.scandir(top) as it:
                shards = [e.name for e in it if len(e.name) == 2]
            for shard in shards:
                try:
                    fd = os.open(shard, O_DIR, dir_fd=top)
                except OSError:
                    continue  # gone, or not a real directory (a link): holds no entry
                try:
                    with os.scandir(fd) as it:
                        names.update(e.name for e in it if len(e.name) == 32)
                finally:
                    os.close(fd)
        finally:
            os.close(top)
        return names

    def _load_manifest(self) -> dict[str, str]:
        try:
            host = self.dirs.host().fd
            fd = os.open(MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=host)
            with open(fd, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self.counters.warn("reading the host manifest", exc)
            return {}
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            return {}
        names = data.get("names")
        if not isinstance(names, dict):
            return {}
        return {str(k): str(v) for k, v in names.items()}

    def _save_manifest(self, names: dict[str, str]) -> None:
        host = self.dirs.host().fd
        tmp = f"{MANIFEST}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=host
            )
            with open(fd, "w", encoding="utf-8") as f:
                json.dump(
                    {"version": MANIFEST_VERSION, "store": self.store.path, "names": names}, f
                )
            os.replace(tmp, MANIFEST, src_dir_fd=host, dst_dir_fd=host)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=host)
            self.counters.warn("writing the host manifest", exc)

    def _scan_headers(self) -> tuple[dict[str, str], list[tuple[float, str, int]]]:
        """Every entry's hex name -> torch_xla name ('' when not ours), plus our entries as
        (last use, name, size) for ordering. Reads every header: only when the listing
        shows names the manifest does not know."""
        self.counters.header_scans += 1
        names: dict[str, str] = {}
        ours: list[tuple[float, str, int]] = []
        for e in self.store.entries():
            key = e.get("key")
            hexname = str(e.get("name"))
            tx = name_of(key, self.build) if isinstance(key, str) else ""
            names[hexname] = tx
            if tx:
                used = e.get("last_use") or e.get("created") or 0.0
                size = e.get("size")
                ours.append(
                    (
                        float(used) if isinstance(used, int | float) else 0.0,
                        tx,
                        int(size) if isinstance(size, int) else 0,
                    )
                )
        return names, ours

    def _refresh_pool(self) -> None:
        rels = self.dirs.pool_rels()
        self.dirs.check()
        pools: dict[str, OwnDir] = {}
        try:
            for rel in rels:
                pools[rel] = self.dirs.sub(rel)
            self._refresh_pools(pools)
        finally:
            for d in pools.values():
                d.close()

    def _refresh_pools(self, pools: dict[str, OwnDir]) -> None:
        started_ns = time.time_ns()
        listing = self._store_listing()
        manifest = self._load_manifest()
        order: list[tuple[float, str, int]] = []
        if listing is None or not listing.issubset(manifest.keys()):
            names, order = self._scan_headers()
        else:
            names = {h: manifest[h] for h in listing}
        wanted = {tx for tx in names.values() if tx}
        held: dict[str, int] = {}
        for pool in pools.values():
            found = self._pool_files(pool)
            for tx in found.keys() - wanted:
                # Only files older than this scan: one another process just published may
                # not have been in the listing yet.
                if found[tx].st_ctime_ns < started_ns:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tx, dir_fd=pool.fd)
                        self.counters.removed_from_pool += 1
                del found[tx]
            for tx, st in found.items():
                held.setdefault(tx, st.st_size)
        missing = wanted - held.keys()
        if missing:
            budget = self.store.max_size
            used = sum(held.values())
            if not order:
                order = [(0.0, tx, 0) for tx in missing]
            # Most recently used first, so a budget smaller than the store keeps the hot set.
            for _, tx, _size in sorted(order, reverse=True):
                if tx not in missing:
                    continue
                added = self._materialize(tx, budget, used, pools)
                if added is None:
                    break
                used += added
        if names != manifest:
            self._save_manifest(names)

    def _pool_files(self, pool: OwnDir) -> dict[str, os.stat_result]:
        out: dict[str, os.stat_result] = {}
        with os.scandir(pool.fd) as it:
            for e in it:
                if is_torch_xla_name(e.name):
                    with contextlib.suppress(FileNotFoundError):
                        out[e.name] = e.stat(follow_symlinks=False)
                elif e.name.startswith(_TMP_PREFIX):
                    self._sweep_tmp(e, pool)
        return out

    def _sweep_tmp(self, e: os.DirEntry[str], pool: OwnDir) -> None:
        with contextlib.suppress(OSError):
            if time.time() - e.stat(follow_symlinks=False).st_mtime > 3600:
                os.unlink(e.name, dir_fd=pool.fd)

    def _materialize(
        self, tx: str, budget: int | None, used: int, pools: dict[str, OwnDir]
    ) -> int | None:
        """Copy one verified entry into the pool; its size, 0 if gone, None if over budget.

        Read without counting a use: filling the host's copy is no hit; torch_xla's load of
        it is, counted once when it opens the file (``View.opened_links``)."""
        key = store_key(tx, self.build)
        data = self.store.get_entry_file(key)
        blob = None if data is None else self.store.verify_entry_file(key, data)
        if blob is None:
            return 0
        # Filed by the key it was verified against: only processes trusting that key link it.
        rel = self.dirs.pool_for(blob.signer)
        pool = None if rel is None else pools.get(rel)
        if pool is None:
            return 0
        size = len(blob)
        if budget is not None and used + size > budget:
            return None
        tmp = f"{_TMP_PREFIX}{tx}.{os.getpid()}.{secrets.token_hex(4)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o444, dir_fd=pool.fd)
            try:
                with memoryview(blob) as view:
                    written = 0
                    while written < size:
                        written += os.write(fd, view[written:])
            finally:
                os.close(fd)
            # Whole file or nothing under the final name; another host process doing the
            # same replaces an equal copy.
            os.replace(tmp, tx, src_dir_fd=pool.fd, dst_dir_fd=pool.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pool.fd)
            raise
        self.counters.materialized += 1
        return size
