"""Bundles: a cache's verified entries in one file, to warm a fresh machine or image.

The format is a gzip-compressed tar (stdlib ``tarfile``): readable by any tool, streamable,
and no new dependency. Each member is one whole entry file (header, key, metadata, checksums,
payload) named by its entry name; the key travels in the member's PAX header. Entries are
verified when exported and again when imported (``put_entry_file`` checks header, length,
checksum and that the key matches), so a tampered member is rejected, and a truncated bundle
imports every member before the damage and reports the rest as unreadable.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from xla_pcache import _core

log = logging.getLogger("xla_pcache")

_KEY_HEX = "XLA_PCACHE.key_hex"
_KEY_TEXT = "XLA_PCACHE.key_text"


@dataclass
class ImportReport:
    imported: int = 0
    present: int = 0
    rejected: int = 0
    unreadable: bool = False
    error: str | None = None


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
    now = time.time()
    chosen = []
    for e in store.entries():
        meta = e.get("meta") or {}
        if framework is not None and (
            not isinstance(meta, dict) or meta.get("framework") != framework
        ):
            continue
        created = e.get("created")
        if (
            newer_than is not None
            and isinstance(created, (int, float))
            and now - created > newer_than
        ):
            continue
        hits = e.get("hits")
        if min_hits and not (isinstance(hits, int) and hits >= min_hits):
            continue
        chosen.append(e)
    written = 0
    tmp = f"{os.fspath(out)}.tmp-{os.getpid()}"
    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for i, e in enumerate(chosen):
            key = e["key"]
            assert isinstance(key, (str, bytes))
            data = store.get_entry_file(key)
            if progress is not None:
                progress(i + 1, len(chosen))
            if data is None:
                continue
            raw = key.encode() if isinstance(key, str) else key
            info = tarfile.TarInfo(_core.entry_name(key))
            info.size = len(data)
            info.mtime = int(now)
            info.pax_headers = {
                _KEY_HEX: raw.hex(),
                _KEY_TEXT: "1" if isinstance(key, str) else "0",
            }
            tar.addfile(info, io.BytesIO(data))
            written += 1
    os.replace(tmp, out)
    return written


def import_bundle(
    store: _core.Store,
    bundle: str | os.PathLike[str],
    *,
    progress: Callable[[int], None] | None = None,
) -> ImportReport:
    """Publishes each verifying entry of ``bundle`` into ``store`` (first writer wins, the
    budget applies as to any put). Never raises for a damaged bundle: see the report."""
    report = ImportReport()
    try:
        with tarfile.open(bundle, "r|gz") as tar:
            for member in tar:
                if not member.isfile():
                    report.rejected += 1
                    continue
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                key = _member_key(member)
                if key is None or len(data) != member.size:
                    report.rejected += 1
                elif key in store:
                    report.present += 1
                else:
                    outcome = store.put_entry_file(key, data)
                    if outcome is None:
                        report.rejected += 1
                    elif outcome:
                        report.imported += 1
                    else:
                        report.present += 1
                if progress is not None:
                    progress(member.size)
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        # zlib errors surface as tarfile.ReadError/OSError; an early end as EOFError.
        report.unreadable = True
        report.error = f"{type(e).__name__}: {e}"
        log.warning(
            "xla_pcache: bundle %s is damaged after %d entries (%s)",
            bundle,
            report.imported + report.present + report.rejected,
            report.error,
        )
    return report


def _member_key(member: tarfile.TarInfo) -> str | bytes | None:
    try:
        raw = bytes.fromhex(member.pax_headers[_KEY_HEX])
        if member.pax_headers.get(_KEY_TEXT) == "1":
            return raw.decode()
        return raw
    except (KeyError, ValueError):
        return None
