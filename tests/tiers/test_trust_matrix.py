"""The trust matrix over the paths by which a store takes bytes it did not write itself: its
own directory (get), a Redis tier, an S3 tier (SeaweedFS), backfill from a slower tier into
a faster one, and bundle import. Rows and plants: tests/trust_matrix.py; the torch_xla host
pool's column: tests/torch_xla/test_torch_xla_trust.py.

Each cell: ci-1 (signing, trusting itself) writes GOOD for the cell's key, the attacker
plants at the key's plain name (before ci's put in the directory, where first-writer-wins
would otherwise keep theirs; after it in a tier, where they can overwrite), then the reader
reads. What it is served, and what a process trusting ci-1 is served later from everything
the reader wrote (its directory, the tiers it backfilled), must be GOOD or nothing for a
trusting reader, and nothing for one that trusts another key. A reader that trusts no key
may be served the attacker's bytes (it asked for no check), but what it writes must never
pass for ci-1's."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import obstore
import pytest
import redis
from xla_pcache import Store, _core
from xla_pcache.config import Settings
from xla_pcache.tiers.objstore import ENTRY_DIR
from xla_pcache.tiers.redis import KEY_PREFIX

from tests.tiers.fixtures import PROTOCOLS
from tests.tiers.servers import (
    BucketServer,
    RedisServer,
    bucket_client,
    fresh_prefix,
    start_redis,
)
from tests.trust_matrix import (
    EVIL,
    GOOD,
    PLANTS,
    READERS,
    Keys,
    Reader,
    plant_in_dir,
    planted_file,
    trusted_view,
)

Outcome = tuple[list[bytes | None], list[bytes | None]]


@dataclass
class Cell:
    tmp: Path
    keys: Keys
    reader: Reader
    plant: str
    key: str

    @property
    def plain(self) -> str:
        return _core.entry_name(self.key)

    @property
    def own(self) -> str:
        return _core.signed_entry_name(self.key, "ci-1")

    def planted(self) -> bytes:
        return planted_file(self.plant, self.key, self.keys, GOOD, EVIL)

    def ci_store(self, root: Path, remote: str | None = None) -> Store:
        ci = self.keys.ci
        return Store(
            root, settings=Settings(), signing_key=ci[0], trusted_keys=[ci[1]], remote=remote
        )

    def reader_store(self, root: Path, remote: str | None = None) -> Store:
        """The reader's store at ``root``: an empty cache, laid out first (a read-only
        process cannot make one)."""
        Store(root, settings=Settings()).close()
        kw = {} if remote is None else {"remote": remote}
        return self.reader.store(root, self.keys, **kw)

    def read(self, store: Store) -> bytes | None:
        blob = store.get(self.key)
        return None if blob is None else bytes(blob)

    def again(self, store: Store, replant: Callable[[], None]) -> bytes | None:
        """For ``changed``: the planted copy replaced after the first read verified GOOD,
        the reader's own copy (if it kept one) dropped, and read again in the same process."""
        replant()
        if not store.read_only:
            store.delete(self.key)
        return self.read(store)


def _flush(store: Store) -> None:
    if store.remote is not None:
        store.remote.flush()


# -- the paths ------------------------------------------------------------------------------


def store_get(cell: Cell, **_: object) -> Outcome:
    root = cell.tmp / "cache"
    Store(root, settings=Settings()).close()
    if cell.plant == "directory":
        # At both names ci could write: a directory is no entry, and no reason to give up.
        plant_in_dir(root, cell.plain, None)
        plant_in_dir(root, cell.own, None)
    elif cell.plant != "changed":
        plant_in_dir(root, cell.plain, cell.planted())
    with cell.ci_store(root) as ci:
        assert ci.put(cell.key, GOOD)
    with cell.reader.store(root, cell.keys) as r:
        served = [cell.read(r)]
        if cell.plant == "changed":
            path = root / "entries" / cell.plain[:2] / cell.plain
            # In place, the same length: what a mapping or a remembered verification would
            # show if it were trusted past the first read.
            with open(path, "r+b") as f:
                f.write(cell.planted())
            served.append(cell.read(r))
    return served, [trusted_view(root, cell.key, cell.keys)]


