"""Settings from the environment, and ``from_env()`` building the cache they ask for."""

from __future__ import annotations

import base64
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import xla_pcache
from xla_pcache import config
from xla_pcache.caches import PersistentCache
from xla_pcache.config import (
    DEFAULT_MEMORY_CAPACITY,
    VARIABLE_NAMES,
    VARIABLES,
    Settings,
    default_cache_path,
    parse_bool,
    parse_capacity,
    settings_from_env,
)

TRUE_WORDS = ["1", "true", "TRUE", "True", "yes", "YES", "on", "On", " 1 "]
FALSE_WORDS = ["0", "false", "FALSE", "no", "No", "off", "OFF"]


@pytest.mark.parametrize("word", TRUE_WORDS)
def test_parse_bool_true(word: str) -> None:
    assert parse_bool(word, "X") is True


@pytest.mark.parametrize("word", FALSE_WORDS)
def test_parse_bool_false(word: str) -> None:
    assert parse_bool(word, "X") is False


@pytest.mark.parametrize("word", ["2", "maybe", "y", "n", "truee", "-1", ""])
def test_parse_bool_rejects(word: str) -> None:
    with pytest.raises(ValueError, match="MY_VAR") as info:
        parse_bool(word, "MY_VAR")
    assert repr(word) in str(info.value)


def test_parse_capacity() -> None:
    assert parse_capacity("0", "N") == 0
    assert parse_capacity(" 4096 ", "N") == 4096
    assert parse_capacity(7, "N") == 7
    for bad in ["-1", "1.5", "2k", "lots"]:
        with pytest.raises(ValueError, match=r"N"):
            parse_capacity(bad, "N")
    with pytest.raises(ValueError):
        parse_capacity(-3, "N")
    with pytest.raises(TypeError):
        parse_capacity(True, "N")


def test_defaults_when_nothing_is_set() -> None:
    settings = settings_from_env({})
    assert settings == Settings(
        path=None, read_only=False, max_size=None, memory_capacity=DEFAULT_MEMORY_CAPACITY
    )
    assert settings.memory_capacity == 2048


def test_every_variable_set(tmp_path: Path) -> None:
    settings = settings_from_env(
        {
            "XLA_PERSISTENT_CACHE_PATH": str(tmp_path),
            "XLA_PERSISTENT_CACHE_READ_ONLY": "Yes",
            "XLA_COMPILATION_CACHE_SIZE": "16",
            "XLA_PERSISTENT_CACHE_MAX_SIZE": "1.5T",
        }
    )
    assert settings == Settings(
        path=str(tmp_path), read_only=True, max_size=int(1.5 * 2**40), memory_capacity=16
    )


def test_empty_values_count_as_unset() -> None:
    assert settings_from_env(dict.fromkeys(VARIABLE_NAMES, "")) == Settings()
    assert settings_from_env(dict.fromkeys(VARIABLE_NAMES, "  ")) == Settings()
    # The one the binding used to read itself, where an empty value was an error.
    assert Settings.from_env({"XLA_PCACHE_LOCK_MODE": ""}).lock_mode == "auto"


def test_max_size_forms() -> None:
    def size(text: str) -> int | None:
        return settings_from_env({"XLA_PERSISTENT_CACHE_MAX_SIZE": text}).max_size

    assert size("1048576") == 1 << 20
    assert size("500M") == 500 << 20
    assert size("50g") == 50 << 30


def test_path_expands_user() -> None:
    settings = settings_from_env({"XLA_PERSISTENT_CACHE_PATH": "~/somewhere"})
    assert settings.path == os.path.join(os.path.expanduser("~"), "somewhere")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("XLA_PERSISTENT_CACHE_READ_ONLY", "sometimes"),
        ("XLA_PERSISTENT_CACHE_READ_ONLY", "2"),
        ("XLA_COMPILATION_CACHE_SIZE", "many"),
        ("XLA_COMPILATION_CACHE_SIZE", "-5"),
        ("XLA_COMPILATION_CACHE_SIZE", "1e3"),
        ("XLA_PERSISTENT_CACHE_MAX_SIZE", "12Q"),
        ("XLA_PERSISTENT_CACHE_MAX_SIZE", "0"),
        ("XLA_PERSISTENT_CACHE_MAX_SIZE", "-1G"),
        ("XLA_PERSISTENT_CACHE_MAX_SIZE", "big"),
    ],
)
def test_malformed_value_names_variable_and_quotes_value(name: str, value: str) -> None:
    with pytest.raises(ValueError) as info:
        settings_from_env({name: value})
    assert name in str(info.value)
    assert repr(value) in str(info.value)


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.read_only = True  # type: ignore[misc]


