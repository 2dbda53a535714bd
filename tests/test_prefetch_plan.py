"""The warm-start plan's format (``xla_pcache.jax._plan``): what is written reads back, and
what is read is untrusted: anything but a plan of the module's own shape and bounds is refused
whole, before it can name a single entry. No JAX needed: these are bytes."""

from __future__ import annotations

import base64
import json
import re
import sys

import pytest
from xla_pcache.jax import _plan

KEY = "jit_step-" + "ab" * 32


def _key(i: int, module: str = "jit_step") -> str:
    return f"{module}_{i}-" + f"{i:064x}"


def _variant(n: int, args: str = "0" * 32, written: float = 1.0) -> _plan.Variant:
    entries = tuple(
        _plan.Entry(_key(i), b"options-%d" % (i % 3), (0,) if i % 2 else (0, 1)) for i in range(n)
    )
    return _plan.Variant(args, written, entries)


def _doc(**variant: object) -> bytes:
    base: dict[str, object] = {
        "args": "0" * 32,
        "written": 1.0,
        "options": [base64.b64encode(b"opts").decode()],
        "devices": [[0]],
        "entries": [[KEY, 0, 0]],
    }
    base.update(variant)
    return json.dumps({"format": _plan.FORMAT, "version": 1, "variants": [base]}).encode()


def test_what_is_written_reads_back_with_options_and_devices_kept_once() -> None:
    plan = _plan.Plan((_variant(10),))
    data = _plan.encode(plan)
    doc = json.loads(data)
    assert len(doc["variants"][0]["options"]) == 3 and len(doc["variants"][0]["devices"]) == 2
    assert _plan.decode(data) == plan
    assert _plan.decode(memoryview(data)) == plan


def test_a_variant_per_argument_set_the_latest_written_when_none_matches() -> None:
    a, b = "a" * 32, "b" * 32
    plan = _plan.merged(None, _variant(2, a, written=10.0))
    plan = _plan.merged(plan, _variant(3, b, written=20.0))
    assert plan.choose(a) is not None and len(plan.choose(a).entries) == 2  # type: ignore[union-attr]
    assert len(plan.choose("c" * 32).entries) == 3  # type: ignore[union-attr]
    # A new run of a's arguments replaces a's variant; at most MAX_VARIANTS, oldest out.
    plan = _plan.merged(plan, _variant(4, a, written=30.0))
    assert len(plan.variants) == 2 and len(plan.choose(a).entries) == 4  # type: ignore[union-attr]
    for i in range(10):
        plan = _plan.merged(plan, _variant(1, f"{i:032x}", written=100.0 + i))
    assert len(plan.variants) == _plan.MAX_VARIANTS
    assert {v.args for v in plan.variants} == {f"{i:032x}" for i in range(6, 10)}
    assert _plan.decode(_plan.encode(plan)) == plan
    assert _plan.Plan(()).choose(a) is None


