"""The Python tools against a hostile directory or input: bundles (export into a directory
others can write, import of a compression bomb), the CLI printing keys and metadata someone
else chose, and sizes given by a user or an environment. Each test here failed before the
fix it covers."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import zlib
from pathlib import Path

import pytest
from xla_pcache import Store
from xla_pcache.bundle import import_bundle

from tests.helpers import clean_env, cli

# Address-space limit for the processes that import a bomb: a reader that inflates a member
# into memory runs out here within a second or two, instead of exhausting the machine.
BOMB_RLIMIT = 1536 << 20


def _run_limited(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    prelude = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({BOMB_RLIMIT}, {BOMB_RLIMIT}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
        check=False,
    )


# bundles -------------------------------------------------------------------------------------


def test_export_does_not_follow_a_planted_temp_link(tmp_path: Path) -> None:
    """Someone who can write the output directory plants a link where the old exporter put
    its temporary file (`<out>.tmp-<pid>`), pointing at a file of the victim's."""
    with Store(tmp_path / "cache") as store:
        assert store.put("k", b"v" * 1000)
        shared = tmp_path / "shared"
        shared.mkdir()
        victim = tmp_path / "victim.txt"
        victim.write_bytes(b"precious")
        out = shared / "warm.tar.gz"
        planted = Path(f"{out}.tmp-{os.getpid()}")
        planted.symlink_to(victim)
        assert store.export_bundle(out) == 1
    assert victim.read_bytes() == b"precious"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert not out.is_symlink() and tarfile.is_tarfile(out)
    # Nothing else is left behind in the shared directory.
    assert sorted(p.name for p in shared.iterdir()) == sorted([out.name, planted.name])


def test_export_replaces_a_link_at_the_output_name_without_following_it(tmp_path: Path) -> None:
    with Store(tmp_path / "cache") as store:
        assert store.put("k", b"v" * 1000)
        victim = tmp_path / "victim.txt"
        victim.write_bytes(b"precious")
        out = tmp_path / "warm.tar.gz"
        out.symlink_to(victim)
        assert store.export_bundle(out) == 1
    assert victim.read_bytes() == b"precious"
    assert not out.is_symlink() and tarfile.is_tarfile(out)


def _bomb(declared: int, content: int, key: str = "bomb") -> bytes:
    """A gzip'd tar whose one member declares `declared` bytes and inflates to `content`
    bytes of zeros, from a few MB: each MiB of zeros compresses, after a full flush, to the
    same bytes, so the deflate stream is built by repetition (the trailer's CRC is left
    wrong: no reader gets that far)."""
    info = tarfile.TarInfo("00/" + "0" * 32)
    info.size = declared
    info.pax_headers = {"XLA_PCACHE.key_hex": key.encode().hex(), "XLA_PCACHE.key_text": "1"}
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"]
    parts.append(c.compress(info.tobuf(format=tarfile.PAX_FORMAT)) + c.flush(zlib.Z_FULL_FLUSH))
    zeros = bytes(1 << 20)
    first = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    assert first == again
    parts.append(first * (content >> 20))
    parts.append(c.flush() + struct.pack("<II", 0, 0))
    return b"".join(parts)


