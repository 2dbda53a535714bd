"""Trusted writers outside the frameworks: the variables and key files, the CLI commands
(keygen, verify --trusted, prune --untrusted, ls, explain, doctor) and bundles."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xla_pcache import Store, _core
from xla_pcache.bundle import export_bundle, import_bundle
from xla_pcache.config import Settings, read_signing_key

from tests.helpers import clean_env, cli, keygen


def pair(key_file: str) -> tuple[str, bytes]:
    k = read_signing_key(key_file)
    return k.name, k.private


def public(text: str) -> tuple[str, bytes]:
    name, b64 = text.split(":", 1)
    return name, base64.b64decode(b64)


def test_keygen_writes_0600_never_overwrites_and_prints_the_public_key(tmp_path: Path) -> None:
    key_file, pub = keygen(tmp_path, "ci-1")
    out = Path(key_file)
    assert os.stat(out).st_mode & 0o777 == 0o600
    name, raw = public(pub)
    assert name == "ci-1" and len(raw) == 32
    assert _core.signing_public_key(pair(key_file)[1]) == raw
    before = out.read_bytes()
    again = cli("keygen", "ci-1", "--out", str(out))
    assert again.returncode == 2 and "never overwrites" in again.stderr
    assert out.read_bytes() == before
    bad = cli("keygen", "ci", "--out", str(tmp_path / "x.key"))
    assert bad.returncode == 2 and "version" in bad.stderr
    assert not (tmp_path / "x.key").exists()


def test_a_readable_or_malformed_key_file_is_an_error_naming_the_variable(
    tmp_path: Path,
) -> None:
    out = Path(keygen(tmp_path, "ci-1")[0])
    out.chmod(0o640)
    with pytest.raises(ValueError, match=r"XLA_PCACHE_SIGNING_KEY.*group or others"):
        Settings.from_env({"XLA_PCACHE_SIGNING_KEY": str(out)})
    for text in ("", "ci-1\n", "ci-1:notbase64!\n", "ci-1:" + base64.b64encode(b"x").decode()):
        bad = tmp_path / "bad.key"
        bad.write_text(text)
        bad.chmod(0o600)
        with pytest.raises(ValueError, match="XLA_PCACHE_SIGNING_KEY"):
            Settings.from_env({"XLA_PCACHE_SIGNING_KEY": str(bad)})
    with pytest.raises(ValueError, match="XLA_PCACHE_SIGNING_KEY"):
        Settings.from_env({"XLA_PCACHE_SIGNING_KEY": str(tmp_path / "missing")})
    # The private key never shows in the settings' repr.
    out.chmod(0o600)
    s = Settings.from_env({"XLA_PCACHE_SIGNING_KEY": str(out)})
    assert s.signing_key is not None
    assert base64.b64encode(s.signing_key.private).decode() not in repr(s)


def test_the_cores_key_checks_are_the_ones_a_store_applies(tmp_path: Path) -> None:
    # Exposed for Python's parsers of key files and lists: what they refuse, a store refuses
    # with the same words, since it is the same rule.
    key = pair(keygen(tmp_path, "ci-1")[0])
    good = [public(keygen(tmp_path, "ci-2")[1])]
    _core.check_signing_key(key)
    _core.check_trusted_keys(good)
    for bad_key in [("ci", key[1]), ("ci-1", key[1][:31]), ("ci-1/x", key[1])]:
        with pytest.raises(ValueError, match="signing_key") as checked:
            _core.check_signing_key(bad_key)
        with pytest.raises(ValueError, match="signing_key") as opened:
            _core.Store(tmp_path / "c", signing_key=bad_key)
        assert str(checked.value) == str(opened.value)
    for bad_set in [[("ci", good[0][1])], good + good, [("ci-3", good[0][1][:31])]]:
        with pytest.raises(ValueError, match="trusted_keys") as checked:
            _core.check_trusted_keys(bad_set)
        with pytest.raises(ValueError, match="trusted_keys") as opened:
            _core.Store(tmp_path / "c", trusted_keys=bad_set)
        assert str(checked.value) == str(opened.value)
    assert not (tmp_path / "c").exists()


def test_trusted_keys_from_the_variable_or_a_file(tmp_path: Path) -> None:
    _, a = keygen(tmp_path, "ci-1")
    _, b = keygen(tmp_path, "ci-2")
    listed = Settings.from_env({"XLA_PCACHE_TRUSTED_KEYS": f"{a}, {b}"}).trusted_keys
    f = tmp_path / "trusted"
    f.write_text(f"# comment\n{a}\n\n{b}\n")
    from_file = Settings.from_env({"XLA_PCACHE_TRUSTED_KEYS": f"@{f}"}).trusted_keys
    assert listed == from_file == (public(a), public(b))
    for bad in ("ci-1", f"{a},{a}", "ci:" + a.split(":")[1], "ci-1:AAAA", "@/nonexistent"):
        with pytest.raises(ValueError, match="XLA_PCACHE_TRUSTED_KEYS"):
            Settings.from_env({"XLA_PCACHE_TRUSTED_KEYS": bad})


def test_operator_commands_name_signers_and_remove_the_untrusted(tmp_path: Path) -> None:
    ci_file, ci_pub = keygen(tmp_path, "ci-1")
    m_file, _ = keygen(tmp_path, "mallory-1")
    root = tmp_path / "cache"
    meta = {"framework": "jax"}
    with Store(root, settings=Settings(), signing_key=pair(ci_file)) as s:
        assert s.put("good", b"g", meta=meta)
    with Store(root, settings=Settings(), signing_key=pair(m_file)) as s:
        assert s.put("evil", b"e", meta=meta)
    with Store(root, settings=Settings()) as s:
        assert s.put("plain", b"p", meta=meta)
    env = {"XLA_PERSISTENT_CACHE_PATH": str(root), "XLA_PCACHE_TRUSTED_KEYS": ci_pub}
    ls = cli("ls", "--json", **env)
    signers = {e["key"]: e["signer"] for e in json.loads(ls.stdout)}
    assert signers == {"good": "ci-1", "evil": "mallory-1", "plain": None}
    listed = cli("verify", "--trusted", **env)
    assert listed.returncode == 1, listed.stderr
    assert "evil: signed by mallory-1, not trusted" in listed.stdout
    assert "plain: unsigned" in listed.stdout
    assert "good" not in listed.stdout
    explained = cli("explain", "evil", **env)
    assert "signed by mallory-1, not trusted" in explained.stdout
    # doctor's trust set-up (its framework probes are left out: they start JAX and torch).
    from xla_pcache.cli import _doctor as doctor

    with pytest.MonkeyPatch.context() as m:
        for k, v in {**env, "XLA_PCACHE_SIGNING_KEY": str(ci_file)}.items():
            m.setenv(k, v)
        config, problems = doctor._configuration(None)
    assert problems == []
    assert config["trust"]["signing_key"]["name"] == "ci-1"
    assert [k["name"] for k in config["trust"]["trusted_keys"]] == ["ci-1"]
    secret = base64.b64encode(pair(ci_file)[1]).decode()
    assert secret not in json.dumps(config)
    assert cli("verify", "--trusted", **{"XLA_PERSISTENT_CACHE_PATH": str(root)}).returncode == 2
    pruned = cli("prune", "--untrusted", **env)
    assert pruned.returncode == 0 and "removed 2 untrusted entries" in pruned.stdout
    assert cli("verify", "--trusted", **env).returncode == 0
    with Store(root, settings=Settings(), trusted_keys=[public(ci_pub)]) as s:
        assert bytes(s.get("good") or b"") == b"g"
        assert len(s) == 1


def test_bundles_keep_signatures_and_a_trusting_import_rejects_and_counts(
    tmp_path: Path,
) -> None:
    ci_file, ci_pub = keygen(tmp_path, "ci-1")
    src = tmp_path / "src"
    with Store(src, settings=Settings(), signing_key=pair(ci_file)) as s:
        assert s.put("signed", b"s" * 1000, meta={"framework": "jax"})
    with Store(src, settings=Settings()) as s:
        assert s.put("unsigned", b"u" * 1000, meta={"framework": "jax"})
    bundle = tmp_path / "b.tar.gz"
    with Store(src, settings=Settings(), read_only=True) as s:
        assert export_bundle(s, bundle) == 2
    dst = tmp_path / "dst"
    # An untrusted entry already at the signed one's key does not stop the import.
    with Store(dst, settings=Settings()) as s:
        assert s.put("signed", b"squatter", meta={"framework": "jax"})
    trusting = {"trusted_keys": [public(ci_pub)]}
    with Store(dst, settings=Settings(), **trusting) as s:  # type: ignore[arg-type]
        report = import_bundle(s, bundle)
        # The unsigned member is whole: not trusted here, counted, and no damage.
        assert (report.imported, report.rejected, report.untrusted) == (1, 0, 1)
        assert s.stats()["untrusted"] >= 1
        blob = s.get("signed")
        assert blob is not None and bytes(blob) == b"s" * 1000 and blob.signer == "ci-1"
        assert s.get("unsigned") is None


FORKED_CHILD = """
import os, sys
from xla_pcache import Store, _core
from xla_pcache.config import Settings
root, seed = sys.argv[1], bytes.fromhex(sys.argv[2])
trusted = [("ci-1", _core.signing_public_key(seed))]
payload = os.urandom(4 << 20)  # past the size hashed on every core
with Store(root, settings=Settings(), signing_key=("ci-1", seed)) as w:
    assert w.put("parent", payload)
