"""``xla-pcache precompile`` on this host without a TPU: JAX with its TPU runtime
(``jax[tpu]``), fresh processes, the environment only.

A user's ahead-of-time step for ``v5e:1x1`` stores an executable and its module record; with
the executable removed, the command stores it again under the same key, and a second run
finds it present. Compiled for the TPU VM's settings (its flag, zlib) where the record was
made with none, it stores the key a process with those settings computes (a compile-only
client loads no executable back: that the TPU hits it is the TPU's run, docs/jax.md).
Records it cannot compile are refused with their reason (planted as a writer of the cache
without a key would plant them); a read-only path, a trusting store and the budget are
honoured.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.config import Settings
from xla_pcache.jax.ahead import _record

from tests.helpers import clean_env, cli, entry_file_key, is_beside
from tests.jax.tpu import (
    TPU_TOPOLOGY,
    TPU_VM_FLAG,
    executables_of,
    record_keys,
    run_aot,
    tpu_vm_env,
)
from tests.tiers.fixtures import bucket_server  # noqa: F401 - a fixture, found by name
from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix

pytestmark = TPU_TOPOLOGY


# Processes of several tests load libtpu at once (the compiler process allows it itself).
SHARED_LIBTPU = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """A process of this host: no TPU flags, JAX's CPU client, this host's compression."""
    return clean_env(
        ("JAX_", "LIBTPU_", "TPU_", "XLA_FLAGS"),
        JAX_PLATFORMS="cpu",
        XDG_CACHE_HOME=str(tmp / "xdg"),
        **SHARED_LIBTPU,
        **extra,
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store a user's AOT step for v5e:1x1 filled: one executable, one record."""
    tmp = tmp_path_factory.mktemp("made")
    cache = tmp / "cache"
    run_aot(_env(tmp, XLA_PERSISTENT_CACHE_PATH=str(cache)))
    assert len(executables_of(cache)) == 1 and len(record_keys(cache)) == 1
    return cache


def _copy(made: Path, tmp: Path) -> Path:
    cache = tmp / "cache"
    shutil.copytree(made, cache)
    return cache


