"""An object-store tier (S3, GCS, Azure Blob) through ``obstore``, the Python binding of the
Rust ``object_store`` crate: one client and one API for the three clouds, each configured
from its own standard environment variables (``AWS_*``, ``GOOGLE_*``, ``AZURE_STORAGE_*``).

The guarantees are the directory's:

- what travels is the whole entry file, verified by the store on the way in (a damaged or
  truncated object is a counted miss, never wrong bytes);
- publish is a conditional create (``If-None-Match: *``): the first writer wins on the
  bucket, a later one is counted ``remote_put_exists``;
- every failure (unknown bucket, wrong credentials, a server down, slow or killed
  mid-transfer) is a miss or a skipped write within the timeout, logged once per kind and
  counted, after which the tier is left alone for ``retry_after`` seconds.

Objects over ``RANGE_CHUNK`` bytes are fetched with ranged reads in parallel: one stream to
a cloud store is limited to some 100 MB/s, several are not.

Compile claims for fleets that share only the bucket live here as well (``ObjectClaims``):
a claim is an object created with ``If-None-Match: *`` and heartbeated by an overwrite
conditional on its ETag.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import socket
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from xla_pcache import _testhook
from xla_pcache._names import EntryName
from xla_pcache._text import package_logger
from xla_pcache._url import BUCKET_SCHEMES
from xla_pcache.tiers.base import Fetched, Spool, Spooled, TierBase, TierURL, parse_tier_url

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = package_logger("xla_pcache")

# An object store takes a single PUT of up to 5 GiB (Redis: config.DEFAULT_REMOTE_MAX_BYTES).
DEFAULT_MAX_VALUE = 5 << 30
# Where entries and claims live below the URL's prefix; the digit is the entry format.
ENTRY_DIR = "xla_pcache-1/entries"
CLAIM_DIR = "xla_pcache-1/claims"
# The first request asks for this many bytes (the whole of most entries, and the object's
# size); the rest of a larger object is fetched in ranged pieces of RANGE_PIECE, in parallel.
# Pieces of 16 MiB: smaller ones cost more requests than their parallelism gains on a fast
# link, larger ones leave a single-stream cloud link idle (docs/benchmarks.md, "Measurements
# behind the code").
RANGE_CHUNK = 8 << 20
RANGE_PIECE = 16 << 20
RANGE_THREADS = 8
# An object larger than this is streamed to a file under the cache's tmp/ on its way to the
# store, rather than held in memory beside the store's own copy.
SPOOL_BYTES = 64 << 20
# Pieces fetched ahead while spooling: what such a read holds in memory at most.
SPOOL_WINDOW = 4
# Writes run in the background; a large PUT is given at least this long.
PUT_TIMEOUT_S = 60.0
# Variables whose values are secrets: scrubbed from every message this module logs.
_SECRET_VARS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
)
_ENDPOINT_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AZURE_STORAGE_ENDPOINT",
    "AZURE_ENDPOINT",
    "GOOGLE_BASE_URL",
    "GOOGLE_ENDPOINT",
)


def scrub(text: str, environ: Mapping[str, str] = os.environ) -> str:
    """``text`` (an exception message) without any secret the environment holds, one line."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    for var in _SECRET_VARS:
        value = environ.get(var, "")
        if len(value) >= 4:
            line = line.replace(value, "***")
    return line[:300]


# Where object_store's GCS client finds a service-account file (or its JSON): the file may
# name the endpoint (``gcs_base_url``), as for a GCS-compatible server of one's own.
_GCS_ACCOUNT_FILE_VARS = (
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "SERVICE_ACCOUNT",
)


def _gcs_base_url(environ: Mapping[str, str]) -> str:
    """The ``gcs_base_url`` of the service account object_store reads (the key's JSON in
    ``GOOGLE_SERVICE_ACCOUNT_KEY``, else the file one of ``_GCS_ACCOUNT_FILE_VARS`` names),
    or ""; an unreadable one is object_store's to report when the store is built."""
    text = environ.get("GOOGLE_SERVICE_ACCOUNT_KEY", "")
    if not text:
        path = next((environ[v] for v in _GCS_ACCOUNT_FILE_VARS if environ.get(v)), "")
        if not path:
            return ""
        try:
            with open(path, "rb") as f:
                text = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return ""
    try:
        doc = json.loads(text)
    except ValueError:
        return ""
    url = doc.get("gcs_base_url") if isinstance(doc, dict) else None
    return url if isinstance(url, str) else ""


