"""Type stubs for the Rust extension ``xla_pcache._core``.

The extension is private: import its names from ``xla_pcache``.
"""

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, Protocol, Self, TypeVar, final

from typing_extensions import Buffer, disjoint_base

# The reports the methods return are plain dicts at run time; their TypedDicts live in a real
# module, so that a test compares them with what the runtime returns (tests/test_stubs.py).
from xla_pcache._reports import Entry, EvictReport, Stats, StoredBudget, VerifyReport

__version__: str
FORMAT_VERSION: int
MAX_DURATION_S: float
# The largest byte size (a budget) the core takes: 2^63-1.
MAX_SIZE: int
# No object smaller than this holds an entry file of any format (a fixed header, a key byte).
ENTRY_MIN_BYTES: int
# The core's defaults of Store()'s durations (seconds), by argument name: what None means.
STORE_DEFAULTS: dict[str, float]
# The counters the core keeps per remote tier, in its order.
TIER_COUNTERS: list[str]
# The test hooks' variable, and whether this build honours it (built with the cargo feature
# ``test-hooks``: the test suite's build, never the wheel users install).
TEST_HOOKS_VAR: str
TEST_HOOKS: bool
# The counters of loading ahead (``stats()`` names each ``prefetch_<counter>``), in order.
PREFETCH_COUNTERS: list[str]

class CacheError(Exception):
    """Base class of every error the cache raises on purpose."""

class FormatError(CacheError):
    """The directory holds a cache of an unknown or newer on-disk format."""

class ReadOnlyError(CacheError):
    """A mutating operation was asked of a store opened read-only."""

Key = str | bytes
_S = TypeVar("_S", bound="Store")

@final
class Blob:
    """A verified entry: its payload through the buffer protocol (no copy), plus metadata.

    ``memoryview(blob)`` exposes the payload without copying; ``bytes(blob)`` copies it.
    The payload stays valid for the life of the Blob, even if the entry is deleted.
    """

    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, view: memoryview, /) -> None: ...
    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    @property
    def key(self) -> Key: ...
    @property
    def meta(self) -> dict[str, str]: ...
    @property
    def signer(self) -> str | None:
        """The signing key's name of a signed entry (a store with trusted keys served it only
        if that key signed it), else None."""
    @property
    def created(self) -> float:
        """Unix time (seconds) at which the entry was written."""
    @property
    def mapped(self) -> bool:
        """True when the payload is memory-mapped, False when it was read into memory."""

@final
class Refusal:
    """Why the core does not take an entry file, or an object by its first bytes: its
    verdict, handed to whoever fetched or received the file (made by the core only)."""

    @property
    def kind(self) -> Literal["corrupt", "untrusted", "other_key", "newer_format"]:
        """``corrupt`` (a checksum, the length or the header does not check out),
        ``untrusted`` (whole, but not signed by a key the store trusts), ``other_key`` (an
        entry of another key than its name's) or ``newer_format`` (a later release's
        entry: a miss, never removed as damage)."""
    @property
    def why(self) -> str:
        """The verdict for people."""
    @property
    def version(self) -> int | None:
        """The later release's format version (``newer_format`` only)."""
    @property
    def garbage(self) -> bool:
        """Whether it proves the object no entry of its name for any reader of any release
        (``corrupt`` or ``other_key``): what a writer may remove."""

@final
class Accept:
    """What a fetch after a local miss hands each remote value to, for one key: the store's
    one gate (the whole entry file verified, trust included) and, for the first value it
    takes, the local publish (unless read-only). Made by the store only."""
    def __call__(
        self, value: Buffer | Sequence[Buffer] | _Spooled
    ) -> tuple[str, ...] | Refusal | None:
        """For a value it takes, the names the tiers before the one that answered are
        backfilled under (none for a read-only store); for one it refuses, the core's
        verdict; None for one it could not read (proves nothing), and for any once it took
        one. ``value``: a buffer, its pieces in order, or a file it was spooled to (read
        from its start)."""

class _Spooled(Protocol):
    fd: int

