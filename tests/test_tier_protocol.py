"""The tier protocol between the store and its chain, with a tier in this process: a put hands
the tiers the bytes it wrote, a fetch hands each value to the core's ``Accept``, which refuses
what is not a whole entry of the key and names what to backfill under."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xla_pcache import Store, _core
from xla_pcache.tiers.chain import Chain, _Slot, open_chain
from xla_pcache.tiers.read_only import ReadOnlyTier


class _Recording:
    """A tier whose server is a dict; records what it is asked."""

    url = "redis://recording"

    def __init__(self, values: dict[str, bytes] | None = None) -> None:
        self.values = dict(values or {})
        self.puts: list[tuple[str, bytes, bool]] = []

    def get(self, name: str, *, max_bytes: int | None = None, spool: Any = None) -> Any:
        return self.values.get(name)

    def put_async(self, name: str, data: Any, *, replace: bool = False, own: bool = False) -> None:
        self.puts.append((name, bytes(data), replace))
        self.values[name] = bytes(data)

    def stats(self) -> dict[str, int | str]:
        return {"remote": self.url}

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _with_tiers(store: Store, *tiers: _Recording | ReadOnlyTier) -> Chain:
    chain = Chain([_Slot(t) for t in tiers])  # type: ignore[arg-type]
    chain.persist_counters(store)
    store._chain = chain
    return chain


def test_a_put_hands_the_tier_the_entry_file_it_wrote(tmp_path: Path) -> None:
    private = _core.generate_signing_key()
    store = Store(tmp_path / "c", remote="redis://unused:1/0", signing_key=("ci-1", private))
    tier = _Recording()
    _with_tiers(store, tier)
    assert store.put("k", b"payload")
    plain, own = _core.entry_name("k"), _core.signed_entry_name("k", "ci-1")
    assert [(n, r) for n, _, r in tier.puts] == [(plain, False), (own, True)]
    assert tier.puts[0][1] == store.get_entry_file("k") == tier.puts[1][1]
    # Unsigned (sign=False): the plain name only.
    assert store.put("u", b"x", sign=False)
    assert [n for n, _, _ in tier.puts[2:]] == [_core.entry_name("u")]
    store.close()


def test_a_fetch_takes_the_first_whole_entry_and_backfills_the_tiers_before(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "w") as w:
        assert w.put("k", b"payload")
        good = w.get_entry_file("k")
    assert good is not None
    name = _core.entry_name("k")
    front = _Recording({name: good[:-1]})  # cut short: refused
    ro = _Recording()
    back = _Recording({name: good})
    store = Store(tmp_path / "r", remote="redis://unused:1/0")
    _with_tiers(store, front, ReadOnlyTier(ro), back)  # type: ignore[arg-type]
    blob = store.get("k")
    assert blob is not None and bytes(blob) == b"payload"
    assert "k" in store  # published locally
    store._chain.flush()  # type: ignore[union-attr]
    assert front.puts == [(name, good, False)] and ro.puts == []  # backfilled, ro untouched
    st = store.stats()
    assert st["remote_hits"] == 1 and st["remote_rejected"] == 1, st
    store.close()


def test_a_read_only_store_takes_a_value_and_names_nothing_to_backfill(tmp_path: Path) -> None:
    with Store(tmp_path / "w") as w:
        assert w.put("k", b"payload")
        good = w.get_entry_file("k")
    assert good is not None
    Store(tmp_path / "r").close()
    front = _Recording()
    back = _Recording({_core.entry_name("k"): good})
    store = Store(tmp_path / "r", remote="redis://unused:1/0", read_only=True)
    _with_tiers(store, front, back)
    blob = store.get("k")
    assert blob is not None and bytes(blob) == b"payload"
    assert front.puts == [] and "k" not in store
    store.close()


def test_replace_tells_the_tiers_to_overwrite_and_the_next_put_does_not(tmp_path: Path) -> None:
    """``Store.replace`` hands its copy to the tiers with ``replace`` set (the plain name's
    object is overwritten), a put before or after it without (only created there)."""
    private = _core.generate_signing_key()
    store = Store(tmp_path / "c", remote="redis://unused:1/0", signing_key=("ci-1", private))
    tier = _Recording()
    _with_tiers(store, tier)
    plain = _core.entry_name("k")
    assert store.put("k", b"one")
    assert store.replace("k", b"two")
    assert store.put("j", b"three")
    assert [(n, r) for n, _, r in tier.puts if n == plain] == [(plain, False), (plain, True)]
    assert [r for n, _, r in tier.puts if n == _core.entry_name("j")] == [False]
    assert bytes(store.get("k") or b"") == b"two"
    store.close()


def test_a_tier_marked_read_only_is_opened_as_one_that_cannot_write() -> None:
    """``?ro=1`` is read once, where the chain opens its tiers: that tier is a
    ``ReadOnlyTier``, with no write to call, and the chain still reports it read-only."""
    chain = open_chain("redis://127.0.0.1:1/0?ro=1,redis://127.0.0.1:1/1")
    ro, rw = chain.tiers
    assert isinstance(ro, ReadOnlyTier) and not isinstance(rw, ReadOnlyTier)
    for write in ("put_async", "submit", "claims"):
        assert not hasattr(ro, write), write
    assert [t["read_only"] for t in chain.describe()] == [True, False]
    assert chain.url.split(",")[0].endswith("?ro=1")
    chain.close()


def test_a_read_only_tier_written_nothing_by_a_put_or_a_backfill(tmp_path: Path) -> None:
    """A put writes through to the tiers that can be written; a ``ReadOnlyTier`` gets
    nothing, and nothing is counted for it."""
    inner = _Recording()
    store = Store(tmp_path / "c", remote="redis://unused:1/0")
    rw = _Recording()
    _with_tiers(store, ReadOnlyTier(inner), rw)  # type: ignore[arg-type]
    assert store.put("k", b"payload")
    assert inner.puts == [] and [n for n, _, _ in rw.puts] == [_core.entry_name("k")]
    st = store.stats()
    assert st.get("tier1_backfills") == 0 and st.get("tier1_puts") == 0, st
    store.close()