def test_default_cache_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert default_cache_path({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "xla_pcache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = str(tmp_path / "home" / ".cache" / "xla_pcache")
    assert default_cache_path({}) == expected
    # A relative XDG_CACHE_HOME is invalid per the XDG spec and ignored.
    assert default_cache_path({"XDG_CACHE_HOME": "relative/dir"}) == expected


# from_env ------------------------------------------------------------------------------------


def test_from_env_unset_gives_memory_cache() -> None:
    cache = xla_pcache.from_env(environ={})
    assert isinstance(cache, xla_pcache.MemoryCache)
    assert cache.capacity == 2048


def test_from_env_memory_capacity() -> None:
    cache = xla_pcache.from_env(environ={"XLA_COMPILATION_CACHE_SIZE": "2"})
    assert isinstance(cache, xla_pcache.MemoryCache)
    for key in ("a", "b", "c"):
        cache.add(key, key)
    assert len(cache) == 2
    assert "a" not in cache


def test_from_env_every_variable_set(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    environ = {
        "XLA_PERSISTENT_CACHE_PATH": str(root),
        "XLA_PERSISTENT_CACHE_MAX_SIZE": "10M",
        "XLA_COMPILATION_CACHE_SIZE": "1",
    }
    cache = xla_pcache.from_env(environ=environ)
    assert isinstance(cache, xla_pcache.PersistentCache)
    with cache:
        assert cache.path == str(root)
        assert cache.read_only is False
        assert cache.store.max_size == 10 << 20
        # Default serialization: bytes-like values stored as they are, read back as bytes.
        cache.add("k1", b"one")
        cache.add("k2", bytearray(b"two"))
        assert len(cache) == 1  # memory capacity 1
        assert cache.get("k1") == b"one"
        assert type(cache.get("k1")) is bytes
    assert (root / "FORMAT").is_file()

    # A second cache over the same directory, read-only, sees what the first one wrote.
    environ["XLA_PERSISTENT_CACHE_READ_ONLY"] = "1"
    reader = xla_pcache.from_env(environ=environ)
    assert isinstance(reader, xla_pcache.PersistentCache)
    with reader:
        assert reader.read_only is True
        assert reader.get("k2") == b"two"
        reader.add("k3", b"three")
        assert "k3" not in reader.store


def test_from_env_custom_serialization(tmp_path: Path) -> None:
    environ = {"XLA_PERSISTENT_CACHE_PATH": str(tmp_path / "c")}
    writer = xla_pcache.from_env(str.encode, lambda blob: bytes(blob).decode(), environ=environ)
    writer.add("k", "text")
    reader = xla_pcache.from_env(str.encode, lambda blob: bytes(blob).decode(), environ=environ)
    assert len(reader) == 0
    assert reader.get("k") == "text"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("XLA_PERSISTENT_CACHE_READ_ONLY", "perhaps"),
        ("XLA_COMPILATION_CACHE_SIZE", "x"),
        ("XLA_PERSISTENT_CACHE_MAX_SIZE", "10 parsecs"),
    ],
)
def test_from_env_malformed(tmp_path: Path, name: str, value: str) -> None:
    environ = {"XLA_PERSISTENT_CACHE_PATH": str(tmp_path / "c"), name: value}
    with pytest.raises(ValueError, match=name):
        xla_pcache.from_env(environ=environ)
    # A bad setting must be refused before anything is created.
    assert not (tmp_path / "c").exists()


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XLA_PERSISTENT_CACHE_PATH", raising=False)
    monkeypatch.setenv("XLA_COMPILATION_CACHE_SIZE", "3")
    cache = xla_pcache.from_env()
    assert isinstance(cache, xla_pcache.MemoryCache)
    assert cache.capacity == 3


def test_compile_wait_and_claim_lease() -> None:
    def wait(value: str) -> float:
        return Settings.from_env({"XLA_PCACHE_COMPILE_WAIT": value}).compile_wait

    def lease(value: str) -> float:
        return Settings.from_env({"XLA_PCACHE_CLAIM_LEASE": value}).claim_lease

    assert Settings.from_env({}).compile_wait == 300.0
    assert wait(" ") == 300.0
    assert wait("0") == 0.0
    assert wait("90") == 90.0
    assert wait("5m") == 300.0
    assert Settings.from_env({}).claim_lease == 30.0
    assert lease("2.5s") == 2.5
    for name, value in (
        ("XLA_PCACHE_COMPILE_WAIT", "-1"),
        ("XLA_PCACHE_COMPILE_WAIT", "soon"),
        ("XLA_PCACHE_CLAIM_LEASE", "0"),
        ("XLA_PCACHE_CLAIM_LEASE", "x"),
    ):
        with pytest.raises(ValueError, match=name):
            Settings.from_env({name: value})


def test_prefetch_settings_parse_and_refuse() -> None:
    default = Settings.from_env({})
    assert default.prefetch is True and default.prefetch_name is None
    assert 1 <= default.prefetch_thread_count() <= 8
    # Unset: 1 GiB, or a quarter of the job's memory when that is less (tests/test_memory.py).
    assert default.prefetch_memory is None and 0 < default.prefetch_memory_bound() <= 1 << 30
    assert Settings.from_env({"XLA_PCACHE_PREFETCH": "0"}).prefetch is False
    for name, value in (
        ("XLA_PCACHE_PREFETCH", "maybe"),
        ("XLA_PCACHE_PREFETCH_THREADS", "0"),
        ("XLA_PCACHE_PREFETCH_THREADS", "many"),
        ("XLA_PCACHE_PREFETCH_LOADS", "0"),
        ("XLA_PCACHE_PREFETCH_MEMORY", "0"),
        ("XLA_PCACHE_PREFETCH_MEMORY", "-1G"),
    ):
        with pytest.raises(ValueError, match=name):
            Settings.from_env({name: value})


# the table of variables ------------------------------------------------------------------------


def test_every_field_has_one_variable() -> None:
    fields = [f.name for f in dataclasses.fields(Settings)]
    # A variable with no field is one the core reads itself (the hash path, the test hooks).
    assert sorted(fields) == sorted(v.field for v in VARIABLES if v.field is not None)
    assert {v.name for v in VARIABLES if v.field is None} == {
        "XLA_PCACHE_HASH_IMPL",
        "XLA_PCACHE_TEST_HOOKS",
    }
    assert len(VARIABLE_NAMES) == len(VARIABLES)


def test_from_env_reads_every_variable(tmp_path: Path) -> None:
    # One well-formed, non-default value per variable: each must reach its field.
    values = {
        "XLA_PERSISTENT_CACHE_PATH": str(tmp_path / "p"),
        "XLA_PERSISTENT_CACHE_READ_ONLY": "1",
        "XLA_COMPILATION_CACHE_SIZE": "7",
        "XLA_PERSISTENT_CACHE_MAX_SIZE": "3G",
        "XLA_PCACHE_COMPILE_WAIT": "1m",
        "XLA_PCACHE_CLAIM_LEASE": "45",
        "XLA_PCACHE_LOCK_MODE": "lease",
        "XLA_PCACHE_READ_MODE": "PREAD",
        "XLA_PCACHE_EVICT_TRACE": str(tmp_path / "trace"),
        "XLA_PCACHE_TEST_HOOKS": str(tmp_path / "hooks"),
        "XLA_PCACHE_HASH_IMPL": "portable",
        "XLA_PCACHE_DISABLE": "yes",
        "XLA_PCACHE_TORCH_XLA_SHARED_PATH": str(tmp_path / "shared"),
        "XLA_PCACHE_TORCH_XLA_LOCAL_DIR": str(tmp_path / "local"),
        "XLA_PCACHE_REMOTE": "redis://cache:6379/0",
        "XLA_PCACHE_REMOTE_TIMEOUT": "0.5",
        "XLA_PCACHE_REMOTE_MAX_BYTES": "1.5G",
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "XLA_PCACHE_SIGNING_KEY": _key_file(tmp_path),
        "XLA_PCACHE_TRUSTED_KEYS": "ci-1:" + base64.b64encode(bytes(32)).decode(),
        "XLA_PCACHE_MIN_COMPILE_TIME": "2s",
        "XLA_PCACHE_MIN_ENTRY_SIZE": "64K",
        "XLA_PCACHE_ON_MISS": "Error",
        "XLA_PCACHE_LOCAL_PATH": str(tmp_path / "bucket-local"),
        "XLA_PCACHE_BUCKET_RECORD_INTERVAL": "1h",
        "XLA_PCACHE_BUCKET_AUTO_PRUNE": "0",
        "XLA_PCACHE_PREFETCH": "off",
        "XLA_PCACHE_PREFETCH_THREADS": "3",
        "XLA_PCACHE_PREFETCH_LOADS": "2",
        "XLA_PCACHE_PREFETCH_MEMORY": "256M",
        "XLA_PCACHE_PREFETCH_NAME": "lm-train",
        "XLA_PCACHE_COMPILE_AHEAD": "no",
        "XLA_PCACHE_COMPILE_AHEAD_THREADS": "2",
        "XLA_PCACHE_COMPILE_AHEAD_MEMORY": "8G",
    }
    assert set(values) == VARIABLE_NAMES
    settings = Settings.from_env(values)
    default = Settings()
    for var in VARIABLES:
        if var.field is not None:
            assert getattr(settings, var.field) != getattr(default, var.field), var.name
    assert settings.remote_max_bytes == 3 << 29
    assert settings.read_mode == "pread" and settings.lock_mode == "lease"
    assert settings.torch_xla_local_root() == str(tmp_path / "local")
    assert (settings.bucket_record_interval, settings.bucket_auto_prune) == (3600.0, False)
    assert (settings.prefetch, settings.prefetch_thread_count()) == (False, 3)
    assert settings.prefetch_load_count("tpu") == settings.prefetch_load_count("cpu") == 2
    # Unset: four at once on a TPU, every thread elsewhere; never more than the threads.
    assert Settings(prefetch_threads=8).prefetch_load_count("tpu") == 4
    assert Settings(prefetch_threads=8).prefetch_load_count("cpu") == 8
    assert Settings(prefetch_threads=2, prefetch_loads=5).prefetch_load_count("gpu") == 2
    assert (settings.prefetch_memory, settings.prefetch_name) == (256 << 20, "lm-train")
    assert (settings.compile_ahead, settings.compile_ahead_thread_count()) == (False, 2)
    assert settings.compile_ahead_reserve() == 8 << 30
    assert 1 <= default.compile_ahead_thread_count() <= 8 and default.compile_ahead_reserve() > 0


def _key_file(tmp_path: Path) -> str:
    path = tmp_path / "ci-1.key"
    path.write_text("ci-1:" + base64.b64encode(bytes(range(32))).decode() + "\n")
    path.chmod(0o600)
    return str(path)


def test_caching_thresholds_take_milliseconds_seconds_and_sizes() -> None:
    def compile_time(value: str) -> float:
        return Settings.from_env({"XLA_PCACHE_MIN_COMPILE_TIME": value}).min_compile_time

    assert (Settings().min_compile_time, Settings().min_entry_size) == (0.0, 0)
    assert compile_time("250ms") == pytest.approx(0.25)
    assert compile_time("2") == compile_time("2s") == 2.0
    assert compile_time("0") == 0.0
    assert Settings.from_env({"XLA_PCACHE_MIN_ENTRY_SIZE": "64K"}).min_entry_size == 64 << 10
    assert Settings.from_env({"XLA_PCACHE_MIN_ENTRY_SIZE": "0"}).min_entry_size == 0
    for value in ("ms", "-1ms", "5xms", "soon", "-1"):
        with pytest.raises(ValueError, match=f"XLA_PCACHE_MIN_COMPILE_TIME {value!r}"):
            compile_time(value)
    with pytest.raises(ValueError, match="XLA_PCACHE_MIN_ENTRY_SIZE"):
        Settings.from_env({"XLA_PCACHE_MIN_ENTRY_SIZE": "big"})


def test_remote_max_bytes_takes_a_size() -> None:
    assert Settings.from_env({"XLA_PCACHE_REMOTE_MAX_BYTES": "512M"}).remote_max_bytes == 512 << 20
    assert Settings.from_env({"XLA_PCACHE_REMOTE_MAX_BYTES": "1024"}).remote_max_bytes == 1024


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("XLA_PCACHE_LOCK_MODE", "flock"),
        ("XLA_PCACHE_READ_MODE", "mapped"),
        ("XLA_PCACHE_DISABLE", "maybe"),
        ("XLA_PCACHE_REMOTE_TIMEOUT", "0"),
        ("XLA_PCACHE_REMOTE_TIMEOUT", "later"),
        ("XLA_PCACHE_REMOTE_MAX_BYTES", "lots"),
        ("XLA_PCACHE_REMOTE_MAX_BYTES", "0"),
        ("XLA_PCACHE_COMPILE_WAIT", "nan"),
    ],
)
def test_every_error_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({name: value})
    assert name in str(info.value)
    assert repr(value) in str(info.value)


