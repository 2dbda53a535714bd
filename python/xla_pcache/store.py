"""``Store``: the Rust store, with budgets accepted as size strings, defaults from
``Settings`` and an optional chain of remote tiers behind the directory; and ``settle``, the
one rule of what a store is opened with."""

from __future__ import annotations

import dataclasses
import os
import threading
import types
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self, TypedDict, Unpack, cast

from xla_pcache import _core
from xla_pcache._text import package_logger
from xla_pcache._url import FILE_SCHEME, url_scheme
from xla_pcache.config import REMOTE_VAR, Settings
from xla_pcache.sizes import parse_duration, parse_size

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from xla_pcache._reports import EvictReport, Stats
    from xla_pcache.bundle import ImportReport
    from xla_pcache.tiers import Chain, Fetch, Spooled, TierURL

log = package_logger("xla_pcache")


class StoreArgs(TypedDict, total=False):
    """The options a caller may give a store (``Store()``, ``xla_pcache.open_store``), as
    people write them: sizes as ``"50G"``, durations as ``"7d"``; None or absent is "not
    given". ``settle`` turns them into ``StoreOptions``."""

    max_size: int | str | None
    read_only: bool | None
    durable: bool
    lock_mode: Literal["auto", "fcntl", "lease"] | None
    read_mode: Literal["auto", "mmap", "pread"] | None
    lock_timeout: float | str | None
    lease_time: float | str | None
    hit_interval: float | str | None
    trash_grace: float | str | None
    tmp_grace: float | str | None
    claim_lease: float | str | None
    remote: str | None
    signing_key: tuple[str, bytes] | None
    trusted_keys: Sequence[tuple[str, bytes]] | None


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """What a store is opened with, settled (``settle``): ``core`` the keyword arguments of
    the core's store (``_core.Store``), every value final, sizes in bytes, durations in
    seconds, None for the core's default (``_core.STORE_DEFAULTS``, written only there); the
    core holds them to its bounds. ``settings`` is what the store reads later (the wait of
    ``claim()``, the tiers' timeout and largest value); ``chain`` the remote tiers behind
    the directory, each URL parsed once (``chain_text`` as given, for what the store shows
    of them)."""

    settings: Settings
    core: Mapping[str, Any]
    chain: tuple[TierURL, ...] = ()
    chain_text: str | None = None

    def __post_init__(self) -> None:
        # Frozen as the rest: what settle decided is not changed in place after.
        object.__setattr__(self, "core", types.MappingProxyType(dict(self.core)))

    @property
    def read_only(self) -> bool:
        return bool(self.core["read_only"])

    @property
    def max_size(self) -> int | None:
        return cast("int | None", self.core["max_size"])

    def replace(self, **changes: Any) -> StoreOptions:
        """These options with ``changes``: to the fields by their names, to ``core`` by the
        core's argument names."""
        own = {f.name: changes.pop(f.name) for f in dataclasses.fields(self) if f.name in changes}
        return dataclasses.replace(self, **own, core={**self.core, **changes})


# Durations the core defaults when not given (Settings has no variable for them).
_CORE_DURATIONS = ("lock_timeout", "lease_time", "hit_interval", "trash_grace", "tmp_grace")