@final
class Hasher:
    """Streaming xxh3-128 over bytes and str parts (str is hashed as UTF-8)."""

    def __new__(cls, *parts: Key | Buffer) -> Hasher: ...
    def update(self, data: Key | Buffer) -> None: ...
    def hexdigest(self) -> str: ...
    def digest(self) -> bytes: ...

def hash_key(*parts: Key | Buffer) -> str:
    """xxh3-128 hex digest of the concatenated parts, each length-prefixed."""

def entry_head_check(head: Buffer, name: str, size: int) -> Refusal | None:
    """The core's verdict on the first bytes ``head`` of an object of ``size`` bytes held
    under entry name ``name``: None when they hold the whole, verifying header of an entry
    filed under that name (the key's plain name, or for a signed entry its signer's own
    name, ``signed_entry_name``) whose file is ``size`` bytes long; else why not (a later
    release's entry is ``newer_format``, never ``garbage``)."""

def entry_head_key(head: Buffer) -> Key | Refusal:
    """The key an entry file's first bytes ``head`` name (str for a text key), read
    untrusted for a caller to fetch and verify whole under it; the core's ``Refusal`` when
    they name none (``newer_format`` for a later release's entry)."""

def signed_entry_name(key: Key, signer: str) -> str:
    """The name (32 hex digits) of ``signer``'s own copy of ``key``'s entry, beside its plain
    ``entry_name``: where a tier keeps a signed entry so that an object squatting the plain
    name stops no one. ValueError naming ``signer`` for what is not a key name."""

def hash_impl() -> str:
    """The xxh3 vector path in use on this CPU for inputs past 240 bytes: ``avx512``, ``avx2``,
    ``sse2``, ``neon``, ``scalar``, or ``portable-*`` when ``XLA_PCACHE_HASH_IMPL=portable``
    forces the build-time one."""

def identify_binaries(
    paths: list[str], record_dir: str | None = None
) -> tuple[
    list[tuple[str, str, int, bool, str, int] | str],
    int,
    tuple[str | None, list[str], str | None],
]:
    """The identity of each file of ``paths``: ``(kind, hex id, ctime ns, computed now,
    loaded, size)`` with kind ``"build-id"`` (its GNU build-id note) or ``"blake3"`` (its
    content's), loaded ``"no"``, ``"same"`` or ``"replaced"`` (mapped in this process, but
    not the file now at the path), or a message when it cannot be read; how many times the
    user's record was refused; and where that record is: ``(the directory it was read from
    or written to, or None; the directories before it that could not be used, each with
    why; why identities computed now are remembered nowhere, or None)``. The record is in
    ``record_dir`` and nowhere else when given; by default in
    ``$XDG_CACHE_HOME/xla_pcache-builds``, else, where that cannot be written,
    ``$XDG_RUNTIME_DIR/xla_pcache-builds-<uid>`` or ``<temp dir>/xla_pcache-builds-<uid>``
    (each a directory of this user's own). Identities are remembered there under each
    file's device, inode, size, mtime and ctime."""

def generate_signing_key() -> bytes:
    """A new Ed25519 private key: 32 random bytes from the operating system."""

def signing_public_key(private: bytes) -> bytes:
    """The 32-byte public key of a 32-byte private key."""

