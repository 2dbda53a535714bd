"""A bucket's stored budget: the object ``config`` beside its entries, JSON
``{"max_size": bytes or null, "max_age_s": seconds or null}``, written by
``xla-pcache config --path s3://...`` and read, untrusted, by every prune and writer."""

from __future__ import annotations

import json
from dataclasses import dataclass

from xla_pcache import _core
from xla_pcache.bucket.layout import CONFIG
from xla_pcache.bucket.objects import BucketObjects
from xla_pcache.bucket.reader import checked_age, checked_size


@dataclass(frozen=True)
class BucketStoredBudget:
    """The bucket's stored budget: bytes and seconds, None where not set."""

    max_size: int | None = None
    max_age_s: float | None = None


def read_stored_budget(objects: BucketObjects) -> BucketStoredBudget:
    """The stored budget; an empty one when there is none or it is out of range (skipped,
    with one warning)."""
    data = objects.reader.json_object(CONFIG, "config")
    if data is None:
        return BucketStoredBudget()
    raw_size, raw_age = data.get("max_size"), data.get("max_age_s")
    size = None if raw_size is None else checked_size(raw_size)
    age = None if raw_age is None else checked_age(raw_age)
    if (raw_size is not None and size is None) or (raw_age is not None and age is None):
        objects.reader.skip(
            "config-malformed",
            f"its budget object ({CONFIG}) holds a max_size or max_age_s out of range "
            "(1 byte to 2^63-1, 1 s to 1e9 s): ignored",
        )
        return BucketStoredBudget()
    return BucketStoredBudget(size, age)


def write_stored_budget(objects: BucketObjects, budget: BucketStoredBudget) -> None:
    """Writes ``budget`` under the rule the directory's stored budget is written by
    (``Store.write_cache_settings``): a size from one byte to ``sizes.MAX_SIZE``
    (``_core.check_size``), a max age from 1 s to ``sizes.MAX_DURATION_S``
    (``_core.check_max_age``); else ``ValueError`` naming the field, before any request.
    What is written is so always what ``read_stored_budget`` takes back."""
    size, age = budget.max_size, budget.max_age_s
    body = {
        "max_size": None if size is None else _core.check_size("max_size", size),
        "max_age_s": None if age is None else _core.check_max_age("max_age_s", age),
    }
    objects.put(CONFIG, json.dumps(body).encode())