def settle(settings: Settings | None, **given: Unpack[StoreArgs]) -> StoreOptions:
    """The one rule of what a store is opened with: an argument given (not None) wins over
    ``settings``; ``settings`` wins over the environment, which is read only when no
    ``settings`` is given (``Settings.from_env()``), and then for all but the budget and
    ``read_only``: those variables are the framework cache's at ``XLA_PERSISTENT_CACHE_PATH``,
    so a store opened without settings is unbounded and writable unless told otherwise.
    Sizes and durations are parsed here (``ValueError`` / ``TypeError`` naming the
    argument); their bounds are the core's, which it keeps when the store opens. A chain of
    remote tiers is checked now and opened at its first use."""
    unknown = sorted(set(given) - StoreArgs.__annotations__.keys())
    if unknown:
        # As a function's own signature would: a misspelt option is never silently dropped.
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    if settings is not None and not isinstance(settings, Settings):
        raise TypeError(
            f"settings must be an xla_pcache.Settings (or None), not {type(settings).__name__}"
        )
    cfg = (
        Settings.from_env().replace(max_size=None, read_only=False)
        if settings is None
        else settings
    )

    def pick(name: str, default: Any, parse: Any = None) -> Any:
        value = given.get(name)
        if value is None:
            return default
        return value if parse is None else parse(value, name=name)

    remote = given.get("remote")
    chain_text = (remote if remote is not None else cfg.remote) or None
    chain: tuple[TierURL, ...] = ()
    if chain_text is not None:
        from xla_pcache.tiers import check_chain

        # Checked now, opened later: a value that names no URL is the caller's error at once.
        chain = check_chain(chain_text, "remote" if remote is not None else REMOTE_VAR)
    signing = given.get("signing_key")
    if signing is None and cfg.signing_key is not None:
        signing = (cfg.signing_key.name, cfg.signing_key.private)
    trusted = given.get("trusted_keys")
    if trusted is None:
        trusted = cfg.trusted_keys
    return StoreOptions(
        settings=cfg,
        core={
            "max_size": pick("max_size", cfg.max_size, parse_size),
            # As given: the binding refuses what is not a bool, naming the argument.
            "read_only": pick("read_only", cfg.read_only),
            "durable": given.get("durable", False),
            "lock_mode": pick("lock_mode", cfg.lock_mode),
            "read_mode": pick("read_mode", cfg.read_mode),
            **{name: pick(name, None, parse_duration) for name in _CORE_DURATIONS},
            "claim_lease": pick("claim_lease", cfg.claim_lease, parse_duration),
            "evict_trace": cfg.evict_trace,
            "signing_key": signing,
            "trusted_keys": None if trusted is None else list(trusted),
        },
        chain=chain,
        chain_text=chain_text,
    )


