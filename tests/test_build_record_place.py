"""Where the record of the runtime's binaries' identities is kept when the home cannot be
written (rust/core/src/record_place.rs): fresh processes, as users run them, with HOME and
XDG_CACHE_HOME pointing where nothing can be made (a read-only home: a read-only bind mount
when root, mode 0555 otherwise; a home that is a file; no home at all; XDG_CACHE_HOME under
/proc). The second process must not hash again (its build says how many files it hashed);
where no place can be written, the cost is shown (one warning, the ``build_rehashes``
counter, doctor's line). A fallback directory someone else could control (a link, another
user's, one others may write, a planted record) is refused, never trusted, and the next one
used."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import xxhash
from xla_pcache import Store, _core
from xla_pcache.config import Settings

from tests.build_identity import identify
from tests.helpers import clean_env, read_only_copy

UID = os.geteuid()
BUILDS = f"xla_pcache-builds-{UID}"
VERIFIED = f"xla_pcache-verified-{UID}"

# This process's JAX build, as a process that starts computes it at its first compile.
BUILD_ONLY = textwrap.dedent(
    """
    import json
    from xla_pcache.jax import _build
    b = _build.build()
    print(json.dumps({"digest": b.digest, "files": len(b.files), "hashed": b.hashed,
                      "dir": getattr(b, "record_dir", None),
                      "unkept": getattr(b, "record_unkept", None)}))
    """
)

# A program that knows nothing of xla_pcache, then asks what the adapter computed at its
# first compile (the build is computed once, there).
JAX_PROGRAM = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp
    value = float(jax.jit(lambda x: jnp.sin(x).sum() * 3)(jnp.arange(8.0)))
    from xla_pcache.jax import _build
    b = _build._build
    print(json.dumps({"value": value, "files": len(b.files), "hashed": b.hashed,
                      "dir": getattr(b, "record_dir", None),
                      "unkept": getattr(b, "record_unkept", None)}))
    """
)


def _env(home: Path | None, tmp: Path, **extra: str) -> dict[str, str]:
    """A child's environment: no XDG_* and no JAX_* of the shell's, HOME as given (None: no
    HOME at all), the temp dir ``tmp``."""
    env = clean_env(("JAX_", "XDG_"), JAX_PLATFORMS="cpu", TMPDIR=str(tmp), **extra)
    env.pop("HOME", None)
    if home is not None:
        env["HOME"] = str(home)
    return env


