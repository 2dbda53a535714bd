"""Loading-ahead plans and the runtime's build, attacked by someone who can write the cache
directory (or its bucket, or a shared disk) but holds no signing key and is not the victim:
what each attack gets, at the level of the module that owns the rule. No JAX is started here
(the plan is bytes, the build a digest of files, the store a real one in a temporary
directory); the real-JAX ends of the same attacks are in tests/jax/test_prefetch.py and
tests/jax/test_builds.py, the record's own in tests/test_build_record.py.

The victim, throughout, trusts no key unless the test says so: a key-less writer can then
plant executables too, so what a plan adds is cost (bounded), never a wrong executable for a
read (``_prefetch`` hands out only what the read's own key, options and devices name). The
plan's writer is also held to its promise to a fleet: the processes of one job write its plan
once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from xla_pcache import Store, _core, build_key, builds
from xla_pcache.jax.ahead import _plan, _prefetch
from xla_pcache.jax.ahead._plan_writer import PlanWriter

KEY = "jit_step-" + "ab" * 32
BUILD = builds.Build("jax", "0123456789abcdef" * 2)
SUFFIX = BUILD.suffix
PLAN_KEY = _plan.plan_key("attacked")


def _key(i: int) -> str:
    return f"jit_step_{i}-" + f"{i:064x}"


def _variant(written: float, keys: range) -> _plan.Variant:
    return _plan.Variant(written, "cpu", 1, tuple(_plan.Entry(_key(i), b"o", (0,)) for i in keys))


def _doc(entries: list[list[object]]) -> bytes:
    variant = {
        "written": 1.0,
        "platform": "cpu",
        "device_count": 1,
        "options": [""],
        "devices": [[0]],
    }
    # Each entry with no timings (``[key, options, devices, None, None, None]``).
    entries = [[*e, None, None, None] for e in entries]
    doc = {
        "format": _plan.FORMAT,
        "version": _plan.VERSION,
        "variants": [{**variant, "entries": entries}],
    }
    return json.dumps(doc).encode()


def _entry_path(root: Path, key: str) -> Path:
    name = _core.entry_name(key)
    return root / "entries" / name[:2] / name


def test_variants_dated_in_the_future_do_not_stay_for_ever() -> None:
    # A writer plants a plan whose variants are all dated a century ahead: the newest are
    # the ones a run follows the order of while several are candidates, and the oldest the
    # ones dropped when the plan is full. A run that writes its variant keeps no other newer
    # than its own, so the planted ones are the first to go as real programs write theirs.
    future = time.time() + 100 * 365 * 86400
    planted = _plan.Plan(
        tuple(_variant(future + i, range(100 * i, 100 * i + 5)) for i in range(1, 17))
    )
    plan = _plan.decode(_plan.encode(planted))
    mine = _variant(time.time(), range(5))
    rewritten = _plan.decode(_plan.encode(_plan.merged(plan, mine)))
    assert rewritten.variants[0].entries == mine.entries
    assert all(v.written <= rewritten.variants[0].written for v in rewritten.variants)
    for i in range(_plan.MAX_VARIANTS - 1):
        rewritten = _plan.merged(rewritten, _variant(time.time(), range(5000 + i, 5001 + i)))
    kept = {e.key for v in rewritten.variants for e in v.entries}
    assert not kept & {e.key for v in planted.variants for e in v.entries}
    # Written in JSON with its date as the attacker chose it: the same.
    raw = json.loads(_plan.encode(planted))
    raw["variants"][0]["written"] = 1e300
    plan = _plan.decode(json.dumps(raw).encode())
    assert max(v.written for v in _plan.merged(plan, mine).variants) == mine.written


# ----------------------------------------------------------------------------- keys a plan names


def test_path_like_keys_name_no_file_outside_and_nul_keys_are_refused(tmp_path: Path) -> None:
    # JAX's key is "<module>-<64 hex>" and the module's name is free text: "../" passes the
    # form. The store files a key under the hash of its bytes, so such a key names a file of
    # the cache like any other, never the path it spells.
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_bytes(b"precious")
    traversal = "../../../etc/passwd-" + "0" * 64
    assert _plan.valid_key(traversal)
    with Store(tmp_path / "cache") as store:
        assert store.get(traversal + SUFFIX, count=False) is None
        assert store.put(traversal + SUFFIX, b"payload")
    assert (outside / "passwd").read_bytes() == b"precious"
    assert not (tmp_path / "cache" / "etc").exists()
    for bad in ("jit\0f-" + "0" * 64, "/etc/passwd\0-" + "0" * 64, "jit f-" + "0" * 64):
        assert not _plan.valid_key(bad)
        with pytest.raises(_plan.PlanError, match="not a JAX cache key"):
            _plan.decode(_doc([[bad, 0, 0]]))


def test_a_plan_cannot_name_another_builds_entry(tmp_path: Path) -> None:
    # Another build's entry is "<JAX key>@build-<its digest>". A plan entry is a JAX key, to
    # which the reader appends its own build: a key that ends in another build's suffix is
    # not of JAX's form, and one that holds it inside is another key altogether.
    other = "@build-" + "e" * 32
    theirs = KEY + other
    assert not _plan.valid_key(theirs)
    with pytest.raises(_plan.PlanError, match="not a JAX cache key"):
        _plan.decode(_doc([[theirs, 0, 0]]))
    inside = "jit_step" + other + "-" + "ab" * 32
    assert _plan.valid_key(inside)
    with Store(tmp_path / "cache") as store:
        assert store.put(theirs, b"another build's executable")
        assert store.get(KEY + SUFFIX, count=False) is None
        assert store.get(inside + SUFFIX, count=False) is None
        assert build_key.split(inside + SUFFIX) == (inside, SUFFIX[len("@build-") :])


def test_a_key_with_a_forged_build_is_an_entry_like_any_other(tmp_path: Path) -> None:
    # The build in a key keeps builds apart, not writers: it is no secret (any process of
    # that install computes it). An executable planted under the victim's own build key is
    # served to a reader that trusts no key, as any planted entry is, and never to one that
    # trusts keys (one miss counted untrusted): signatures are what stop a writer.
    private = _core.generate_signing_key()
    trusted = [("ci-1", _core.signing_public_key(private))]
    with Store(tmp_path / "cache") as store:
        assert store.put(KEY + SUFFIX, b"planted", meta={"backend": "cpu"})
    with Store(tmp_path / "cache", trusted_keys=trusted) as store:
        assert store.get(KEY + SUFFIX) is None
        assert store.stats()["untrusted"] == 1
    with Store(tmp_path / "cache") as store:
        assert bytes(store.get(KEY + SUFFIX) or b"") == b"planted"


# ----------------------------------------------------------------------------- writing a plan


def _writer(store: Store, seen: list[_plan.Entry]) -> PlanWriter:
    """The plan writer of a session as it would stand after its run on one CPU read
    ``seen``, its plan read as none. No backend: writing a plan uses the store alone."""
    session = _prefetch.Prefetch(
        store,
        None,
        threads=1,
        memory=1 << 20,
        name="attacked",
        jax_version="0",
        form=2,
        build=BUILD,
    )
    writer = session._writer
    writer.bind(PLAN_KEY, "attacked", BUILD.digest, None, "cpu", 1)
    for entry in seen:
        writer.read(entry)
    return writer


def _future_plan() -> bytes:
    future = time.time() + 86400 * 365
    variants = tuple(_variant(future + i, range(100 * i, 100 * i + 50)) for i in (1, 2, 3, 4))
    return _plan.encode(_plan.Plan(variants))


def _garbage(store: Store, root: Path) -> None:
    assert store.replace(PLAN_KEY, b"\xff" * 1000)


def _huge(store: Store, root: Path) -> None:
    assert store.replace(PLAN_KEY, b" " * (_plan.MAX_PLAN_BYTES + 1))


def _dated_ahead(store: Store, root: Path) -> None:
    assert store.replace(PLAN_KEY, _future_plan())


def _directory(store: Store, root: Path) -> None:
    store.delete(PLAN_KEY)
    _entry_path(root, PLAN_KEY).mkdir(parents=True)


def _link(store: Store, root: Path) -> None:
    store.delete(PLAN_KEY)
    _entry_path(root, PLAN_KEY).parent.mkdir(parents=True, exist_ok=True)
    _entry_path(root, PLAN_KEY).symlink_to(root.parent / "victim")


REPLACED: dict[str, Callable[[Store, Path], None]] = {
    "garbage": _garbage,
    "over 4 MiB": _huge,
    "four variants dated ahead": _dated_ahead,
    "a directory at its name": _directory,
    "a link at its name": _link,
}


@pytest.mark.parametrize("how", sorted(REPLACED))
def test_a_plan_replaced_during_the_run_is_written_over_with_the_runs_own(
    how: str, tmp_path: Path
) -> None:
    # Between the plan's read and this run's write, a writer puts something else at the
    # plan's key: the write reads it again, keeps it only as far as it is a plan (and never
    # newer than this run), and puts the run's variant; nothing outside the cache is touched.
    root = tmp_path / "cache"
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    seen = [_plan.Entry(_key(i), b"o", (0,)) for i in range(3)]
    with Store(root) as store:
        for e in seen:
            assert store.put(e.key + SUFFIX, b"executable")
        REPLACED[how](store, root)
        _writer(store, seen).write()
        blob = store.get(PLAN_KEY, count=False)
        assert blob is not None
        plan = _plan.decode(memoryview(blob))
    assert victim.read_bytes() == b"precious"
    assert 1 <= len(plan.variants) <= _plan.MAX_VARIANTS
    latest = max(plan.variants, key=lambda v: v.written)
    assert plan.variants[0] is latest and latest.entries == tuple(seen)


def test_a_read_only_session_writes_no_plan_whatever_it_read(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    seen = [_plan.Entry(_key(0), b"o", (0,))]
    with Store(root) as store:
        assert store.put(seen[0].key + SUFFIX, b"executable")
        assert store.replace(PLAN_KEY, b"garbage")
    before = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    with Store(root, read_only=True) as store:
        _writer(store, seen).write()
    after = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    assert after == before


def test_a_plan_is_kept_in_use_only_by_the_runs_that_read_what_it_holds(
    tmp_path: Path,
) -> None:
    # A plan that settled is never written again: a use recorded by each run that read what
    # it holds keeps it from being the first entry the budget evicts. A run that read none of
    # it (a planted plan naming other programs keeps nothing alive by being read), and a
    # read-only run, record none.
    root = tmp_path / "cache"
    mine = [_plan.Entry(_key(i), b"o", (0,)) for i in range(3)]
    plan = _plan.Plan((_plan.Variant(1.0, "cpu", 1, tuple(mine)),))

    def uses() -> int:
        with Store(root, read_only=True) as store:
            (entry,) = [e for e in store.entries() if str(e["key"]) == PLAN_KEY]
            return int(entry["hits"])

    with Store(root) as store:
        for e in mine:
            assert store.put(e.key + SUFFIX, b"executable")
        assert store.replace(PLAN_KEY, _plan.encode(plan))
    for read_only, seen in ((True, mine), (False, []), (False, mine)):
        with Store(root, read_only=read_only) as store:
            writer = _writer(store, seen)
            writer.bind(PLAN_KEY, "attacked", BUILD.digest, plan, "cpu", 1)
            assert not writer.dirty
            writer.close()
    # Once: only the writable run that read it.
    assert uses() == 1


# ----------------------------------------------------------------------------- builds


class _Counting:
    """A store that counts the lookups made of it (``key in store``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.path = store.path
        self.asked: list[str] = []

    def __contains__(self, key: object) -> bool:
        self.asked.append(str(key))
        return key in self.store


def test_a_planted_miss_log_costs_a_miss_a_bounded_number_of_lookups(tmp_path: Path) -> None:
    # The other builds a miss is compared with are learned from the miss log, which anyone
    # who can write the cache can fill: with thousands of made-up builds, a miss still asks
    # the store about at most 16 of them (and the bare key), and the log is read at most
    # once a minute. An entry of a real other build is then perhaps not found: the count
    # and explain's words are misled, nothing is loaded.
    root = tmp_path / "cache"
    with Store(root) as store:
        assert store.put(KEY + "@build-" + "e" * 32, b"another build's")
    lines = [
        json.dumps({"key": KEY + "@build-" + f"{i:032x}", "t": 1.0 + i, "module": "x"})
        for i in range(5000)
    ]
    (root / "misses.log").write_text("\n".join(lines) + "\n")
    other = builds.OtherBuilds(BUILD)
    with Store(root) as store:
        counting = _Counting(store)
        assert other.find(counting, KEY) is None
        assert len(counting.asked) == 1 + builds.OtherBuilds.MAX_BUILDS
        counting.asked.clear()
        assert other.find(counting, "jit_other-" + "0" * 64) is None
        assert len(counting.asked) == 1 + builds.OtherBuilds.MAX_BUILDS


# ----------------------------------------------------------------------------- what a read costs

# A trusting reader's get of the plan's key, in a fresh process: its peak memory (ru_maxrss,
# KiB) grown by the get, and what the get returned.
_TRUSTING_GET = """
import json, resource, sys
from xla_pcache import Store
root, key, name, public = sys.argv[1:]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with Store(root, trusted_keys=[(name, bytes.fromhex(public))]) as store:
    got = store.get(key, count=False)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"got": got is not None, "grown_kib": grown}))
"""


def test_a_planted_plan_of_any_size_costs_a_trusting_reader_its_header(tmp_path: Path) -> None:
    # A plan (or any entry) planted unsigned by another user: a file others can write, so a
    # trusting reader reads it into its own memory rather than mapping it. Its header says
    # no trusted key signed it, and that is all that is read: a 96 MiB plan does not raise
    # the reader's memory by 96 MiB at every process start.
    root = tmp_path / "cache"
    with Store(root) as store:
        assert store.put(PLAN_KEY, bytes(96 << 20), meta={"kind": _plan.META_KIND})
    planted = _entry_path(root, PLAN_KEY)
    os.chmod(planted, 0o664)  # another user's, writable by the group they share
    private = _core.generate_signing_key()
    public = _core.signing_public_key(private).hex()
    proc = subprocess.run(
        [sys.executable, "-c", _TRUSTING_GET, str(root), PLAN_KEY, "ci-1", public],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["got"] is False
    assert got["grown_kib"] < 16 << 10, got


def test_the_processes_of_one_job_write_its_plan_once(tmp_path: Path) -> None:
    # A fleet starts one job at once: its processes read the same programs and none found a
    # plan at its start. The first to write says it for all; the others find a variant
    # holding what they read when they read the plan again to write, and write nothing (no
    # put, the plan's file untouched). A run that read more, or another program, is
    # another write.
    root = tmp_path / "cache"
    seen = [_plan.Entry(_key(i), b"o", (0,)) for i in range(4)]
    other = [_plan.Entry(_key(i), b"o", (0,)) for i in range(100, 103)]
    with Store(root) as store:
        for e in seen + other:
            assert store.put(e.key + SUFFIX, b"executable")
        _writer(store, seen[:3]).write()
        after_first = store.stats()
        assert after_first["prefetch_plans_written"] == 1
        inode = _entry_path(root, PLAN_KEY).stat().st_ino
        late = [_writer(store, seen[:3]) for _ in range(3)]
        for writer in late:
            writer.write()
            assert not writer.dirty
        stats = store.stats()
        assert stats["prefetch_plans_written"] == 1 and stats["puts"] == after_first["puts"]
        assert _entry_path(root, PLAN_KEY).stat().st_ino == inode
        _writer(store, seen).write()
        _writer(store, other).write()
        _writer(store, seen[1:3]).write()
        assert store.stats()["prefetch_plans_written"] == 3
        blob = store.get(PLAN_KEY, count=False)
        assert blob is not None
        plan = _plan.decode(memoryview(blob))
    # The run that read all four replaced the variant of three it holds whole.
    assert [[e.key for e in v.entries] for v in plan.variants] == [
        [e.key for e in other],
        [e.key for e in seen],
    ]


def test_a_cold_run_writes_its_plan_once_after_its_last_compile(tmp_path: Path) -> None:
    # A cold run of a large program: each program's compile outlasts the quiet spell after
    # its read. A write after quiet while a program read is still compiling (its key not
    # stored yet) waits for it, so the plan is written once with every program, not once
    # per long compile; the exit's write takes what is stored then.
    seen = [_plan.Entry(_key(i), b"o", (0,)) for i in range(3)]
    with Store(tmp_path / "cache") as store:
        writer = _writer(store, seen)
        for e in seen[:2]:
            assert store.put(e.key + SUFFIX, b"executable")
        writer.write()  # the third still compiling
        assert store.stats()["prefetch_plans_written"] == 0 and writer.dirty
        assert store.put(seen[2].key + SUFFIX, b"executable")
        writer.write()
        assert store.stats()["prefetch_plans_written"] == 1 and not writer.dirty
        # At exit, a program still compiling is left out rather than waited for.
        late = _writer(store, [*seen, _plan.Entry(_key(9), b"o", (0,))])
        late.write(final=True)
        blob = store.get(PLAN_KEY, count=False)
        assert blob is not None
        keys = [[e.key for e in v.entries] for v in _plan.decode(memoryview(blob)).variants]
        assert keys == [[e.key for e in seen]]
