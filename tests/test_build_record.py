"""The user's record of binaries' identities (``_core.identify_binaries``, rust/core/src/
build_id/), attacked: a record planted where someone else could have written it, a link,
a FIFO, another owner, a mode others may write, garbage, a huge file. Each is refused (a
hostile one never read nor written) or rebuilt (a garbled one of ours), with one warning,
and never trusted: the identity is the file's own. The record of the user's own, in a
directory of theirs, is what spares the hash of a later process."""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash
from xla_pcache import _core

# The record's layout (build_id/record.rs): magic, version, count, slots of 112 bytes, xxh3-64.
MAGIC = b"xpcbrec\0"


def _record(slots: list[tuple[os.stat_result, bytes]]) -> bytes:
    out = MAGIC + struct.pack("<II", 1, len(slots))
    for st, ident in slots:
        out += struct.pack(
            "<QQQQQBB6x", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, 2, 32
        )
        out += ident.ljust(64, b"\0")
    return out + struct.pack("<Q", xxhash.xxh3_64_intdigest(out))


def _identify(path: Path, record: Path) -> tuple[str, bool, int]:
    """(hex id, hashed now, refusals) of one file."""
    (got,), problems, _ = _core.identify_binaries([str(path)], str(record))
    assert not isinstance(got, str), got
    kind, hexid, _changed, computed, loaded, size = got
    assert size == path.stat().st_size
    assert (kind, loaded) == ("blake3", "no")
    return hexid, computed, problems


LIE = bytes(range(32))


def _plant(record: Path, lib: Path) -> None:
    record.mkdir(mode=0o700, exist_ok=True)
    (record / "record").write_bytes(_record([(os.stat(lib), LIE)]))
    os.chmod(record / "record", 0o600)


def _fifo(d: Path) -> None:
    (d / "record").unlink()
    os.mkfifo(d / "record", 0o600)


def _link_file(d: Path) -> None:
    (d / "record").rename(d.parent / "elsewhere")
    (d / "record").symlink_to(d.parent / "elsewhere")


def _link_dir(d: Path) -> None:
    d.rename(d.parent / "real")
    d.symlink_to(d.parent / "real")


def _huge(d: Path) -> None:
    with open(d / "record", "r+b") as f:
        f.truncate(1 << 40)


HOSTILE: dict[str, Callable[[Path], None]] = {
    "planted in a directory others may write": lambda d: os.chmod(d, 0o777),
    "a record others may write": lambda d: os.chmod(d / "record", 0o666),
    "a link to a record": _link_file,
    "a directory that is a link": _link_dir,
    "a FIFO": _fifo,
}
GARBLED: dict[str, Callable[[Path], None]] = {
    "garbage": lambda d: (d / "record").write_bytes(os.urandom(5000)),
    "huge (sparse)": _huge,
    "truncated": lambda d: os.truncate(d / "record", 20),
    "a slot changed under its checksum": lambda d: (d / "record").write_bytes(
        (lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:])((d / "record").read_bytes())
    ),
}


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    p = tmp_path / "libframework.so"
    p.write_bytes(b"\x7fELF but not really; the bytes of a framework binary" * 1000)
    return p


def test_the_users_own_record_spares_the_hash(lib: Path, tmp_path: Path) -> None:
    record = tmp_path / "record"
    truth, computed, problems = _identify(lib, record)
    assert (computed, problems) == (True, 0)
    assert oct(record.stat().st_mode & 0o777) == oct(0o700)
    assert oct((record / "record").stat().st_mode & 0o777) == oct(0o600)
    assert _identify(lib, record) == (truth, False, 0)
    # A record of this user's, in a directory of theirs, is theirs: what it says is used.
    _plant(record, lib)
    assert _identify(lib, record) == (LIE.hex(), False, 0)


def _spoiled(spoil: Callable[[Path], None], lib: Path, tmp_path: Path) -> tuple[Path, str]:
    """A record of ``lib``'s identity, then spoiled by ``spoil``; and the file's own
    identity (computed with a clean record)."""
    record = tmp_path / "record"
    truth = _identify(lib, tmp_path / "clean")[0]
    _plant(record, lib)
    spoil(record)
    return record, truth


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_a_hostile_record_is_refused_and_left(
    how: str, lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record, truth = _spoiled(HOSTILE[how], lib, tmp_path)
    before = sorted(os.listdir(record))
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        assert _identify(lib, record) == (truth, True, 1)
    warned = [r for r in caplog.records if "identities" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    # Never written: the next process refuses it again and hashes again.
    assert sorted(os.listdir(record)) == before
    assert _identify(lib, record) == (truth, True, 1)


@pytest.mark.parametrize("how", sorted(GARBLED))
def test_a_garbled_record_is_rebuilt(
    how: str, lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record, truth = _spoiled(GARBLED[how], lib, tmp_path)
    with caplog.at_level(logging.WARNING, logger="xla_pcache"):
        assert _identify(lib, record) == (truth, True, 1)
    assert len([r for r in caplog.records if "identities" in r.getMessage()]) == 1
    # Rebuilt with the file's own identity: the next process reads it from there.
    assert _identify(lib, record) == (truth, False, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
@pytest.mark.parametrize("what", ["record", "directory"])
def test_a_record_of_another_owner_is_refused(what: str, lib: Path, tmp_path: Path) -> None:
    record = tmp_path / "record"
    truth = _identify(lib, tmp_path / "clean")[0]
    _plant(record, lib)
    os.chown(record / "record" if what == "record" else record, 4242, 4242)
    assert _identify(lib, record) == (truth, True, 1)


def test_a_file_that_cannot_be_read_is_said_not_raised(tmp_path: Path) -> None:
    (got, missing), problems, _ = _core.identify_binaries(
        [str(tmp_path), str(tmp_path / "absent.so")], str(tmp_path / "record")
    )
    assert isinstance(got, str) and "not a regular file" in got
    assert isinstance(missing, str) and "absent.so" in missing
    assert problems == 0


def test_a_binary_rewritten_with_its_size_and_mtime_kept_is_identified_again(
    lib: Path, tmp_path: Path
) -> None:
    # A reinstall (or a swap) that keeps the file's inode, size and mtime, with other
    # content: its ctime moved, which nobody can set back, so the record's shortcut no
    # longer holds and the file is hashed again. The same for another file renamed into its
    # place with the old mtime (a new inode).
    record = tmp_path / "record"
    first, computed, _ = _identify(lib, record)
    assert computed
    st = lib.stat()
    time.sleep(0.05)  # past the coarse clock the kernel stamps ctime with
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF
    with open(lib, "r+b") as f:
        f.write(data)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = lib.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )
    second, computed, _ = _identify(lib, record)
    assert computed and second != first
    time.sleep(0.05)
    swapped = tmp_path / "swapped.so"
    swapped.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))
    os.utime(swapped, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(swapped, lib)
    third, computed, _ = _identify(lib, record)
    assert computed and third == first
