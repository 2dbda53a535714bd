"""Bundles: a cache's verified entries in one file, to warm a fresh machine or image.

The format is a gzip-compressed tar (stdlib ``tarfile``): readable by any tool, streamable,
and no new dependency. Each member is one whole entry file (header, key, metadata, checksums,
payload) named by the name of the file it was in (its key's plain name, or a signer's own
name for the key, so two entries of one key, such as a squatter's plain file and a trusted
signer's own, travel as two members, never two under one name); the key travels in the
member's PAX header. Entries are
verified when exported and again when imported (``put_entry_file`` checks header, length,
checksum and that the key matches), so a tampered member is rejected, and a truncated bundle
imports every member before the damage and reports the rest as unreadable.

A bundle may come from anyone, so import trusts none of it: members are read into memory and
handed to the store (never extracted to a path); a member that is not a regular file, or
that declares more than ``max_entry_bytes``, is rejected without being read; and the whole
stream stops once it has inflated past ``max_total_bytes`` (by default 100 times the
bundle's size, and at least 256 MiB), so a compression bomb costs a bounded amount of memory
and time and is reported, never a ``MemoryError``. Export writes a fresh, randomly named
temporary file (``O_EXCL|O_NOFOLLOW``) in the output directory and renames it into place,
so a link planted in that directory is never followed.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from xla_pcache import _core, _testhook
from xla_pcache._reports import Entry
from xla_pcache._text import package_logger
from xla_pcache.sizes import parse_duration

log = package_logger("xla_pcache")

_KEY_HEX = "XLA_PCACHE.key_hex"
_KEY_TEXT = "XLA_PCACHE.key_text"

# A compiled program larger than this is rare; a member declaring more is refused unread
# (callers with bigger programs pass max_entry_bytes).
DEFAULT_MAX_ENTRY_BYTES = 2 << 30
# Bundles of compiled programs inflate a few times; deflate's own limit is about 1000x.
# A stream inflating past this many times the file's size (and at least the floor) is
# treated as a bomb: reading stops.
MAX_EXPANSION = 100
EXPANSION_FLOOR = 256 << 20
_CHUNK = 1 << 20


@dataclass
class ImportReport:
    imported: int = 0
    present: int = 0
    rejected: int = 0
    unreadable: bool = False
    error: str | None = None
    # Members rejected because of their size (declared, or inflated past the total cap);
    # included in ``rejected``.
    oversized: int = 0
    # Whole entries a store with trusted keys does not take (unsigned, or signed by a key it
    # does not trust): counted, not ``rejected``: nothing in the bundle was damaged.
    untrusted: int = 0
    # Entries of a later release's format, which this release cannot read: counted, not
    # ``rejected`` (nothing was damaged), and not imported (that release imports them).
    newer_format: int = 0


def export_bundle(
    store: _core.Store,
    out: str | os.PathLike[str],
    *,
    framework: str | None = None,
    newer_than: float | None = None,
    min_hits: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Writes the verified entries of ``store`` (filtered by producer framework, by age in
    seconds and by hits recorded) to ``out``; returns how many were written. Unverifiable
    entries are left out. Hits recorded are at most one per process per hit interval, so
    ``min_hits`` selects on a lower bound of the uses."""
    if isinstance(min_hits, bool) or not isinstance(min_hits, int) or min_hits < 0:
        raise ValueError(f"min_hits must be a non-negative int, not {min_hits!r}")
    if newer_than is not None:
        newer_than = parse_duration(newer_than, name="newer_than")
    now = time.time()
    chosen: list[Entry] = []
    for e in store.entries():
        if framework is not None and e["meta"].get("framework") != framework:
            continue
        if newer_than is not None and now - e["created"] > newer_than:
            continue
        if e["hits"] < min_hits:
            continue
        chosen.append(e)
    target = os.fspath(out)
    # A fresh name made with O_EXCL|O_NOFOLLOW in the output directory: a link planted
    # there (under any name) is never followed, and the rename stays on one filesystem.
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(target)),
        prefix=f".{os.path.basename(target)}.",
        suffix=".tmp",
    )
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as raw:
            written = _write_tar(store, raw, chosen, now, progress)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return written