class Store(_core.Store):
    """A persistent key -> blob store rooted at the directory ``path`` (see
    ``xla_pcache._core.Store``); ``xla_pcache.open_store`` opens one for any cache path, a
    bucket's included.

    ``max_size`` may be a byte count or a string such as ``"500M"``, ``"50G"``, ``"1.5T"``;
    durations are seconds or strings such as ``"30s"``, ``"7d"``. A size or duration that is
    negative, NaN, infinite, empty or out of range is a ``ValueError`` naming the argument.

    What is not passed comes from ``settings`` (``settle`` is the rule): the budget
    (``max_size``; pass ``settings.replace(max_size=None)`` for none), ``read_only``, the lock
    and read modes (``lock_mode``, ``read_mode``), the eviction trace, ``claim_lease`` (how
    long a compile claim may go without a heartbeat before waiters take it over), the wait
    of ``claim()`` and the remote tiers, and the signing and trusted keys. An argument
    passed wins over ``settings``; ``settings`` wins over the environment, which is read
    only when no ``settings`` is given (``Settings.from_env()``), and then for all but the
    budget and ``read_only``: those variables are the framework cache's at
    ``XLA_PERSISTENT_CACHE_PATH``, so a store opened without settings is unbounded and
    writable unless told otherwise. ``durable`` syncs each entry before it is published;
    ``lock_timeout``, ``lease_time``, ``hit_interval``, ``trash_grace`` and ``tmp_grace``
    default to the core's (``_core.STORE_DEFAULTS``).
    ``signing_key`` ((name, 32-byte private key)) signs every put; ``trusted_keys`` ((name,
    32-byte public key) pairs) makes the store serve only entries one of them signed
    (docs/reliability.md, "Trusted writers"). ``own_root_fd``: a descriptor of ``path``
    checked as a directory of this user's own (``_owndir``; a bucket path's host-local
    store): the store works beneath it and never resolves ``path`` again. ``remote`` (a URL such as
    ``"redis://host:6379/0"``, or a comma-separated chain of them) puts remote tiers behind
    the directory: a local miss asks them, a put this process published is copied to them
    (docs/remote.md). The tiers' clients and threads start on the first miss or put.
    """

    _settings: Settings
    _chain_text: str | None
    _chain_urls: tuple[TierURL, ...]
    _chain: Chain | None
    _chain_failed: bool
    _chain_lock: threading.Lock

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        settings: Settings | None = None,
        own_root_fd: int | None = None,
        **given: Unpack[StoreArgs],
    ) -> Self:
        url_read_only = False
        scheme = url_scheme(os.fspath(path))
        if scheme == FILE_SCHEME:
            # The directory a file: URL names, by the parser cache_path.route uses.
            from xla_pcache._file_url import directory

            try:
                named = directory(os.fspath(path))
            except ValueError as e:
                from xla_pcache.tiers import redact

                raise ValueError(
                    f"path {redact(os.fspath(path))!r} names no directory here: {e}"
                ) from None
            path, url_read_only = named.path, named.read_only
        elif scheme is not None:
            # A URL is never a directory: a bucket path is served by a host-local store
            # (xla_pcache.bucket), and nothing is created under a name made of the URL.
            from xla_pcache.tiers import redact

            raise ValueError(
                f"path {redact(path)!r} is a URL, not a directory: open a bucket path "
                "with xla_pcache.open_store"
            )
        opts = settle(settings, **given)
        if url_read_only and not opts.read_only:
            opts = opts.replace(read_only=True)
        return cls._open(path, opts, own_root_fd=own_root_fd)

    @classmethod
    def _open(
        cls, path: str | os.PathLike[str], opts: StoreOptions, *, own_root_fd: int | None = None
    ) -> Self:
        """The store at the directory ``path``, opened with settled options (``settle``):
        what ``Store()`` and ``xla_pcache.open_store`` end in."""
        self = super().__new__(cls, path, **opts.core, own_root_fd=own_root_fd)
        if self.signing_key_name is not None and self.trusted_key_names is None:
            _warn_signing_without_trust(self.signing_key_name)
        self._settings = opts.settings
        self._chain_text = opts.chain_text
        self._chain_urls = opts.chain
        self._chain = None
        self._chain_failed = False
        self._chain_lock = threading.Lock()
        if self._chain_text is not None:
            # Only then does the Rust get/put call back into Python (on a miss, after a
            # publish); a store without a chain serves hits with no Python frame in between.
            # The hooks hold the store weakly: a strong reference would be a cycle through
            # the Rust object, which the garbage collector cannot see.
            self._set_chain(*_chain_hooks(self))
        _track_for_fork(self)
        return self

    @property
    def settings(self) -> Settings:
        """The settings this store was opened with."""
        return self._settings

    def root_fd(self) -> int:
        """A new descriptor of the directory this store works in (``O_PATH``: a base for
        ``dir_fd=``), the caller's to close; for files beside the store's own (the miss log,
        a bucket's spool of use records), so that they land where its entries do."""
        return self._root_fd()

    @property
    def remote(self) -> Chain | None:
        """The chain of remote tiers behind the directory (opened now if it was not yet), or
        None."""
        return self._open_chain()

    def _open_chain(self) -> Chain | None:
        if self._chain is not None or self._chain_text is None or self._chain_failed:
            return self._chain
        with self._chain_lock:
            if self._chain is None and not self._chain_failed:
                from xla_pcache.tiers import hide_chain_secrets, open_chain, redact_chain

                try:
                    chain = open_chain(
                        self._chain_urls,
                        self._settings,
                        trusting=bool(self.trusted_key_names),
                        # Its counters also go to this store's journal, summed across
                        # processes.
                        counters=self,
                    )
                    self._chain = chain
                except Exception as e:  # never the caller's: the local cache still works
                    self._chain_failed = True
                    log.warning(
                        "xla_pcache: cannot open the remote cache %s (%s: %s); local cache only",
                        redact_chain(self._chain_text),
                        type(e).__name__,
                        hide_chain_secrets(str(e), self._chain_text),
                    )
        return self._chain

    def _chain_fetch(
        self, names: list[str], max_bytes: int | None, accept: _core.Accept
    ) -> Fetch | None:
        """After a local miss: the tiers' values for ``names`` (the core's candidate names
        for the key, in its order: an object squatting the plain name hides no trusted
        entry), each handed to ``accept``, the core's gate, which verifies it, publishes the
        first it takes (unless read-only) and hands it to ``get``. What the fetch found (the
        core's verdict on each value refused), or None without a chain."""
        chain = self._open_chain()
        if chain is None:
            return None
        # What a tier holds is untrusted: never accepted past this store's budget
        # (``max_bytes``), and a large one is streamed to an unnamed file the core opens
        # under this cache's tmp/ (beneath the root, no link followed).
        return chain.fetch(names, accept, max_bytes=max_bytes, spool=self._spool)

    def _spool(self) -> Spooled:
        from xla_pcache.tiers import Spooled

        return Spooled(self._spool_fd())

    def _chain_put(self, names: list[str], data: bytes, replace: bool) -> None:
        """After a put this process published: the entry file it wrote, to the tiers under
        ``names`` (a signed entry's signer's own name after the plain one: no squatting,
        docs/remote.md); ``replace``: it overwrites the plain name's object there
        (``replace``), else it is only created."""
        chain = self._open_chain()
        if chain is not None:
            chain.put_async(names, data, replace=replace)

    def replace(self, key: _core.Key, value: Buffer, *, meta: dict[str, str] | None = None) -> bool:
        """Put ``value`` under ``key`` in place of the entry there: for a small record that
        changes (a prefetch plan), never an executable, which is first-writer-wins
        everywhere. The entry is deleted, then put, so a reader meanwhile sees the old
        entry, a miss or the new one, always whole; and each writable remote tier's copy is
        overwritten (a put only creates there). False when nothing was written: read-only,
        another process's put came between (its value stays), over budget, or a failure
        (logged)."""
        if self.read_only:
            return False
        self.delete(key)
        # A put whose copy to the tiers (``_chain_put``) overwrites.
        return self._put_replacing(key, value, meta=meta)

    def stats(self) -> Stats:
        """As ``_core.Store.stats``; with a chain, also ``remote`` (its URL, password
        redacted) and, once it was used, its counters (``remote_hits``, ...)."""
        out = super().stats()
        if self._chain_text is not None:
            from xla_pcache.tiers import redact, redact_chain

            extra = cast(dict[str, Any], out)
            if self._chain is not None:
                # The totals the store keeps across processes win over this process's own.
                for k, v in self._chain.stats().items():
                    extra.setdefault(k, v)
            else:
                # Not opened (and not opened for this: no client just to report): the tiers
                # as configured, by number, as the chain names them.
                for i, url in enumerate(self._chain_urls, 1):
                    extra[f"tier{i}"] = redact(url.text)
            # Before the chain is opened, the tiers as configured; then the tiers in use.
            extra.setdefault("remote", redact_chain(self._chain_text))
        return out

    def close(self) -> None:
        """As ``_core.Store.close``; also finishes the chain's queued writes."""
        super().close()
        chain, self._chain = self._chain, None
        if chain is not None:
            chain.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def export_bundle(
        self,
        out: str | os.PathLike[str],
        *,
        framework: str | None = None,
        newer_than: float | str | None = None,
        min_hits: int = 0,
    ) -> int:
        """Write verified entries to a bundle file (tar.gz); returns how many. ``min_hits``
        keeps entries with at least that many hits recorded (at most one per process per
        hit interval: a lower bound on uses). See ``xla_pcache.bundle``."""
        from xla_pcache.bundle import export_bundle

        age = None if newer_than is None else parse_duration(newer_than, name="newer_than")
        return export_bundle(self, out, framework=framework, newer_than=age, min_hits=min_hits)

    def import_bundle(self, bundle: str | os.PathLike[str]) -> ImportReport:
        """Publish each verifying entry of a bundle; returns imported/present/rejected."""
        from xla_pcache.bundle import import_bundle

        return import_bundle(self, bundle)

    def claim(self, key: _core.Key, wait: float | str | None = None) -> _core.Claim:
        """Single flight: claim ``key`` for compiling, or wait for the process compiling it.

        The first process to miss a key claims it (``state == "claimed"``): it compiles and
        puts the key, and the put releases the claim (so does ``release()``, leaving the
        ``with`` block, or closing the store). Others that miss the same key meanwhile wait
        up to ``wait`` seconds (default the settings' ``compile_wait``:
        ``XLA_PCACHE_COMPILE_WAIT``, else 300) and get
        ``"published"`` once the entry is there (then ``get`` it), ``"abandoned"`` when the
        holder gave up without publishing, or ``"timed_out"``; in both of the last cases
        they compile themselves. A holder that stops heartbeating for ``claim_lease``
        seconds (killed, host lost) is taken over by a waiter (``took_over``). A read-only
        store waits but never claims (``"unclaimed"`` when nobody holds a claim).
        """
        if wait is None:
            return super().claim(key, self._settings.compile_wait)
        return super().claim(key, parse_duration(wait, name="wait"))

    def wait_for(self, key: _core.Key, timeout: float | str) -> _core.Claim:
        return super().wait_for(key, parse_duration(timeout, name="timeout"))

    def evict(
        self, max_size: int | str | None = None, older_than: float | str | None = None
    ) -> EvictReport:
        """As ``_core.Store.evict``; ``max_size`` may also be a string such as ``"50G"`` and
        ``older_than`` one such as ``"7d"``, as ``Store()`` accepts them."""
        return super().evict(
            parse_size(max_size, name="max_size"),
            None if older_than is None else parse_duration(older_than, name="older_than"),
        )


