"""Every environment variable the package reads, in one place: named, parsed and documented.

``Settings.from_env()`` reads them all at once, and nothing else in the Python package looks
at the environment for them. ``VARIABLES`` is the table of them (name, type, default,
meaning) from which the README's table is checked and the tests clear the environment. Some
are read where they act instead, and named here for the table only (their rows have no
``Settings`` field): the Rust core reads ``XLA_PCACHE_HASH_IMPL`` once per process (a speed
knob) and, in a test build only, ``XLA_PCACHE_TEST_HOOKS``; it also reads ``XDG_CACHE_HOME``
and ``HOME`` for this user's records beside the caches (the verified signatures', the
runtime's binaries'), with the rule ``Settings.cache_home`` states, and, where those cannot
be written, ``XDG_RUNTIME_DIR`` and ``TMPDIR`` (absolute values only) for a directory of this
user's own on this host (rust/core/src/record_place.rs). The start-up hook
``_xla_pcache_autoload`` (outside the package, so that a Python process that does not use
the cache never loads the extension) reads ``XLA_PCACHE_DISABLE`` and the two path
variables itself, with the same rules.

Every malformed value is a ``ValueError`` that names the variable and quotes the value: a
cache that silently falls back to a default could fill a shared disk or write to a directory
that was meant to be read-only. An empty variable counts as unset, everywhere.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import errno
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from xla_pcache import _core
from xla_pcache._url import is_url
from xla_pcache.sizes import MAX_DURATION_S, parse_duration, parse_size

PATH_VAR = "XLA_PERSISTENT_CACHE_PATH"
READ_ONLY_VAR = "XLA_PERSISTENT_CACHE_READ_ONLY"
MEMORY_CAPACITY_VAR = "XLA_COMPILATION_CACHE_SIZE"
MAX_SIZE_VAR = "XLA_PERSISTENT_CACHE_MAX_SIZE"
COMPILE_WAIT_VAR = "XLA_PCACHE_COMPILE_WAIT"
CLAIM_LEASE_VAR = "XLA_PCACHE_CLAIM_LEASE"
LOCK_MODE_VAR = "XLA_PCACHE_LOCK_MODE"
READ_MODE_VAR = "XLA_PCACHE_READ_MODE"
EVICT_TRACE_VAR = "XLA_PCACHE_EVICT_TRACE"
HASH_IMPL_VAR = "XLA_PCACHE_HASH_IMPL"
# Defined by the core, which alone reads it (and only in a test build).
TEST_HOOKS_VAR = _core.TEST_HOOKS_VAR
DISABLE_VAR = "XLA_PCACHE_DISABLE"
SHARED_PATH_VAR = "XLA_PCACHE_TORCH_XLA_SHARED_PATH"
LOCAL_DIR_VAR = "XLA_PCACHE_TORCH_XLA_LOCAL_DIR"
REMOTE_VAR = "XLA_PCACHE_REMOTE"
REMOTE_TIMEOUT_VAR = "XLA_PCACHE_REMOTE_TIMEOUT"
REMOTE_MAX_BYTES_VAR = "XLA_PCACHE_REMOTE_MAX_BYTES"
XDG_CACHE_HOME_VAR = "XDG_CACHE_HOME"
SIGNING_KEY_VAR = "XLA_PCACHE_SIGNING_KEY"
TRUSTED_KEYS_VAR = "XLA_PCACHE_TRUSTED_KEYS"
MIN_COMPILE_TIME_VAR = "XLA_PCACHE_MIN_COMPILE_TIME"
MIN_ENTRY_SIZE_VAR = "XLA_PCACHE_MIN_ENTRY_SIZE"
ON_MISS_VAR = "XLA_PCACHE_ON_MISS"
LOCAL_PATH_VAR = "XLA_PCACHE_LOCAL_PATH"
BUCKET_RECORD_INTERVAL_VAR = "XLA_PCACHE_BUCKET_RECORD_INTERVAL"
BUCKET_AUTO_PRUNE_VAR = "XLA_PCACHE_BUCKET_AUTO_PRUNE"
PREFETCH_VAR = "XLA_PCACHE_PREFETCH"
PREFETCH_THREADS_VAR = "XLA_PCACHE_PREFETCH_THREADS"
PREFETCH_MEMORY_VAR = "XLA_PCACHE_PREFETCH_MEMORY"
PREFETCH_NAME_VAR = "XLA_PCACHE_PREFETCH_NAME"
COMPILE_AHEAD_VAR = "XLA_PCACHE_COMPILE_AHEAD"
COMPILE_AHEAD_THREADS_VAR = "XLA_PCACHE_COMPILE_AHEAD_THREADS"
COMPILE_AHEAD_MEMORY_VAR = "XLA_PCACHE_COMPILE_AHEAD_MEMORY"

# Single flight: how long a process that misses waits for another one compiling the same
# program, at most (longer than most compiles, short enough that a stuck holder costs a
# few minutes, not a job); and how long a claim may go without a heartbeat.
DEFAULT_COMPILE_WAIT_S = 300.0
DEFAULT_CLAIM_LEASE_S: float = _core.STORE_DEFAULTS["claim_lease"]

# torch_xla's in-memory cache holds 2048 computations by default; keep the same number so
# switching between the C++ and Python caches does not change memory use.
DEFAULT_MEMORY_CAPACITY = 2048

# A remote read or write that takes longer than this counts as a miss or a skipped write.
DEFAULT_REMOTE_TIMEOUT_S = 2.0
# Redis' proto-max-bulk-len: the largest value a default server accepts.
DEFAULT_REMOTE_MAX_BYTES = 512 << 20

# What is worth caching (applied to JAX's two thresholds unless the user set JAX's own): a hit
# reads an entry back in well under a millisecond for the small programs and a few
# milliseconds for tens of MB, always less than compiling the same program took
# (docs/jax.md, "What is cached"), so every compiled program is stored, whatever its size.
DEFAULT_MIN_COMPILE_TIME_S = 0.0
# A cache in a bucket: how often each host uploads the record of the entries it used (each
# entry at most once per interval); writers check the bucket's budget as often, after a put.
DEFAULT_BUCKET_RECORD_INTERVAL_S = 600.0
DEFAULT_MIN_ENTRY_SIZE = 0
# Loading ahead (JAX): the threads that deserialize a plan's executables (XLA's deserialize
# releases the GIL: 22 TPU executables took 2.0 s one after another, 0.3 s on 8 threads), and
# how many bytes of executables loaded ahead and not yet asked for a process holds at most.
DEFAULT_PREFETCH_THREADS = 8
DEFAULT_PREFETCH_MEMORY = 1 << 30
# Compiling ahead (JAX): the threads that compile a plan's programs whose executables are
# gone (9 programs of a TPU LM took 61.9 s one after another, 24.3 s on 8 threads and 28.5 s
# on 12, each compile 2-3x slower while 8 ran, on a 13-CPU host), at most the CPUs less one;
# and the memory a compile ahead leaves to everything else, as a fraction of the host's
# (a compile's working memory is XLA's and unknown before it runs: a compile starts only
# while the host has more than this available).
DEFAULT_COMPILE_AHEAD_THREADS = 8
DEFAULT_COMPILE_AHEAD_RESERVE_FRACTION = 0.25

LockMode = Literal["auto", "fcntl", "lease"]
ReadMode = Literal["auto", "mmap", "pread"]
LOCK_MODES: tuple[LockMode, ...] = ("auto", "fcntl", "lease")
READ_MODES: tuple[ReadMode, ...] = ("auto", "mmap", "pread")
OnMiss = Literal["compile", "warn", "error"]
ON_MISS_MODES: tuple[OnMiss, ...] = ("compile", "warn", "error")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class Variable:
    """One row of the configuration table: ``default`` and ``meaning`` as the README shows
    them (the README's table is checked against this one by a test). ``field`` is the
    ``Settings`` field it sets, None for a variable the core reads itself."""

    name: str
    field: str | None
    kind: str
    default: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable(
        PATH_VAR,
        "path",
        "path",
        "unset",
        "The cache directory (torch_xla's variable). `from_env()` gives a `PersistentCache` "
        "there, else a `MemoryCache`; the adapters and the CLI use it as their default path. "
        "A `file:` URL names the directory on this host (`file:///srv/cache`, "
        "`file://localhost/srv/cache`, percent-decoded; `?ro=1` read-only); one naming no "
        "directory here is refused with one warning (docs/configuration.md).",
    ),
    Variable(
        READ_ONLY_VAR,
        "read_only",
        "bool",
        "0",
        "Never write to the cache: no entries, journals, locks, temp files or repairs; for a "
        "bucket path nothing is written to the bucket (as `?ro=1`: no entries, records, "
        "markers, budget or prune) (torch_xla's variable). `1/0`, `true/false`, `yes/no`, "
        "`on/off`, any case.",
    ),
    Variable(
        MEMORY_CAPACITY_VAR,
        "memory_capacity",
        "count",
        "2048",
        "Compiled objects each process keeps in memory in front of the directory "
        "(torch_xla's variable).",
    ),
    Variable(
        MAX_SIZE_VAR,
        "max_size",
        "size",
        "unbounded",
        "Byte budget of the directory, shared by all processes; least recently used entries "
        "are evicted past it, down to 90 %. Bytes or `K/M/G/T/P` (binary), decimals allowed.",
    ),
    Variable(
        COMPILE_WAIT_VAR,
        "compile_wait",
        "duration",
        "300",
        "Single flight: on a miss, how long a process waits for another one already "
        "compiling the same program (JAX; see docs/jax.md), seconds or `90s`/`5m`. `0` turns "
        "it off: every process that misses compiles.",
    ),
    Variable(
        CLAIM_LEASE_VAR,
        "claim_lease",
        "duration",
        "30",
        "A compile claim whose heartbeat a waiter has not seen change for this long is taken "
        "over (its holder died or lost the filesystem). Seconds or `30s`/`2m`.",
    ),
    Variable(
        LOCK_MODE_VAR,
        "lock_mode",
        "choice",
        "auto",
        "Evictor exclusion: `auto` (fcntl locks; lease files on FUSE and where locks fail), "
        "`fcntl`, `lease`.",
    ),
    Variable(
        READ_MODE_VAR,
        "read_mode",
        "choice",
        "auto",
        "How entries are read: `auto` (mmap on local filesystems, `pread` on NFS/FUSE/"
        "unknown), `mmap`, `pread`.",
    ),
    Variable(
        EVICT_TRACE_VAR,
        "evict_trace",
        "path",
        "unset",
        "Append `pid start_ns end_ns` for every eviction to this file (to check that evictors "
        "never overlap).",
    ),
    Variable(
        TEST_HOOKS_VAR,
        None,
        "path",
        "unset",
        "For tests only: a directory where a process marks the points a test waits on "
        "(inside a `verify` or `prune` walk, an export, a compile claim) with a file "
        "`<point>.<pid>`, and holds at some of them until the test signals it or creates "
        "`<point>.go`. Honoured only by a test build (the cargo feature `test-hooks`); the "
        "wheel ignores it. Leave unset.",
    ),
    Variable(
        HASH_IMPL_VAR,
        None,
        "choice",
        "auto",
        "xxh3 implementation for checksums and names: `auto` (vector path picked at run time: "
        "AVX-512/AVX2/SSE2 on x86-64, NEON on aarch64), `twox` (the same without the AVX-512 "
        "loop), `portable` (the build-time baseline, SSE2 on x86-64). Same values either "
        "way. Read by the Rust core once per process; an unknown value is logged and ignored "
        "there (it is not a setting of the store's behaviour, only of its speed).",
    ),
    Variable(
        DISABLE_VAR,
        "disabled",
        "bool",
        "0",
        "Turn zero-code activation off: JAX and torch_xla run as if xla_pcache were not "
        "installed (explicit `install()` calls still work).",
    ),
    Variable(
        SHARED_PATH_VAR,
        "torch_xla_shared_path",
        "path",
        "unset",
        "Set by the torch_xla adapter, not by users: the shared cache path, moved out of "
        "`XLA_PERSISTENT_CACHE_PATH` so that child processes running torch_xla without "
        "xla_pcache do not write into the store; `install()` and activation in a child "
        "still find it.",
    ),
    Variable(
        LOCAL_DIR_VAR,
        "torch_xla_local_dir",
        "path",
        "`$XDG_CACHE_HOME/xla_pcache/torch_xla`",
        "The host-local directory torch_xla writes to after `xla_pcache.torch_xla.install()`"
        " (see docs/torch_xla.md). Made mode 0700; refused (torch_xla uncached, one warning) "
        "when another user owns it; one of yours others can write is left as it is, with "
        "`xla_pcache-<uid>` (0700) beneath it used. A directory, never a URL (refused, naming "
        "this variable).",
    ),
    Variable(
        REMOTE_VAR,
        "remote",
        "url",
        "unset",
        "Remote tiers behind the directory, for every `Store` built from the environment "
        "(adapters included): a comma-separated chain tried in order, of "
        "`redis://[:password@]host:port/db` (or `rediss://`, TLS), `s3://bucket/prefix`, "
        "`gs://bucket/prefix`, `az://container/prefix`; `?ro=1` makes a tier read-only, "
        "`?trust=required` makes it serve only entries signed by a trusted key. "
        'Needs `pip install "xla-pcache[redis]"` / `"xla-pcache[objstore]"`; object-store '
        "credentials come from the cloud's standard variables. See docs/remote.md.",
    ),
    Variable(
        REMOTE_TIMEOUT_VAR,
        "remote_timeout",
        "duration",
        "2",
        "Seconds (or `30s`/`1m`) for each remote connect/read/write before it counts as a "
        "miss or a skipped write.",
    ),
    Variable(
        REMOTE_MAX_BYTES_VAR,
        "remote_max_bytes",
        "size",
        "512M (Redis), 5G (object stores)",
        "Entries larger than this are not written to a remote tier (counted "
        "`remote_too_large`); for Redis, match the server's `proto-max-bulk-len`. Bytes or "
        "`K/M/G/T/P`.",
    ),
    Variable(
        XDG_CACHE_HOME_VAR,
        "xdg_cache_home",
        "path",
        "`~/.cache`",
        "Where the default caches live when no path is given: `$XDG_CACHE_HOME/xla_pcache` "
        "(JAX, the demo), `$XDG_CACHE_HOME/xla_pcache/torch_xla` (torch_xla's host-local "
        "directory) and `$XDG_CACHE_HOME/xla_pcache/remote` (the host-local stores of bucket "
        "paths); this user's records beside the caches (verified signatures, the runtime's "
        "binaries' identities) are `$XDG_CACHE_HOME/xla_pcache-verified` and "
        "`-builds`, or, where that cannot be written, directories of this user's own in "
        "`$XDG_RUNTIME_DIR` or the temp dir (docs/configuration.md). A relative value is "
        "ignored, as the XDG spec says.",
    ),
    Variable(
        ON_MISS_VAR,
        "on_miss",
        "choice",
        "compile",
        "What a miss of the persistent cache does: `compile` (compile, as without a cache), "
        "`warn` (compile, and log one warning per miss with its reason), `error` (fail the "
        "compile with an error naming this variable and the program: for serving, where a "
        "missed warm-up should fail fast). JAX raises from the jitted call; torch_xla: see "
        "docs/torch_xla.md. A cached program runs in every mode.",
    ),
    # Trusted writers.
    Variable(
        SIGNING_KEY_VAR,
        "signing_key",
        "path",
        "unset",
        "A private key file made by `xla-pcache keygen` (mode 0600): every put of this "
        "process is signed with it. A malformed file, a link, a FIFO, or one group or others "
        'can access, is an error. See docs/reliability.md, "Trusted writers".',
    ),
    Variable(
        TRUSTED_KEYS_VAR,
        "trusted_keys",
        "keys",
        "unset",
        "`NAME:BASE64[,NAME:BASE64...]` (the public keys `keygen` prints), or `@FILE` with one "
        "per line (a regular file named directly, not a link, that group and others cannot "
        "write): only entries signed by one of these keys are served; any other is a miss, "
        "counted `untrusted`, never loaded. Unset: every verified entry is served.",
    ),
    # What is cached.
    Variable(
        MIN_COMPILE_TIME_VAR,
        "min_compile_time",
        "duration",
        "0",
        "What is cached: a program whose compile took less than this is not stored (seconds, "
        "`250ms`, `2s`). Applied to JAX's `jax_persistent_cache_min_compile_time_secs` (JAX's "
        "own default: 1 s) unless the program sets that itself, by its variable or by "
        "`jax.config.update` before activation. See docs/jax.md.",
    ),
    Variable(
        MIN_ENTRY_SIZE_VAR,
        "min_entry_size",
        "size",
        "0",
        "What is cached: an entry smaller than this is not stored (bytes or `K/M/G/T/P`). Applied "
        "to JAX's `jax_persistent_cache_min_entry_size_bytes` unless the program sets that "
        "itself.",
    ),
    # A cache in a bucket (docs/remote.md, "A cache in a bucket").
    Variable(
        LOCAL_PATH_VAR,
        "local_path",
        "path",
        "`$XDG_CACHE_HOME/xla_pcache/remote/<name from the URL>`",
        "When the cache path is a bucket (`gs://`, `s3://`, `az://`), the host-local store in "
        "front of it, where this host keeps what it fetched and compiled; the bucket is its "
        "remote tier. Put it on a local disk. Made mode 0700; refused (uncached, one warning) "
        "when another user owns it; one of yours others can write is left as it is, with "
        "`xla_pcache-<uid>` (0700) beneath it as the store.",
    ),
    Variable(
        BUCKET_RECORD_INTERVAL_VAR,
        "bucket_record_interval",
        "duration",
        "600",
        "When the cache path is a bucket: how often a host uploads the record of the entries "
        "it used (one object per host per interval, each entry at most once), which `prune` "
        "reads as last uses; writers check the bucket's budget as often. Seconds or "
        "`10m`/`1h`; `0` records nothing and never prunes from writers.",
    ),
    Variable(
        BUCKET_AUTO_PRUNE_VAR,
        "bucket_auto_prune",
        "bool",
        "1",
        "When the cache path is a bucket with a budget (`xla-pcache config --path "
        "s3://...`): a host that wrote entries prunes the bucket once it estimates it past "
        "the budget, one host at a time. `0` leaves pruning to `xla-pcache prune` (cron).",
    ),
    # Loading ahead (docs/jax.md, "Loading ahead").
    Variable(
        PREFETCH_VAR,
        "prefetch",
        "bool",
        "1",
        "JAX: load ahead. A process records which executables it read from the cache (a plan, "
        "kept in the store); the next process of the same program loads them on a thread pool "
        "from the backend's start, and its reads take them from there. `0` turns it off "
        "(nothing loaded, recorded or written).",
    ),
    Variable(
        PREFETCH_THREADS_VAR,
        "prefetch_threads",
        "count",
        "8 (at most the CPUs less one)",
        "Threads that read, decompress and load a plan's executables ahead (at least 1).",
    ),
    Variable(
        PREFETCH_MEMORY_VAR,
        "prefetch_memory",
        "size",
        "1G",
        "Executables loaded ahead and not yet asked for, at most (their serialized bytes); "
        "loading waits past it. Bytes or `K/M/G/T/P`.",
    ),
    Variable(
        PREFETCH_NAME_VAR,
        "prefetch_name",
        "text",
        "the main module or script",
        "The name of this workload's plan: processes of one name share it, each program "
        "keeping its own variant (up to 16), told apart by what it reads. Set it to keep "
        "workloads apart that should not share one (more than 16 programs behind one entry "
        "point).",
    ),
    Variable(
        COMPILE_AHEAD_VAR,
        "compile_ahead",
        "bool",
        "1",
        "JAX, with loading ahead: a program compiled is recorded (its module and compile "
        "options, an entry beside its executable); when a plan names an executable that is "
        "gone (evicted, pruned, another runtime build), its program is compiled ahead on a "
        "thread pool and handed to JAX's compile of a byte-identical module and options. "
        "`0` turns both off.",
    ),
    Variable(
        COMPILE_AHEAD_THREADS_VAR,
        "compile_ahead_threads",
        "count",
        "8 (at most the CPUs less one)",
        "Threads that compile ahead, each one program at a time (at least 1).",
    ),
    Variable(
        COMPILE_AHEAD_MEMORY_VAR,
        "compile_ahead_memory",
        "size",
        "a quarter of the host's memory",
        "Memory compiling ahead leaves to everything else: a compile ahead starts only while "
        "the host (or its cgroup) has more than this available, and holds at most one "
        "compiled program per thread until it is used. Bytes or `K/M/G/T/P`.",
    ),
)

VARIABLE_NAMES: frozenset[str] = frozenset(v.name for v in VARIABLES)


def parse_bool(value: str, name: str) -> bool:
    """``1/0``, ``true/false``, ``yes/no``, ``on/off`` in any case; anything else is an error."""
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"invalid {name} {value!r}: expected 1/0, true/false, yes/no or on/off")


def parse_capacity(value: str | int, name: str) -> int:
    """A non-negative count of objects (0 keeps nothing in memory)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    if isinstance(value, int):
        count = value
    else:
        try:
            count = int(value.strip(), 10)
        except ValueError:
            raise ValueError(
                f"invalid {name} {value!r}: expected a whole number of objects, such as '2048'"
            ) from None
    if count < 0:
        raise ValueError(f"invalid {name} {value!r}: must not be negative")
    return count


def _positive_count(value: str, name: str) -> int:
    count = parse_capacity(value, name)
    if count < 1:
        raise ValueError(f"invalid {name} {value!r}: must be at least 1")
    return count


def _choice(value: str, name: str, choices: tuple[str, ...]) -> Any:
    word = value.strip().lower()
    if word not in choices:
        raise ValueError(f"invalid {name} {value!r}: expected one of {', '.join(choices)}")
    return word


def _positive_size(value: str, name: str) -> int:
    size = parse_size(value, name=name) or 0
    # The core's rule (a budget of no bytes would evict every entry as soon as it is
    # written); unset means unbounded.
    try:
        return _core.check_size(name, size)
    except ValueError:
        raise ValueError(
            f"invalid {name} {value!r}: must be positive (unset it for no limit)"
        ) from None


def _duration(*, zero_ok: bool) -> Callable[[str, str], float]:
    bounds = "from 0 to" if zero_ok else "positive and at most"

    def parse(value: str, name: str) -> float:
        seconds = parse_duration(value, name=name)
        if seconds > MAX_DURATION_S or (seconds == 0 and not zero_ok):
            raise ValueError(
                f"invalid {name} {value!r}: must be {bounds} {MAX_DURATION_S:.0f} seconds"
            )
        return seconds

    return parse


def _compile_time(value: str, name: str) -> float:
    # A compile-time threshold is naturally written in milliseconds; "5m" would be minutes.
    word = value.strip()
    scale = 1.0
    if word.lower().endswith("ms"):
        word, scale = word[:-2], 1e-3
    try:
        if not word or (word[-1:].isalpha() and scale != 1.0):
            raise ValueError(word)
        return _duration(zero_ok=True)(word, name) * scale
    except ValueError:
        raise ValueError(
            f"invalid {name} {value!r}: expected seconds from 0, such as '0.5', '2s' or '500ms'"
        ) from None


def _size(value: str, name: str) -> int:
    size = parse_size(value, name=name)
    return size or 0


def _path(value: str, name: str) -> str:
    return os.path.expanduser(value.strip())


def _text(value: str, name: str) -> str:
    return value.strip()


def _key_bytes(text: str, what: str, name: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"invalid {name}: the {what} is not base64") from None


def _keys_the_core_takes(check: Callable[[Any], None], keys: Any, argument: str, name: str) -> None:
    """The core's verdict on keys read from ``name`` (``_core.check_signing_key`` /
    ``check_trusted_keys``: the key name's rule, no name given twice, 32-byte keys), the
    same a store gives them as its ``argument``; ``ValueError`` naming ``name`` otherwise."""
    try:
        check(keys)
    except ValueError as e:
        raise ValueError(f"invalid {name}: {str(e).removeprefix(argument + ': ')}") from None


def _key_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@dataclass(frozen=True)
class SigningKey:
    """A private key read from a key file: its name, and the 32 bytes (never shown)."""

    name: str
    path: str
    private: bytes = field(repr=False)


def _read_key_file(path: str, name: str, what: str, refused: int, why: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``path``, opened without following a link or waiting on a
    FIFO (``O_NOFOLLOW | O_NONBLOCK``): a regular file whose mode has none of the bits
    ``refused``, or ``ValueError`` naming ``name``, the file and why (``why``, given the
    file's ``{mode}``, when it is the mode)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        cause = "a symbolic link (name the file itself)" if e.errno == errno.ELOOP else e.strerror
        raise ValueError(f"invalid {name} {path!r}: cannot open {what} ({cause})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"invalid {name} {path!r}: {what} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & refused:
            raise ValueError(f"invalid {name} {path!r}: " + why.format(mode=f"{mode:04o}"))
        return f.read(limit)


def read_signing_key(path: str, name: str = SIGNING_KEY_VAR) -> SigningKey:
    """Reads a key file written by ``xla-pcache keygen``: one ``NAME:BASE64`` line (``#``
    comments allowed). It must be a regular file (not a link, not a FIFO) that group and
    others cannot access."""
    path = os.path.expanduser(path.strip())
    data = _read_key_file(
        path,
        name,
        "the private key file",
        0o077,
        "a private key readable or writable by group or others (mode {mode}); run chmod 600 on it",
        4096,
    )
    try:
        lines = _key_lines(data.decode("utf-8"))
    except UnicodeDecodeError:
        lines = []
    if len(lines) != 1 or ":" not in lines[0]:
        raise ValueError(
            f"invalid {name} {path!r}: expected one 'NAME:BASE64' line, as xla-pcache keygen writes"
        )
    key_name, b64 = (p.strip() for p in lines[0].split(":", 1))
    private = _key_bytes(b64, "private key", name)
    _keys_the_core_takes(_core.check_signing_key, (key_name, private), "signing_key", name)
    return SigningKey(key_name, path, private)


def _read_trusted_list(value: str, name: str) -> str:
    """The text of a trusted-keys list file (``@FILE``). Whoever can add a line to it signs
    for every process that reads it, so, as ssh's StrictModes does for its key files, it must
    be a regular file named directly (not reached through a link) that neither group nor
    others can write; anything else is refused, naming the file and why."""
    path = os.path.expanduser(value[1:].strip())
    data = _read_key_file(
        path,
        name,
        "the trusted-keys list",
        0o022,
        "the trusted-keys list is writable by group or others (mode {mode}), so they could add "
        "a key every reader trusts; run chmod go-w on it",
        (1 << 20) + 1,
    )
    if len(data) > 1 << 20:
        raise ValueError(f"invalid {name} {path!r}: the trusted-keys list is over 1 MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"invalid {name} {path!r}: the trusted-keys list is not UTF-8") from None


def parse_trusted_keys(value: str, name: str = TRUSTED_KEYS_VAR) -> tuple[tuple[str, bytes], ...]:
    """``NAME:BASE64[,NAME:BASE64...]``, or ``@FILE`` with one such key per line."""
    value = value.strip()
    if value.startswith("@"):
        items = _key_lines(_read_trusted_list(value, name))
    else:
        items = [v.strip() for v in value.split(",") if v.strip()]
    keys: list[tuple[str, bytes]] = []
    for item in items:
        if ":" not in item:
            raise ValueError(f"invalid {name}: {item[:80]!r} is not NAME:BASE64")
        key_name, b64 = (p.strip() for p in item.split(":", 1))
        keys.append((key_name, _key_bytes(b64, f"public key of {key_name!r}", name)))
    if not keys:
        raise ValueError(f"invalid {name} {value!r}: no keys in it")
    _keys_the_core_takes(_core.check_trusted_keys, keys, "trusted_keys", name)
    return tuple(keys)


def _local_path(value: str, name: str) -> str:
    path = _path(value, name)
    if is_url(path):
        # Not quoted: a URL may carry a credential.
        raise ValueError(f"invalid {name}: a local directory, not a URL")
    return path


def _absolute(value: str, name: str) -> str | None:
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    value = value.strip()
    return value if os.path.isabs(value) else None


# How each field is parsed from its (non-empty) variable.
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "path": _path,
    "read_only": parse_bool,
    "memory_capacity": parse_capacity,
    "max_size": _positive_size,
    "compile_wait": _duration(zero_ok=True),
    "claim_lease": _duration(zero_ok=False),
    "lock_mode": lambda v, n: _choice(v, n, LOCK_MODES),
    "read_mode": lambda v, n: _choice(v, n, READ_MODES),
    "evict_trace": _path,
    "disabled": parse_bool,
    "torch_xla_shared_path": _path,
    "torch_xla_local_dir": _local_path,
    "remote": _text,
    "remote_timeout": _duration(zero_ok=False),
    "remote_max_bytes": _positive_size,
    "xdg_cache_home": _absolute,
    "signing_key": read_signing_key,
    "trusted_keys": parse_trusted_keys,
    "min_compile_time": _compile_time,
    "min_entry_size": _size,
    "on_miss": lambda v, n: _choice(v, n, ON_MISS_MODES),
    "local_path": _local_path,
    "bucket_record_interval": _duration(zero_ok=True),
    "bucket_auto_prune": parse_bool,
    "prefetch": parse_bool,
    "prefetch_threads": lambda v, n: _positive_count(v, n),
    "prefetch_memory": _positive_size,
    "prefetch_name": _text,
    "compile_ahead": parse_bool,
    "compile_ahead_threads": lambda v, n: _positive_count(v, n),
    "compile_ahead_memory": _positive_size,
}


@dataclass(frozen=True)
class Settings:
    """What the environment asks of the cache; ``Settings()`` is what an empty one asks.

    ``path`` is None when no persistent cache is wanted. ``max_size`` is a byte budget or
    None for unbounded. ``memory_capacity`` is the number of live objects kept in memory.
    Durations are seconds, sizes bytes. See ``VARIABLES`` for every field's variable.
    """

    path: str | None = None
    read_only: bool = False
    memory_capacity: int = DEFAULT_MEMORY_CAPACITY
    max_size: int | None = None
    compile_wait: float = DEFAULT_COMPILE_WAIT_S
    claim_lease: float = DEFAULT_CLAIM_LEASE_S
    lock_mode: LockMode = "auto"
    read_mode: ReadMode = "auto"
    evict_trace: str | None = None
    disabled: bool = False
    torch_xla_shared_path: str | None = None
    torch_xla_local_dir: str | None = None
    # Never in the repr: a Redis URL may hold a password.
    remote: str | None = field(default=None, repr=False)
    remote_timeout: float = DEFAULT_REMOTE_TIMEOUT_S
    # None: each kind of tier's own largest value (DEFAULT_REMOTE_MAX_BYTES for Redis).
    remote_max_bytes: int | None = None
    xdg_cache_home: str | None = None
    # Trusted writers: the private key every put is signed with, and the public keys
    # (name, 32 bytes) whose entries alone are served. None: unsigned puts; every entry.
    signing_key: SigningKey | None = None
    trusted_keys: tuple[tuple[str, bytes], ...] | None = None
    # What is cached (seconds, bytes); see DEFAULT_MIN_COMPILE_TIME_S.
    min_compile_time: float = DEFAULT_MIN_COMPILE_TIME_S
    min_entry_size: int = DEFAULT_MIN_ENTRY_SIZE
    on_miss: OnMiss = "compile"
    # A cache in a bucket: the host-local store in front of it (None: one per bucket under
    # remote_store_root()), how often hits are recorded there, whether writers prune.
    local_path: str | None = None
    bucket_record_interval: float = DEFAULT_BUCKET_RECORD_INTERVAL_S
    bucket_auto_prune: bool = True
    # Loading ahead (JAX): on; threads (None: DEFAULT_PREFETCH_THREADS, at most the CPUs less
    # one); bytes loaded ahead and not yet taken, at most; the plan's name (None: the entry
    # point).
    prefetch: bool = True
    prefetch_threads: int | None = None
    prefetch_memory: int = DEFAULT_PREFETCH_MEMORY
    prefetch_name: str | None = None
    # Compiling ahead (JAX): on; threads (None: DEFAULT_COMPILE_AHEAD_THREADS, at most the
    # CPUs less one); the memory it leaves to everything else (None: a quarter of the host's).
    compile_ahead: bool = True
    compile_ahead_threads: int | None = None
    compile_ahead_memory: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Read every variable of ``VARIABLES``; raise ``ValueError`` naming the first
        malformed one. An empty variable counts as unset (as in torch_xla and in shells
        that export ``VAR=``)."""
        values: dict[str, Any] = {}
        for var in VARIABLES:
            raw = environ.get(var.name)
            if var.field is None or raw is None or raw.strip() == "":
                continue
            values[var.field] = _PARSERS[var.field](raw, var.name)
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @property
    def inherited_path(self) -> str | None:
        """The shared cache path a process should use: ``XLA_PERSISTENT_CACHE_PATH``, else
        the one the torch_xla adapter of a parent process moved aside for its children."""
        return self.path or self.torch_xla_shared_path

    def cache_home(self) -> str:
        """``$XDG_CACHE_HOME``, or ``~/.cache`` per the XDG base-dir spec."""
        return self.xdg_cache_home or os.path.join(os.path.expanduser("~"), ".cache")

    def default_cache_path(self) -> str:
        """``$XDG_CACHE_HOME/xla_pcache``, or ``~/.cache/xla_pcache``."""
        return os.path.join(self.cache_home(), "xla_pcache")

    def remote_store_root(self) -> str:
        """``$XDG_CACHE_HOME/xla_pcache/remote``: the host-local stores of bucket paths."""
        return os.path.join(self.default_cache_path(), "remote")

    def prefetch_thread_count(self) -> int:
        """``XLA_PCACHE_PREFETCH_THREADS``, else 8, or fewer to leave one of the CPUs this
        process may use to the thread JAX traces and compiles on (at least 1)."""
        if self.prefetch_threads is not None:
            return self.prefetch_threads
        return max(1, min(DEFAULT_PREFETCH_THREADS, _usable_cpus() - 1))

    def compile_ahead_thread_count(self) -> int:
        """``XLA_PCACHE_COMPILE_AHEAD_THREADS``, else 8, or fewer to leave one of the CPUs
        this process may use to the thread JAX traces and compiles on (at least 1)."""
        if self.compile_ahead_threads is not None:
            return self.compile_ahead_threads
        return max(1, min(DEFAULT_COMPILE_AHEAD_THREADS, _usable_cpus() - 1))

    def compile_ahead_reserve(self) -> int:
        """``XLA_PCACHE_COMPILE_AHEAD_MEMORY``, else a quarter of the host's memory (0 when it
        cannot be read: then only the threads bound compiling ahead)."""
        if self.compile_ahead_memory is not None:
            return self.compile_ahead_memory
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            return 0
        return int(max(0, total) * DEFAULT_COMPILE_AHEAD_RESERVE_FRACTION)

    def torch_xla_local_root(self) -> str:
        """``$XLA_PCACHE_TORCH_XLA_LOCAL_DIR``, else ``$XDG_CACHE_HOME/xla_pcache/torch_xla``."""
        return self.torch_xla_local_dir or os.path.join(self.default_cache_path(), "torch_xla")


def _usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def settings_from_env(environ: Mapping[str, str] = os.environ) -> Settings:
    """``Settings.from_env(environ)``."""
    return Settings.from_env(environ)


def default_cache_path(environ: Mapping[str, str] = os.environ) -> str:
    """``$XDG_CACHE_HOME/xla_pcache``, or ``~/.cache/xla_pcache`` per the XDG base-dir spec."""
    return Settings.from_env(environ).default_cache_path()