def _tier_cell(
    cell: Cell, url: str, overwrite: Callable[[str, bytes | None], None], names: list[str]
) -> Outcome:
    with cell.ci_store(cell.tmp / "ci", remote=url) as ci:
        assert ci.put(cell.key, GOOD)
        _flush(ci)
    if cell.plant != "changed":
        overwrite(cell.plain, None if cell.plant == "directory" else cell.planted())
    local = cell.tmp / "reader"
    with cell.reader_store(local, remote=url) as r:
        served = [cell.read(r)]
        if cell.plant == "changed":

            def replant() -> None:
                for n in names:
                    overwrite(n, cell.planted())

            served.append(cell.again(r, replant))
        _flush(r)
    return served, [trusted_view(local, cell.key, cell.keys)]


def _redis_writer(client: redis.Redis) -> Callable[[str, bytes | None], None]:
    def overwrite(name: str, data: bytes | None) -> None:
        client.delete(KEY_PREFIX + name)
        if data is None:
            client.rpush(KEY_PREFIX + name, b"not a string")  # Redis's stand-in for a directory
        else:
            client.set(KEY_PREFIX + name, data)

    return overwrite


def _s3_writer(server: BucketServer, prefix: str) -> Callable[[str, bytes | None], None]:
    client = bucket_client(server, prefix)

    def overwrite(name: str, data: bytes | None) -> None:
        if data is None:
            # A "directory": the name gone, an object below it as a prefix.
            obstore.delete(client, f"{ENTRY_DIR}/{name}")
            obstore.put(client, f"{ENTRY_DIR}/{name}/x", b"planted")
        else:
            obstore.put(client, f"{ENTRY_DIR}/{name}", data, mode="overwrite")

    return overwrite


def tier_redis(cell: Cell, redis_url: str, **_: object) -> Outcome:
    overwrite = _redis_writer(redis.Redis.from_url(redis_url))
    return _tier_cell(cell, redis_url, overwrite, [cell.plain, cell.own])


def tier_s3(cell: Cell, server: BucketServer, **_: object) -> Outcome:
    prefix = fresh_prefix()
    return _tier_cell(cell, server.url(prefix), _s3_writer(server, prefix), [cell.plain, cell.own])


def backfill(cell: Cell, redis_url: str, server: BucketServer, **_: object) -> Outcome:
    """GOOD and the plant in the slower tier (S3); the reader's chain puts Redis first: what
    it verified is backfilled there, and what Redis then holds is read by a trusting
    process too."""
    prefix = fresh_prefix()
    s3_url = server.url(prefix)
    with cell.ci_store(cell.tmp / "ci", remote=s3_url) as ci:
        assert ci.put(cell.key, GOOD)
        _flush(ci)
    overwrite = _s3_writer(server, prefix)
    if cell.plant != "changed":
        overwrite(cell.plain, None if cell.plant == "directory" else cell.planted())
    local = cell.tmp / "reader"
    client = redis.Redis.from_url(redis_url)
    with cell.reader_store(local, remote=f"{redis_url},{s3_url}") as r:
        served = [cell.read(r)]
        if cell.plant == "changed":
            names = [cell.plain, cell.own]

            def replant() -> None:
                for n in names:
                    overwrite(n, cell.planted())
                    client.delete(KEY_PREFIX + n)  # what was backfilled: read again from S3

            served.append(cell.again(r, replant))
        _flush(r)
    later = [trusted_view(local, cell.key, cell.keys)]
    checker = Store(cell.tmp / "checker", settings=Settings(), trusted_keys=[cell.keys.ci[1]])
    with checker:
        for n in (cell.plain, cell.own):
            value = client.get(KEY_PREFIX + n) if client.type(KEY_PREFIX + n) == b"string" else None
            blob = None if value is None else checker.verify_entry_file(cell.key, value)
            later.append(None if blob is None else bytes(blob))
    return served, later


