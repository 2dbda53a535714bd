"""The doctor's round trip through a bucket path: each request a host makes of the bucket,
made once, with the credentials and endpoint this environment gives, so that a set-up that
cannot work says which request failed and why (no credentials, no permission, no bucket,
no server), not only that the cache missed.

A reader lists the entries and reads an object (a HEAD of one that is not there: a miss,
which needs the permission to read). A writer also does what a compile claim does: creates
an object under ``claims/`` (a conditional create), overwrites it conditionally on the
write it made (its ETag, or on GCS its generation), reads it back and deletes it. An object
left there by a doctor killed half-way is a stale claim, which a prune removes.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

# What each step needs of the bucket, by cloud: what docs/remote.md tells an operator.
NEEDS = {
    "list": "list (GCS: storage.objects.list; S3: s3:ListBucket)",
    "read": "read (GCS: storage.objects.get; S3: s3:GetObject)",
    "create": "create (GCS: storage.objects.create; S3: s3:PutObject)",
    "overwrite": "overwrite (GCS: storage.objects.create and storage.objects.delete; "
    "S3: s3:PutObject)",
    "delete": "delete (GCS: storage.objects.delete; S3: s3:DeleteObject)",
}


# What a status the service answered means for the set-up, said first.
_STATUS = {
    "400": "the service refused the request as malformed",
    "401": "the credentials were refused (none, expired or wrong)",
    "403": "permission denied",
    "404": "no such bucket or object",
    "412": "a precondition failed (another writer came in between)",
}
# What object_store says when no answer came: refused, reset, timed out, or unsent.
_UNREACHED = ("connect", "timed out", "error sending request", "dns error")
_STATUS_IN = re.compile(r"status code: ([0-9]{3})\b")


def _reason(e: BaseException) -> str:
    from xla_pcache.tiers import objstore

    said = objstore.scrub(str(e))
    found = _STATUS_IN.search(str(e))
    lead = f"{found[1]}, {_STATUS[found[1]]}: " if found and found[1] in _STATUS else ""
    if not found and any(w in said.lower() for w in _UNREACHED):
        lead = "the service could not be reached: "
    return f"{lead}{type(e).__name__}: {said}"


def check(url: str, *, read_only: bool, timeout: float) -> tuple[list[dict[str, Any]], list[str]]:
    """The steps made against the bucket at ``url`` (each ``{"step", "ok", "detail"}``) and
    a problem for the first that failed (the steps after it are not made)."""
    from xla_pcache.bucket.pages import delimited
    from xla_pcache.tiers import objstore
    from xla_pcache.tiers.base import redact

    steps: list[dict[str, Any]] = []
    try:
        location, url_read_only = objstore.parse_object_url(url)
        client = objstore.open_client(location, timeout=timeout, for_writes=True)
    except Exception as e:
        detail = f"{type(e).__name__}: {objstore.scrub(str(e))}"
        steps.append({"step": "client", "ok": False, "detail": detail})
        return steps, [f"bucket {redact(url)}: no client could be made ({detail})"]
    read_only = read_only or url_read_only
    import obstore

    probe = f"xla_pcache-1/claims/{secrets.token_hex(16)}"
    state: dict[str, Any] = {}

    def listing() -> str:
        # Bounded: a service that pages round fails the step, never hangs the command.
        wait_s = objstore.request_bound(timeout, for_writes=True)
        got = delimited(client, objstore.ENTRY_DIR, wait_s=wait_s)
        n = len(got["objects"]) + len(got["common_prefixes"])
        return f"{n} entries or directories in one page"

    def read_missing() -> str:
        try:
            obstore.head(client, probe)
        except Exception as e:
            if objstore.classify(e) == "missing":
                return "an absent object is a miss"
            raise
        return "found"

    def create() -> str:
        result = obstore.put(client, probe, b"{}", mode="create", use_multipart=False)
        state["version"] = objstore.Version.of(result)
        return "conditional create"

    def overwrite() -> str:
        mode: Any = state["version"].mode()
        result = obstore.put(client, probe, b'{"t": 1}', mode=mode, use_multipart=False)
        state["version"] = objstore.Version.of(result)
        return "overwrite conditional on the write before"

    def read_back() -> str:
        data = bytes(obstore.get(client, probe).bytes())
        if data != b'{"t": 1}':
            raise ValueError(f"read back {len(data)} bytes that are not what was written")
        return "read back what was written"

    def delete() -> str:
        obstore.delete(client, probe)
        state.pop("version")
        return "deleted"

    plan: list[tuple[str, str, Callable[[], str]]] = [
        ("list", "list", listing),
        ("read", "read", read_missing),
    ]
    if not read_only:
        plan += [
            ("create", "create", create),
            ("overwrite", "overwrite", overwrite),
            ("read", "read back", read_back),
            ("delete", "delete", delete),
        ]
    problems: list[str] = []
    for need, step, run in plan:
        try:
            detail = run()
        except Exception as e:
            kind = objstore.classify(e)
            why = _reason(e)
            steps.append({"step": step, "ok": False, "detail": why})
            problems.append(
                f"bucket {redact(url)}: {step} failed ({why}); a "
                f"{'read-only host' if read_only else 'writer'} needs {NEEDS[need]}"
                + (" and the bucket to exist" if kind == "missing" and need == "list" else "")
            )
            break
        steps.append({"step": step, "ok": True, "detail": detail})
    if "version" in state:
        # Failed after the create: the probe is removed if it can be (else a prune does).
        try:
            obstore.delete(client, probe)
        except Exception:
            steps.append({"step": "clean up", "ok": False, "detail": f"{probe} left"})
    return steps, problems
