"""``Settings``: what the environment asks of the cache, every variable of ``VARIABLES`` read
at once (``Settings.from_env``) by its field's parser; the defaults of an empty environment;
and the paths and counts derived from them (the default cache path, the threads and memory
loading and compiling ahead use).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from xla_pcache import _core, _memory
from xla_pcache.config import values
from xla_pcache.config.keys import SigningKey, parse_trusted_keys, read_signing_key
from xla_pcache.config.variables import VARIABLES

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
# What loading and compiling ahead may take of the job's memory (the least of the host's and
# its cgroups' limits, ``_memory``): a share, so that a job limited below the host's memory
# (a container, a scheduler's job) keeps its proportions.
JOB_MEMORY_SHARE = 0.25
# Loading ahead (JAX): the threads that deserialize a plan's executables (XLA's deserialize
# releases the GIL: 22 TPU executables took 2.0 s one after another, 0.3 s on 8 threads), and
# how many bytes of executables loaded ahead and not yet asked for a process holds at most
# (and at most the share of the job's memory: what a planted plan can make a process hold).
DEFAULT_PREFETCH_THREADS = 8
DEFAULT_PREFETCH_MEMORY = 1 << 30
# Deserializes at once on a TPU (``prefetch_load_count``).
DEFAULT_TPU_PREFETCH_LOADS = 4
# Compiling ahead (JAX): the threads that compile a plan's programs whose executables are
# gone (9 programs of a TPU LM took 61.9 s one after another, 24.3 s on 8 threads and 28.5 s
# on 12, each compile 2-3x slower while 8 ran, on a 13-CPU host), at most the CPUs less one;
# and the memory a compile ahead leaves to everything else, the share of the job's memory
# (a compile's working memory is XLA's and unknown before it runs: a compile starts only
# while the job has more than this available).
DEFAULT_COMPILE_AHEAD_THREADS = 8
DEFAULT_COMPILE_AHEAD_RESERVE_FRACTION = JOB_MEMORY_SHARE

LockMode = Literal["auto", "fcntl", "lease"]
ReadMode = Literal["auto", "mmap", "pread"]
LOCK_MODES: tuple[LockMode, ...] = ("auto", "fcntl", "lease")
READ_MODES: tuple[ReadMode, ...] = ("auto", "mmap", "pread")
OnMiss = Literal["compile", "warn", "error"]
ON_MISS_MODES: tuple[OnMiss, ...] = ("compile", "warn", "error")

# How each field is parsed from its (non-empty) variable.
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "path": values.path,
    "read_only": values.parse_bool,
    "memory_capacity": values.parse_capacity,
    "max_size": values.positive_size,
    "compile_wait": values.duration(zero_ok=True),
    "claim_lease": values.duration(zero_ok=False),
    "lock_mode": lambda v, n: values.choice(v, n, LOCK_MODES),
    "read_mode": lambda v, n: values.choice(v, n, READ_MODES),
    "evict_trace": values.path,
    "disabled": values.parse_bool,
    "torch_xla_shared_path": values.path,
    "torch_xla_local_dir": values.local_path,
    "remote": values.text,
    "remote_timeout": values.duration(zero_ok=False),
    "remote_max_bytes": values.positive_size,
    "xdg_cache_home": values.absolute,
    "signing_key": read_signing_key,
    "trusted_keys": parse_trusted_keys,
    "min_compile_time": values.compile_time,
    "min_entry_size": values.size,
    "on_miss": lambda v, n: values.choice(v, n, ON_MISS_MODES),
    "local_path": values.local_path,
    "bucket_record_interval": values.duration(zero_ok=True),
    "bucket_auto_prune": values.parse_bool,
    "prefetch": values.parse_bool,
    "prefetch_threads": values.positive_count,
    "prefetch_loads": values.positive_count,
    "prefetch_memory": values.positive_size,
    "prefetch_name": values.text,
    "compile_ahead": values.parse_bool,
    "compile_ahead_threads": values.positive_count,
    "compile_ahead_memory": values.positive_size,
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
    # one); bytes loaded ahead and not yet taken, at most (None: DEFAULT_PREFETCH_MEMORY, at
    # most a quarter of the job's memory); the plan's name (None: the entry point).
    prefetch: bool = True
    prefetch_threads: int | None = None
    prefetch_loads: int | None = None
    prefetch_memory: int | None = None
    prefetch_name: str | None = None
    # Compiling ahead (JAX): on; threads (None: DEFAULT_COMPILE_AHEAD_THREADS, at most the
    # CPUs less one); the memory it leaves to everything else (None: a quarter of the job's).
    compile_ahead: bool = True
    compile_ahead_threads: int | None = None
    compile_ahead_memory: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Read every variable of ``VARIABLES``; raise ``ValueError`` naming the first
        malformed one. An empty variable counts as unset (as in torch_xla and in shells
        that export ``VAR=``)."""
        fields: dict[str, Any] = {}
        for var in VARIABLES:
            raw = environ.get(var.name)
            if var.field is None or raw is None or raw.strip() == "":
                continue
            fields[var.field] = _PARSERS[var.field](raw, var.name)
        return cls(**fields)

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

    def prefetch_load_count(self, platform: str) -> int:
        """``XLA_PCACHE_PREFETCH_LOADS``, else, on a TPU, 4 (its runtime deserializes three
        to four executables side by side at full speed: on a v5e host three at once each
        took its time alone, eight at once progressed as three and a half, each 1.35-6x its
        time alone, so the one read first waited for them all), elsewhere every loading
        thread (XLA's CPU client deserializes on a pool of its own); at most the threads."""
        threads = self.prefetch_thread_count()
        if self.prefetch_loads is not None:
            return min(threads, self.prefetch_loads)
        return min(threads, DEFAULT_TPU_PREFETCH_LOADS) if platform == "tpu" else threads

    def compile_ahead_thread_count(self) -> int:
        """``XLA_PCACHE_COMPILE_AHEAD_THREADS``, else 8, or fewer to leave one of the CPUs
        this process may use to the thread JAX traces and compiles on (at least 1)."""
        if self.compile_ahead_threads is not None:
            return self.compile_ahead_threads
        return max(1, min(DEFAULT_COMPILE_AHEAD_THREADS, _usable_cpus() - 1))

    def prefetch_memory_bound(self, job_memory: int | None = None) -> int:
        """``XLA_PCACHE_PREFETCH_MEMORY``, else 1 GiB or a quarter of the job's memory
        (``job_memory``, else read: the least of the host's and its cgroups' limits), the
        smaller (at least 1 byte: loading then takes one executable at a time)."""
        if self.prefetch_memory is not None:
            return self.prefetch_memory
        job = _memory.total() if job_memory is None else job_memory
        if job is None:
            return DEFAULT_PREFETCH_MEMORY
        return max(1, min(DEFAULT_PREFETCH_MEMORY, int(job * JOB_MEMORY_SHARE)))

    def compile_ahead_reserve(self, job_memory: int | None = None) -> int:
        """``XLA_PCACHE_COMPILE_AHEAD_MEMORY``, else a quarter of the job's memory
        (``job_memory``, else read: the least of the host's and its cgroups' limits; 0 when
        none can be read: then only the threads bound compiling ahead)."""
        if self.compile_ahead_memory is not None:
            return self.compile_ahead_memory
        job = _memory.total() if job_memory is None else job_memory
        return 0 if job is None else int(job * DEFAULT_COMPILE_AHEAD_RESERVE_FRACTION)

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