def _allow_http(environ: Mapping[str, str]) -> bool:
    # object_store refuses plain http unless told; an endpoint the user set to http:// (a
    # test server, a store on a private network) is what they asked for: in a variable, or
    # as the service-account file's ``gcs_base_url``.
    urls = [environ.get(v, "") for v in _ENDPOINT_VARS]
    if any(environ.get(v) for v in ("GOOGLE_SERVICE_ACCOUNT_KEY", *_GCS_ACCOUNT_FILE_VARS)):
        urls.append(_gcs_base_url(environ))
    return any(u.strip().lower().startswith("http://") for u in urls)


def classify(e: BaseException) -> str:
    """``missing``, ``exists``, ``precondition``, ``empty`` or ``error`` for an obstore
    exception: what this tier and a bucket's upkeep act on. ``empty``: a ranged read from
    the first byte refused as unsatisfiable (416), which S3, GCS and Azure answer only for
    an object of no bytes (object_store has no kind for it: the status is in its message)."""
    import obstore.exceptions as ox

    if isinstance(e, FileNotFoundError | ox.NotFoundError):
        return "missing"
    if isinstance(e, ox.AlreadyExistsError):
        return "exists"
    if isinstance(e, ox.PreconditionError):
        return "precondition"
    if isinstance(e, ox.GenericError) and _UNSATISFIABLE.search(str(e)):
        return "empty"
    return "error"


_UNSATISFIABLE = re.compile(r"status code: 416\b")


class Version(NamedTuple):
    """Which write of an object a conditional overwrite replaces: its ETag (what S3 and
    Azure match, ``If-Match``) and its version (what GCS matches: the generation,
    ``x-goog-if-generation-match``; object_store refuses a GCS update without it), from a
    write's result or a HEAD's metadata."""

    e_tag: str | None
    version: str | None

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> Version:
        e_tag, version = meta.get("e_tag"), meta.get("version")
        return cls(str(e_tag) if e_tag else None, str(version) if version else None)

    def mode(self) -> dict[str, str]:
        """obstore's put ``mode`` that overwrites this write only (``PreconditionError``
        when another write came since)."""
        return {k: v for k, v in self._asdict().items() if v is not None}


# The process that first used obstore: its runtime's threads exist there only, so a process
# forked from it cannot use obstore at all (a request there waits for ever).
_obstore_pid: int | None = None


def request_bound(timeout: float, *, for_writes: bool = False) -> float:
    """The longest one request of a client ``open_client`` made may take: its timeout,
    once more for its one retry, and the backoff between."""
    return 2 * (max(timeout, PUT_TIMEOUT_S) if for_writes else timeout) + 2.0


def open_client(
    url: str, *, timeout: float, environ: Mapping[str, str] = os.environ, for_writes: bool = False
) -> Any:
    """The obstore store for ``url`` (scheme, bucket and prefix; no query), credentials and
    endpoint from the environment. Creating it makes no request."""
    global _obstore_pid
    try:
        from obstore.store import from_url
    except ImportError as e:
        raise ImportError(
            'object-store tiers need obstore: pip install "xla-pcache[objstore]"'
        ) from e
    if _obstore_pid is None:
        _obstore_pid = os.getpid()
    elif _obstore_pid != os.getpid():
        raise RuntimeError(
            "not usable in a process forked from one that used it (the client does not "
            "survive fork)"
        )
    request_timeout = max(timeout, PUT_TIMEOUT_S) if for_writes else timeout
    client: dict[str, Any] = {
        "connect_timeout": timedelta(seconds=timeout),
        "timeout": timedelta(seconds=request_timeout),
        "allow_http": _allow_http(environ),
    }
    # One retry, inside the timeout: a dead server costs one timeout, not object_store's
    # default of ten retries over three minutes.
    retry = {
        "max_retries": 1,
        "retry_timeout": timedelta(seconds=timeout),
        "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(1)},
    }
    return from_url(url, client_options=client, retry_config=retry)  # type: ignore[call-overload]


