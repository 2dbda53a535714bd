"""Object-store tiers and chains against a real S3 service (SeaweedFS ``weed mini``) and a
real redis-server, on loopback. GCS and Azure: URL parsing and redaction only (no service)."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import obstore
import pytest
import redis
from xla_pcache import Store, entry_name, open_store
from xla_pcache._reports import tier_counters
from xla_pcache.config import Settings
from xla_pcache.tiers.chain import open_chain, redact
from xla_pcache.tiers.objstore import ENTRY_DIR, ObjectClaim, ObjectClaims, parse_object_url

from tests.helpers import cli_out, entry_file_key, hooks_env, is_module_record
from tests.jax.helpers import (
    finish_jax,
    hits,
    open_barrier,
    results,
    run_jax,
    runs,
    start_jax,
    worker_plan_name,
)
from tests.tiers.servers import (
    S3_BUCKET,
    BucketServer,
    RedisServer,
    bucket_client,
    fresh_prefix,
    start_s3,
)


def _objects(server: BucketServer, prefix: str) -> list[str]:
    return sorted(o["path"] for o in obstore.list(bucket_client(server, prefix)).collect())


def _flush(store: Store) -> None:
    assert store.remote is not None
    store.remote.flush()


def test_two_hosts_share_through_a_bucket(tmp_path: Path, server: BucketServer) -> None:
    url = server.url(fresh_prefix())
    a = Store(tmp_path / "a", remote=url)
    payload = os.urandom(550_000)
    assert a.put("k", payload, meta={"m": "1"})
    _flush(a)
    b = Store(tmp_path / "b", remote=url)
    blob = b.get("k")
    assert blob is not None and bytes(blob) == payload and blob.meta["m"] == "1"
    assert "k" in b  # published locally: the next get is a local hit
    assert b.get("missing") is None
    st = b.stats()
    assert st["remote_hits"] == 1 and st["remote_misses"] == 1, st
    assert st["tier1"] == url and st["tier1_hits"] == 1


def test_large_entry_travels_in_ranged_pieces(tmp_path: Path, server: BucketServer) -> None:
    url = server.url(fresh_prefix())
    a = Store(tmp_path / "a", remote=url)
    payload = os.urandom(26 << 20)  # the first 8 MiB, then two ranged pieces in parallel
    assert a.put("big", payload)
    _flush(a)
    b = Store(tmp_path / "b", remote=url)
    blob = b.get("big")
    assert blob is not None and bytes(blob) == payload
    assert b.stats()["remote_read_bytes"] > len(payload)


@pytest.mark.jax
def test_jax_program_compiled_on_one_host_hits_on_the_other(
    tmp_path: Path, bucket_server: BucketServer
) -> None:
    # A tier that cannot be used (unknown scheme) drops itself, not the cache.
    env = {
        "XLA_PCACHE_REMOTE": "ftp://nowhere/x," + bucket_server.url(fresh_prefix()),
        **bucket_server.env(),
    }
    first = run_jax([{"op": "install", "path": str(tmp_path / "a")}, *runs(0)], env=env)
    assert hits(first) == [0]
    second = run_jax([{"op": "install", "path": str(tmp_path / "b")}, *runs(0)], env=env)
    assert hits(second) == [1]
    assert results(second)[0] == results(first)[0]


def test_two_writers_racing_one_key_leave_one_object(tmp_path: Path, server: BucketServer) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    stores = [Store(tmp_path / w, remote=url) for w in ("a", "b")]
    barrier = threading.Barrier(2)

    def put(i: int) -> None:
        barrier.wait()
        assert stores[i].put("k", b"same program" * 1000, meta={"writer": str(i)})
        _flush(stores[i])

    threads = [threading.Thread(target=put, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _objects(server, prefix) == [f"{ENTRY_DIR}/{entry_name('k')}"]
    st = [s.stats() for s in stores]
    assert sum(int(s.get("remote_puts", 0)) for s in st) == 1, st
    assert sum(int(s.get("remote_put_exists", 0)) for s in st) == 1, st
    # Both see it; a third host gets the winner's entry.
    for s in stores:
        assert bytes(s.get("k") or b"") == b"same program" * 1000
    c = Store(tmp_path / "c", remote=url)
    blob = c.get("k")
    assert blob is not None and blob.meta["writer"] in ("0", "1")


def test_tampered_and_truncated_objects_are_counted_misses(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    a = Store(tmp_path / "a", remote=url)
    for k in ("flip", "cut"):
        assert a.put(k, bytes(range(256)) * 100)
    _flush(a)
    client = bucket_client(server, prefix)
    for k in ("flip", "cut"):
        path = f"{ENTRY_DIR}/{entry_name(k)}"
        value = bytearray(obstore.get(client, path).bytes())
        if k == "cut":
            del value[-1]
        else:
            value[-10] ^= 0xFF
        obstore.put(client, path, bytes(value))
    b = Store(tmp_path / "b", remote=url)
    assert b.get("flip") is None and b.get("cut") is None
    assert b.stats()["remote_rejected"] == 2
    assert len(b) == 0  # nothing bad published


class _CutRelay:
    """A TCP relay to the S3 server that forwards requests whole and responses up to
    ``limit`` bytes, then stops forwarding: the test kills the server behind it while the
    client is mid-transfer, and the relay then drops the client's connection."""

    def __init__(self, port: int, limit: int) -> None:
        self.upstream = port
        self.limit = limit
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = int(self.sock.getsockname()[1])
        self.cut = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            self.conns += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, None), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(server, client, self.limit), daemon=True
            ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: limit - sent])
                    self.cut.set()
                    # Stalled here until the server is killed.
                    while src.recv(65536):
                        pass
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def test_server_killed_mid_transfer_is_a_miss_and_the_local_tier_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = start_s3(tmp_path / "weed")
    try:
        prefix = fresh_prefix()
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        a = Store(tmp_path / "a", remote=server.url(prefix))
        payload = os.urandom(4 << 20)
        assert a.put("k", payload)
        _flush(a)
        relay = _CutRelay(server.port, limit=1 << 20)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{relay.port}")
        monkeypatch.setenv("XLA_PCACHE_REMOTE_TIMEOUT", "3")
        b = Store(tmp_path / "b", remote=server.url(prefix))
        result: list[Any] = []
        getter = threading.Thread(target=lambda: result.append(b.get("k")))
        getter.start()
        assert relay.cut.wait(30), "the transfer never reached the cut"
        server.stop()  # SIGKILL while the object is a quarter sent
        getter.join(30)
        assert not getter.is_alive()
        assert result == [None]
        st = b.stats()
        assert st["remote_get_errors"] == 1 and "k" not in b, st
        # The local directory goes on: puts and gets work, the dead remote is skipped.
        assert b.put("local", b"v")
        assert bytes(b.get("local") or b"") == b"v"
        _flush(b)
        relay.close()
    finally:
        server.stop()


