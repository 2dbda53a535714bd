"""A bucket's prune lease, ``prune.lease``: held while a prune runs so that one host prunes
at a time. Taken by a conditional create (or, once stale, an overwrite conditional on the
write it replaces: its ETag, or on GCS its generation),
rewritten in the background, released only while still ours; objects planted below its
name, which make it a directory that refuses the create, are removed first."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from xla_pcache.bucket.layout import LEASE, epoch
from xla_pcache.bucket.objects import BucketObjects
from xla_pcache.bucket.reader import CLOCKS_APART_S, delete_hint
from xla_pcache.tiers import objstore

# Rewritten every third of it while a prune runs; taken over when it has not been rewritten
# for STALE_AFTER_S by this host's clock (hosts' clocks may differ by that much).
LEASE_S = 60.0
STALE_AFTER_S = CLOCKS_APART_S


class BusyError(Exception):
    """Another host holds the prune lease, or (``BlockedError``) the lease cannot be taken."""


class BlockedError(BusyError):
    """The prune lease can be neither created nor found, and what blocks it could not be
    removed (objects below its name the client cannot remove, or no permission to)."""


def _take(objects: BucketObjects, stale_after: float, body: bytes) -> objstore.Version:
    meta: Mapping[str, Any] | None = None
    for attempt in range(2):
        try:
            return objects.put(LEASE, body, mode="create")
        except Exception as e:
            if objstore.classify(e) not in ("exists", "precondition"):
                raise
        meta = objects.reader.head(LEASE)
        if meta is not None:
            break
        # Refused, and not there: its holder released it just now (try again), or
        # objects planted below its name make it a directory, which refuses the
        # create (a prefix squat: SeaweedFS, MinIO, hierarchical namespaces).
        if attempt == 0:
            objects.clear_squat(LEASE)
    reader = objects.reader
    if meta is None:
        unlistable = [k for k in reader.unlistable if f"/{LEASE}/" in f"/{k}"]
        hint = (
            delete_hint(reader.scheme, reader.bucket, unlistable[0])
            if unlistable
            else f"`xla-pcache prune --untrusted --path {objects.url}`"
        )
        raise BlockedError(
            f"{LEASE} can be neither created nor found: something below its name blocks "
            f"it; remove it with {hint}"
        )
    age = time.time() - epoch(meta)
    if age < stale_after:
        holder = reader.json_object(LEASE, "lease") or {}
        owner = str(holder.get("owner", "?"))[:100]
        raise BusyError(f"another prune holds {LEASE} ({owner}, rewritten {age:.0f} s ago)")
    try:
        return objects.put(LEASE, body, mode=objstore.Version.of(meta).mode())
    except Exception as e:
        if objstore.classify(e) in ("exists", "precondition", "missing"):
            raise BusyError(f"another host took over {LEASE} first") from None
        raise


@contextlib.contextmanager
def hold(objects: BucketObjects, stale_after: float = STALE_AFTER_S) -> Iterator[threading.Event]:
    """Holds the prune lease (``BusyError`` when another host does, ``BlockedError`` when
    it cannot be taken), rewritten in the background; the event is set once it was lost
    (taken over after a long silence)."""
    body = json.dumps({"owner": f"{socket.gethostname()}-{os.getpid()}"}).encode()
    e_tag = _take(objects, stale_after, body)
    lost = threading.Event()
    stop = threading.Event()

    def beat() -> None:
        nonlocal e_tag
        while not stop.wait(LEASE_S / 3):
            try:
                e_tag = objects.put(LEASE, body, mode=e_tag.mode())
            except Exception:
                lost.set()
                return

    beater = threading.Thread(target=beat, name="xla_pcache-prune-lease", daemon=True)
    beater.start()
    try:
        yield lost
    finally:
        stop.set()
        beater.join()
        if not lost.is_set():
            with contextlib.suppress(Exception):
                meta = objects.reader.head(LEASE)
                if meta is not None and objstore.Version.of(meta) == e_tag:
                    objects.delete([LEASE])