class ObjectTier(TierBase):
    """One bucket (or container) and prefix: entries read whole or in ranged pieces,
    written by a background thread with a conditional create."""

    def __init__(
        self,
        url: str,
        *,
        display_url: str,
        timeout: float = 2.0,
        max_value_bytes: int = DEFAULT_MAX_VALUE,
        retry_after: float = 5.0,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.url = display_url
        self.timeout = timeout
        self.max_value_bytes = max_value_bytes
        self._store = open_client(url, timeout=timeout, environ=environ)
        self._put_store = open_client(url, timeout=timeout, environ=environ, for_writes=True)
        self._pid = os.getpid()
        self._readers: ThreadPoolExecutor | None = None
        super().__init__(retry_after=retry_after, thread_name="xla_pcache-objstore")
        self.claims = ObjectClaims(self)

    def _before_use(self) -> None:
        """In a forked child (a DataLoader worker) neither the parent's threads nor
        obstore's runtime exist: a request would wait for ever (seen: a put in a child
        never returned, its timeout never fired). The child leaves this tier alone: its
        gets are misses, its puts skipped, counted, with one warning; the local directory
        and the other tiers go on."""
        if os.getpid() == self._pid:
            return
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._down_until = float("inf")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)
        self._readers = None
        self.claims = ObjectClaims(self)
        log.warning(
            "xla_pcache: remote cache %s is not used in this forked process (its client "
            "does not survive fork); the local cache goes on",
            self.url,
        )

    def _describe(self, e: BaseException) -> str:
        return scrub(str(e))

    @staticmethod
    def entry_path(name: EntryName) -> str:
        return f"{ENTRY_DIR}/{name}"

    # ---------------------------------------------------------------- reads
    def get(self, name: str, *, max_bytes: int | None, spool: Spool | None) -> Fetched:
        """The object stored for entry ``name`` (a large one as its ranged pieces, in order,
        not joined: the store gathers them into the one buffer it verifies and keeps; one
        over ``SPOOL_BYTES`` streamed to a file ``spool`` makes), or None (miss or failure,
        both counted).

        The object is untrusted (anyone who can write the bucket wrote it): its size is
        checked against ``max_bytes`` (the store's budget) and the tier's largest value from
        the first response, and its header against ``name`` and that size, before anything
        more is read. A garbage or oversized object costs one ranged read."""
        checks = self._checked(name, max_bytes)
        if checks is None:
            return None
        import obstore

        checked, limit = checks
        path = self.entry_path(checked)
        try:
            # The first piece, in a request that also says how large the object is: one
            # round trip for the usual entry, the rest in parallel for a large one.
            first = obstore.get(self._store, path, options={"range": (0, RANGE_CHUNK)})
            size = int(first.meta["size"])
            if size > limit:
                self.reject("too_large", f"an object of {size} bytes is over the limit of {limit}")
                return None
            head = first.bytes()
            # Its first bytes as the service holds them (not a read cut short): what the
            # core says of them holds of the object.
            whole = len(memoryview(head)) == min(size, RANGE_CHUNK)
            refused, verdict = self.judge_head(checked, head, size, whole=whole)
            if refused:
                return verdict
            if size <= len(head):
                return head
            if size > SPOOL_BYTES and spool is not None:
                try:
                    spooled = spool()
                except Exception:
                    # tmp/ not writable here (a read-only mount) or not a real directory
                    # inside the cache: in memory, as a smaller one.
                    return self._get_rest(path, head, size)
                return self._spool_rest(path, head, size, spooled)
            return self._get_rest(path, head, size)
        except Exception as e:
            kind = classify(e)
            if kind == "missing":
                self.count("remote_misses")
            elif kind == "empty":
                # No bytes at all (a ranged read of it is refused): no entry file.
                return self.judge_head(checked, b"", 0, whole=True)[1]
            else:
                self.fail("get", e)
            return None

    def _pieces(self, path: str, start: int, size: int, window: int) -> Iterator[Buffer]:
        """The object's bytes from ``start`` on, in ranged pieces fetched in parallel, in
        order, with at most ``window`` pieces fetched ahead of the one taken."""
        import obstore

        def fetch(at: int) -> Buffer:
            end = min(at + RANGE_PIECE, size)
            part = obstore.get_range(self._store, path, start=at, end=end)
            if len(memoryview(part)) != end - at:
                raise ValueError("short ranged read")
            return part

        if self._readers is None:
            self._readers = ThreadPoolExecutor(
                max_workers=RANGE_THREADS, thread_name_prefix="xla_pcache-objstore-get"
            )
        starts = iter(range(start, size, RANGE_PIECE))
        ahead: deque[Future[Buffer]] = deque()
        try:
            for at in itertools.islice(starts, window):
                ahead.append(self._readers.submit(fetch, at))
            while ahead:
                part = ahead.popleft().result()
                for at in itertools.islice(starts, 1):
                    ahead.append(self._readers.submit(fetch, at))
                yield part
        finally:
            for f in ahead:
                f.cancel()

    def _get_rest(self, path: str, head: Buffer, size: int) -> list[Buffer]:
        # Not joined here: a join is a copy of the whole object into fresh memory, and the
        # store copies the pieces once anyway, into the buffer it verifies and serves.
        return [head, *self._pieces(path, len(memoryview(head)), size, RANGE_THREADS)]

    def _spool_rest(self, path: str, head: Buffer, size: int, spooled: Spooled) -> Spooled:
        # A large object goes to a file, piece by piece, rather than into memory twice
        # (pieces, then the gathered copy): the store reads it once from there.
        try:
            at = spooled.write_at(head, 0)
            # map() yields in order and keeps at most the pieces not yet taken in flight.
            for part in self._pieces(path, at, size, SPOOL_WINDOW):
                at += spooled.write_at(part, at)
        except BaseException:
            spooled.close()
            raise
        return spooled

    def exists(self, name: EntryName) -> bool:
        import obstore

        try:
            obstore.head(self._store, self.entry_path(name))
        except Exception:
            return False
        return True

    # ---------------------------------------------------------------- writes
    def _write(self, name: EntryName, data: Buffer, mode: str) -> None:
        """Publishes ``data`` with a conditional create; with ``own`` (a signer's own name
        for the key) an overwrite: only that signer writes there, and whatever else holds
        the name (an object planted to squat it) is replaced; with ``update`` (a plain name
        whose record changes: ``Store.replace``) an overwrite of the write it read, unless
        that is a later release's entry, which stays (``remote_put_newer_format``)."""
        import obstore

        t = time.perf_counter()
        put_mode: Any = {"create": "create", "own": "overwrite"}.get(mode)
        if put_mode is None:
            put_mode = self._update_mode(name)
            if put_mode is None:
                return
        try:
            # A single PUT: object_store's multipart upload cannot be conditional.
            obstore.put(
                self._put_store,
                self.entry_path(name),
                data,
                mode=put_mode,
                use_multipart=False,
            )
        except Exception as e:
            if classify(e) in ("exists", "precondition"):
                self.count("remote_put_exists")  # first writer won, as in the directory
            else:
                self.fail("put", e)
            return
        self.count("remote_puts")
        self.count("remote_written_bytes", len(memoryview(data)))
        self.count("remote_put_ms", round((time.perf_counter() - t) * 1000))

    def _update_mode(self, name: EntryName) -> Any:
        """How to overwrite entry ``name``'s object: created when there is none, else
        replaced only in the write its first bytes were read from (its ETag, or on GCS its
        generation: ``Version``; another write meanwhile wins: counted
        ``remote_put_exists``); None when it is a later release's entry (the core says so
        of those first bytes), which is left."""
        import obstore

        from xla_pcache import _core

        try:
            got = obstore.get(self._store, self.entry_path(name), options={"range": (0, 64)})
            head, meta = got.bytes(), got.meta
        except Exception as e:
            kind = classify(e)
            if kind == "missing":
                return "create"
            if kind == "empty":
                return "overwrite"
            self.fail("put", e)
            return None
        verdict = _core.entry_head_key(head)
        if isinstance(verdict, _core.Refusal) and verdict.kind == "newer_format":
            self.count("remote_put_newer_format")
            if self.first_warning("put_newer_format"):
                log.warning(
                    "xla_pcache: remote cache %s: %s holds %s; not replaced",
                    self.url,
                    name,
                    verdict.why,
                )
            return None
        return Version.of(meta).mode() or "overwrite"

    def close(self) -> None:
        self.claims.close()
        super().close()
        if self._readers is not None:
            self._readers.shutdown(wait=True)


