"""The variables' names and their table (``VARIABLES``: name, the ``Settings`` field each
sets, kind, default and meaning as the README shows them), from which the README's table is
checked and the tests clear the environment.

A row with no field is a variable read where it acts (the core's ``XLA_PCACHE_HASH_IMPL`` and
``XLA_PCACHE_TEST_HOOKS``), named here for the table only.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_pcache import _core

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
PREFETCH_LOADS_VAR = "XLA_PCACHE_PREFETCH_LOADS"
PREFETCH_NAME_VAR = "XLA_PCACHE_PREFETCH_NAME"
COMPILE_AHEAD_VAR = "XLA_PCACHE_COMPILE_AHEAD"
COMPILE_AHEAD_THREADS_VAR = "XLA_PCACHE_COMPILE_AHEAD_THREADS"
COMPILE_AHEAD_MEMORY_VAR = "XLA_PCACHE_COMPILE_AHEAD_MEMORY"


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
        PREFETCH_LOADS_VAR,
        "prefetch_loads",
        "count",
        "4 on a TPU, else the threads",
        "Of those threads, how many deserialize at once (at least 1; a read waiting for one "
        "not started yet passes it). A TPU runtime runs three to four side by side at "
        "full speed: more only slow the one read first.",
    ),
    Variable(
        PREFETCH_MEMORY_VAR,
        "prefetch_memory",
        "size",
        "1G, at most a quarter of the job's memory",
        "Executables loaded ahead and not yet asked for, at most (their serialized bytes); "
        "loading waits past it. The job's memory is the least of the host's and every cgroup "
        "limit over the process. Bytes or `K/M/G/T/P`.",
    ),
    Variable(
        PREFETCH_NAME_VAR,
        "prefetch_name",
        "text",
        "the program: a script's path in its project, a module, a command",
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
        "JAX, with loading ahead: a program compiled is recorded as JAX's key sees it (an "
        "entry beside its executable); when a plan names an executable that is gone "
        "(evicted, pruned, another runtime build), its program is compiled ahead in a "
        "compiler process (CPU and TPU programs), only when JAX's key of the record is its "
        "key, and JAX's read of it is served what was compiled. `0` turns both off.",
    ),
    Variable(
        COMPILE_AHEAD_THREADS_VAR,
        "compile_ahead_threads",
        "count",
        "8 (at most the CPUs less one)",
        "Threads of the compiler process, each compiling one program at a time (at least 1).",
    ),
    Variable(
        COMPILE_AHEAD_MEMORY_VAR,
        "compile_ahead_memory",
        "size",
        "a quarter of the job's memory",
        "Memory compiling ahead leaves to everything else: a compile ahead starts only while "
        "the job has more than this available (the least of the host's `MemAvailable` and "
        "each cgroup limit over the process, v1 or v2, less its use). The job's memory is the "
        "least of the host's and those limits. Bytes or `K/M/G/T/P`.",
    ),
)

VARIABLE_NAMES: frozenset[str] = frozenset(v.name for v in VARIABLES)