_warned_signing_without_trust = False


def _warn_signing_without_trust(signer: str) -> None:
    """Once per process: a store that signs with no trusted keys is half a set-up. It serves
    every verified entry, whoever wrote it, so the programs it runs are not vouched for by
    any key, while what it compiles is signed for the trusting fleet. The two variables go
    together (docs/reliability.md, "Trusted writers")."""
    global _warned_signing_without_trust
    if _warned_signing_without_trust:
        return
    _warned_signing_without_trust = True
    from xla_pcache.config import SIGNING_KEY_VAR, TRUSTED_KEYS_VAR

    log.warning(
        "xla_pcache: this process signs its entries with key %s (%s) but trusts no key (%s "
        "is not set): it serves entries from anyone who can write the cache, signed or not. "
        "Set %s too, with at least this key's public half (xla-pcache keygen prints it)",
        signer,
        SIGNING_KEY_VAR,
        TRUSTED_KEYS_VAR,
        TRUSTED_KEYS_VAR,
    )


def _chain_hooks(store: Store) -> tuple[Any, Any]:
    """What the binding calls after a local miss and after a put that published (its
    ``_set_chain``), holding the store weakly."""
    ref = weakref.ref(store)

    def fetch_from_chain(
        names: list[str], max_bytes: int | None, accept: _core.Accept
    ) -> Fetch | None:
        s = ref()
        return None if s is None else s._chain_fetch(names, max_bytes, accept)

    def on_publish(names: list[str], data: bytes, replace: bool) -> None:
        s = ref()
        if s is not None:
            s._chain_put(names, data, replace)

    return fetch_from_chain, on_publish


# Fork safety. A child forked while another thread was inside a store (PyTorch's DataLoader
# forks its workers) would inherit its mutexes locked, its journal (two writers on one
# journal), its held claims and a heartbeat thread that does not exist there. Right after the
# fork, while the child is still single-threaded, every live store forgets all of that: the
# child opens its own journal on its first write. A plain dict of weak references (its
# operations are single steps under the GIL, so a fork never sees it half-updated).
_live_stores: dict[int, weakref.ref[_core.Store]] = {}


def _track_for_fork(store: _core.Store) -> None:
    key = id(store)

    def forget(_ref: weakref.ref[_core.Store]) -> None:
        _live_stores.pop(key, None)

    _live_stores[key] = weakref.ref(store, forget)


def _after_fork_in_child() -> None:
    for ref in list(_live_stores.values()):
        store = ref()
        if store is not None:
            store._after_fork_child()
            if isinstance(store, Store):
                # The chain's writer threads did not come across the fork: a fresh chain is
                # opened on the child's first miss or put.
                store._chain = None
                store._chain_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
