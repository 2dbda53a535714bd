"""A bucket as the cache path, on a real S3 service (SeaweedFS on loopback, one for the
module): hosts are fresh processes with only the environment set and host-local stores of
their own (``XDG_CACHE_HOME``), running real JAX (and torch_xla) programs; the bucket's
budget, use records and pruning through the command and the store.

The JAX hosts run in order, each scenario building on the bucket the previous left (a
module fixture per step): a cold host fills the bucket; four hosts at once warm-start from
it (the plan and its entries fetched and loaded from the backend's start) and compile each
new program once; one host reads an old entry; a read-only host writes
nothing; prune then keeps the bucket within its budget and the entry read last, though it
was written first. Every host runs in an empty working directory, which stays empty.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import obstore
import pytest
from typer.testing import CliRunner
from xla_pcache import Store, bucket, build_key, entry_name, open_store
from xla_pcache.bucket import upkeep
from xla_pcache.cli import app
from xla_pcache.config import Settings
from xla_pcache.jax import _build as jax_build
from xla_pcache.jax.ahead import _plan

from tests.helpers import entry_file_key, executables, is_beside
from tests.jax.helpers import (
    finish_jax,
    hits,
    open_barrier,
    results,
    runs,
    start_jax,
    worker_plan_name,
)
from tests.tiers.relay import Relay
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix


def _objects(server: BucketServer, prefix: str) -> dict[str, tuple[int, str | None]]:
    """Every object below ``prefix``: path -> (size, ETag)."""
    return {
        str(o["path"]): (int(o["size"]), o["e_tag"])
        for o in obstore.list(bucket_client(server, prefix)).collect()
    }


def _under(objects: dict[str, Any], folder: str) -> list[str]:
    return sorted(p for p in objects if p.startswith(f"xla_pcache-1/{folder}/"))


def _executables(server: BucketServer, prefix: str) -> list[str]:
    """The entries, less the worker processes' prefetch plan and the programs' module
    records (told by the key in each object's header)."""
    client = bucket_client(server, prefix)
    return [
        p
        for p in _under(_objects(server, prefix), "entries")
        if not is_beside(entry_file_key(bytes(obstore.get(client, p).bytes())))
    ]


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


# ------------------------------------------------------------------------------ JAX hosts


def start(steps: list[dict[str, Any]], env: dict[str, str], home: Path) -> subprocess.Popen[str]:
    """One host: a fresh JAX process in an empty working directory of its own, its
    host-local store under ``home``."""
    work = home / "work"
    work.mkdir(parents=True)
    return start_jax(steps, {**env, "XDG_CACHE_HOME": str(home)}, cwd=work)


def host(steps: list[dict[str, Any]], env: dict[str, str], home: Path) -> dict[str, Any]:
    report = finish_jax(start(steps, env, home))
    assert list((home / "work").iterdir()) == [], "a host left files in its working directory"
    return report


def warnings_of(report: dict[str, Any]) -> list[str]:
    return [r["msg"] for r in report["log"] if r["level"] == "WARNING"]


@pytest.fixture(scope="module")
def fleet(bucket_server: BucketServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    prefix = fresh_prefix()
    url = bucket_server.url(prefix)
    env = {**bucket_server.env(), "JAX_COMPILATION_CACHE_DIR": url}
    return {"prefix": prefix, "url": url, "env": env, "tmp": tmp_path_factory.mktemp("fleet")}


@pytest.fixture(scope="module")
def cold(fleet: dict[str, Any]) -> dict[str, Any]:
    """Host A fills the bucket with programs 0 and 1, then points JAX at other URLs: a gs:// and
    an az:// bucket (no credentials: their tiers fail or drop, the local stores work) and an
    hdfs:// URL (not served: one warning, uncached; JAX's own option left unset, as JAX would
    fail on it)."""
    home = fleet["tmp"] / "a"
    steps = [
        *runs(0, 1, layers=1),
        {"op": "inspect"},
        {"op": "install", "path": "gs://no-such-bkt/jax"},
        *runs(7, layers=1),
        {"op": "set_cache_dir", "path": "az://ctr/jax"},
        *runs(8, layers=1),
        {"op": "install", "path": "hdfs://nn/jax"},
        *runs(9, layers=1),
    ]
    # One request past the timeout leaves the tier alone for its retry_after (5 s), about
    # this host's whole run: a 0.5 s timeout on a loaded 2-core machine lost every upload
    # after the first claim. The gs:// and az:// tiers fail at once here (no credentials),
    # whatever the timeout.
    env = {**fleet["env"], "XLA_PCACHE_REMOTE_TIMEOUT": "10"}
    report = host(steps, env, home)
    return {"report": report, "home": home}


@pytest.mark.jax
def test_a_cold_host_fills_the_bucket_and_makes_nothing_elsewhere(
    fleet: dict[str, Any], cold: dict[str, Any], bucket_server: BucketServer
) -> None:
    report = cold["report"]
    assert hits(report) == [0] * 5
    objects = _objects(bucket_server, fleet["prefix"])
    assert len(_executables(bucket_server, fleet["prefix"])) == 2, (objects, warnings_of(report))
    assert not _under(objects, "claims"), objects
    # Its exit record: no use (every get missed), 5 entries written (2 programs, their
    # module records, its plan).
    (record,) = _under(objects, "records")
    assert record.split("-")[-2] == "5", record
    # JAX's option names the host-local store; that and the other buckets' are all there is.
    local = cold["home"] / "xla_pcache" / "remote" / bucket.local_name(fleet["url"])
    assert report["inspect"][0]["cache_dir"] == str(local)
    assert sorted(p.name for p in local.parent.iterdir()) == sorted(
        bucket.local_name(u) for u in (fleet["url"], "gs://no-such-bkt/jax", "az://ctr/jax")
    )
    # Beside it, only the user's own record of the runtime's binaries (outside every cache).
    assert sorted(p.name for p in cold["home"].iterdir()) == [
        "work",
        "xla_pcache",
        "xla_pcache-builds",
    ]
    (hdfs,) = [w for w in warnings_of(report) if "hdfs" in w]
    assert "install(path)=hdfs://nn/jax cannot be served" in hdfs
    assert "without a persistent cache" in hdfs


@pytest.fixture(scope="module")
def four(fleet: dict[str, Any], cold: dict[str, Any]) -> list[dict[str, Any]]:
    """Four hosts with empty local stores start together: programs 0 and 1 (in the bucket)
    and 4 (new to all)."""
    tmp = fleet["tmp"]
    go = tmp / "go"
    ready = [tmp / f"ready-{i}" for i in range(4)]
    procs = [
        start(
            [
                {"op": "loaded_ahead"},
                *runs(0, 1, layers=1),
                # Together at the new program, whose compile outlasts their start-up jitter.
                {"op": "wait", "ready": str(ready[i]), "file": str(go)},
                *runs(4, layers=8),
            ],
            fleet["env"],
            tmp / f"d{i}",
        )
        for i in range(4)
    ]
    open_barrier(procs, ready, go)
    reports = [finish_jax(p) for p in procs]
    for i in range(4):
        assert list((tmp / f"d{i}" / "work").iterdir()) == []
    return reports


@pytest.mark.jax
def test_four_hosts_warm_start_and_compile_each_new_program_once(
    fleet: dict[str, Any],
    cold: dict[str, Any],
    four: list[dict[str, Any]],
    bucket_server: BucketServer,
) -> None:
    for report in four:
        # Warm start from the bucket with an empty local store: the plan and what it names
        # were fetched from the bucket and loaded from the backend's start, before JAX read
        # anything; every old program hits.
        ahead = report["loaded_ahead"]
        assert ahead["began"] == "before the first read" and ahead["states"] == {"loaded": 2}
        assert hits(report)[:2] == [1, 1], hits(report)
        assert {p: results(report)[p] for p in (0, 1)} == {
            p: results(cold["report"])[p] for p in (0, 1)
        }
    # The new program compiled by one host; the three others waited on its bucket claim.
    assert sorted(hits(r)[2] for r in four) == [0, 1, 1, 1], [hits(r) for r in four]
    assert len({str(results(r)[4]) for r in four}) == 1
    objects = _objects(bucket_server, fleet["prefix"])
    assert len(_executables(bucket_server, fleet["prefix"])) == 3, objects
    assert not _under(objects, "claims"), objects


@pytest.fixture(scope="module")
def reader(fleet: dict[str, Any], four: list[dict[str, Any]]) -> dict[str, Any]:
    """Host E, after the four, uses program 0: the first written, now the last used."""
    return host(runs(0, layers=1), fleet["env"], fleet["tmp"] / "e")


@pytest.fixture(scope="module")
def read_only(fleet: dict[str, Any], reader: dict[str, Any], bucket_server: BucketServer) -> Any:
    before = _objects(bucket_server, fleet["prefix"])
    env = {**fleet["env"], "XLA_PERSISTENT_CACHE_READ_ONLY": "1"}
    report = host(runs(1, 6, layers=1), env, fleet["tmp"] / "c")
    return before, report, _objects(bucket_server, fleet["prefix"])


@pytest.mark.jax
def test_a_read_only_host_writes_nothing_to_the_bucket(
    fleet: dict[str, Any], read_only: Any, bucket_server: BucketServer
) -> None:
    before, report, after = read_only
    assert hits(report) == [1, 0]  # served from the bucket; a new program compiled
    assert after == before  # no entry, claim or record: every object as it was
    # Nor a plan of its own in its host-local store, where the new program's entry is kept:
    # the fleet's plan it fetched, as the bucket has it.
    local = fleet["tmp"] / "c" / "xla_pcache" / "remote" / bucket.local_name(fleet["url"])
    with Store(local, read_only=True, settings=Settings()) as store:
        assert len(executables(store)) > len(_executables(bucket_server, fleet["prefix"]))
        (plan,) = [e["key"] for e in store.entries() if e["name"] == worker_plan_name()]
        blob = store.get(plan)
        assert blob is not None
        variants = _plan.decode(bytes(blob)).variants
        stats = store.stats()
    build = jax_build.build()
    assert build_key.split(str(plan))[1] is None, "one plan, whatever the build"
    named = {
        f"xla_pcache-1/entries/{entry_name(build.store_key(e.key))}"
        for v in variants
        for e in v.entries
    }
    assert named
    assert named <= set(_executables(bucket_server, fleet["prefix"])), "the plan names the new one"
    assert stats["prefetch_plans_written"] == 0


@pytest.mark.jax
def test_prune_keeps_the_bucket_within_budget_and_what_was_read_last(
    fleet: dict[str, Any], reader: dict[str, Any], read_only: Any, server: BucketServer
) -> None:
    assert hits(reader) == [1]
    url, prefix = fleet["url"], fleet["prefix"]
    # The entry E read: program 0, the first host A wrote (E's plan loaded the fleet's other
    # programs ahead too, unused: no use of them is recorded for the bucket).
    local = fleet["tmp"] / "a" / "xla_pcache" / "remote" / bucket.local_name(url)
    with Store(local, read_only=True) as store:
        key = min(executables(store), key=lambda e: e["created"])["key"]
    first = entry_name(key)
    # What E used with it: the plan it loaded, touched as E ended so that it ages with the
    # entries it names (a touch is a use, in the bucket as in the host's store).
    with_it = {worker_plan_name()}
    sizes = {p.rpartition("/")[2]: s for p, (s, _) in _objects(server, prefix).items()}
    assert with_it <= set(sizes), (with_it, sizes)
    # Room for those only: prune goes to 90 % of the stored budget.
    budget = int((sizes[first] + sum(sizes[n] for n in with_it)) / upkeep.LOW_WATERMARK) + 1
    out = cli("config", "--path", url, "--max-size", str(budget))
    assert out.exit_code == 0, out.output
    stats = json.loads(cli("stats", "--path", url, "--json").output)
    # Three programs, their module records and the fleet's prefetch plan (entries too, the
    # plan last written by the four hosts, before E's read).
    assert (stats["entries"], stats["max_size"], stats["records_pending"]) == (7, budget, 6)
    assert stats["fill"] > 1
    out = cli("prune", "--path", url, "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert (report["removed"], report["entries"]) == (5, 2), report
    objects = _objects(server, prefix)
    kept = sorted(f"xla_pcache-1/entries/{n}" for n in {first, *with_it})
    assert _under(objects, "entries") == kept
    assert not _under(objects, "records")  # folded into usage
    after = json.loads(cli("stats", "--path", url, "--json").output)
    assert after["bytes"] <= budget and after["last_prune"] is not None, after
    # A second prune finds nothing to do.
    again = json.loads(cli("prune", "--path", url, "--json").output)
    assert again["removed"] == 0 and again["records_folded"] == 0, again


@pytest.mark.jax
def test_a_bucket_without_its_extra_is_one_warning_and_no_directory(
    fleet: dict[str, Any],
) -> None:
    home = fleet["tmp"] / "f"
    env = {"JAX_COMPILATION_CACHE_DIR": "gs://no-such-bkt/jax", "TEST_HIDE_MODULES": "obstore"}
    report = host(runs(0, layers=1), env, home)
    (warning,) = warnings_of(report)
    assert "JAX_COMPILATION_CACHE_DIR=gs://no-such-bkt/jax cannot be served" in warning
    assert 'pip install "xla-pcache[objstore]"' in warning and "JAX uses its own" in warning
    assert sorted(p.name for p in home.iterdir()) == ["work"]


# ------------------------------------------------------------------------------ in process


def _store(url: str, home: Path, **changes: Any) -> bucket.BucketStore:
    settings = Settings.from_env().replace(xdg_cache_home=str(home), **changes)
    store = open_store(url, settings=settings)
    assert isinstance(store, bucket.BucketStore)
    return store


def test_a_host_records_its_uses_once_per_interval_in_one_object(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    writer = _store(url, tmp_path / "w")
    for i in range(3):
        assert writer.put(f"k{i}", bytes(1000))
    writer.close()
    # Two processes of one host (one local store). The host's first record goes out at once;
    # then, within the interval, each spools what it noted, and the last to exit uploads the
    # host's spool as one record.
    one, two = _store(url, tmp_path / "h"), _store(url, tmp_path / "h")
    assert one.get("k0") is not None
    one._recorder.flush()
    for _ in range(3):
        assert one.get("k0") is not None and one.get("k1") is not None
    assert two.get("k2") is not None
    assert one._recorder._pending == {entry_name("k1")}  # k0: noted within the interval
    one._recorder.flush()  # spooled: this host uploaded less than an interval ago
    two.close()
    one.close()
    records = _under(_objects(server, prefix), "records")
    assert len(records) == 3, records  # the writer's (its puts), and the host's two
    b = upkeep.Bucket(url)
    used = sorted(sorted(b.use_record_names(p)) for p in records)
    # A put is a use: the writer's record names what it wrote.
    wrote = sorted(entry_name(f"k{i}") for i in range(3))
    later = sorted([entry_name("k1"), entry_name("k2")])
    assert used == sorted([wrote, [entry_name("k0")], later]), used


def test_a_touch_is_a_use_in_the_buckets_record(tmp_path: Path, server: BucketServer) -> None:
    """An entry no lookup reads (a plan, a module record) is touched when the entries it
    belongs with are used: on a bucket path the touch goes into the host's use record, so
    that a prune ages it with them, not first; an absent entry is no use."""
    prefix = fresh_prefix()
    url = server.url(prefix)
    writer = _store(url, tmp_path / "w")
    assert writer.put("plan", bytes(100))
    writer.close()
    host = _store(url, tmp_path / "h")
    assert host.get("plan", count=False) is not None  # fetched to the host, not a use
    assert host._recorder._pending == set()
    assert host.touch("plan") and not host.touch("absent")
    assert host._recorder._pending == {entry_name("plan")}
    host.close()
    records = _under(_objects(server, prefix), "records")
    b = upkeep.Bucket(url)
    used = [sorted(b.use_record_names(p)) for p in records]
    assert [entry_name("plan")] in used, used


def test_a_writers_record_names_its_puts_within_a_records_cap(
    tmp_path: Path, server: BucketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put is a use: the writer's record names every entry it wrote (a prune that cannot
    list an entry asks for it by name), at most ``RECORD_NAMES`` an object (2 here, 100,000
    in use), the host's write counts in the first."""
    from xla_pcache.bucket import recorder

    monkeypatch.setattr(recorder, "RECORD_NAMES", 2)
    prefix = fresh_prefix()
    url = server.url(prefix)
    writer = _store(url, tmp_path / "w")
    for i in range(5):
        assert writer.put(f"k{i}", bytes(1000))
    writer.close()
    b = upkeep.Bucket(url)
    records = b.use_records()
    named = sorted(n for path, *_ in records for n in b.use_record_names(path))
    assert named == sorted(entry_name(f"k{i}") for i in range(5)), records
    assert len(records) == 3 and sorted(puts for *_, puts, _ in records) == [0, 0, 5], records


def test_budget_stats_and_prune_through_the_command(
    tmp_path: Path, server: BucketServer, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    w = _store(url, tmp_path / "w")
    for i in range(6):
        assert w.put(f"k{i}", bytes(20_000))
    w.close()
    r = _store(url, tmp_path / "r")
    assert r.get("k1") is not None and r.get("k4") is not None
    r.close()
    out = cli("config", "--path", url, "--max-size", "50K", "--max-age", "30d")
    assert out.exit_code == 0 and "max size: 50.0K" in out.output, out.output
    shown = json.loads(cli("config", "--path", url, "--show", "--json").output)
    assert shown["stored"] == {"max_size": 50 << 10, "max_age_s": 30 * 86400.0}
    stats = json.loads(cli("stats", "--path", url, "--json").output)
    assert (stats["entries"], stats["records_pending"]) == (6, 2) and stats["fill"] > 1
    table = cli("stats", "--path", url).output
    assert "budget" in table and "50.0K" in table
    # Another host holds the prune lease: this one does not prune.
    client = bucket_client(server, prefix)
    obstore.put(client, upkeep.LEASE, b'{"owner": "elsewhere-1"}')
    busy = cli("prune", "--path", url)
    assert busy.exit_code == 1 and "elsewhere-1" in busy.output, busy.output
    obstore.delete(client, upkeep.LEASE)
    out = cli("prune", "--path", url)
    assert out.exit_code == 0 and "removed 4 entries" in out.output, out.output
    objects = _objects(server, prefix)
    kept = {p.rpartition("/")[2] for p in _under(objects, "entries")}
    assert kept == {entry_name("k1"), entry_name("k4")}  # the two read since
    size = sum(objects[p][0] for p in _under(objects, "entries"))
    # Hostile objects: a budget that is no budget is ignored with one warning; junk under
    # entries/ is removed by every prune; a record that is not gzip is skipped.
    obstore.put(client, upkeep.CONFIG, b'{"max_size": -1}')
    obstore.put(client, "xla_pcache-1/entries/zz/not-an-entry", b"x" * 10)
    obstore.put(client, f"{upkeep.USE_RECORD_DIR}/r-1-0000000000000000-9-99", b"not gzip")
    b = upkeep.Bucket(url)
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        assert b.read_stored_budget() == upkeep.BucketStoredBudget()
        report = b.prune(max_size=size)
    assert caplog.text.count("out of range") == 1 and "is not gzip" in caplog.text
    assert report.junk_names == ["xla_pcache-1/entries/zz/not-an-entry"]
    assert report.removed == 0 and report.entries == 2 and report.records_folded == 1
    assert report.skipped == {"config-malformed": 1, "record-malformed": 1}, report.skipped


# Each field's values at and past the directory's bounds (``_core.check_size``,
# ``_core.check_max_age``): the first two of each are kept, the rest refused.
_BUDGET_BOUNDS = [
    ("max_size", 1),
    ("max_size", (1 << 63) - 1),
    ("max_size", 0),
    ("max_size", -5),
    ("max_size", 1 << 63),
    ("max_age_s", 1.0),
    ("max_age_s", 1e9),
    ("max_age_s", 0.5),
    ("max_age_s", 1e9 + 1),
    ("max_age_s", float("nan")),
    ("max_age_s", float("inf")),
]


def test_a_buckets_stored_budget_is_written_under_the_directorys_size_rule(
    tmp_path: Path, server: BucketServer
) -> None:
    """The bucket's budget is refused where the directory's is (a ValueError naming the
    field, before any request: nothing in the bucket), and what is written reads back as
    written; read-only or not, an out-of-range value is the argument's error first."""
    directory = Store(tmp_path / "dir")
    for field, value in _BUDGET_BOUNDS:
        prefix = fresh_prefix()
        b = upkeep.Bucket(server.url(prefix))
        arg = {"max_size": "max_size", "max_age_s": "max_age"}[field]
        try:
            directory.write_cache_settings(**{arg: value})
        except ValueError:
            kept = False
        else:
            kept = True
        budget = upkeep.BucketStoredBudget(**{field: value})
        if kept:
            b.write_stored_budget(budget)
            assert b.read_stored_budget() == budget, (field, value)
            continue
        with pytest.raises(ValueError, match=field):
            b.write_stored_budget(budget)
        with pytest.raises(ValueError, match=field):
            upkeep.Bucket(server.url(prefix), read_only=True).write_stored_budget(budget)
        assert "put" not in b.requests and not _objects(server, prefix), (field, value)
    directory.close()


def test_writers_prune_one_host_at_a_time_when_past_the_budget(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    url = server.url(prefix)
    client = bucket_client(server, prefix)
    upkeep.Bucket(url).write_stored_budget(upkeep.BucketStoredBudget(max_size=100_000))
    one = _store(url, tmp_path / "one")
    for i in range(8):
        assert one.put(f"a{i}", bytes(20_000))
    one.remote.flush()
    one._recorder.flush(final=True)  # its record says 8 entries: past the budget, it prunes
    assert one._recorder.prunes == 1
    assert sum(s for s, _ in _objects(server, prefix).values() if s > 10_000) <= 100_000
    # Another host is pruning (it holds the lease): a writer past the budget leaves it be.
    obstore.put(client, upkeep.LEASE, b"{}")
    two = _store(url, tmp_path / "two")
    for i in range(4):
        assert two.put(f"b{i}", bytes(20_000))
    two.remote.flush()
    two._recorder.flush(final=True)
    assert two._recorder.prunes == 0
    obstore.delete(client, upkeep.LEASE)
    assert two.put("b9", bytes(20_000))
    two.close()
    assert two._recorder is None
    estimate = upkeep.Bucket(url).estimate()
    assert estimate.known and estimate.bytes <= 100_000, estimate
    one.close()


def test_a_write_at_interpreter_exit_is_made_not_dropped(
    tmp_path: Path, server: BucketServer
) -> None:
    """At exit the writer threads are gone (torch_xla's last publish comes then): the write
    is made on the calling thread instead of being skipped, and so is what follows it."""
    prefix = fresh_prefix()
    store = _store(server.url(prefix), tmp_path / "h")
    tier = store._bucket_tier()
    tier._writer.shutdown(wait=True)  # as threading's exit hook leaves it
    assert store.put("k", b"v" * 100)
    store.mark("torch_xla/123", "123")
    assert _under(_objects(server, prefix), "entries") == [
        f"xla_pcache-1/entries/{entry_name('k')}"
    ]
    assert len(_under(_objects(server, prefix), "torch_xla")) == 1
    assert tier.stats()["remote_puts"] == 1 and "remote_put_skipped" not in tier.stats()
    store.close()


@pytest.mark.torch_xla
def test_torch_xla_serves_a_fresh_host_from_the_bucket(
    tmp_path: Path, bucket_server: BucketServer
) -> None:
    from tests.helpers import clean_env, run_worker
    from tests.torch_xla.helpers import PROGRAM, cold, served

    url = bucket_server.url(fresh_prefix())

    def run(spec: dict[str, Any], env: dict[str, str], name: str) -> dict[str, Any]:
        home = tmp_path / name
        (home / "work").mkdir(parents=True)
        report = run_worker(
            str(PROGRAM),
            json.dumps(spec),
            cwd=home / "work",
            env=clean_env(
                ("XLA_", "PJRT_", "JAX_"),
                PJRT_DEVICE="CPU",
                TF_CPP_MIN_LOG_LEVEL="1",
                XDG_CACHE_HOME=str(home),
                **{**bucket_server.env(), **env},
            ),
        )
        assert "Traceback" not in report["stderr"], report["stderr"][-4000:]
        assert list((home / "work").iterdir()) == []
        return report

    first = run({"graphs": ["add"]}, {"XLA_PERSISTENT_CACHE_PATH": url}, "a")
    cold(first)
    # A fresh host, torch_xla's own API naming the bucket: its copy is filled from the bucket,
    # past ten thousand objects planted before every marker (on main its listing stopped
    # at 10,000 objects in key order and never saw the real marker: it compiled).
    relay = Relay(bucket_server)
    try:
        prefix = url.split("/", 3)[3]
        relay.plant_many(f"{prefix}/{upkeep.MARKER_DIR}/!{i:08d}" for i in range(10_000))
        second = run(
            {"init": [url, False], "graphs": ["add"]}, bucket_server.point_at(relay.endpoint), "b"
        )
    finally:
        relay.close()
    served(second)
    assert first["results"] == second["results"]
    objects = _objects(bucket_server, url.split("/", 3)[3])
    assert len(_under(objects, "entries")) == len(_under(objects, "torch_xla")) == 1
    # A host on the same bucket marked read-only (?ro=1): it is served, compiles a graph the
    # bucket lacks, and writes nothing there, no entry and no marker of it either.
    third = run({"graphs": ["add", "square"]}, {"XLA_PERSISTENT_CACHE_PATH": f"{url}?ro=1"}, "c")
    assert third["results"]["add"] == first["results"]["add"]
    assert third["counters"]["PersistentCacheMiss"] == 1, third["counters"]
    assert _objects(bucket_server, url.split("/", 3)[3]) == objects
    # It published the new graph where it may: its own host-local store.
    home = Settings().replace(xdg_cache_home=str(tmp_path / "c"))
    with Store(bucket.local_path(url, home), read_only=True) as local:
        assert len([e for e in local.entries() if str(e["key"]).startswith("torch_xla/")]) == 2