def _precompile(
    cache: Path | str, tmp: Path, *args: str, **env: str
) -> tuple[int, dict[str, Any], str]:
    proc = cli(
        "precompile",
        "--topology",
        "v5e:1x1",
        "--path",
        str(cache),
        "--json",
        *args,
        env=_env(tmp, **env),
        timeout=600,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, report, proc.stderr


def _remove(cache: Path, key: str) -> None:
    with Store(cache, settings=Settings()) as store:
        assert store.delete(key)


def test_a_removed_executable_is_stored_again_under_its_key_then_found_present(
    made: Path, tmp_path: Path
) -> None:
    cache = _copy(made, tmp_path)
    (key,) = executables_of(cache)
    records = record_keys(cache)
    _remove(cache, key)
    code, report, err = _precompile(cache, tmp_path)
    assert code == 0, err[-3000:]
    assert report["counts"] == {"compiled": 1, "present": 0, "not compilable": 0, "failed": 0}
    assert set(executables_of(cache)) == {key}
    assert record_keys(cache) == records
    # Where the settings came from is said, and none is this host's own.
    assert "flags: each record's own" in err and "compression: each record's own" in err
    (used,) = report["settings"]
    assert used["source"] == (
        "flags from the record's key parts, compression from the record's key parts"
    )
    code, report, err = _precompile(cache, tmp_path)
    assert code == 0, err[-3000:]
    assert report["counts"] == {"compiled": 0, "present": 1, "not compilable": 0, "failed": 0}
    assert set(executables_of(cache)) == {key}


def test_other_flags_give_the_key_a_process_with_them_computes(made: Path, tmp_path: Path) -> None:
    cache = _copy(made, tmp_path)
    (made_key,) = executables_of(cache)
    code, report, err = _precompile(
        cache, tmp_path, "--libtpu-init-args", "", "--compression", "zlib"
    )
    assert code == 0, err[-3000:]
    assert report["counts"]["compiled"] == 1, report
    (used,) = report["settings"]
    assert (used["flags"], used["compression"]) == (TPU_VM_FLAG, "zlib")
    assert used["source"] == "flags from --libtpu-init-args, compression from --compression"
    (new_key,) = set(executables_of(cache)) - {made_key}
    # A process as a TPU VM runs (JAX's own flag, no zstandard) computes that key: the
    # executable it stores in a cache of its own is under it. (A compile-only client loads
    # no executable back: that the TPU hits it is the TPU's run, docs/jax.md.)
    own = tmp_path / "own"
    run_aot(tpu_vm_env(tmp_path, own, **SHARED_LIBTPU))
    assert set(executables_of(own)) == {new_key}
    # Into the precompiled store it stores nothing new (first writer wins on that key).
    run_aot(tpu_vm_env(tmp_path, cache, **SHARED_LIBTPU))
    assert set(executables_of(cache)) == {made_key, new_key}


def _plant(cache: Path, key: str, data: bytes) -> None:
    with Store(cache, settings=Settings()) as store:
        assert store.put(key, data)


def test_records_it_cannot_compile_are_refused_with_their_reason(
    made: Path, tmp_path: Path
) -> None:
    cache = _copy(made, tmp_path)
    (key,) = executables_of(cache)
    rkey = _record.record_key(key.partition("@")[0])
    with Store(cache, read_only=True) as store:
        data = bytes(store.get(rkey, count=False))
    record = _record.decode(data)
    program = key.partition("@")[0].rpartition("-")[0]

    def made_up() -> str:
        return f"{program}-{secrets.token_hex(32)}"

    def variant(**changes: Any) -> bytes:
        fields = {
            "module": record.module,
            "options": record.options,
            "devices": record.devices,
            "target": record.target,
            "parts": record.parts,
        }
        fields.update(changes)
        return _record.encode(_record.Record(**fields))

    parts = dict(record.parts)
    planted = {
        # What it holds is not the program of its key.
        made_up(): (data, "what it holds is not the program of its key"),
        # Another jaxlib's.
        made_up(): (
            variant(parts=tuple(sorted({**parts, "jax_lib version": "0.0.1"}.items()))),
            "made by jaxlib 0.0.1",
        ),
        # A program with host callbacks.
        made_up(): (
            variant(module=record.module + b"xla_ffi_python_cpu_callback"),
            "it has host callbacks",
        ),
        # Devices the topology lacks (a record claiming four chips).
        made_up(): (
            variant(
                devices=(0, 1, 2, 3),
                target=_record.Target("tpu", "TPU v5 lite", 4, "v5e:2x2", "default", (2, 2, 1)),
            ),
            "do not fit v5e:1x1",
        ),
        # Another generation.
        made_up(): (
            variant(target=_record.Target("tpu", "TPU v4", 1, "v4:1x1x1", "megacore", (1, 1, 1))),
            "made for TPU v4",
        ),
        # Not a TPU program.
        made_up(): (variant(target=_record.Target("cpu", "cpu", 1)), "not a TPU program"),
        # Flags kept only as a digest.
        made_up(): (
            variant(parts=tuple(sorted({**parts, "XLA flags": "sha256:" + "0" * 64}.items()))),
            "XLA flags are not kept readable",
        ),
    }
    for pkey, (pdata, _) in planted.items():
        _plant(cache, _record.record_key(pkey), pdata)
    # A name that is no JAX key (a path, as a writer may plant one).
    _plant(cache, _record.KEY_PREFIX + "../../outside", data)
    code, report, err = _precompile(cache, tmp_path)
    assert code == 0, err[-3000:]
    outcomes = {o["key"]: o for o in report["records"]}
    for pkey, (_, why) in planted.items():
        assert outcomes[pkey]["status"] == "not compilable", outcomes[pkey]
        assert why in outcomes[pkey]["detail"], outcomes[pkey]
    assert outcomes["../../outside"]["detail"] == "its key is not a JAX key"
    assert outcomes[key.partition("@")[0]]["status"] == "present"
    # Nothing planted was compiled: the one executable is the user's.
    assert set(executables_of(cache)) == {key}
    assert not any(p.name == "outside" for p in tmp_path.rglob("outside"))


def test_a_records_flags_are_printed_escaped(made: Path, tmp_path: Path) -> None:
    """A record's key parts are what its writer put there: flags holding a terminal's
    escape sequences (no space, no NUL: flags as any) reach the text report escaped."""
    cache = _copy(made, tmp_path)
    (key,) = executables_of(cache)
    rkey = _record.record_key(key.partition("@")[0])
    with Store(cache, read_only=True) as store:
        record = _record.decode(bytes(store.get(rkey, count=False)))
    program = key.partition("@")[0].rpartition("-")[0]
    hostile = "--xla_x=\x1b]0;pwned\x07\u202e"
    parts = tuple(sorted({**dict(record.parts), "XLA flags": hostile}.items()))
    planted = f"{program}-{secrets.token_hex(32)}"
    _plant(
        cache,
        _record.record_key(planted),
        _record.encode(dataclasses.replace(record, parts=parts)),
    )
    proc = cli("precompile", "--topology", "v5e:1x1", "--path", str(cache), env=_env(tmp_path))
    # libtpu knows no such flag: that record's compiler process ends, it fails, the run says so.
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"failed: {planted}" in proc.stdout, proc.stdout
    assert "--xla_x=\\x1b]0;pwned\\x07\\u202e" in proc.stdout, proc.stdout
    assert "\x1b" not in proc.stdout + proc.stderr and "\u202e" not in proc.stdout


@pytest.mark.parametrize(
    ("topology", "why"),
    [
        ("v9:1x1", "not a TPU generation known"),
        ("v5e:1x1x1", "has 2 dimensions"),
        ("v5e:100x100", "more than"),
        ("v5e:4x4", "spans hosts"),
        ("../v5e", "is not GENERATION"),
    ],
)
def test_an_unknown_topology_is_refused(tmp_path: Path, topology: str, why: str) -> None:
    proc = cli("precompile", "--topology", topology, "--path", str(tmp_path), env=_env(tmp_path))
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr


def test_a_read_only_path_is_refused_and_left_as_it_was(made: Path, tmp_path: Path) -> None:
    cache = _copy(made, tmp_path)
    (key,) = executables_of(cache)
    _remove(cache, key)
    code, _, err = _precompile(cache, tmp_path, XLA_PERSISTENT_CACHE_READ_ONLY="1")
    assert code == 2 and "read-only" in err and "precompile writes" in err, err
    assert executables_of(cache) == {}
    code, _, err = _precompile(f"file://{cache}?ro=1", tmp_path)
    assert code == 2 and "read-only" in err, err


def _keygen(tmp: Path, name: str) -> tuple[str, str]:
    out = tmp / f"{name}.key"
    proc = cli("keygen", name, "--out", str(out), env=_env(tmp))
    assert proc.returncode == 0, proc.stderr
    return str(out), proc.stdout.strip().splitlines()[-1]


def test_a_trusting_store_compiles_only_signed_records_and_signs_what_it_stores(
    tmp_path: Path,
) -> None:
    signing, public = _keygen(tmp_path, "fleet-1")
    trust = {"XLA_PCACHE_TRUSTED_KEYS": public}
    # An unsigned record (an AOT step without the key): a trusting store never serves it.
    unsigned = tmp_path / "unsigned"
    run_aot(_env(tmp_path, XLA_PERSISTENT_CACHE_PATH=str(unsigned)))
    (key,) = executables_of(unsigned)
    _remove(unsigned, key)
    code, report, err = _precompile(unsigned, tmp_path, XLA_PCACHE_SIGNING_KEY=signing, **trust)
    assert code == 0, err[-3000:]
    (outcome,) = report["records"]
    assert outcome["status"] == "not compilable" and "does not serve it" in outcome["detail"]
    assert executables_of(unsigned) == {}
    # Trusting, with no key to sign: what it stored would never be served.
    code, _, err = _precompile(unsigned, tmp_path, **trust)
    assert code == 2 and "serves only signed entries" in err, err
    # A signed record: compiled, and what is stored is signed.
    signed = tmp_path / "signed"
    run_aot(_env(tmp_path, XLA_PERSISTENT_CACHE_PATH=str(signed), XLA_PCACHE_SIGNING_KEY=signing))
    (key,) = executables_of(signed)
    _remove(signed, key)
    code, report, err = _precompile(signed, tmp_path, XLA_PCACHE_SIGNING_KEY=signing, **trust)
    assert code == 0 and report["counts"]["compiled"] == 1, err[-3000:]
    with Store(signed, read_only=True) as store:
        signers = {str(e["key"]): e["signer"] for e in store.entries()}
    assert signers[key] == "fleet-1", signers


def test_the_budget_holds(made: Path, tmp_path: Path) -> None:
    cache = _copy(made, tmp_path)
    (key,) = executables_of(cache)
    _remove(cache, key)
    budget = 8 << 10  # smaller than the executable
    code, report, err = _precompile(cache, tmp_path, XLA_PERSISTENT_CACHE_MAX_SIZE=str(budget))
    assert code == 1, err[-3000:]
    (outcome,) = report["records"]
    assert outcome["status"] == "failed" and "did not keep it" in outcome["detail"], outcome
    with Store(cache, read_only=True) as store:
        assert sum(int(e["size"]) for e in store.entries()) <= budget
    assert executables_of(cache) == {}


def test_it_needs_a_cache_that_exists(tmp_path: Path) -> None:
    proc = cli(
        "precompile",
        "--topology",
        "v5e:1x1",
        "--path",
        str(tmp_path / "none"),
        env=_env(tmp_path),
    )
    assert proc.returncode == 2 and "no such cache directory" in proc.stderr, proc.stderr
    assert not (tmp_path / "none").exists()


def _bucket_entries(server: BucketServer, prefix: str) -> dict[str, str]:
    """Each entry object below ``prefix``: its path -> the key its header names."""
    import obstore

    client = bucket_client(server, prefix)
    paths = [str(o["path"]) for o in obstore.list(client, "xla_pcache-1/entries/").collect()]
    return {p: entry_file_key(bytes(obstore.get(client, p).bytes())) for p in paths}


def test_on_a_bucket_the_buckets_records_are_compiled_into_it(
    bucket_server: BucketServer,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    import obstore

    prefix = fresh_prefix()
    url = bucket_server.url(prefix)
    served = bucket_server.env()
    # A fleet host's AOT step writes its executable and its record to the bucket.
    run_aot(
        _env(
            tmp_path,
            XLA_PERSISTENT_CACHE_PATH=url,
            XLA_PCACHE_LOCAL_PATH=str(tmp_path / "writer"),
            **served,
        )
    )
    entries = _bucket_entries(bucket_server, prefix)
    (executable,) = [p for p, k in entries.items() if not is_beside(k)]
    key = entries[executable]
    assert any(k.startswith(_record.KEY_PREFIX) for k in entries.values()), entries
    obstore.delete(bucket_client(bucket_server, prefix), executable)
    # Another host, whose own copy is empty: the records it compiles are the bucket's
    # (listed there), and the executable goes back to the bucket under the same key.
    code, report, err = _precompile(
        url, tmp_path, XLA_PCACHE_LOCAL_PATH=str(tmp_path / "other"), **served
    )
    assert code == 0, err[-3000:]
    assert report["counts"] == {"compiled": 1, "present": 0, "not compilable": 0, "failed": 0}
    assert report["complete_listing"], report
    assert _bucket_entries(bucket_server, prefix)[executable] == key
    # A third host finds it present in the bucket.
    code, report, err = _precompile(
        url, tmp_path, XLA_PCACHE_LOCAL_PATH=str(tmp_path / "third"), **served
    )
    assert code == 0, err[-3000:]
    assert report["counts"] == {"compiled": 0, "present": 1, "not compilable": 0, "failed": 0}
    # Read-only there (?ro=1): refused before anything is read.
    code, _, err = _precompile(f"{url}?ro=1", tmp_path, **served)
    assert code == 2 and "read-only" in err, err


def test_a_compile_past_its_timeout_fails_and_the_command_ends(made: Path, tmp_path: Path) -> None:
    # A compile of this program takes far longer than a millisecond anywhere: the
    # compiler process is stopped in it, the record fails, and the command ends.
    cache = _copy(made, tmp_path)
    (key,) = executables_of(cache)
    _remove(cache, key)
    code, report, err = _precompile(cache, tmp_path, "--compile-timeout", "0.001")
    assert code == 1, err[-3000:]
    (outcome,) = report["records"]
    assert outcome["status"] == "failed" and "ran past 0.001 s" in outcome["detail"], outcome
    assert executables_of(cache) == {}


@pytest.mark.parametrize("plan", ["../../outside", "a/b", "..", "\u540d\u524d\u202e", "x" * 5000])
def test_a_hostile_plan_name_finds_no_plan_and_touches_nothing(
    made: Path, tmp_path: Path, plan: str
) -> None:
    cache = _copy(made, tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _, err = _precompile(cache, tmp_path / "cwd", "--plan", plan)
    assert code == 2 and "no plan" in err, err[-3000:]
    assert (
        sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "cwd" not in p.parts)
        == before
    )


def test_a_planted_plan_over_its_bound_is_refused_whole(made: Path, tmp_path: Path) -> None:
    from xla_pcache.jax.ahead import _plan, _plan_name

    cache = _copy(made, tmp_path)
    # A plan naming some 100k records (more bytes than any plan may have), planted as a
    # writer without a key plants it under the plan's key.
    key = _plan.plan_key(_plan_name.workload("fleet", "0.10.2", 0))
    names = ",".join(f'"{_record.KEY_PREFIX}jit_f-{i:064x}"' for i in range(100_000))
    _plant(cache, key, names.encode())
    code, _, err = _precompile(cache, tmp_path, "--plan", key)
    assert code == 2 and "is refused" in err, err[-3000:]