def test_wrong_credentials_are_a_miss_logged_once_without_the_secret(
    tmp_path: Path,
    server: BucketServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    prefix = fresh_prefix()
    a = Store(tmp_path / "a", remote=server.url(prefix))
    assert a.put("k", b"v" * 100)
    _flush(a)
    for k, v in server.env(secret="wrong-secret-0b1d").items():
        monkeypatch.setenv(k, v)
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        b = Store(tmp_path / "b", remote=server.url(prefix))
        assert b.get("k") is None
        assert b.get("k2") is None  # left alone after the failure: skipped, no new warning
        assert b.put("k3", b"local")
        _flush(b)
    st = b.stats()
    assert st["remote_get_errors"] == 1 and st["remote_skipped"] == 1, st
    assert bytes(b.get("k3") or b"") == b"local"
    warnings = [r for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    for secret in ("wrong-secret-0b1d", server.secret):
        assert secret not in caplog.text and secret not in str(st)
    assert _objects(server, prefix) == [f"{ENTRY_DIR}/{entry_name('k')}"]


def test_redis_bucket_chain_backfills_redis(
    tmp_path: Path, server: BucketServer, redis_server: RedisServer
) -> None:
    chain = f"{redis_server.url},{server.url(fresh_prefix())}"
    a = Store(tmp_path / "a", remote=chain)
    assert a.put("k", b"payload" * 1000)
    _flush(a)
    client = redis.Redis.from_url(redis_server.url)
    assert client.dbsize() == 1  # written through to both tiers
    client.flushall()
    b = Store(tmp_path / "b", remote=chain)
    assert bytes(b.get("k") or b"") == b"payload" * 1000
    _flush(b)
    st = b.stats()
    assert st["tier1_misses"] == 1 and st["tier2_hits"] == 1 and st["tier1_backfills"] == 1, st
    assert client.dbsize() == 1
    # Redis alone now serves it.
    c = Store(tmp_path / "c", remote=redis_server.url)
    assert bytes(c.get("k") or b"") == b"payload" * 1000


def test_a_replaced_record_is_replaced_in_every_tier(
    tmp_path: Path, server: BucketServer, redis_server: RedisServer
) -> None:
    """``Store.replace`` (a prefetch plan): the last writer's value, locally and in each
    writable tier, where a put's first writer wins; a read-only store replaces nothing."""
    chain = f"{redis_server.url},{server.url(fresh_prefix())}"
    a = Store(tmp_path / "a", remote=chain)
    assert a.put("plan", b"first" * 100)
    assert not a.put("plan", b"second" * 100), "a put creates only"
    assert a.replace("plan", b"second" * 100, meta={"kind": "plan"})
    _flush(a)
    assert bytes(a.get("plan") or b"") == b"second" * 100
    client = redis.Redis.from_url(redis_server.url)
    # A host that has neither: from Redis, then from the bucket alone.
    b = Store(tmp_path / "b", remote=chain)
    blob = b.get("plan")
    assert blob is not None and bytes(blob) == b"second" * 100 and blob.meta["kind"] == "plan"
    client.flushall()
    c = Store(tmp_path / "c", remote=chain)
    assert bytes(c.get("plan") or b"") == b"second" * 100
    ro = Store(tmp_path / "c", remote=chain, read_only=True)
    assert not ro.replace("plan", b"third")
    assert bytes(c.get("plan") or b"") == b"second" * 100


def test_a_bucket_hosts_replace_goes_through_its_own_store(
    tmp_path: Path, server: BucketServer
) -> None:
    """``Store.replace`` on a bucket path's host-local store, which works beneath the handle
    it was opened on: the bucket's copy is the last writer's, and a fresh host reads it; a
    read-only host (``?ro=1``) replaces its own copy only, never the bucket's."""
    url = server.url(fresh_prefix())

    def host(name: str, path: str = url) -> Any:
        settings = Settings.from_env().replace(xdg_cache_home=str(tmp_path / name))
        return open_store(path, settings=settings)

    with host("a") as a:
        assert a.put("plan", b"first" * 100)
        assert a.replace("plan", b"second" * 100, meta={"kind": "plan"})
        assert bytes(a.get("plan") or b"") == b"second" * 100
    with host("b") as b:
        assert bytes(b.get("plan") or b"") == b"second" * 100
    with host("c", f"{url}?ro=1") as c:
        assert c.replace("plan", b"third" * 100)
        assert bytes(c.get("plan") or b"") == b"third" * 100
    with host("d") as d:
        assert bytes(d.get("plan") or b"") == b"second" * 100


def test_read_only_tier_and_read_only_store_write_nothing(
    tmp_path: Path, server: BucketServer, redis_server: RedisServer
) -> None:
    prefix = fresh_prefix()
    seed = Store(tmp_path / "seed", remote=server.url(prefix))
    assert seed.put("seeded", b"from s3")
    _flush(seed)
    chain = f"{redis_server.url},{server.url(prefix, ro='1')}"
    a = Store(tmp_path / "a", remote=chain)
    assert a.put("k", b"v")
    _flush(a)
    client = redis.Redis.from_url(redis_server.url)
    assert client.dbsize() == 1
    assert _objects(server, prefix) == [f"{ENTRY_DIR}/{entry_name('seeded')}"]
    assert a.stats()["tier2"] == server.url(prefix) and "ro=1" in a.stats()["remote"]
    # A read-only store reads the chain and backfills nothing, locally or to Redis.
    client.flushall()
    Store(tmp_path / "ro").close()
    ro = Store(tmp_path / "ro", remote=chain, read_only=True)
    assert bytes(ro.get("seeded") or b"") == b"from s3"
    _flush(ro)
    assert client.dbsize() == 0 and "seeded" not in ro
    assert _objects(server, prefix) == [f"{ENTRY_DIR}/{entry_name('seeded')}"]


def test_a_bad_tier_is_dropped_and_the_others_go_on(
    tmp_path: Path, server: BucketServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.url(fresh_prefix())
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        a = Store(tmp_path / "a", remote=f"ftp://u:pw-9@host/x,{url},s3://{S3_BUCKET}/p?bad=1")
    assert a.put("k", b"v")
    _flush(a)
    assert "pw-9" not in caplog.text and "unknown scheme ftp://" in caplog.text
    st = a.stats()
    assert st["remote"] == url and st["remote_dropped"].count(",") == 1, st
    b = Store(tmp_path / "b", remote="nonsense")
    assert b.put("k", b"v") and bytes(b.get("k") or b"") == b"v"


def test_object_store_urls_parse_and_redact() -> None:
    assert parse_object_url("s3://bucket/a/b/") == ("s3://bucket/a/b", False)
    assert parse_object_url("gs://bucket?ro=1") == ("gs://bucket", True)
    assert parse_object_url("az://container/p?read_only=yes") == ("az://container/p", True)
    for bad in ("s3://", "s3://k:secret@bucket/p", "gs://b/p?token=x", "http://h/p"):
        with pytest.raises(ValueError):
            parse_object_url(bad)
    # Only the mode options are shown: any other option, name and value, is hidden.
    assert redact("s3://b/p?ro=1&sig=abc") == "s3://b/p?ro=1&***"
    assert redact("rediss://user:pw@host:6380/1") == "rediss://***@host:6380/1"
    assert "secret" not in redact("az://u:secret@c/p")


def test_gcs_and_azure_tiers_from_their_standard_variables(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is sent: building a client makes no request. Azure needs an account name;
    without one the tier is dropped with a warning that names no secret."""
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "c2VjcmV0LWF6dXJlLWtleQ==")
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        bare = open_chain("az://ctr/pre")
    assert len(bare) == 0 and bare.dropped == ["az://ctr/pre"]
    assert "c2VjcmV0" not in caplog.text and "Account must be specified" in caplog.text
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "xpcaccount")
    chain = open_chain("gs://bkt/pre?ro=1,az://ctr/pre")
    assert [t["url"] for t in chain.describe()] == ["gs://bkt/pre", "az://ctr/pre"]
    assert [t["read_only"] for t in chain.describe()] == [True, False]
    assert "c2VjcmV0" not in str(chain.stats())
    chain.close()


def _single_flight_steps(cache: Path, ready: Path, go: Path) -> list[dict[str, Any]]:
    return [
        {"op": "install", "path": str(cache), "compile_wait": 300},
        {"op": "wait", "ready": str(ready), "file": str(go)},
        *runs(5),
    ]


def _marked(hooks: Path, point: str, procs: list[subprocess.Popen[str]]) -> list[int]:
    """The pids of ``procs`` that marked ``point`` (a test hook's ``<point>.<pid>``)."""
    for p in procs:
        assert p.poll() is None, p.communicate()
    return [p.pid for p in procs if (hooks / f"{point}.{p.pid}").exists()]


def _until_marked(hooks: Path, point: str, procs: list[subprocess.Popen[str]], n: int) -> None:
    while len(_marked(hooks, point, procs)) < n:
        time.sleep(0.01)


@pytest.mark.jax
def test_single_flight_across_hosts_sharing_only_the_bucket(
    tmp_path: Path, bucket_server: BucketServer
) -> None:
    """Six processes, three per "host" (separate cache directories), sharing only the
    bucket, start the same program together: one compiles, five hit.

    The test hooks (``XLA_PCACHE_TEST_HOOKS``) make the waiting certain: each host's
    claimant is held inside its directory's claim until its two neighbours wait on it,
    then the bucket's claimant inside the bucket's claim until the other host waits on
    it."""
    prefix = fresh_prefix()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    env = {
        "XLA_PCACHE_REMOTE": bucket_server.url(prefix),
        **hooks_env(hooks),
        **bucket_server.env(),
    }
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(6)]
    procs = [
        start_jax(_single_flight_steps(tmp_path / ("a" if i < 3 else "b"), ready[i], go), env)
        for i in range(6)
    ]
    open_barrier(procs, ready, go)
    _until_marked(hooks, "claimed", procs, 2)  # one per host, in its directory
    _until_marked(hooks, "claim-wait", procs, 4)
    (hooks / "claimed.go").touch()
    _until_marked(hooks, "bucket-claimed", procs, 1)
    _until_marked(hooks, "bucket-claim-wait", procs, 1)
    (hooks / "bucket-claimed.go").touch()
    reports = [finish_jax(p, timeout=300) for p in procs]
    got = [hits(r)[0] for r in reports]
    assert sorted(got) == [0, 1, 1, 1, 1, 1], got
    assert len({str(results(r)[5]) for r in reports}) == 1
    # The claim is gone from the bucket once the entry is there (beside the processes' plan
    # and the program's module record).
    client = bucket_client(bucket_server, prefix)
    names = [
        n
        for n in _objects(bucket_server, prefix)
        if not n.endswith(worker_plan_name())
        and not (
            "/entries/" in n
            and is_module_record(entry_file_key(bytes(obstore.get(client, n).bytes())))
        )
    ]
    assert [n.split("/")[1] for n in names] == ["entries"], names


def test_doctor_shows_the_chain_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console
    from xla_pcache.cli import _doctor as doctor

    monkeypatch.setenv(
        "XLA_PCACHE_REMOTE",
        "redis://:pw-2c4e@127.0.0.1:1/0,s3://bkt/p?ro=1,bogus://h/x,gs://bkt/q?trust=required",
    )
    monkeypatch.setenv("XLA_PCACHE_TRUSTED_KEYS", f"ci-1:{base64.b64encode(bytes(32)).decode()}")
    store, info, problems = doctor._open_store({"path": str(tmp_path / "c")})
    store.close()
    assert info["remote"] == [
        {
            "tier": 1,
            "url": "redis://***@127.0.0.1:1/0",
            "read_only": False,
            "trust_required": False,
        },
        {"tier": 2, "url": "s3://bkt/p", "read_only": True, "trust_required": False},
        {"tier": 3, "url": "gs://bkt/q", "read_only": False, "trust_required": True},
    ]
    assert problems == ["remote tier bogus://h/x is not used (see the warning)"]
    out = io.StringIO()
    report = {
        "xla_pcache": "0",
        "format_version": 1,
        "python": "3",
        "config": {"path": str(tmp_path / "c"), "path_source": "--path"},
        "cache": {**info, "entries": 0, "bytes": 0, "mmap_reads": True},
        "frameworks": {},
        "problems": problems,
    }
    doctor._render(Console(file=out, width=200), report)
    text = out.getvalue()
    assert "remote tier 1: redis://***@127.0.0.1:1/0" in text
    assert "remote tier 2: s3://bkt/p (read-only)" in text and "pw-2c4e" not in text
    assert "remote tier 3: gs://bkt/q (trusted entries only)" in text


def test_remote_counters_are_summed_across_processes(
    tmp_path: Path, server: BucketServer, redis_server: RedisServer
) -> None:
    """Each process writes its remote counters to its journal; ``stats`` of any process
    (and ``xla-pcache stats``) sums them, as it does the local counters."""
    import subprocess
    import sys

    chain = f"{redis_server.url},{server.url(fresh_prefix())}"
    seed = Store(tmp_path / "seed", remote=chain)
    assert seed.put("k", b"x" * 5000)
    _flush(seed)
    redis.Redis.from_url(redis_server.url).flushall()
    code = (
        "import sys; from xla_pcache import Store\n"
        "s = Store(sys.argv[1], remote=sys.argv[2])\n"
        "assert s.get(sys.argv[3]) is not None\n"
        "s.remote.flush(); s.close()\n"
    )
    for _ in range(2):
        # Two processes on one cache directory, one after the other: the first fetches
        # from S3 (backfilling Redis), the second hits locally.
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "shared"), chain, "k"],
            check=True,
            timeout=120,
        )
    code_miss = (
        "import sys; from xla_pcache import Store\n"
        "s = Store(sys.argv[1], remote=sys.argv[2])\n"
        "assert s.get('absent') is None; s.close()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code_miss, str(tmp_path / "shared"), chain],
        check=True,
        timeout=120,
    )
    st = Store(tmp_path / "shared").stats()
    assert st["remote_hits"] == 1 and st["remote_backfills"] == 1, st
    assert st["remote_misses"] == 3, st  # Redis then S3 for "k" once, and for "absent" 2
    assert st["remote_read_bytes"] > 5000 and st["remote_puts"] == 1, st
    # The same per tier (by name, its kind): S3 answered, Redis missed and was backfilled
    # (its put came from the backfill), both missed "absent".
    b = server.scheme  # the bucket tier's kind
    per_kind: dict[str, Any] = dict(st)
    assert per_kind[f"remote_{b}_hits"] == 1 and per_kind["remote_redis_hits"] == 0, st
    assert per_kind["remote_redis_misses"] == 2 and per_kind[f"remote_{b}_misses"] == 1, st
    assert per_kind["remote_redis_backfills"] == 1 and per_kind["remote_redis_puts"] == 1, st
    assert per_kind[f"remote_{b}_read_bytes"] == st["remote_read_bytes"], st
    assert per_kind["remote_redis_written_bytes"] == st["remote_written_bytes"] > 5000, st
    # Only the tiers that exist: no other name, no kind this chain lacks.
    assert set(tier_counters(st)) == {"redis", b}, st
    others = {"s3", "gs", "az"} - {b}
    assert not any(k.startswith(tuple(f"remote_{o}_" for o in others)) for k in st), st
    with pytest.raises(ValueError, match="tier"):
        Store(tmp_path / "shared").add_tier_counters([("Bad Name", "hits", 1)])
    out = cli_out("stats", "--path", str(tmp_path / "shared"), "--json", XLA_PCACHE_REMOTE=chain)
    import json

    report = json.loads(out)
    assert report["remote_hits"] == 1 and report["remote_misses"] == 3, report
    assert report[f"remote_{b}_hits"] == 1 and report["remote_redis_misses"] == 2, report
    assert report[f"remote_{b}_get_ms"] + report["remote_redis_get_ms"] == report["remote_get_ms"]
    assert report["tier1"] == redis_server.url and report["tier2"].startswith(f"{b}://"), report


def _claimed(tmp_path: Path, url: str) -> tuple[Store, Store, ObjectClaims, ObjectClaim]:
    """Two hosts' stores on the bucket at ``url``, a holder and a waiter, and the holder's
    claim of "k": (holder, waiter, the waiter's claims, the holder's claim)."""
    holder = Store(tmp_path / "a", remote=url)
    waiter = Store(tmp_path / "b", remote=url)
    assert holder.remote is not None and waiter.remote is not None
    hc, wc = holder.remote.claims(), waiter.remote.claims()
    assert hc is not None and wc is not None
    mine = hc.claim(entry_name("k"), wait=5, lease=30)
    assert mine.state == "claimed" and mine.held
    return holder, waiter, wc, mine


def test_bucket_claims_single_flight_and_takeover(
    tmp_path: Path, server: BucketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One claim per key on the bucket; a waiter sees it held, then published once the
    holder's entry is uploaded and the claim released; a claim whose ETag stops changing
    for the lease (a killed holder) is taken over by exactly one waiter."""
    # The order under test needs the upload to succeed: on a loaded machine a request can
    # take longer than the default 2 s, and a failed upload rightly makes the waiter compile.
    monkeypatch.setenv("XLA_PCACHE_REMOTE_TIMEOUT", "20")
    url = server.url(fresh_prefix())
    holder, waiter, wc, mine = _claimed(tmp_path, url)
    name = entry_name("k")
    assert wc.claim(name, wait=0.3, lease=30).state == "timed_out"
    assert holder.put("k", b"compiled")
    mine.release()  # queued after the upload
    got = wc.claim(name, wait=10, lease=30)
    assert got.state == "published"
    assert bytes(waiter.get("k") or b"") == b"compiled"
    # A holder that died: its claim object stays and never changes.
    dead = entry_name("dead")
    client = bucket_client(server, url.split("/", 3)[3])
    obstore.put(client, f"xla_pcache-1/claims/{dead}", b"{}", mode="create")
    results_: list[Any] = []

    # The lease is long beside a request's round trip, so the taker's heartbeats keep the
    # claim alive for the other thread, which waits out several leases: two takeovers would
    # be a lost race, not a slow machine.
    def take() -> None:
        results_.append(wc.claim(dead, wait=8, lease=2))

    threads = [threading.Thread(target=take) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    states = sorted((c.state, c.took_over) for c in results_)
    # One takes it over; the other then sees the taker's heartbeats and waits it out.
    assert states == [("claimed", True), ("timed_out", False)], states
    for c in results_:
        c.release()


def test_a_claim_released_between_the_two_looks_is_seen_published(
    tmp_path: Path, server: BucketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter's first look finds no entry; before its look at the claim, the holder
    uploads the entry and deletes its claim. The waiter must then find the entry, not take
    a claim and compile what was just published. The interleaving is made, not waited for:
    the waiter's first look at the entry answers as it would have a moment earlier."""
    url = server.url(fresh_prefix())
    holder, waiter, wc, mine = _claimed(tmp_path, url)
    name = entry_name("k")
    tier = wc._tier
    real_exists = tier.exists
    looks: list[bool] = []

    def exists_then_publish(n: Any) -> bool:
        if not looks:  # the first look: the holder has not published yet
            looks.append(False)
            assert holder.put("k", b"compiled")
            mine.release()
            holder.remote.flush()
            return False
        looks.append(real_exists(n))
        return looks[-1]

    monkeypatch.setattr(tier, "exists", exists_then_publish)
    got = wc.claim(name, wait=10, lease=30)
    assert got.state == "published", (got.state, looks)
    assert not got.held
    assert bytes(waiter.get("k") or b"") == b"compiled"
    client = bucket_client(server, url.split("/", 3)[3])
    left = obstore.list(client, prefix="xla_pcache-1/claims/").collect()
    assert left == [], "a claim was left"


def test_a_forked_child_leaves_the_bucket_alone_without_hanging(
    tmp_path: Path, server: BucketServer
) -> None:
    """obstore's runtime does not survive fork: a child forked from a process that used the
    tier (a DataLoader worker) skips it (a request there would wait for ever) and goes on
    with its local directory."""
    import subprocess
    import sys

    prefix = fresh_prefix()
    code = (
        "import os, sys\n"
        "from xla_pcache import Store\n"
        "s = Store(sys.argv[1], remote=sys.argv[2])\n"
        "assert s.put('parent', b'p'); s.remote.flush()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = s.put('child', b'c') and s.get('other') is None\n"
        "    s.remote.flush()\n"
        # A tier opened anew in the child (a store made there) is dropped, not used.
        "    s2 = Store(sys.argv[1] + '-child', remote=sys.argv[2])\n"
        "    ok = ok and s2.put('x', b'y') and len(s2.remote) == 0\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
        "assert s.put('after', b'a'); s.remote.flush()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c"), server.url(prefix)],
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "not usable in a process forked" in out.stderr
    names = {entry_name(k) for k in ("parent", "after")}
    assert {p.split("/", 2)[2] for p in _objects(server, prefix)} == names


def test_chain_checks_and_redaction() -> None:
    from xla_pcache.tiers.chain import check_chain, redact_chain

    check_chain("bogus://x,s3://b/p", "remote")  # unusable tiers are dropped later, not here
    with pytest.raises(ValueError, match="remote"):
        check_chain(" , ", "remote")
    with pytest.raises(TypeError, match="remote"):
        check_chain(b"redis://h", "remote")
    assert redact_chain("redis://:pw@h:1/0, s3://b/p?ro=1") == "redis://***@h:1/0,s3://b/p?ro=1"