def test_a_run_that_read_more_than_a_plan_holds_keeps_its_start() -> None:
    big = _variant(_plan.MAX_ENTRIES + 50)
    kept = _plan.bounded(big)
    assert kept.entries == big.entries[: _plan.MAX_ENTRIES]
    # Entries no plan may hold are left out (a key of another form, oversized options).
    odd = _plan.Variant(
        "0" * 32,
        1.0,
        (
            _plan.Entry("not a key", b"", ()),
            _plan.Entry(KEY, b"x" * (_plan.MAX_OPTION_BYTES + 1), ()),
            _plan.Entry(_key(1), b"", (-1,)),
            _plan.Entry(_key(2), b"", (3,)),
        ),
    )
    assert [e.key for e in _plan.bounded(odd).entries] == [_key(2)]
    # Whatever is kept fits the byte bound: large options are cut down to it.
    wide = _plan.Variant(
        "0" * 32,
        1.0,
        tuple(_plan.Entry(_key(i), bytes([i]) * (200 << 10), ()) for i in range(40)),
    )
    data = _plan.encode(_plan.Plan((wide,)))
    assert len(data) <= _plan.MAX_PLAN_BYTES
    assert 0 < len(_plan.decode(data).variants[0].entries) < 40


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"x" * (_plan.MAX_PLAN_BYTES + 1), "more than"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (b"{}", "not a prefetch plan"),
        (json.dumps({"format": _plan.FORMAT, "version": 2, "variants": []}).encode(), "version"),
        (
            json.dumps({"format": _plan.FORMAT, "version": 1, "variants": [], "x": 1}).encode(),
            "version",
        ),
        (
            json.dumps({"format": _plan.FORMAT, "version": 1, "variants": [{}] * 5}).encode(),
            "more than",
        ),
        (_doc(entries=[[_key(i), 0, 0] for i in range(_plan.MAX_ENTRIES + 1)]), "more than"),
        (_doc(entries=[["../../etc/passwd", 0, 0]]), "not a JAX cache key"),
        (_doc(entries=[["jit_f-" + "0" * 63 + "\n", 0, 0]]), "not a JAX cache key"),
        (_doc(entries=[[KEY, 0, 0], [KEY, 0, 0]]), "twice"),
        (_doc(entries=[[KEY, 1, 0]]), "not an index"),
        (_doc(entries=[[KEY, 0, -1]]), "not an index"),
        (_doc(entries=[[KEY, True, 0]]), "not an index"),
        (_doc(entries=[[KEY, 0]]), "not [key"),
        (_doc(options=["not base64!"]), "base64"),
        (_doc(options=["A" * (_plan.MAX_OPTION_BYTES * 2)]), "compile options over"),
        (_doc(devices=[[-1]]), "device id"),
        (_doc(devices=[[2**40]]), "device id"),
        (_doc(devices=[["0"]]), "device id"),
        (_doc(args="../x"), "digest"),
        (_doc(written=float("nan")), "time"),
        (_doc(written=-5), "time"),
        (_doc(extra=1), "fields"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_anything_else_is_refused_whole(data: bytes, why: str) -> None:
    with pytest.raises(_plan.PlanError, match=re.escape(why)):
        _plan.decode(data)


def test_two_variants_of_one_argument_set_are_refused() -> None:
    one = json.loads(_doc())["variants"][0]
    doc = {"format": _plan.FORMAT, "version": 1, "variants": [one, one]}
    with pytest.raises(_plan.PlanError, match="two variants"):
        _plan.decode(json.dumps(doc).encode())


def test_valid_keys_are_jax_keys() -> None:
    assert _plan.valid_key(KEY)
    assert _plan.valid_key("jit__lambda-" + "0" * 64)
    assert _plan.valid_key("pjit_ünïcode-" + "f" * 64)
    for bad in ("", KEY[:-1], KEY.upper(), "jit f-" + "0" * 64, "x" * 2000 + "-" + "0" * 64, 7):
        assert not _plan.valid_key(bad), bad


def test_workload_names_separate_what_makes_a_plan_unusable_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    monkeypatch.setattr(sys, "argv", ["/srv/train.py", "--steps", "10"])
    assert _plan.entry_point() == ("script /srv/train.py", ["--steps", "10"])
    monkeypatch.setattr(sys, "argv", ["-c", "x"])
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-c", "print(1)", "x"])
    code, args = _plan.entry_point()
    assert code.startswith("code ") and args == ["x"]
    names = {
        _plan.workload(None, "0.10.2", "tpu", 8, 0),
        _plan.workload(None, "0.10.2", "tpu", 4, 0),
        _plan.workload(None, "0.10.2", "tpu", 8, 1),
        _plan.workload(None, "0.10.2", "cpu", 8, 0),
        _plan.workload(None, "0.12.0", "tpu", 8, 0),
        _plan.workload("lm", "0.10.2", "tpu", 8, 0),
    }
    assert len(names) == 6 and len({_plan.plan_key(n) for n in names}) == 6
    assert all(_plan.plan_key(n).startswith(_plan.KEY_PREFIX) for n in names)
    assert not _plan.valid_key(_plan.plan_key(next(iter(names))))
    assert _plan.args_digest(["a", "b"]) != _plan.args_digest(["ab"])
