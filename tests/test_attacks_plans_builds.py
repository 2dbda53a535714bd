"""Loading-ahead plans and the runtime's build, attacked by someone who can write the cache
directory (or its bucket, or a shared disk) but holds no signing key and is not the victim:
what each attack gets, at the level of the module that owns the rule. No JAX is started here
(the plan is bytes, the build a digest of files, the store a real one in a temporary
directory); the real-JAX ends of the same attacks are in tests/jax/test_prefetch.py and
tests/jax/test_builds.py, the record's own in tests/test_build_record.py.

The victim, throughout, trusts no key unless the test says so: a key-less writer can then
plant executables too, so what a plan adds is cost (bounded), never a wrong executable for a
read (``_prefetch`` hands out only what the read's own key, options and devices name)."""

from __future__ import annotations

import json
import time

from xla_pcache.jax import _plan


def _key(i: int) -> str:
    return f"jit_step_{i}-" + f"{i:064x}"


def _variant(args: str, written: float, keys: range) -> _plan.Variant:
    return _plan.Variant(args, written, tuple(_plan.Entry(_key(i), b"o", (0,)) for i in keys))


def test_a_variant_dated_in_the_future_is_chosen_once_not_for_ever() -> None:
    # A writer plants a plan whose only variant is dated a century ahead, under arguments no
    # run uses. A run of new arguments (an output directory, a timestamp) takes the latest
    # variant: the planted one, once. It reads its own programs, diverges and writes its
    # variant; the planted one stays among the others but is never newer than that write, so
    # the next run of new arguments takes the run's variant, not the planted one again.
    future = time.time() + 100 * 365 * 86400
    planted = _plan.Plan((_variant("f" * 32, future, range(100, 200)),))
    plan = _plan.decode(_plan.encode(planted))
    assert plan.choose("a" * 32) == plan.variants[0]
    mine = _variant("a" * 32, time.time(), range(5))
    rewritten = _plan.decode(_plan.encode(_plan.merged(plan, mine)))
    assert {v.args for v in rewritten.variants} == {"a" * 32, "f" * 32}
    latest = rewritten.choose("b" * 32)
    assert latest.entries == mine.entries
    assert all(v.written <= latest.written for v in rewritten.variants)
    # Written in JSON with its date as the attacker chose it: the same.
    raw = json.loads(_plan.encode(planted))
    raw["variants"][0]["written"] = 1e300
    plan = _plan.decode(json.dumps(raw).encode())
    assert _plan.merged(plan, mine).choose("c" * 32).entries == mine.entries