def test_store_errors_name_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("XLA_PCACHE_LOCK_MODE", "flock"), ("XLA_PCACHE_READ_MODE", "x")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            with pytest.raises(ValueError, match=name):
                xla_pcache.Store(tmp_path / "c")
    # Passed as arguments, the message names the argument.
    with pytest.raises(ValueError, match="lock_mode"):
        xla_pcache.Store(tmp_path / "c", lock_mode="flock")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="read_mode"):
        xla_pcache.Store(tmp_path / "c", read_mode="x")  # type: ignore[arg-type]


def _keys() -> tuple[config.SigningKey, tuple[tuple[str, bytes], ...]]:
    private = xla_pcache._core.generate_signing_key()
    signing = config.SigningKey("ci-1", "/nowhere", private)
    return signing, (("ci-1", xla_pcache._core.signing_public_key(private)),)


def _evict_lock_kind(store: xla_pcache.Store) -> str:
    lock = Path(store.path) / "locks" / "evict.lock"
    lock.unlink(missing_ok=True)
    store.evict(0)
    return "fcntl" if lock.exists() else "lease"


# Each option of Store: (settings that ask for it, an argument that asks otherwise, the
# variable that asks a third thing, what the store shows of it).
_SIGNING, _TRUSTED = _keys()
_OPTIONS: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, str], Any]] = {
    "max_size": (
        {"max_size": 1 << 20},
        {"max_size": "2M"},
        ("XLA_PERSISTENT_CACHE_MAX_SIZE", "3M"),
        lambda s: s.max_size,
    ),
    "read_only": (
        {"read_only": True},
        {"read_only": False},
        ("XLA_PERSISTENT_CACHE_READ_ONLY", "0"),
        lambda s: s.read_only,
    ),
    "read_mode": (
        {"read_mode": "pread"},
        {"read_mode": "mmap"},
        ("XLA_PCACHE_READ_MODE", "mmap"),
        lambda s: "pread" if not s.mmap_reads else "mmap",
    ),
    "lock_mode": (
        {"lock_mode": "lease"},
        {"lock_mode": "fcntl"},
        ("XLA_PCACHE_LOCK_MODE", "fcntl"),
        # fcntl locks a lock file it keeps; a lease is a file removed on release.
        lambda s: _evict_lock_kind(s),
    ),
    "remote": (
        {"remote": "redis://127.0.0.1:1/0"},
        {"remote": "redis://127.0.0.1:2/0"},
        ("XLA_PCACHE_REMOTE", "redis://127.0.0.1:3/0"),
        lambda s: s._chain_text,
    ),
    "signing_key": (
        {"signing_key": _SIGNING},
        {"signing_key": ("ci-2", _SIGNING.private)},
        ("XLA_PCACHE_SIGNING_KEY", "/nonexistent-key-file"),
        lambda s: s.signing_key_name,
    ),
    "trusted_keys": (
        {"trusted_keys": _TRUSTED},
        {"trusted_keys": [("ci-2", _TRUSTED[0][1])]},
        ("XLA_PCACHE_TRUSTED_KEYS", "not a key"),
        lambda s: s.trusted_key_names,
    ),
}