def _write_tar(
    store: _core.Store,
    sink: io.BufferedWriter,
    chosen: list[Entry],
    now: float,
    progress: Callable[[int, int], None] | None,
) -> int:
    written = 0
    with tarfile.open(fileobj=sink, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for i, e in enumerate(chosen):
            key = e["key"]
            # File by file, each under the name it is filed under: what the store hands out
            # there (with trusted keys, only what they signed).
            data = store.entry_file_named(key, e["name"])
            if progress is not None:
                progress(i + 1, len(chosen))
            if data is None:
                continue
            raw = key.encode() if isinstance(key, str) else key
            info = tarfile.TarInfo(e["name"])
            info.size = len(data)
            info.mtime = int(now)
            info.pax_headers = {
                _KEY_HEX: raw.hex(),
                _KEY_TEXT: "1" if isinstance(key, str) else "0",
            }
            tar.addfile(info, io.BytesIO(data))
            written += 1
            if written == 1:
                # A test signals the export here, with its temporary file half written.
                _testhook.hold_for_signal("export")
    return written


def _umask() -> int:
    # os.umask can only be read by setting it, which races with other threads creating files.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


class _Bomb(Exception):
    """The stream inflated past its cap."""


class _Capped:
    """The inflated stream, counting what it yields; raises ``_Bomb`` past ``limit`` bytes, so
    every byte tarfile reads (members, headers, members it skips) is bounded."""

    def __init__(self, inner: gzip.GzipFile, limit: int) -> None:
        self._inner = inner
        self.limit = limit
        self.total = 0

    def read(self, size: int = -1) -> bytes:
        # Never more than one chunk past the cap, whatever tarfile asks for.
        want = _CHUNK if size is None or size < 0 else min(size, _CHUNK)
        data = self._inner.read(want)
        self.total += len(data)
        if self.total > self.limit:
            raise _Bomb
        return data


def import_bundle(
    store: _core.Store,
    bundle: str | os.PathLike[str],
    *,
    progress: Callable[[int], None] | None = None,
    max_entry_bytes: int | None = None,
    max_total_bytes: int | None = None,
) -> ImportReport:
    """Publishes each verifying entry of ``bundle`` into ``store`` (first writer wins, the
    budget applies as to any put). Never raises for a damaged or hostile bundle: see the
    report. A member over ``max_entry_bytes`` (default: the store's budget, at most 2 GiB) or
    not a regular file is rejected unread; reading stops once the bundle has inflated past
    ``max_total_bytes`` (default: 100 times its size on disk, at least 256 MiB)."""
    entry_cap = _limit(max_entry_bytes, "max_entry_bytes")
    if entry_cap is None:
        budget = store.max_size
        entry_cap = min(DEFAULT_MAX_ENTRY_BYTES, budget or DEFAULT_MAX_ENTRY_BYTES)
    total_cap = _limit(max_total_bytes, "max_total_bytes")
    report = ImportReport()
    counted = True  # whether the member being read is already in the report
    bombed = False
    try:
        with open(bundle, "rb") as raw:
            if total_cap is None:
                total_cap = max(EXPANSION_FLOOR, MAX_EXPANSION * os.fstat(raw.fileno()).st_size)
            stream = _Capped(gzip.GzipFile(fileobj=raw, mode="rb"), total_cap)
            # Stream mode only ever calls read(); the stub asks for a whole file object.
            with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    counted = False
                    outcome = _import_member(store, tar, member, entry_cap)
                    counted = True
                    if outcome == "rejected":
                        report.rejected += 1
                    elif outcome == "untrusted":
                        report.untrusted += 1
                    elif outcome == "newer_format":
                        report.newer_format += 1
                    elif outcome == "oversized":
                        report.rejected += 1
                        report.oversized += 1
                    elif outcome == "imported":
                        report.imported += 1
                    else:
                        report.present += 1
                    if progress is not None:
                        progress(member.size)
    except _Bomb:
        bombed = True
        if not counted:
            report.rejected += 1
            report.oversized += 1
        report.unreadable = True
        report.error = (
            f"the bundle inflates to more than {total_cap:,} bytes (a compression bomb?); "
            "reading stopped"
        )
        log.warning(
            "xla_pcache: bundle %s refused after %d entries: %s",
            bundle,
            report.imported + report.present + report.rejected,
            report.error,
        )
    except (tarfile.TarError, OSError, EOFError, ValueError, MemoryError, zlib.error) as e:
        # zlib errors surface as gzip.BadGzipFile/OSError/zlib.error; an early end as EOFError.
        if not counted:
            report.rejected += 1
        report.unreadable = True
        report.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        log.warning(
            "xla_pcache: bundle %s is damaged after %d entries (%s)",
            bundle,
            report.imported + report.present + report.rejected,
            report.error,
        )
    if report.oversized and not bombed:
        # One line for the whole bundle, however many members were too large.
        log.warning(
            "xla_pcache: bundle %s: %d members rejected as too large (over %d bytes each, or "
            "inflating past %d bytes in all)",
            bundle,
            report.oversized,
            entry_cap,
            total_cap,
        )
    return report


def _limit(value: int | None, name: str) -> int | None:
    """A size cap: None, or a byte size by the core's rule (``_core.check_size``)."""
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        return _core.check_size(name, value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive int or None, not {value!r}") from None


def _import_member(
    store: _core.Store,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    entry_cap: int,
) -> str:
    # Only plain members: a link, device, FIFO, directory or sparse file is nothing export
    # writes, and is never read.
    if not member.isreg() or member.issparse():
        return "rejected"
    if member.size > entry_cap:
        return "oversized"
    key = _member_key(member)
    if key is None:
        return "rejected"
    f = tar.extractfile(member)
    if f is None:
        return "rejected"
    try:
        data = f.read(member.size)
    except MemoryError:
        return "oversized"
    if len(data) != member.size:
        return "rejected"
    # A trusting store is not asked: an untrusted entry at the key must not stop a trusted
    # one from being imported (it goes beside it; put_entry_file decides).
    if store.trusted_key_names is None and key in store:
        return "present"
    # Verified with the signature kept; a trusting store refuses (and counts `untrusted`)
    # what it would not serve, and says why.
    outcome = store.put_entry_file(key, data)
    if isinstance(outcome, _core.Refusal):
        return outcome.kind if outcome.kind in ("untrusted", "newer_format") else "rejected"
    return "imported" if outcome else "present"


def _member_key(member: tarfile.TarInfo) -> str | bytes | None:
    try:
        raw = bytes.fromhex(member.pax_headers[_KEY_HEX])
        if member.pax_headers.get(_KEY_TEXT) == "1":
            return raw.decode()
        return raw
    except (KeyError, ValueError):
        return None