r = Store(root, settings=Settings(), trusted_keys=trusted, read_only=True)
assert r.get("parent") is not None
pid = os.fork()
if pid == 0:
    ok = r.get("parent") is not None
    with Store(root, settings=Settings(), signing_key=("ci-1", seed)) as w:
        ok = ok and w.put("child", payload)
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), r.get("child") is not None)
"""


def test_a_forked_child_hashes_large_signed_entries(tmp_path: Path) -> None:
    """Large payloads are hashed on a thread pool; a child forked after the parent used it
    (multiprocessing, data loader workers) gets and signs as the parent does, not waiting
    for ever on threads that stayed in the parent."""
    seed = _core.generate_signing_key().hex()
    r = subprocess.run(
        [sys.executable, "-c", FORKED_CHILD, str(tmp_path / "c"), seed],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["child", "0", "True"]


def test_a_verified_entry_cannot_be_changed_under_a_trusting_reader(tmp_path: Path) -> None:
    """A file another user can write in place (its owner, or a group it is writable by) is
    read into the reader's memory and verified there, never mapped: writing the file after
    the get leaves what was verified, and handed out, as it was."""
    seed = _core.generate_signing_key()
    trusted = [("ci-1", _core.signing_public_key(seed))]
    payload = os.urandom(1 << 20)  # large enough to be mapped when that is safe
    with Store(tmp_path, settings=Settings(), signing_key=("ci-1", seed)) as w:
        assert w.put("k", payload)
    (entry,) = [p for p in (tmp_path / "entries").rglob("*") if p.is_file()]
    # Handing the file to another user needs root; a group-writable file of one's own does not.
    cases = [(os.geteuid(), 0o664)] + ([(4321, 0o644)] if os.geteuid() == 0 else [])
    for owner, mode in cases:
        os.chown(entry, owner, -1)
        entry.chmod(mode)
        with Store(tmp_path, settings=Settings(), trusted_keys=trusted, read_only=True) as r:
            blob = r.get("k")
            assert blob is not None
            with open(entry, "r+b") as f:
                f.seek(-4096, os.SEEK_END)
                original = f.read(4096)
                f.seek(-4096, os.SEEK_END)
                f.write(b"\xcc" * 4096)
            try:
                assert bytes(blob) == payload, (owner, oct(mode))
            finally:
                with open(entry, "r+b") as f:
                    f.seek(-4096, os.SEEK_END)
                    f.write(original)


def test_trusting_readers_keep_a_per_user_record_and_ignore_one_others_can_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A trusting reader records the signatures it verified in this user's own record
    (`$XDG_CACHE_HOME/xla_pcache-verified`, 0700 / 0600). A record it would not use (a
    link, a FIFO, group-writable, garbage) changes nothing a reader serves: it verifies as
    without one, warns once and counts the path (`unsafe_paths`)."""
    home = tmp_path / "home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    # Where a refused record's ids go instead: this test's own, not the host's temp dir.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    seed = _core.generate_signing_key()
    trusted = [("ci-1", _core.signing_public_key(seed))]
    cache = tmp_path / "c"
    with Store(cache, settings=Settings(), signing_key=("ci-1", seed)) as w:
        assert w.put("k", b"x" * 1000)

    def read() -> int:
        with Store(cache, settings=Settings(), trusted_keys=trusted, read_only=True) as r:
            assert r.get("k") is not None
            return r.stats()["unsafe_paths"]

    assert read() == 0
    rec_dir = home / "xla_pcache-verified"
    rec = rec_dir / "record"
    assert (rec_dir.stat().st_mode & 0o777, rec.stat().st_mode & 0o777) == (0o700, 0o600)
    good = rec.read_bytes()
    assert read() == 0 and rec.read_bytes() == good  # found: nothing more recorded

    def link() -> None:
        (rec_dir / "elsewhere").write_bytes(good)
        (rec_dir / "elsewhere").chmod(0o600)
        rec.symlink_to(rec_dir / "elsewhere")

    def fifo() -> None:
        os.mkfifo(rec, 0o600)

    def group_writable() -> None:
        rec.write_bytes(good)
        rec.chmod(0o620)

    def garbage() -> None:
        rec.write_bytes(b"\xa5" * 4000)
        rec.chmod(0o600)

    for spoil in (link, fifo, group_writable, garbage):
        rec.unlink()
        spoil()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="xla_pcache"):
            assert read() == 1, spoil.__name__
        assert caplog.text.count("is not used") == 1, (spoil.__name__, caplog.text)
    # A garbled record of this user's own is replaced by the next reader that verifies.
    assert rec.read_bytes()[:8] == b"xpcvrec\0"
