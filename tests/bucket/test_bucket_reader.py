"""The bucket's one reader, offline (``xla_pcache.bucket.reader``, its walk
``bucket.listing``): where a listing resumes after a key the client refuses (past no name
of ours), the key read back from the client's error, the
cutting of streamed text into lines, and the bounds every number read from a bucket meets.
Against a real S3 service: tests/bucket/test_hostile_bucket.py."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from xla_pcache.bucket import listing as bl
from xla_pcache.bucket import reader as br
from xla_pcache.sizes import MAX_DURATION_S, MAX_SIZE

# Characters that make a key refused or not, and their neighbours in key order.
_KEY_CHARS = st.sampled_from(["a", "0", "/", ".", " ", "-", "\x01", "\x1f", "\x7f", "\x80", "é"])
_KEYS = st.lists(_KEY_CHARS, min_size=1, max_size=12).map(lambda cs: "p/q/" + "".join(cs))


def test_what_the_client_refuses() -> None:
    for ok in ("a/b", "a/b/", "/a/b", "a/.b", "a/..b", "a/b c", "a/\x80"):
        assert br.parseable(ok), ok
    for bad in ("a//b", "a/./b", "a/../b", "a/.", "a/..", "a/b\x01", "a/\x7f", "a//"):
        assert not br.parseable(bad), bad


@given(_KEYS, _KEYS)
def test_a_listing_resumes_after_every_key_sharing_the_refused_start(key: str, other: str) -> None:
    """``resume_after``: the client can name it, it sorts after the refused key, and every
    key between the two is refused too (so resuming there skips nothing the client could
    list, and it is itself looked at alone)."""
    if br.parseable(key):
        return
    nxt = br.resume_after(key)
    assert nxt is not None
    assert br.parseable(nxt) and nxt > key
    if key < other < nxt:
        assert not br.parseable(other), (key, other, nxt)


def test_the_refused_key_is_read_back_from_the_clients_error() -> None:
    from obstore.exceptions import InvalidPathError

    key = 'p/entries/a"b\\c\n\x01\u200b/../x'
    debug = (
        'InvalidPath {\n    source: BadSegment {\n        path: "p/entries/a\\"b\\\\c\\n'
        '\\u{1}\\u{200b}/../x",\n    },\n}'
    )
    e = InvalidPathError(f"Encountered object with invalid path: ...\n\nDebug source:\n{debug}")
    assert br.refused_key(e) == key
    assert br.refused_key(ValueError('path: "x"')) is None
    assert br.refused_key(InvalidPathError("no key here")) is None


@given(
    st.lists(st.sampled_from([b"a" * 40, b"", b"b" * 300, b"c" * 128, b"d" * 129]), max_size=20),
    st.lists(st.integers(1, 200), min_size=1, max_size=10),
)
def test_streamed_text_is_cut_into_whole_lines_and_long_ones_dropped(
    lines: list[bytes], cuts: list[int]
) -> None:
    """Whatever the pieces, the blocks hold exactly the lines of at most ``MAX_LINE``
    bytes that fit in a block, and never keep more than ``MAX_LINE`` bytes between two."""
    text = b"".join(line + b"\n" for line in lines)
    blocks = br._Blocks()
    out = b""
    at = 0
    i = 0
    while at < len(text):
        n = cuts[i % len(cuts)]
        out += blocks.feed(text[at : at + n])
        assert len(blocks.pending) <= br.MAX_LINE
        at += n
        i += 1
    out += blocks.finish()
    got = out.split(b"\n")[:-1] if out else []
    # Every line kept is whole; a line over MAX_LINE is kept only when a block held it all.
    assert all(line in lines for line in got)
    assert [x for x in lines if len(x) <= br.MAX_LINE] == [x for x in got if len(x) <= br.MAX_LINE]


def test_numbers_read_from_a_bucket_meet_the_directorys_bounds() -> None:
    assert br.checked_size(MAX_SIZE) == MAX_SIZE
    for bad in (MAX_SIZE + 1, 10**400, 0, -1, True, 1.5, "5", None):
        assert br.checked_size(bad) is None, bad
    assert br.checked_size(0, zero=True) == 0 and br.checked_count(0) == 0
    assert br.checked_age(MAX_DURATION_S) == MAX_DURATION_S
    for bad in (MAX_DURATION_S * 2, 10**400, 0.5, math.inf, math.nan, False, "7"):
        assert br.checked_age(bad) is None, bad
    assert br.checked_time(1.0, now=100.0) == 1.0
    for bad in (-1.0, 100.0 + br.CLOCKS_APART_S + 1, math.nan, math.inf, 10**400):
        assert br.checked_time(bad, now=100.0) is None, bad


# Names of ours near a refused key: hex heads that share a start with it, and markers.
_DIGITS = st.sampled_from(list("0179af"))
_HEXISH = st.one_of(
    st.lists(_DIGITS, max_size=34), st.lists(_DIGITS, min_size=31, max_size=33)
).map("".join)
_TAILS = st.sampled_from(
    ["", "/", "//x", "/./x", "\x01", "\x01x", " ", "-", "-12", "-1\x01", "g", ":"]
)


def _near(rel: str) -> list[str]:
    """The 32-hex names around ``rel``: for each place in its run of hex digits, each digit
    there followed by the least and the greatest digits (the least name after ``rel`` is
    one of them)."""
    k = 0
    while k < min(32, len(rel)) and rel[k] in "0123456789abcdef":
        k += 1
    return [
        rel[:i] + c + fill * (31 - i)
        for i in range(min(k, 31) + 1)
        for c in "0123456789abcdef"
        for fill in "0f"
    ]


@given(_HEXISH, _TAILS)
def test_a_skip_passes_no_name_of_ours(head: str, tail: str) -> None:
    """``Names.skip``: the listing resumes at or after the refused key, past no entry name
    or marker that sorts after it, and asks by name for the offset only when it may be
    one; ``first_after`` is never past the least name of ours after a key."""
    rel = head + tail
    if bl.parseable("d/" + rel):
        return
    for names, make in (
        (bl.Names(hex=True, exact=True), lambda h: [h]),
        (bl.Names(hex=True, exact=False), lambda h: [f"{h}-0", f"{h}-12", f"{h}-9"]),
    ):
        got = names.skip(rel)
        ours = sorted(n for h in _near(rel) for n in make(h) if n > rel)
        first = names.first_after(rel)
        if got is None:
            assert not ours, (rel, ours)
            continue
        offset, ask = got
        assert offset > rel
        for n in ours:
            assert n > offset or (n == offset and ask), (rel, offset, n)
            assert first is not None and first <= n, (rel, first, n)
    records = bl.Names(hex=False, lead="r-")
    got = records.skip(rel)
    if rel < "r-":
        assert got is not None and got[0] <= "r-0"


def test_the_next_entry_name_after_a_key() -> None:
    assert bl.head_after("") == "0" * 32
    assert bl.head_after("ab/x") == "ab" + "0" * 30
    assert bl.head_after("ab:") == "aba" + "0" * 29
    assert bl.head_after("abz") == "ac" + "0" * 30
    assert bl.head_after("f" * 32 + "\x01") is None
    assert bl.head_after("0" * 31 + "1/x") == "0" * 31 + "2"