def test_gzip_bomb_is_rejected_and_counted(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(_bomb(declared=8 << 30, content=4 << 30))
    assert bomb.stat().st_size < 8 << 20
    result = _run_limited(
        """
        import json
        from xla_pcache import Store
        with Store(sys.argv[1]) as store:
            r = store.import_bundle(sys.argv[2])
            print(json.dumps({**r.__dict__, "entries": len(store)}))
        """,
        str(tmp_path / "cache"),
        str(bomb),
    )
    assert result.returncode == 0, result.stderr
    assert "MemoryError" not in result.stderr and "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert (report["imported"], report["rejected"], report["oversized"]) == (0, 1, 1)
    assert report["unreadable"] and "compression bomb" in report["error"]
    assert report["entries"] == 0


def test_gzip_bomb_in_the_cli_is_one_clear_message(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(_bomb(declared=8 << 30, content=4 << 30))
    result = _run_limited(
        """
        from xla_pcache.cli import main
        sys.argv = ["xla-pcache", "import", sys.argv[2], "--path", sys.argv[1]]
        main()
        """,
        str(tmp_path / "cache"),
        str(bomb),
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    assert "rejected as corrupt 1 (1 of them too large)" in result.stdout
    assert "compression bomb" in result.stdout


def test_member_inflating_past_the_total_cap_is_rejected(tmp_path: Path) -> None:
    """A member under the per-entry cap whose bytes still run past the total cap is
    rejected as it is read (counted once), and nothing after it is read."""
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(_bomb(declared=64 << 20, content=64 << 20))
    with Store(tmp_path / "cache") as store:
        r = import_bundle(store, bomb, max_total_bytes=8 << 20)
        assert (r.imported, r.rejected, r.oversized, r.unreadable) == (0, 1, 1, True)
        assert len(store) == 0


def test_member_over_the_entry_cap_is_rejected_unread(tmp_path: Path) -> None:
    with Store(tmp_path / "a") as src:
        for i in range(3):
            assert src.put(f"k{i}", bytes([i]) * (10_000 * (i + 1)))
        src.export_bundle(tmp_path / "b.tgz")
    with Store(tmp_path / "q") as dst:
        r = import_bundle(dst, tmp_path / "b.tgz", max_entry_bytes=25_000)
        assert (r.imported, r.rejected, r.oversized, r.unreadable) == (2, 1, 1, False)
        assert "k2" not in dst and "k0" in dst and "k1" in dst
        with pytest.raises(ValueError, match="max_entry_bytes"):
            import_bundle(dst, tmp_path / "b.tgz", max_entry_bytes=0)


def test_non_regular_members_are_rejected(tmp_path: Path) -> None:
    """Links, devices, directories and FIFOs are never followed or created: rejected."""
    with Store(tmp_path / "a") as src:
        assert src.put("good", b"g" * 5000)
        src.export_bundle(tmp_path / "b.tgz")
    hostile = tmp_path / "h.tgz"
    with (
        tarfile.open(tmp_path / "b.tgz") as tin,
        tarfile.open(hostile, "w:gz", format=tarfile.PAX_FORMAT) as tout,
    ):
        good = tin.getmembers()[0]
        data = tin.extractfile(good)
        assert data is not None
        payload = data.read()
        for kind, extra in (
            (tarfile.SYMTYPE, {"linkname": "/etc/passwd"}),
            (tarfile.LNKTYPE, {"linkname": good.name}),
            (tarfile.DIRTYPE, {}),
            (tarfile.FIFOTYPE, {}),
            (tarfile.CHRTYPE, {}),
        ):
            m = tarfile.TarInfo(f"x{int.from_bytes(kind, 'big')}")
            m.type = kind
            m.pax_headers = dict(good.pax_headers)
            for name, value in extra.items():
                setattr(m, name, value)
            tout.addfile(m)
        tout.addfile(good, io.BytesIO(payload))
    with Store(tmp_path / "q") as dst:
        r = import_bundle(dst, hostile)
        assert (r.imported, r.rejected, r.unreadable) == (1, 5, False)
        assert dst.keys() == ["good"]
    # Nothing is extracted to a path: no member name appears anywhere.
    assert not [p for p in tmp_path.rglob("x*")]


# CLI -----------------------------------------------------------------------------------------

ODD_KEY = "jit_f[/]x [bold]y[/bold] :smile: [link=file:///etc]z"
ODD_META = {"framework": "[/]jax", "framework_version": "[red]0.10"}


def test_cli_prints_keys_meta_and_paths_literally(tmp_path: Path) -> None:
    """Whoever writes the cache chooses keys and metadata: the tables show them as they are
    (rich markup in a key used to crash `ls` with a MarkupError, or restyle the table)."""
    name = "team[/]cache [bold]"
    with Store(tmp_path / name) as store:
        assert store.put(ODD_KEY, b"v" * 100, meta=ODD_META)
    for args in (("ls",), ("stats",), ("verify",), ("prune", "--max-size", "1G")):
        result = cli(*args, "--path", name, cwd=tmp_path, COLUMNS="250")
        assert result.returncode == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr
        if args[0] in ("stats", "verify"):
            # The title holds the absolute path, folded to the table's width.
            assert "".join(name.split()) in "".join(result.stdout.split()), (args, result.stdout)
        if args == ("ls",):
            assert ODD_KEY in result.stdout, result.stdout
            assert "[/]jax [red]0.10" in result.stdout, result.stdout


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
def test_cli_names_what_is_wrong_with_format(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "c"
    root.mkdir()
    fmt = root / "FORMAT"
    if kind == "directory":
        fmt.mkdir()
    elif kind == "fifo":
        os.mkfifo(fmt)
    else:
        other = tmp_path / "elsewhere"
        other.write_text("secret first line\n")
        fmt.symlink_to(other)
    result = cli("stats", "--path", str(root))
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    words = {"directory": "a directory", "fifo": "a FIFO", "symlink": "a symbolic link"}
    assert f"FORMAT is {words[kind]}" in result.stderr, result.stderr
    assert "secret" not in result.stderr


def test_cli_export_error_names_the_output(tmp_path: Path) -> None:
    with Store(tmp_path / "c") as store:
        assert store.put("k", b"v")
    out = tmp_path / "missing-dir" / "b.tgz"
    result = cli("export", "--path", str(tmp_path / "c"), "-o", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip() == f"xla-pcache: error: cannot write {out}: No such file or directory"
    )


# sizes and durations -------------------------------------------------------------------------


def test_huge_max_size_is_a_value_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_size") as info:
        Store(tmp_path / "c", max_size="9" * 40)
    assert "too large to convert" not in str(info.value)
    with pytest.raises(ValueError, match="max_size"):
        Store(tmp_path / "c", max_size=1 << 64)
    # The largest budget the store can hold is accepted.
    with Store(tmp_path / "c", max_size=(1 << 63) - 1) as store:
        assert store.max_size == (1 << 63) - 1


def test_evict_accepts_size_and_duration_strings(tmp_path: Path) -> None:
    with Store(tmp_path / "c") as store:
        for i in range(4):
            assert store.put(f"k{i}", bytes(100_000))
        result = store.evict(max_size="1G")
        assert result["removed"] == 0 and len(store) == 4
        result = store.evict(max_size="200K")
        assert result["removed"] == 2 and len(store) == 2
        assert store.evict(older_than="7d")["removed"] == 0
        with pytest.raises(ValueError, match="max_size"):
            store.evict(max_size="9" * 40)
        with pytest.raises(ValueError, match="older_than"):
            store.evict(older_than=float("nan"))


def test_empty_max_size_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_size"):
        Store(tmp_path / "c", max_size="")
    with Store(tmp_path / "c") as store, pytest.raises(ValueError, match="max_size"):
        store.evict(max_size="  ")
    # In the environment an empty value means unset, as for every other variable.
    code = "from xla_pcache.config import Settings; print(Settings.from_env().max_size)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean_env(), "XLA_PERSISTENT_CACHE_MAX_SIZE": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "None"


@pytest.mark.parametrize(
    ("kwargs", "name", "error"),
    [
        ({"max_size": -1}, "max_size", ValueError),
        ({"max_size": float("nan")}, "max_size", TypeError),
        ({"max_size": True}, "max_size", TypeError),
        ({"max_size": "inf"}, "max_size", ValueError),
        ({"lock_timeout": 1e20}, "lock_timeout", ValueError),
        ({"lock_timeout": float("nan")}, "lock_timeout", ValueError),
        ({"lease_time": float("inf")}, "lease_time", ValueError),
        ({"hit_interval": -1.0}, "hit_interval", ValueError),
        ({"trash_grace": True}, "trash_grace", TypeError),
        ({"tmp_grace": 10**400}, "tmp_grace", ValueError),
        ({"claim_lease": "99999999999999999999"}, "claim_lease", ValueError),
    ],
)
def test_store_arguments_are_checked_by_name(
    tmp_path: Path, kwargs: dict[str, object], name: str, error: type[Exception]
) -> None:
    with pytest.raises(error, match=name):
        Store(tmp_path / "c", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


def test_claim_lease_variable_too_large_is_a_value_error(tmp_path: Path) -> None:
    """It used to reach the binding as 1e20 s and panic there (a BaseException, which the
    activation hook's `except Exception` does not catch)."""
    code = """
        import sys
        from xla_pcache import Store
        try:
            Store(sys.argv[1])
        except ValueError as e:
            print("ValueError:", e)
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "c")],
        env={**clean_env(), "XLA_PCACHE_CLAIM_LEASE": "99999999999999999999"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("ValueError:") and "XLA_PCACHE_CLAIM_LEASE" in out.stdout


def test_claim_and_wait_durations_are_checked(tmp_path: Path) -> None:
    with Store(tmp_path / "c") as store:
        with pytest.raises(ValueError, match="wait"):
            store.claim("k", wait=1e20)
        with pytest.raises(ValueError, match="timeout"):
            store.wait_for("k", float("inf"))


def test_remote_arguments_and_variables_are_checked_by_name(tmp_path: Path) -> None:
    """No server is contacted: the checks come before any connection."""
    from xla_pcache.config import REMOTE_MAX_BYTES_VAR, REMOTE_TIMEOUT_VAR
    from xla_pcache.tiers.redis import RedisTier as RemoteTier

    url = "redis://127.0.0.1:1/0"
    with pytest.raises(ValueError, match="timeout"):
        RemoteTier(url, timeout=float("nan"))
    with pytest.raises(ValueError, match="timeout"):
        RemoteTier(url, timeout=0)
    with pytest.raises(ValueError, match="max_value_bytes"):
        RemoteTier(url, max_value_bytes=-1)
    with pytest.raises(ValueError, match="retry_after"):
        RemoteTier(url, retry_after=float("inf"))
    code = "import sys; from xla_pcache import Store; Store(sys.argv[1]).get('k')"
    store = str(tmp_path / "c")
    for name, value in ((REMOTE_TIMEOUT_VAR, "soon"), (REMOTE_MAX_BYTES_VAR, "9" * 40)):
        out = subprocess.run(
            [sys.executable, "-c", code, store],
            env={**clean_env(), "XLA_PCACHE_REMOTE": url, name: value},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 1 and f"ValueError: invalid {name}" in out.stderr, out.stderr
    # Empty means unset, as for every other variable.
    out = subprocess.run(
        [sys.executable, "-c", code, store],
        env={
            **clean_env(),
            "XLA_PCACHE_REMOTE": url,
            REMOTE_TIMEOUT_VAR: "",
            REMOTE_MAX_BYTES_VAR: " ",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_doctor_prints_paths_and_problems_literally() -> None:
    """`doctor` quotes paths and cache errors (a FORMAT's first line, chosen by whoever wrote
    it): rendered as text, never as markup. The report is built by hand: collecting a real
    one compiles a program per framework, tens of seconds."""
    from rich.console import Console
    from xla_pcache.cli._doctor import _render

    odd = "/shared/[/]cache [bold]x"
    report = {
        "xla_pcache": "0.1.0",
        "format_version": 1,
        "python": "3.11",
        "config": {"path": odd, "path_source": "--path [/]"},
        "cache": {"filesystem": "ext4[/]", "mmap_reads": True, "entries": 1, "bytes": 10},
        "activation": {"jax": "on [/]"},
        "frameworks": {
            "jax": {"versions": {"jax": "0.10[/]"}, "backend_hint": "cpu", "error": "bad [/] x"}
        },
        "problems": [f'{odd}/FORMAT is not an xla_pcache format file (first line "[/]evil")'],
    }
    out = io.StringIO()
    _render(Console(file=out, width=400, highlight=False), report)
    text = out.getvalue()
    for needle in (odd, "--path [/]", "ext4[/]", "on [/]", "bad [/] x", '(first line "[/]evil")'):
        assert needle in text, (needle, text)