@pytest.mark.parametrize("option", sorted(_OPTIONS))
def test_store_takes_each_option_from_settings(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Store(path, settings=s)`` asks what ``s`` asks (on e1a808d ``max_size`` and
    ``read_only`` were left out); an argument passed wins over ``s``; ``s`` wins over the
    environment, which is not read when ``s`` is given (a malformed variable included)."""
    asks, argument, (var, value), shown = _OPTIONS[option]
    root = tmp_path / "c"
    xla_pcache.Store(root).close()
    settings = Settings(path=str(root), **asks)
    monkeypatch.setenv(var, value)
    with xla_pcache.Store(root, settings=settings) as s:
        from_settings = shown(s)
    with xla_pcache.Store(root, settings=settings, **argument) as s:
        from_argument = shown(s)
    with PersistentCache(root, lambda v: v, bytes, settings=settings) as c:
        from_cache = shown(c.store)
    expected = {
        "max_size": (1 << 20, 2 << 20),
        "read_only": (True, False),
        "read_mode": ("pread", "mmap"),
        "lock_mode": ("lease", "fcntl"),
        "remote": ("redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"),
        "signing_key": ("ci-1", "ci-2"),
        "trusted_keys": (["ci-1"], ["ci-2"]),
    }[option]
    assert (from_settings, from_argument) == expected
    assert from_cache == expected[0]


def test_store_without_settings_keeps_its_own_budget_and_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``settings``: the environment's other settings, but not the budget and read-only
    mode of the framework cache at ``XLA_PERSISTENT_CACHE_PATH`` (docs/configuration.md)."""
    root = tmp_path / "c"
    xla_pcache.Store(root).close()
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_MAX_SIZE", "3M")
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_READ_ONLY", "1")
    monkeypatch.setenv("XLA_PCACHE_READ_MODE", "pread")
    with xla_pcache.Store(root) as s:
        assert (s.max_size, s.read_only, s.mmap_reads) == (None, False, False)
    with PersistentCache(root, lambda v: v, bytes) as c:
        assert (c.store.max_size, c.read_only) == (None, False)
    with xla_pcache.Store(root, settings=Settings.from_env()) as s:
        assert (s.max_size, s.read_only) == (3 << 20, True)
    # claim_lease has nothing to show but its check: the settings' value reaches it.
    with pytest.raises(ValueError, match="claim_lease"):
        xla_pcache.Store(root, settings=Settings(claim_lease=-1.0))
    xla_pcache.Store(root, settings=Settings(claim_lease=-1.0), claim_lease=5).close()


def _readme_rows() -> dict[str, tuple[str, str]]:
    """Variable -> (meaning, default), from the README's configuration table."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2].strip("`"))
    return rows


def _readme_table() -> dict[str, str]:
    """Variable -> default, from the README's configuration table."""
    return {name: default for name, (_, default) in _readme_rows().items()}


def test_readme_table_matches_settings() -> None:
    table = _readme_table()
    assert list(table) == [v.name for v in VARIABLES]
    assert table == {v.name: v.default.strip("`") for v in VARIABLES}


def test_readme_table_says_what_config_says() -> None:
    # In full: the README's meaning of each variable is VARIABLES', word for word.
    meanings = {name: meaning for name, (meaning, _) in _readme_rows().items()}
    differ = {v.name for v in VARIABLES if meanings.get(v.name) != v.meaning}
    assert not differ, {
        n: (meanings.get(n), VARIABLES[[v.name for v in VARIABLES].index(n)].meaning)
        for n in differ
    }


def test_fixture_clears_every_variable() -> None:
    # The autouse fixture of conftest.py: no test sees the caller's shell.
    assert not VARIABLE_NAMES & os.environ.keys()


def _hook() -> Any:
    import importlib.util

    hook = (
        Path(__file__).resolve().parent.parent
        / "python/xla_pcache.data/purelib/_xla_pcache_autoload.py"
    )
    spec = importlib.util.spec_from_file_location("_autoload_under_test", hook)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("value", ["1", "TRUE", " yes ", "on", "0", "off", "", "  ", "No"])
def test_start_up_hook_reads_disable_as_settings_does(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hook outside the package reads the variable itself (importing the package would load
    # the extension in every Python process); it must agree with Settings.
    module = _hook()
    assert module._TRUE == config._TRUE and module._FALSE == config._FALSE
    monkeypatch.setenv("XLA_PCACHE_DISABLE", value)
    assert module.disabled() == Settings.from_env().disabled


@pytest.mark.parametrize("value", ["maybe", "2", "disable"])
def test_start_up_hook_refuses_what_settings_refuses(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Settings raises for these; the hook, which must never break start-up, leaves the cache
    # off and says why.
    monkeypatch.setenv("XLA_PCACHE_DISABLE", value)
    with pytest.raises(ValueError, match="XLA_PCACHE_DISABLE"):
        Settings.from_env()
    module = _hook()
    monkeypatch.setenv("XLA_PERSISTENT_CACHE_PATH", "/tmp/somewhere")
    with caplog.at_level("WARNING", logger="xla_pcache"):
        assert module.disabled() is True
        assert module.wanted() is False
    assert "invalid XLA_PCACHE_DISABLE '" in caplog.text


def test_on_miss_takes_three_modes_and_names_itself_when_malformed() -> None:
    assert Settings.from_env({}).on_miss == "compile"
    for mode in ("compile", "warn", "error", " WARN "):
        assert Settings.from_env({"XLA_PCACHE_ON_MISS": mode}).on_miss == mode.strip().lower()
    with pytest.raises(ValueError, match="XLA_PCACHE_ON_MISS"):
        Settings.from_env({"XLA_PCACHE_ON_MISS": "fail"})