# ------------------------------------------------------------------------------ claims


class ObjectClaim:
    """How a claim on the bucket ended; ``release()`` gives up a held one (after the
    writes queued before it, so a waiter finds the entry before the claim is gone)."""

    def __init__(self, claims: ObjectClaims, name: EntryName, state: str, waited: float) -> None:
        self._claims = claims
        self.name = name
        self.state = state
        self.waited = waited
        self.took_over = False
        self.e_tag: Version | None = None

    @property
    def held(self) -> bool:
        return self.state == "claimed" and self.e_tag is not None

    def release(self) -> None:
        if self.held:
            self._claims.release(self)


class ObjectClaims:
    """Compile claims on the bucket: ``<prefix>/xla_pcache-1/claims/<entry name>``.

    Taking one is a conditional create; its holder rewrites it every ``lease / 3`` seconds
    with an overwrite conditional on the write it last made (its ETag, or on GCS its
    generation: ``Version``), so two holders cannot both believe they hold it. A waiter
    takes the claim over when its ETag and version have not changed for
    ``lease`` seconds of the waiter's own clock (no clocks are compared across hosts), with
    the same conditional overwrite: of several waiters, one wins. The holder releases it
    by deleting it once the entry is uploaded; a waiter that sees the claim gone and no
    entry compiles itself (``abandoned``).
    """

    def __init__(self, tier: ObjectTier) -> None:
        self._tier = tier
        self._held: dict[EntryName, ObjectClaim] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease = 30.0
        self._owner = f"{socket.gethostname()}-{os.getpid()}-{random.getrandbits(32):08x}"

    def _path(self, name: EntryName) -> str:
        return f"{CLAIM_DIR}/{name}"

    def _body(self) -> bytes:
        return json.dumps({"owner": self._owner, "t": time.time()}).encode()

    def _create(self, name: EntryName) -> Version:
        import obstore

        result = obstore.put(self._tier._store, self._path(name), self._body(), mode="create")
        return Version.of(result)

    def _overwrite(self, name: EntryName, e_tag: Version) -> Version:
        import obstore

        mode: Any = e_tag.mode()
        result = obstore.put(self._tier._store, self._path(name), self._body(), mode=mode)
        return Version.of(result)

    def _peek(self, name: EntryName) -> Version | None:
        """Which write the claim is, or None when there is no claim."""
        import obstore

        try:
            meta = obstore.head(self._tier._store, self._path(name))
        except Exception as e:
            if classify(e) == "missing":
                return None
            raise
        return Version.of(meta)

    def claim(self, name: str, wait: float, lease: float, may_claim: bool = True) -> ObjectClaim:
        """Claim ``name`` or wait up to ``wait`` seconds for its holder on another host.

        ``claimed`` (ours: compile, put, release), ``published`` (the entry is in the
        bucket), ``abandoned`` (the holder went away without one), ``timed_out``, or
        ``unclaimed`` when the bucket cannot be reached (compile without a claim).
        ``ValueError`` naming ``name`` for what is not an entry name."""
        try:
            checked = EntryName(name)
        except (TypeError, ValueError) as e:
            raise ValueError(f"name: {e}") from None
        return self._claim(checked, wait, lease, may_claim)

    def _claim(self, name: EntryName, wait: float, lease: float, may_claim: bool) -> ObjectClaim:
        self._lease = lease
        tier = self._tier
        start = time.monotonic()
        deadline = start + wait
        seen: Version | None = None
        seen_at = start
        waited = False
        interval = 0.05
        try:
            # Every pass ends at the deadline check and the sleep below, whatever the
            # bucket answered: a bucket that contradicts itself (HEAD says no claim, the
            # conditional create says there is one, as an object planted under the
            # claim's name as a prefix makes SeaweedFS answer) costs polls, never a spin.
            while True:
                if not tier.available():
                    return ObjectClaim(self, name, "unclaimed", time.monotonic() - start)
                if tier.exists(name):
                    return ObjectClaim(self, name, "published", time.monotonic() - start)
                e_tag = self._peek(name)
                now = time.monotonic()
                if e_tag is None:
                    # The holder uploads the entry, then deletes its claim: both may have
                    # happened since the look at the entry above, on the first pass too.
                    if tier.exists(name):
                        return ObjectClaim(self, name, "published", time.monotonic() - start)
                    if waited:
                        tier.count("remote_claims_abandoned_seen")
                        return ObjectClaim(self, name, "abandoned", now - start)
                    if not may_claim:
                        return ObjectClaim(self, name, "unclaimed", now - start)
                    try:
                        new = self._create(name)
                    except Exception as e:
                        if classify(e) not in ("exists", "precondition"):
                            raise
                        # Another host was first: wait for it, as below.
                    else:
                        return self._held_claim(name, new, now - start, took_over=False)
                elif e_tag != seen:
                    seen, seen_at = e_tag, now
                elif may_claim and now - seen_at >= lease:
                    try:
                        new = self._overwrite(name, e_tag)
                    except Exception as e:
                        if classify(e) not in ("exists", "precondition"):
                            raise
                        # Another waiter took it over first: wait for it, as below.
                    else:
                        return self._held_claim(name, new, now - start, took_over=True)
                if now >= deadline:
                    tier.count("remote_claim_wait_timeouts")
                    return ObjectClaim(self, name, "timed_out", now - start)
                if not waited:
                    waited = True
                    tier.count("remote_claim_waits")
                    _testhook.reached("bucket-claim-wait")
                time.sleep(min(interval, max(0.0, deadline - now)))
                interval = min(interval * 1.5, 0.5)
        except Exception as e:
            tier.fail("claim", e)
            return ObjectClaim(self, name, "unclaimed", time.monotonic() - start)

    def _held_claim(
        self, name: EntryName, e_tag: Version, waited: float, *, took_over: bool
    ) -> ObjectClaim:
        claim = ObjectClaim(self, name, "claimed", waited)
        claim.e_tag = e_tag
        claim.took_over = took_over
        self._tier.count("remote_claims")
        if took_over:
            self._tier.count("remote_claim_takeovers")
        with self._lock:
            self._held[name] = claim
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._heartbeat, name="xla_pcache-objstore-claims", daemon=True
                )
                self._thread.start()
        # A test holds the claimant here while other hosts come to wait on it.
        _testhook.hold("bucket-claimed")
        return claim

    def _heartbeat(self) -> None:
        while not self._stop.wait(max(0.05, self._lease / 3)):
            with self._lock:
                held = [c for c in self._held.values() if c.e_tag is not None]
            for claim in held:
                try:
                    assert claim.e_tag is not None
                    new = self._overwrite(claim.name, claim.e_tag)
                except Exception as e:
                    if classify(e) in ("precondition", "exists", "missing"):
                        # Taken over (we were silent too long) or gone: no longer ours.
                        with self._lock:
                            self._held.pop(claim.name, None)
                        claim.e_tag = None
                    continue
                with self._lock:
                    if claim.e_tag is not None:
                        claim.e_tag = new

    def release(self, claim: ObjectClaim) -> None:
        with self._lock:
            self._held.pop(claim.name, None)
        e_tag, claim.e_tag = claim.e_tag, None
        if e_tag is None:
            return

        def drop() -> None:
            import obstore

            try:
                # Only our own claim: a takeover since then changed its ETag (its version).
                if self._peek(claim.name) == e_tag:
                    obstore.delete(self._tier._store, self._path(claim.name))
            except Exception as e:
                self._tier.fail("claim", e)

        self._tier.submit(drop)

    def release_all(self) -> None:
        with self._lock:
            held = list(self._held.values())
        for claim in held:
            self.release(claim)

    def close(self) -> None:
        self._stop.set()
        self.release_all()