def _bundle(path: Path, cell: Cell, members: list[tuple[str, bytes | None]]) -> Path:
    """A bundle as the attacker writes one: members named as they like, the key in each
    member's PAX header as export writes it; None is a directory member."""
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.pax_headers = {"XLA_PCACHE.key_hex": cell.key.encode().hex()}
            info.pax_headers["XLA_PCACHE.key_text"] = "1"
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def bundle_import(cell: Cell, **_: object) -> Outcome:
    good = _good_file(cell)
    local = cell.tmp / "reader"
    with cell.reader_store(local) as r:
        if cell.plant == "changed":
            r.import_bundle(_bundle(cell.tmp / "a.tgz", cell, [(cell.plain, good)]))
            served = [cell.read(r)]
            changed = _bundle(cell.tmp / "b.tgz", cell, [(cell.plain, cell.planted())])
            if not r.read_only:
                r.delete(cell.key)
            r.import_bundle(changed)
            served.append(cell.read(r))
        else:
            plant = None if cell.plant == "directory" else cell.planted()
            members = [(cell.plain, plant), (cell.own, good)]
            r.import_bundle(_bundle(cell.tmp / "b.tgz", cell, members))
            served = [cell.read(r)]
    return served, [trusted_view(local, cell.key, cell.keys)]


def _good_file(cell: Cell) -> bytes:
    root = cell.tmp / "ci"
    with cell.ci_store(root) as ci:
        assert ci.put(cell.key, GOOD)
        data = ci.get_entry_file(cell.key)
    assert data is not None
    return data


PATHS: dict[str, Callable[..., Outcome]] = {
    "store_get": store_get,
    "tier_redis": tier_redis,
    "tier_s3": tier_s3,
    "backfill": backfill,
    "bundle_import": bundle_import,
}


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def matrix_redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


def expected_good(path: str, reader: Reader, plant: str) -> bool:
    """Where a reader trusting ci-1 must be served GOOD on its first read (ci's entry is
    still there under its own name, or ci's put cleared the squatted name): everywhere but
    a bundle imported read-only (nothing is written, so nothing is read back)."""
    return reader.trusts == "ci" and not (path == "bundle_import" and reader.read_only)


# The paths through a bucket, run on each protocol of the tests (S3 and GCS); the others
# start the S3 server only as the matrix's fixture wants one.
ON_BUCKETS = ("tier_s3", "backfill")


def _cells() -> Iterator[pytest.param]:  # type: ignore[valid-type]
    for path in PATHS:
        for proto in PROTOCOLS if path in ON_BUCKETS else ("s3",):
            marks = [pytest.mark.gcs] if proto == "gs" else []
            for reader in READERS:
                for plant in PLANTS:
                    yield pytest.param(
                        proto,
                        path,
                        reader,
                        plant,
                        id=f"{proto}-{path}-{reader}-{plant}",
                        marks=marks,
                    )


# The server per module and protocol, as the fixture says: parametrized with other
# arguments, it would otherwise start one per cell (a second and a half for weed's).
@pytest.mark.parametrize(
    ("bucket_server", "path", "reader_name", "plant"),
    list(_cells()),
    indirect=["bucket_server"],
    scope="module",
)
def test_trust_matrix(
    tmp_path: Path,
    keys: Keys,
    matrix_redis: RedisServer,
    server: BucketServer,
    path: str,
    reader_name: str,
    plant: str,
) -> None:
    reader = READERS[reader_name]
    cell = Cell(tmp_path, keys, reader, plant, key=f"matrix/{path}/{reader_name}/{plant}")
    served, later = PATHS[path](cell, redis_url=matrix_redis.url, server=server)
    allowed: set[bytes | None] = {
        "ci": {None, GOOD},
        "other": {None},
        None: {None, GOOD, EVIL},
    }[reader.trusts]
    assert all(s in allowed for s in served), (served, allowed)
    if expected_good(path, reader, plant):
        assert served[0] == GOOD, served
    # Whatever the reader wrote, a process trusting ci-1 is later served GOOD or nothing.
    assert all(v in (None, GOOD) for v in later), later
