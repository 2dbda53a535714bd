"""The warm-start plan's format (``xla_pcache.jax.ahead._plan``): what is written reads back, and
what is read is untrusted: anything but a plan of the module's own shape and bounds is refused
whole, before it can name a single entry. No JAX needed: these are bytes."""

from __future__ import annotations

import base64
import dataclasses
import json
import re

import pytest
from xla_pcache.jax.ahead import _plan

KEY = "jit_step-" + "ab" * 32


def _key(i: int, module: str = "jit_step") -> str:
    return f"{module}_{i}-" + f"{i:064x}"


def _variant(
    n: int, written: float = 1.0, start: int = 0, platform: str = "tpu", count: int = 2
) -> _plan.Variant:
    # Timings as a run measures them: when each was read, its size, and (for some) what
    # its read cost the main thread.
    entries = tuple(
        _plan.Entry(
            _key(i),
            b"options-%d" % (i % 3),
            (0,) if i % 2 else (0, 1),
            at_us=i * 1000,
            size=1000 + i,
            read_us=None if i % 2 else 50 + i,
        )
        for i in range(start, start + n)
    )
    return _plan.Variant(written, platform, count, entries)


def _doc(**variant: object) -> bytes:
    base: dict[str, object] = {
        "written": 1.0,
        "platform": "cpu",
        "device_count": 1,
        "options": [base64.b64encode(b"opts").decode()],
        "devices": [[0]],
        "entries": [[KEY, 0, 0, None, None, None]],
    }
    base.update(variant)
    return json.dumps(
        {"format": _plan.FORMAT, "version": _plan.VERSION, "variants": [base]}
    ).encode()


def _entries(*entries: list[object]) -> bytes:
    """A plan of these entries, each without timings unless it has its own."""
    return _doc(entries=[e if len(e) == 6 else [*e, None, None, None] for e in entries])


def test_what_is_written_reads_back_with_options_and_devices_kept_once() -> None:
    plan = _plan.Plan((_variant(10),))
    data = _plan.encode(plan)
    doc = json.loads(data)
    assert len(doc["variants"][0]["options"]) == 3 and len(doc["variants"][0]["devices"]) == 2
    assert _plan.decode(data) == plan
    assert _plan.decode(memoryview(data)) == plan
    # Each entry's timings read back, the unmeasured ones as None.
    entries = _plan.decode(data).variants[0].entries
    assert [(e.at_us, e.size, e.read_us) for e in entries[:2]] == [
        (0, 1000, 50),
        (1000, 1001, None),
    ]


def test_timings_out_of_their_bounds_are_not_written_and_what_a_run_missed_is_carried() -> None:
    odd = _plan.Entry(KEY, b"", (0,), at_us=-1, size=_plan.MAX_SIZE + 1, read_us=7)
    (kept,) = _plan.bounded(_plan.Variant(1.0, "cpu", 1, (odd,))).entries
    assert (kept.at_us, kept.size, kept.read_us) == (None, None, 7)
    # A run served from loading ahead measures no read on the main thread, a miss no
    # size: a variant it writes keeps what the stored plan measured of its keys.
    stored = _plan.Plan((_variant(4),))
    fresh = tuple(
        _plan.Entry(e.key, e.options, e.devices, at_us=9) for e in stored.variants[0].entries
    )
    carried = _plan.carried(fresh, stored)
    assert [(e.at_us, e.size, e.read_us) for e in carried[:2]] == [(9, 1000, 50), (9, 1001, None)]
    assert _plan.carried(fresh, None) == fresh


def test_a_variant_per_program_a_run_that_read_no_more_writes_nothing() -> None:
    a, b = _variant(4, written=10.0), _variant(4, written=20.0, start=100)
    plan = _plan.merged(_plan.merged(None, a), b)
    assert plan.variants == (b, a)
    # The same program again, or stopped early, or run with loading ahead off in between:
    # what it read is held by a variant, there is nothing to write.
    assert _plan.covers(plan, a) and _plan.covers(plan, b)
    assert _plan.covers(plan, dataclasses.replace(a, entries=a.entries[:2], written=99.0))
    # Not on another platform or device count, nor a run that read more.
    assert not _plan.covers(plan, dataclasses.replace(a, platform="cpu"))
    assert not _plan.covers(plan, dataclasses.replace(a, device_count=8))
    assert not _plan.covers(plan, _variant(5, written=30.0))
    assert not _plan.covers(None, a)
    # A run that read more than an earlier one of its program replaces it; one of another
    # platform is kept beside it.
    longer = _variant(6, written=30.0)
    elsewhere = dataclasses.replace(a, platform="cpu", written=5.0)
    plan = _plan.merged(_plan.Plan((*plan.variants, elsewhere)), longer)
    assert plan.variants == (longer, b, elsewhere)
    # At most MAX_VARIANTS, the oldest written out.
    for i in range(20):
        plan = _plan.merged(plan, _variant(1, written=100.0 + i, start=1000 + i))
    assert len(plan.variants) == _plan.MAX_VARIANTS
    assert [v.entries[0].key for v in plan.variants] == [_key(1000 + i) for i in range(19, 3, -1)]
    assert _plan.decode(_plan.encode(plan)) == plan
    assert _plan.Plan(()).on("tpu", 2) == ()