def parse_object_url(url: str | TierURL) -> tuple[str, bool]:
    """(the bucket (or container) and prefix ``url`` names, as obstore takes it; whether
    read-only). The location is the one identity of a bucket path: the scheme and the
    bucket's name lower-cased, no options, no slashes at the prefix's ends, so that two
    spellings of one cache have the same. ``ValueError`` for what is not an object-store
    URL or carries options no object store takes (the mode options are
    ``base.parse_tier_url``'s; a ``TierURL`` it made is not parsed again)."""
    spec = (url if isinstance(url, TierURL) else parse_tier_url(url)).checked()
    parts = urllib.parse.urlsplit(spec.bare)
    if parts.scheme not in BUCKET_SCHEMES:
        raise ValueError(f"not an object-store URL (scheme {parts.scheme!r})")
    if not parts.hostname:
        raise ValueError("no bucket or container in the URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials do not go in the URL: use the cloud's standard variables")
    if parts.query:
        # Not named: what follows a '?' may be a token pasted by mistake.
        raise ValueError("an option other than ro, read_only and trust (not shown)")
    if parts.fragment:
        raise ValueError("a '#' part, which a bucket URL has none of (not shown)")
    prefix = parts.path.strip("/")
    base = f"{parts.scheme}://{parts.hostname}"
    return (f"{base}/{prefix}" if prefix else base), spec.read_only