def check_key_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a valid key name (ending in a version: ``ci-1``)."""

def check_signing_key(key: tuple[str, bytes]) -> None:
    """Raise ValueError unless ``key`` (name, 32-byte private key) is a signing key a store
    takes (``Store(signing_key=)``): the key name's rule and the key's length."""

def check_trusted_keys(keys: Sequence[tuple[str, bytes]]) -> None:
    """Raise ValueError unless ``keys`` ((name, 32-byte public key) pairs) is a trusted set
    a store takes (``Store(trusted_keys=)``): each name's rule, no name given twice, each key
    32 bytes and an Ed25519 public key."""

def check_size(name: str, value: int) -> int:
    """``value`` as a byte size (a budget): from one byte to ``MAX_SIZE``; ValueError naming
    ``name`` otherwise. The core's one rule, which ``Store(max_size=)`` and the stored budget
    keep."""

def check_max_age(name: str, seconds: float) -> float:
    """``seconds`` as a max age: from 1 second (a cache's stored budget holds whole seconds)
    to ``MAX_DURATION_S``; ValueError naming ``name`` otherwise. The core's one rule, which
    ``Store.write_cache_settings`` keeps."""

@final
class OwnDir:
    """A directory ``own_directory`` checked."""

    @property
    def fd(self) -> int:
        """A descriptor of the directory, opened for reading: the caller's, to use for
        everything in it and to close."""
    @property
    def path(self) -> str:
        """Where it is (for messages)."""
    @property
    def found(self) -> Literal["own", "made", "repaired"]:
        """How it was found."""
    @property
    def mode(self) -> int | None:
        """Repaired: the mode it had."""
    @property
    def discarded(self) -> int:
        """Repaired: how many names it held, discarded."""
    @property
    def open_root(self) -> int | None:
        """Under rule "named": the mode of the named root when others can write it (the
        directory is then the one beneath it); None otherwise."""

def own_directory(
    path: str | os.PathLike[str],
    *,
    dir_fd: int | None = None,
    rule: Literal["refuse", "repair", "named"] = "refuse",
) -> OwnDir:
    """Opens ``path`` (with ``dir_fd``, its last component beneath that descriptor of its
    parent), making it mode 0700 (missing parents too) when absent, and checks that it is a
    directory of this user's own: not a link, owned by the effective user, writable by no
    one else. ``rule`` says what becomes of one of this user's that others can write:
    "refuse", "repair" (made 0700 and emptied) or "named" (a root the user named: left as
    it is, and our own directory beneath it used). ``CacheError`` naming it and why when it
    is refused."""

def test_hook_reached(point: str) -> bool:
    """Mark ``point`` as reached (``<dir>/<point>.<pid>``, created exclusively, no link
    followed); False when hooks are off (unset, or a build without them)."""

def test_hook_released(point: str) -> bool:
    """Whether the test created ``<dir>/<point>.go``."""

def entry_name(key: Key) -> str:
    """The file name (32 hex digits, xxh3-128 of the key bytes) under which ``key`` is filed
    in ``entries/<first two digits>/``."""

ClaimState = Literal["claimed", "published", "abandoned", "timed_out", "unclaimed"]

@final
class Claim:
    """How ``Store.claim`` / ``Store.wait_for`` ended, and the claim itself when it is ours.

    ``state``: ``"claimed"`` (this process compiles: put the key, which releases the claim,
    or call ``release()``), ``"published"`` (the entry is there), ``"abandoned"`` (the holder
    gave up without publishing), ``"timed_out"`` (the wait ran out) or ``"unclaimed"``
    (nothing claimed: read-only, ``wait_for``, a holder gone stale, or a failure, logged).
    A context manager: leaving it releases the claim.
    """

    @property
    def state(self) -> ClaimState: ...
    @property
    def waited(self) -> float:
        """Seconds spent waiting for another process's claim (0.0 if none was held)."""
    @property
    def took_over(self) -> bool:
        """The claim was taken over from a holder that stopped heartbeating."""
    @property
    def held(self) -> bool:
        """This process still holds the claim (not released, not lost to a takeover)."""
    def release(self) -> None:
        """Give the claim up now: removed if the entry was published, else marked retired
        so that waiters compile at once. Idempotent."""
    def __enter__(self) -> Claim: ...
    def __exit__(self, *exc: object) -> None: ...

@disjoint_base
class Store:
    """A persistent key -> blob store rooted at a directory.

    ``max_size`` is a byte budget (int) or None for unbounded. ``read_only`` stores never
    write anything to the directory. ``durable`` fsyncs file and directory on every put.
    ``lock_mode`` is ``"auto"`` (fcntl, lease file where fcntl locks fail), ``"fcntl"`` or
    ``"lease"``; ``None`` is ``"auto"``. ``read_mode`` is ``"auto"`` (mmap on local
    filesystems, pread elsewhere), ``"mmap"`` or ``"pread"``; ``None`` is ``"auto"``.
    ``evict_trace`` names a file to which every eviction appends ``pid start_ns end_ns``.
    A duration left None takes the core's default (``STORE_DEFAULTS``: lock_timeout 0.5 s,
    lease_time 30 s, hit_interval 60 s, trash_grace 300 s, tmp_grace 3600 s, claim_lease
    30 s; tests/test_stubs.py holds this list to the runtime's).
    The environment is never read here: ``xla_pcache.Store`` fills these from
    ``xla_pcache.config.Settings``.
    """

    def __new__(
        cls: type[_S],
        path: str | os.PathLike[str],
        *,
        max_size: int | None = None,
        read_only: bool = False,
        durable: bool = False,
        lock_mode: Literal["auto", "fcntl", "lease"] | None = None,
        lock_timeout: float | None = None,
        lease_time: float | None = None,
        hit_interval: float | None = None,
        trash_grace: float | None = None,
        tmp_grace: float | None = None,
        claim_lease: float | None = None,
        read_mode: Literal["auto", "mmap", "pread"] | None = None,
        evict_trace: str | os.PathLike[str] | None = None,
        signing_key: tuple[str, bytes] | None = None,
        trusted_keys: Iterable[tuple[str, bytes]] | None = None,
        own_root_fd: int | None = None,
    ) -> _S: ...
    @property
    def trusted_keys(self) -> list[tuple[str, bytes]] | None:
        """The trusted keys as (name, 32-byte public key) pairs, in order; None without."""
    @property
    def signing_key_name(self) -> str | None:
        """The name of the key every put is signed with, or None (unsigned puts)."""
    @property
    def trusted_key_names(self) -> list[str] | None:
        """The names of the trusted keys, or None (every verified entry is served)."""
    def untrusted_entries(self, remove: bool = False) -> list[tuple[str, Key, str]]:
        """(path, key, why) of each entry a reader with this store's trusted keys would not
        serve ("unsigned", "signed by mallory-1, not trusted", ...), and of each entry name
        held by no file ("a directory at an entry's name", a FIFO, a link: key ``""``);
        with ``remove``, each is removed (ReadOnlyError if read-only). ValueError without
        trusted keys."""
    @property
    def path(self) -> str: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def max_size(self) -> int | None:
        """The budget this handle keeps: the cache's stored one (``xla-pcache config``),
        lowered by the ``max_size`` it was opened with if that is smaller; None: unbounded."""
    @property
    def max_age(self) -> float | None:
        """The cache's stored max age in seconds: entries unused longer are evicted."""
    def cache_settings(self) -> StoredBudget:
        """The cache's stored budget (its CONFIG file), as this handle last read it (at
        most the refresh interval ago)."""
    def write_cache_settings(
        self, *, max_size: int | None = None, max_age: float | None = None
    ) -> None:
        """Replace the cache's stored budget (written to a temp file, then renamed into
        place); None unsets one. ``ReadOnlyError`` on a read-only handle."""
    def count_adopted(self, nbytes: int, compile_time_s: float | None = None) -> None:
        """Count a lookup served from another program's cache files (an adopted JAX entry of
        ``nbytes`` payload bytes) as a hit and as ``adopted``; ``compile_time_s`` (None when
        unknown: nothing added) goes to the compile time saved."""
    def count_other_build(self) -> None:
        """Count a miss (already counted by its ``get``) of a key that another build of the
        framework's runtime has an entry for (``other_build`` in ``stats``)."""
    def count_newer_format(self, version: int) -> None:
        """Count a later release's entry (format ``version``) that a remote tier holds,
        refused after its first bytes (``entry_head_check``), as a lookup here counts one:
        ``newer_format`` in ``stats``, one warning naming the version."""
    def count_build_rehash(self) -> None:
        """Count a process start that hashed its runtime's binaries with no record to keep
        their identities in (``build_rehashes`` in ``stats``)."""
    def count_misses(self, n: int) -> None:
        """Count ``n`` misses of lookups a framework made in a copy the store filled
        (torch_xla's host-local copy), so ``stats`` counts them with the store's own."""
    @property
    def mmap_reads(self) -> bool:
        """Whether gets map files (local filesystems) or pread them (NFS, FUSE, unknown)."""
    @property
    def filesystem(self) -> str:
        """Name of the filesystem the root is on (ext4, nfs, fuse.sshfs, tmpfs, ...)."""
    def _set_chain(
        self,
        fetch: Callable[[list[str], int | None, Accept], object],
        on_publish: Callable[[list[str], bytes, bool], object],
    ) -> None:
        """Put a chain of tiers behind the directory (once): after a local miss ``get`` calls
        ``fetch(names, max_bytes, accept)`` (the names to ask the tiers for, in the core's
        order; the budget; an ``Accept``) and returns the value ``accept`` took; after a put
        published, ``put`` calls ``on_publish(names, data, replace)`` (the names a tier keeps
        the entry under; the entry file as written; whether the tiers' plain object is
        overwritten: ``_put_replacing``). Exceptions they raise are logged, never the
        caller's."""
    def _fetch(self, key: Key) -> tuple[Blob | None, object]:
        """Ask the tiers for ``key`` as a local miss does, without looking in the directory
        or counting a miss: their verified entry (published here unless read-only) or None,
        and what the chain's fetch returned (``tiers.Fetched``: what each tier refused, with
        the core's verdict), None also without a chain."""
    def put(
        self, key: Key, value: Buffer, *, meta: dict[str, str] | None = None, sign: bool = True
    ) -> bool:
        """Store value under key. True if this call stored it; False if the key exists (first
        writer wins), the store is read-only, the value is over budget, or the write failed
        (failures are logged and counted, never raised). The store's signing key, if any,
        signs it; ``sign=False`` for bytes this process did not produce (a file adopted from
        another program's cache): written unsigned, whatever key the store holds."""
    def _put_replacing(
        self, key: Key, value: Buffer, *, meta: dict[str, str] | None = None
    ) -> bool:
        """``put`` (signed), whose copy to the tiers overwrites the object at the entry's
        plain name rather than only creating it (``xla_pcache.store.Store.replace``)."""
    def get(self, key: Key, *, count: bool = True) -> Blob | None:
        """The verified entry, or None (a miss; corrupt entries are counted and removed).
        With ``count=False`` the lookup counts nothing (no hit, miss, bytes read, compile
        time saved or untrusted entry) and records no use of the entry: a read ahead of the
        lookup it may serve, which ``count_hit`` counts when it does."""
    def count_hit(self, blob: Blob) -> None:
        """Count a lookup served by ``blob``, an entry read earlier with ``get(count=False)``:
        a hit, its payload bytes, its recorded compile time and a use of its entry, as
        ``get`` would have."""
    def add_prefetch_counters(self, counts: Sequence[tuple[str, int]]) -> None:
        """For each ``(counter, n)``: add ``n`` to the prefetch counter ``counter`` (one of
        ``PREFETCH_COUNTERS``), reported by ``stats`` as ``prefetch_<counter>`` and summed
        across processes. ``ValueError`` naming the first unknown counter, before any is
        added."""
    def get_entry_file(self, key: Key) -> bytes | None:
        """The verified entry file (header, key, metadata, payload) as bytes, or None."""
    def entry_names(self, key: Key) -> list[str]:
        """The names (32 hex digits) an entry of ``key`` may be under for this store's reads,
        in the order every reader tries them: the plain ``entry_name``, then each trusted
        signer's own name (``signed_entry_name``) in the trusted keys' order. What the remote
        tiers are asked for; the order is the core's, written once."""
    def entry_file_named(self, key: Key, name: str) -> bytes | None:
        """The entry file under ``name`` (as ``entries()`` lists it) when it holds an entry
        of ``key`` that ``get_entry_file`` would hand out, filed correctly there (its key's
        plain name or its signer's own); None otherwise. ValueError naming ``name`` for what
        is not an entry name."""
    def verify_entry_file(self, key: Key, data: Buffer) -> Blob | None:
        """Verify a whole entry file in memory (header, length, checksum, key) and return its
        payload as a Blob without writing anything; None if it does not verify."""
    def take_entry_file(self, key: Key, pieces: Iterable[Buffer], publish: bool) -> Blob | None:
        """A whole entry file received in ``pieces`` (buffers, in order): gathered into one
        buffer (the only copy), verified once (header, length, checksum, key), published when
        ``publish`` (what is published is what was verified), and its payload returned as a
        Blob; None if it does not verify (nothing written)."""
    def _root_fd(self) -> int:
        """A new descriptor of the cache's directory (``O_PATH``: a base for the ``*at``
        calls), the caller's to close: the directory the store works in, which for a store
        opened on ``own_root_fd`` is that one, whatever was renamed since."""
    def _spool_fd(self) -> int:
        """A new unnamed file under the cache's tmp/, opened beneath the root with no link
        followed in any component, as a descriptor the caller owns: where a tier streams a
        large entry file before ``Accept`` reads it. ``CacheError`` when tmp/ cannot be used
        (not a real directory inside the cache: counted and warned of)."""
    def put_entry_file(self, key: Key, data: Buffer) -> bool | Refusal:
        """Publish a whole entry file after verifying it (header, length, checksum, key):
        what ``put`` returns, or the core's ``Refusal`` when it does not verify (nothing
        written)."""
    def claim(self, key: Key, wait: float) -> Claim:
        """Claim ``key`` for compiling, or wait up to ``wait`` seconds for another process's
        claim on it to end (read-only stores only wait). ``claim_lease`` seconds without a
        heartbeat make a claim stale: it is taken over."""
    def wait_for(self, key: Key, timeout: float) -> Claim:
        """Wait up to ``timeout`` seconds for another process's claim on ``key`` to end,
        without ever claiming."""
    def __contains__(self, key: object, /) -> bool:
        """Whether an entry file exists; does not verify, does not count as a use."""
    def touch(self, key: Key) -> bool:
        """Record a use of ``key``'s entry, as a hit does, counting nothing and reading no
        content: for an entry no lookup reads while the entries it belongs with are used
        (JAX's module records), so that it ages with them, not first. False when there is no
        entry file, or the store is read-only (it records no use)."""
    def delete(self, key: Key) -> bool:
        """Remove the entry (two-phase: moved to trash first). ReadOnlyError if read-only."""
    def clear(self, *, all: bool = False) -> int:
        """Remove every entry but those of a later release's format (which stay indexed:
        budgeted, evicted by LRU), or with ``all`` those too; returns how many were removed.
        ReadOnlyError if read-only."""
    def __len__(self) -> int: ...
    def keys(self) -> list[Key]: ...
    def entries(self, shard: str | None = None) -> list[Entry]:
        """One dict per entry: key, name, size (payload bytes), disk_bytes, created,
        last_use, hits (hit records folded from the journals: at most one per process per
        hit interval, a lower bound), meta. Reads entry headers (walks the directory); with
        ``shard`` (a name ``entry_shards`` gave), only that shard's."""
    def entry_shards(self) -> list[str]:
        """The shard directories under entries/, sorted: ``entries(shard)`` of each in turn
        lists every entry a shard at a time (a caller shows the first ones at once)."""
    def trashed_keys(self, names: list[str]) -> dict[str, Key]:
        """The keys of entries just evicted (file names as ``evict`` reports them), read from
        their files in trash/ while they are there (a few minutes); absent names are left
        out."""
    def interrupt(self) -> None:
        """Ask the running ``verify`` or ``evict`` to stop after the entry it is at; the
        cache is valid after each entry. With none running it does nothing. Ctrl-C does this
        on its own."""
    def stats(self) -> Stats:
        """Counters aggregated across every process that used the cache: hits, misses, puts,
        put_exists, corrupt, errors, evictions, evicted_bytes, bytes_written, bytes_read,
        too_large, claims, claim_takeovers, claims_abandoned, claim_waits, claim_wait_ms,
        claim_wait_timeouts, puts_refused, unsafe_paths (paths refused because a component was
        not a real directory inside the cache, or a directory stood where an entry file
        belongs, and verification records a trusting reader would not use), unreadable
        (index files skipped because they could not be read), compile_saved_ms (compile time
        the hits saved: each hit adds its entry's ``compile_time_s`` metadata), untrusted
        (entries a store with trusted keys would not serve, each a miss and never loaded,
        and what a trusting import rejected), adopted (lookups served from JAX's own cache
        files, each also a hit: ``count_adopted``) and other_build (misses of a key another
        build of the framework's runtime has an entry for, each also a miss:
        ``count_other_build``), and loading ahead's (``add_prefetch_counters``):
        prefetch_planned, prefetch_loaded, prefetch_used (each also a hit, ``count_hit``),
        prefetch_wasted, prefetch_errors, prefetch_saved_ms, prefetch_plans_written and
        prefetch_plans_refused; build_rehashes (process starts that hashed the runtime's
        binaries with no record to keep their identities in: ``count_build_rehash``);
        compiling ahead's (``add_prefetch_counters`` too): prefetch_compiled,
        prefetch_compiled_used and prefetch_modules_refused; newer_format (lookups that met
        an entry of a later release's format, locally or in a tier, each a miss, never
        removed); plus hit_rate, entries, bytes
        (on disk), max_size, max_age_s, processes, path, filesystem, read_only, mmap_reads,
        view_age_s (seconds since the journal folded longest ago was last read to its end;
        None if unknown) and view_fresh
        (whether those reads bypassed a network client's attribute cache; if not, entries and
        bytes may lag by that cache's time too). Once some remote tier counted (in any
        process), also the ``remote_*`` totals and ``remote_<tier>_<counter>`` for each tier
        by name; a store that never had a tier reports neither."""
    def add_tier_counters(self, counts: Sequence[tuple[str, str, int]]) -> None:
        """For each ``(tier, counter, n)``: add ``n`` to counter ``counter`` (one of
        ``xla_pcache._reports.TIER_COUNTERS``) of the remote tier named ``tier`` (1 to 40 of
        ``a-z 0-9 _ - .``; at most 32 tiers), and to its ``remote_*`` total; summed across
        processes by ``stats``, which reports it as ``remote_<tier>_<counter>``.
        ``ValueError`` for another name or counter, before any is added."""
    def process_stats(self) -> dict[str, int]:
        """This process's own counters for this store handle (the names ``stats`` sums
        across processes), without reading any journal."""
    def evict(self, max_size: int | None = None, older_than: float | None = None) -> EvictReport:
        """Evict least recently used entries now, down to ``max_size`` bytes (default: the
        low watermark of the store's budget) and/or every entry unused for ``older_than``
        seconds. First reconciles the index with the directory (lists every shard: records
        of files that are gone are dropped, files the index did not know are added), and
        re-reads the other processes' journals when done, going on while they put it over the
        target again. Returns {"removed": n, "bytes": b (st_blocks of the files removed),
        "dropped": index records of files already gone, "added": files found unindexed,
        "names": [entry file names], "skipped": why it evicted nothing (the evictor lock held
        by another process, or not to be taken: then counted as an error and warned once) or
        None, "skipped_files": [what it went on without: index files it could not read, with
        their owner], "interrupted":
        stopped early by ``interrupt``}. Ctrl-C stops it after the entry it is at (the cache
        stays valid) and raises KeyboardInterrupt. Raises ReadOnlyError on a read-only
        store."""
    def verify(
        self,
        repair: bool = False,
        progress: Callable[[int, int], object] | None = None,
    ) -> VerifyReport:
        """Walk every file; report corrupt, foreign (orphaned), unindexed and dangling index
        records and stale temp/trash files; repair if asked. ``progress(done, total)`` is
        called as files are checked. Returns {"entries", "bytes", "corrupt": [paths],
        "foreign": [paths], "newer_format": [paths of a later release's entries: indexed,
        never removed], "unindexed", "dangling", "stale_tmp", "stale_trash", "problems",
        "repaired", "interrupted", "skipped_files": [entries or index files it could not
        read, and paths that are not real directories inside the cache, with why]}. Ctrl-C
        (or a ``progress`` that raises) stops it after the file it is at, and the exception
        is raised; an interrupted walk neither reconciles nor repairs the index."""
    def flush(self) -> None:
        """Write this process's pending counters to its journal."""
    def close(self) -> None:
        """Release (retire) held claims and flush counters; any later call raises
        CacheError."""
    def _after_fork_child(self) -> None:
        """In a forked child: forget the parent's journal, locks, claims and threads (called
        by the ``os.register_at_fork`` hook of ``xla_pcache.store``)."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...