def test_a_run_that_read_more_than_a_plan_holds_keeps_its_start() -> None:
    big = _variant(_plan.MAX_ENTRIES + 50)
    kept = _plan.bounded(big)
    assert kept.entries == big.entries[: _plan.MAX_ENTRIES]
    # Entries no plan may hold are left out (a key of another form, oversized options).
    odd = _plan.Variant(
        1.0,
        "cpu",
        1,
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
        1.0,
        "cpu",
        1,
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
        # Earlier versions' plans live under other keys; one found under this version's
        # is refused, not read (version 3 had no timings).
        (
            json.dumps(
                {"format": _plan.FORMAT, "version": _plan.VERSION - 1, "variants": []}
            ).encode(),
            "version",
        ),
        (
            json.dumps(
                {"format": _plan.FORMAT, "version": _plan.VERSION, "variants": [], "x": 1}
            ).encode(),
            "version",
        ),
        (
            json.dumps(
                {"format": _plan.FORMAT, "version": _plan.VERSION, "variants": [{}] * 17}
            ).encode(),
            "more than",
        ),
        (_entries(*[[_key(i), 0, 0] for i in range(_plan.MAX_ENTRIES + 1)]), "more than"),
        (_entries(["../../etc/passwd", 0, 0]), "not a JAX cache key"),
        (_entries(["jit_f-" + "0" * 63 + "\n", 0, 0]), "not a JAX cache key"),
        (_entries([KEY, 0, 0], [KEY, 0, 0]), "twice"),
        (_entries([KEY, 1, 0]), "not an index"),
        (_entries([KEY, 0, -1]), "not an index"),
        (_entries([KEY, True, 0]), "not an index"),
        (_doc(entries=[[KEY, 0]]), "not [key"),
        (_doc(entries=[[KEY, 0, 0]]), "not [key"),
        (_doc(entries=[[KEY, 0, 0, None, None, None, None]]), "not [key"),
        # Timings: counts within their bounds, or null; anything else refuses the plan.
        (_entries([KEY, 0, 0, -1, None, None]), "an entry's time"),
        (_entries([KEY, 0, 0, _plan.MAX_AT_US + 1, None, None]), "an entry's time"),
        (_entries([KEY, 0, 0, 1.5, None, None]), "an entry's time"),
        (_entries([KEY, 0, 0, True, None, None]), "an entry's time"),
        (_entries([KEY, 0, 0, "1", None, None]), "an entry's time"),
        (_entries([KEY, 0, 0, None, _plan.MAX_SIZE + 1, None]), "an entry's size"),
        (_entries([KEY, 0, 0, None, [1], None]), "an entry's size"),
        (_entries([KEY, 0, 0, None, None, _plan.MAX_READ_US + 1]), "an entry's read cost"),
        (_entries([KEY, 0, 0, None, None, 10**400]), "an entry's read cost"),
        (_entries([KEY, 0, 0, None, None, float("inf")]), "an entry's read cost"),
        (_doc(options=["not base64!"]), "base64"),
        (_doc(options=["A" * (_plan.MAX_OPTION_BYTES * 2)]), "compile options over"),
        (_doc(devices=[[-1]]), "device id"),
        (_doc(devices=[[2**40]]), "device id"),
        (_doc(devices=[["0"]]), "device id"),
        (_doc(platform="../x"), "platform"),
        (_doc(platform=""), "platform"),
        (_doc(platform=7), "platform"),
        (_doc(device_count=0), "count of devices"),
        (_doc(device_count=True), "count of devices"),
        (_doc(device_count=_plan.MAX_DEVICES + 1), "count of devices"),
        (_doc(written=float("nan")), "time"),
        (_doc(written=-5), "time"),
        (_doc(extra=1), "fields"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_anything_else_is_refused_whole(data: bytes, why: str) -> None:
    with pytest.raises(_plan.PlanError, match=re.escape(why)):
        _plan.decode(data)


def test_valid_keys_are_jax_keys() -> None:
    assert _plan.valid_key(KEY)
    assert _plan.valid_key("jit__lambda-" + "0" * 64)
    assert _plan.valid_key("pjit_ünïcode-" + "f" * 64)
    for bad in ("", KEY[:-1], KEY.upper(), "jit f-" + "0" * 64, "x" * 2000 + "-" + "0" * 64, 7):
        assert not _plan.valid_key(bad), bad


def test_a_run_is_recognised_by_what_it_reads() -> None:
    from xla_pcache.jax.ahead._recognition import Recognition

    # Three programs of one entry point on a TPU of two devices, sharing keys 0 and 1, and
    # one of another platform; A and B also share 10.
    def variant(keys: list[int], written: float, platform: str = "tpu") -> _plan.Variant:
        entries = tuple(_plan.Entry(_key(i), b"o", (0, 1)) for i in keys)
        return _plan.Variant(written, platform, 2, entries)

    a = variant([0, 1, 10, 11, 12], 3.0)
    b = variant([1, 0, 10, 20, 21], 2.0)
    c = variant([0, 1, 30], 1.0)
    gpu = variant([0, 1, 10, 11, 12, 40], 4.0, "gpu")
    recog = Recognition([a, b, c, gpu])
    # Before the backend is up: what every variant holds, in the newest one's order.
    assert [e.key for e in recog.wanted()] == [_key(0), _key(1)]
    recog.restrict("tpu", 2)
    assert recog.candidates == 3 and recog.reference() == a
    assert not recog.observe(_key(0))  # every candidate holds it
    assert not recog.observe(_key(99))  # none does: a new program narrows nothing
    assert recog.observe(_key(10)) and recog.candidates == 2
    assert [e.key for e in recog.wanted()] == [_key(i) for i in (0, 1, 10)]
    assert recog.order()[_key(10)] == 2
    # One left: its whole list, in its own order.
    assert recog.observe(_key(20)) and recog.candidates == 1
    assert [e.key for e in recog.wanted()] == [_key(i) for i in (1, 0, 10, 20, 21)]
    assert not recog.observe(_key(11))  # read after: B is kept
    # No variant of this platform: nothing is wanted.
    other = Recognition([a, b])
    other.restrict("cpu", 1)
    assert other.wanted() == [] and other.reference() is None and other.order() == {}
