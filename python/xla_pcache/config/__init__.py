"""Every variable of ours, in one place: named, parsed and documented.

``Settings.from_env()`` reads them all at once; elsewhere the package only sets the ones
torch_xla and child processes read (``torch_xla/_environment.py``) and asks whether a
threshold's variable is set (``jax/_thresholds.py``). Other programs' variables (JAX's, the
runtimes', the object stores') are read where they act (ARCHITECTURE.md, "Configuration and
the store's constructor"). ``VARIABLES`` is the table of them (name, type, default,
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

- ``variables``: the names and the table (``VARIABLES``);
- ``values``: a value parsed by its kind (bool, count, size, duration, choice, path, text);
- ``keys``: the signing key's file and the trusted keys, read as ssh reads its own;
- ``settings``: ``Settings``, every variable read at once, and the defaults.
"""

from __future__ import annotations

from xla_pcache.config.keys import SigningKey, parse_trusted_keys, read_signing_key
from xla_pcache.config.settings import (
    DEFAULT_BUCKET_RECORD_INTERVAL_S,
    DEFAULT_CLAIM_LEASE_S,
    DEFAULT_COMPILE_AHEAD_RESERVE_FRACTION,
    DEFAULT_COMPILE_AHEAD_THREADS,
    DEFAULT_COMPILE_WAIT_S,
    DEFAULT_MEMORY_CAPACITY,
    DEFAULT_MIN_COMPILE_TIME_S,
    DEFAULT_MIN_ENTRY_SIZE,
    DEFAULT_PREFETCH_MEMORY,
    DEFAULT_PREFETCH_THREADS,
    DEFAULT_REMOTE_MAX_BYTES,
    DEFAULT_REMOTE_TIMEOUT_S,
    DEFAULT_TPU_PREFETCH_LOADS,
    LOCK_MODES,
    ON_MISS_MODES,
    READ_MODES,
    LockMode,
    OnMiss,
    ReadMode,
    Settings,
    default_cache_path,
    settings_from_env,
)

# _TRUE, _FALSE: Settings' words, which the start-up hook keeps a copy of (a test holds the
# two equal).
from xla_pcache.config.values import _FALSE as _FALSE
from xla_pcache.config.values import _TRUE as _TRUE
from xla_pcache.config.values import parse_bool, parse_capacity
from xla_pcache.config.variables import (
    BUCKET_AUTO_PRUNE_VAR,
    BUCKET_RECORD_INTERVAL_VAR,
    CLAIM_LEASE_VAR,
    COMPILE_AHEAD_MEMORY_VAR,
    COMPILE_AHEAD_THREADS_VAR,
    COMPILE_AHEAD_VAR,
    COMPILE_WAIT_VAR,
    DISABLE_VAR,
    EVICT_TRACE_VAR,
    HASH_IMPL_VAR,
    LOCAL_DIR_VAR,
    LOCAL_PATH_VAR,
    LOCK_MODE_VAR,
    MAX_SIZE_VAR,
    MEMORY_CAPACITY_VAR,
    MIN_COMPILE_TIME_VAR,
    MIN_ENTRY_SIZE_VAR,
    ON_MISS_VAR,
    PATH_VAR,
    PREFETCH_LOADS_VAR,
    PREFETCH_MEMORY_VAR,
    PREFETCH_NAME_VAR,
    PREFETCH_THREADS_VAR,
    PREFETCH_VAR,
    READ_MODE_VAR,
    READ_ONLY_VAR,
    REMOTE_MAX_BYTES_VAR,
    REMOTE_TIMEOUT_VAR,
    REMOTE_VAR,
    SHARED_PATH_VAR,
    SIGNING_KEY_VAR,
    TEST_HOOKS_VAR,
    TRUSTED_KEYS_VAR,
    VARIABLE_NAMES,
    VARIABLES,
    XDG_CACHE_HOME_VAR,
    Variable,
)

__all__ = [
    "BUCKET_AUTO_PRUNE_VAR",
    "BUCKET_RECORD_INTERVAL_VAR",
    "CLAIM_LEASE_VAR",
    "COMPILE_AHEAD_MEMORY_VAR",
    "COMPILE_AHEAD_THREADS_VAR",
    "COMPILE_AHEAD_VAR",
    "COMPILE_WAIT_VAR",
    "DEFAULT_BUCKET_RECORD_INTERVAL_S",
    "DEFAULT_CLAIM_LEASE_S",
    "DEFAULT_COMPILE_AHEAD_RESERVE_FRACTION",
    "DEFAULT_COMPILE_AHEAD_THREADS",
    "DEFAULT_COMPILE_WAIT_S",
    "DEFAULT_MEMORY_CAPACITY",
    "DEFAULT_MIN_COMPILE_TIME_S",
    "DEFAULT_MIN_ENTRY_SIZE",
    "DEFAULT_PREFETCH_MEMORY",
    "DEFAULT_PREFETCH_THREADS",
    "DEFAULT_REMOTE_MAX_BYTES",
    "DEFAULT_REMOTE_TIMEOUT_S",
    "DEFAULT_TPU_PREFETCH_LOADS",
    "DISABLE_VAR",
    "EVICT_TRACE_VAR",
    "HASH_IMPL_VAR",
    "LOCAL_DIR_VAR",
    "LOCAL_PATH_VAR",
    "LOCK_MODES",
    "LOCK_MODE_VAR",
    "MAX_SIZE_VAR",
    "MEMORY_CAPACITY_VAR",
    "MIN_COMPILE_TIME_VAR",
    "MIN_ENTRY_SIZE_VAR",
    "ON_MISS_MODES",
    "ON_MISS_VAR",
    "PATH_VAR",
    "PREFETCH_LOADS_VAR",
    "PREFETCH_MEMORY_VAR",
    "PREFETCH_NAME_VAR",
    "PREFETCH_THREADS_VAR",
    "PREFETCH_VAR",
    "READ_MODES",
    "READ_MODE_VAR",
    "READ_ONLY_VAR",
    "REMOTE_MAX_BYTES_VAR",
    "REMOTE_TIMEOUT_VAR",
    "REMOTE_VAR",
    "SHARED_PATH_VAR",
    "SIGNING_KEY_VAR",
    "TEST_HOOKS_VAR",
    "TRUSTED_KEYS_VAR",
    "VARIABLES",
    "VARIABLE_NAMES",
    "XDG_CACHE_HOME_VAR",
    "LockMode",
    "OnMiss",
    "ReadMode",
    "Settings",
    "SigningKey",
    "Variable",
    "default_cache_path",
    "parse_bool",
    "parse_capacity",
    "parse_trusted_keys",
    "read_signing_key",
    "settings_from_env",
]