def _run(code: str, env: dict[str, str]) -> tuple[dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture
def read_only_home(tmp_path: Path) -> Iterator[Path]:
    empty = tmp_path / "empty-home"
    empty.mkdir()
    with read_only_copy(empty, tmp_path / "ro-home") as home:
        yield home


def _homes(tmp_path: Path, ro: Path) -> dict[str, tuple[Path | None, dict[str, str]]]:
    file = tmp_path / "home-file"
    file.write_bytes(b"not a directory")
    writable = tmp_path / "untouched-home"
    writable.mkdir()
    return {
        "read-only home": (ro, {}),
        "home is a file": (file, {}),
        "no home": (None, {}),
        "XDG_CACHE_HOME under /proc": (writable, {"XDG_CACHE_HOME": "/proc/xla_pcache-none"}),
    }


def test_a_jax_program_with_a_read_only_home_hashes_once(
    tmp_path: Path, read_only_home: Path
) -> None:
    """The headline case: a JAX program in a container whose home cannot be written. Its
    first process hashes jaxlib (and keeps the identities in the temp dir, a directory of
    this user's own), the second hashes nothing. On 6b856ec every process hashed again."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = _env(
        read_only_home,
        tmp,
        XLA_PERSISTENT_CACHE_PATH=str(tmp_path / "cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    first, err = _run(JAX_PROGRAM, env)
    second, err2 = _run(JAX_PROGRAM, env)
    assert first["files"] and first["hashed"] == first["files"], (first, err)
    assert second["value"] == first["value"]
    assert second["hashed"] == 0, (second, err2)
    assert first["dir"] == str(tmp / BUILDS) and first["unkept"] is None, first
    assert "cannot be remembered" not in err, err
    assert oct((tmp / BUILDS).stat().st_mode & 0o777) == oct(0o700)
    with Store(tmp_path / "cache", read_only=True) as s:
        assert s.stats()["build_rehashes"] == 0
    assert not any(read_only_home.iterdir())


@pytest.mark.parametrize(
    "how", ["read-only home", "home is a file", "no home", "XDG_CACHE_HOME under /proc"]
)
def test_an_unwritable_home_keeps_the_record_on_this_host(
    how: str, tmp_path: Path, read_only_home: Path
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    home, extra = _homes(tmp_path, read_only_home)[how]
    env = _env(home, tmp, **extra)
    first, _ = _run(BUILD_ONLY, env)
    second, err = _run(BUILD_ONLY, env)
    assert first["hashed"] == first["files"], first
    assert (second["hashed"], second["digest"]) == (0, first["digest"]), (second, err)
    assert first["dir"] == second["dir"] == str(tmp / BUILDS), (first, second)
    # XDG_CACHE_HOME, when set, is where the user put the cache: HOME is never written.
    if how == "XDG_CACHE_HOME under /proc":
        assert home is not None and not any(home.iterdir())


def test_nowhere_to_keep_it_is_shown(tmp_path: Path) -> None:
    """No home and a temp dir that cannot be written either: every process hashes, and says
    so once (a warning), counts it (``build_rehashes``) and doctor names it."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with (
        read_only_copy(empty, tmp_path / "ro-home") as home,
        read_only_copy(empty, tmp_path / "ro-tmp") as tmp,
    ):
        cache = tmp_path / "cache"
        env = _env(
            home,
            tmp,
            XLA_PERSISTENT_CACHE_PATH=str(cache),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        )
        for n in (1, 2):
            got, err = _run(JAX_PROGRAM, env)
            assert got["hashed"] == got["files"], got
            assert got["unkept"] and got["dir"] is None, got
            assert err.count("cannot be remembered") == 1, err
            with Store(cache, read_only=True) as s:
                assert s.stats()["build_rehashes"] == n
        doctor = subprocess.run(
            [sys.executable, "-m", "xla_pcache", "doctor", "--path", str(cache)],
            env={**env, "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "identities remembered nowhere" in doctor.stdout, doctor.stdout
        stats = subprocess.run(
            [sys.executable, "-m", "xla_pcache", "stats", "--path", str(cache), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(stats.stdout)["build_rehashes"] == 2, stats.stdout


def test_doctor_says_where_the_record_is(tmp_path: Path, read_only_home: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = _env(read_only_home, tmp)
    _run(BUILD_ONLY, env)
    doctor = subprocess.run(
        [sys.executable, "-m", "xla_pcache", "doctor", "--path", str(tmp_path / "c"), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(doctor.stdout)
    record = report["frameworks"]["jax"]["build"]["record"]
    assert record["dir"] == str(tmp / BUILDS) and record["unkept"] is None, record
    assert record["skipped"] and str(read_only_home) in record["skipped"][0], record


# The record's layout (build_id/record.rs): magic, version, count, slots of 112 bytes, xxh3-64.
LIE = bytes(range(32))


def _lying_record(lib: Path) -> bytes:
    st = os.stat(lib)
    out = b"xpcbrec\0" + struct.pack("<II", 1, 1)
    out += struct.pack(
        "<QQQQQBB6x", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, 2, 32
    )
    out += LIE.ljust(64, b"\0")
    return out + struct.pack("<Q", xxhash.xxh3_64_intdigest(out))


def _plant_dir(d: Path, lib: Path, mode: int = 0o700) -> None:
    d.mkdir()
    (d / "record").write_bytes(_lying_record(lib))
    os.chmod(d / "record", 0o600)
    os.chmod(d, mode)


def _link(run: Path, lib: Path) -> None:
    ours = run.parent / "ours"
    _plant_dir(ours, lib)
    (run / BUILDS).symlink_to(ours)


def _open_to_all(run: Path, lib: Path) -> None:
    _plant_dir(run / BUILDS, lib, 0o777)


def _file(run: Path, lib: Path) -> None:
    (run / BUILDS).write_bytes(_lying_record(lib))


def _record_others_write(run: Path, lib: Path) -> None:
    _plant_dir(run / BUILDS, lib)
    os.chmod(run / BUILDS / "record", 0o666)


def _record_is_a_link(run: Path, lib: Path) -> None:
    elsewhere = run.parent / "lie"
    elsewhere.write_bytes(_lying_record(lib))
    os.chmod(elsewhere, 0o600)
    (run / BUILDS).mkdir(mode=0o700)
    (run / BUILDS / "record").symlink_to(elsewhere)


def _another_users(run: Path, lib: Path) -> None:
    _plant_dir(run / BUILDS, lib)
    os.chown(run / BUILDS / "record", 4242, 4242)
    os.chown(run / BUILDS, 4242, 4242)


HOSTILE: dict[str, Callable[[Path, Path], None]] = {
    "a link to a directory of ours holding a lie": _link,
    "a directory others may write, holding a lie": _open_to_all,
    "a file at the name": _file,
    "a lie others may write, in a directory of ours": _record_others_write,
    "a record that is a link to a lie": _record_is_a_link,
    "another user's directory holding a lie": _another_users,
}


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_a_hostile_fallback_is_refused_and_the_next_used(
    how: str, tmp_path: Path, read_only_home: Path
) -> None:
    """Another local user who can write where the record falls back to ($XDG_RUNTIME_DIR
    set to a shared directory here) makes the name first, a link, a mode others may write,
    or plants a record that lies: it is refused with one warning, never read nor written,
    and the temp dir's place is used instead; the identity is always the file's own."""
    if how == "another user's directory holding a lie" and UID != 0:
        pytest.skip("only root can give a directory to another user")
    lib = tmp_path / "libt.so"
    lib.write_bytes(b"\x7fELF not really: a framework binary's bytes" * 1000)
    (clean,) = _core.identify_binaries([str(lib)], str(tmp_path / "clean"))[0]
    assert not isinstance(clean, str)
    truth = clean[1]
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o1777)
    HOSTILE[how](run, lib)
    before = {p: p.lstat() for p in run.rglob("*")} | {
        p: p.lstat() for p in tmp_path.glob("ours/*")
    }
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = _env(read_only_home, tmp, XDG_RUNTIME_DIR=str(run))
    for n in (1, 2):
        got, stderr = identify(lib, env, timeout=120)
        assert got["id"] == truth, (how, got)
        assert got["hashed"] == (1 if n == 1 else 0), (how, n, got)
        assert got["dir"] == str(tmp / BUILDS), (how, got)
        assert got["problems"] == 1, got
        warned = [line for line in stderr.splitlines() if "is not used" in line]
        assert len(warned) == 1 and str(run / BUILDS) in warned[0], stderr
    # Left as they were: nothing written through a link or into another's directory.
    after = {p: p.lstat() for p in before}
    assert {p: (s.st_mtime_ns, s.st_size, s.st_mode) for p, s in after.items()} == {
        p: (s.st_mtime_ns, s.st_size, s.st_mode) for p, s in before.items()
    }


def test_the_verification_record_is_kept_on_this_host_too(
    tmp_path: Path, read_only_home: Path
) -> None:
    """A trusting reader's record of signatures it verified has the same place: with the home
    read-only, the second reader finds the first one's record in the temp dir and records
    nothing more (on 6b856ec no record was kept anywhere)."""
    seed = _core.generate_signing_key()
    public = _core.signing_public_key(seed)
    cache = tmp_path / "cache"
    with Store(cache, settings=Settings(), signing_key=("ci-1", seed)) as w:
        assert w.put("k", b"x" * 1000)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = _env(read_only_home, tmp)
    read = textwrap.dedent(
        f"""
        import base64
        from xla_pcache import Store
        from xla_pcache.config import Settings
        trusted = [("ci-1", base64.b64decode({base64.b64encode(public)!r}))]
        with Store({str(cache)!r}, settings=Settings(), trusted_keys=trusted,
                   read_only=True) as r:
            assert r.get("k") is not None
            assert r.stats()["untrusted"] == 0
        """
    )
    subprocess.run([sys.executable, "-c", read], env=env, check=True, timeout=120)
    record = tmp / VERIFIED / "record"
    assert record.is_file(), sorted(tmp.rglob("*"))
    assert oct((tmp / VERIFIED).stat().st_mode & 0o777) == oct(0o700)
    kept = record.read_bytes()
    subprocess.run([sys.executable, "-c", read], env=env, check=True, timeout=120)
    assert record.read_bytes() == kept  # found there: nothing more recorded
    assert not any(read_only_home.iterdir())
    # Nowhere to keep it (the temp dir read-only too): the reader serves, and says so once.
    with read_only_copy(tmp_path / "empty-home", tmp_path / "ro-tmp") as ro_tmp:
        proc = subprocess.run(
            [sys.executable, "-c", read],
            env=_env(read_only_home, ro_tmp),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("signatures this process verifies cannot be remembered") == 1, (
        proc.stderr
    )


def test_an_images_record_in_a_read_only_home_is_read_and_completed_on_this_host(
    tmp_path: Path,
) -> None:
    """An image built with part of the record in its home (a read-only root filesystem at
    run time): the first process reads what it holds, hashes only the rest and keeps the
    whole record in the temp dir; the second hashes nothing (on 6b856ec every process
    hashed the files the image's record lacked)."""
    from xla_pcache.jax import _build

    files = [path for _, path, _ in _build.wanted()]
    assert len(files) > 2
    image = tmp_path / "image-home"
    part = files[: len(files) // 2]
    _core.identify_binaries(part, str(image / ".cache" / "xla_pcache-builds"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with read_only_copy(image, tmp_path / "ro-home") as home:
        env = _env(home, tmp)
        first, _ = _run(BUILD_ONLY, env)
        second, err = _run(BUILD_ONLY, env)
    assert first["hashed"] == len(files) - len(part), first
    assert second["hashed"] == 0, (second, err)
    assert second["dir"] == str(tmp / BUILDS), second
