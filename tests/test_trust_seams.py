"""Trust where two features meet, each seam as an attacker with write access to the cache
directory (but no trusted key) would try it: the torch_xla host pool after a key is
revoked, a bundle of a squatted key, names held by directories, key files that are FIFOs or
links or writable by others, one rule for key names, and credentials in remote URLs."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from xla_pcache import Store, _core
from xla_pcache.config import Settings
from xla_pcache.torch_xla._host_mirror import HostMirror, store_key

from tests.helpers import clean_env, cli, keygen


def _pair(name: str) -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    seed = _core.generate_signing_key()
    return (name, seed), (name, _core.signing_public_key(seed))


def test_a_revoked_key_is_never_linked_into_a_torch_xla_view(tmp_path: Path) -> None:
    """The host pool files each copy by the key it was verified against: a process whose
    trusted set no longer holds that key gets no link (a miss, which torch_xla counts),
    whatever a process trusting it copied into the pool of the same host before."""
    ci, ci_pub = _pair("ci-1")
    _, ci2_pub = _pair("ci-2")
    root = tmp_path / "store"
    with Store(root, settings=Settings(), signing_key=ci, trusted_keys=[ci_pub]) as w:
        assert w.put(store_key("123"), b"the executable", meta={"framework": "torch_xla"})
    local = tmp_path / "local"

    def view_of(trusted: list[tuple[str, bytes]] | None) -> list[str]:
        store = Store(root, settings=Settings(), read_only=True, trusted_keys=trusted)
        mirror = HostMirror(store, str(local))
        mirror.refresh_pool()
        try:
            return sorted(os.listdir(mirror.open_view()))
        finally:
            mirror.close_view()
            store.close()

    assert view_of([ci_pub]) == ["123"]
    # ci-1 dropped from the set (revoked): no link, though the host holds ci-1's copy.
    assert view_of([ci2_pub]) == []
    # A process trusting no key reads its own unverified copies, never the verified pools'.
    assert view_of(None) == ["123"]
    assert view_of([ci2_pub]) == []
    assert view_of([ci2_pub, ci_pub]) == ["123"]


def test_a_bundle_of_a_squatted_key_keeps_the_trusted_entry(tmp_path: Path) -> None:
    """A squatter's plain entry and ci-1's own entry of one key travel as two members; a
    trusting import takes ci-1's, counts the other as not trusted, and exits 0."""
    ci, ci_pub = _pair("ci-1")
    src = tmp_path / "src"
    with Store(src, settings=Settings()) as s:
        assert s.put("k", b"evil", meta={"framework": "jax"})
    with Store(src, settings=Settings(), signing_key=ci, trusted_keys=[ci_pub]) as s:
        assert s.put("k", b"good", meta={"framework": "jax"})
    bundle = tmp_path / "b.tar.gz"
    exported = cli("export", "--path", str(src), "-o", str(bundle))
    assert exported.returncode == 0, exported.stderr
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert len(names) == 2 and len(set(names)) == 2, names
    trusted = f"ci-1:{base64.b64encode(ci_pub[1]).decode()}"
    dst = tmp_path / "dst"
    imported = cli("import", str(bundle), "--path", str(dst), XLA_PCACHE_TRUSTED_KEYS=trusted)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "imported 1" in imported.stdout and "not trusted 1" in imported.stdout
    with Store(dst, settings=Settings(), trusted_keys=[ci_pub], read_only=True) as r:
        blob = r.get("k")
        assert blob is not None and bytes(blob) == b"good" and blob.signer == "ci-1"


def test_no_key_is_blocked_by_directories_at_its_names(tmp_path: Path) -> None:
    """A directory at a key's plain name and one at the signer's own name: the trusted put
    moves them aside and publishes; `prune --untrusted` removes such names."""
    ci, ci_pub = _pair("ci-1")
    root = tmp_path / "c"
    Store(root, settings=Settings()).close()

    def plant(name: str) -> Path:
        p = root / "entries" / name[:2] / name
        (p / "inner").mkdir(parents=True)
        return p

    plain = plant(_core.entry_name("k"))
    own = plant(_core.signed_entry_name("k", "ci-1"))
    with Store(root, settings=Settings(), signing_key=ci, trusted_keys=[ci_pub]) as w:
        assert w.put("k", b"good")
        assert w.process_stats()["unsafe_paths"] == 1
    with Store(root, settings=Settings(), trusted_keys=[ci_pub], read_only=True) as r:
        assert bytes(r.get("k") or b"") == b"good"
    assert plain.is_file() and own.is_dir()
    late = plant(_core.signed_entry_name("j", "ci-1"))
    trusted = f"ci-1:{base64.b64encode(ci_pub[1]).decode()}"
    pruned = cli("prune", "--untrusted", "--path", str(root), XLA_PCACHE_TRUSTED_KEYS=trusted)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.count("a directory at an entry's name") == 2, pruned.stdout
    assert not late.exists() and not own.exists()


@pytest.mark.parametrize("var", ["XLA_PCACHE_SIGNING_KEY", "XLA_PCACHE_TRUSTED_KEYS"])
def test_a_key_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path, var: str) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo, 0o600)
    value = f"@{fifo}" if var == "XLA_PCACHE_TRUSTED_KEYS" else str(fifo)
    # A fresh process: on a FIFO the read used to wait for ever (the timeout fails it).
    r = subprocess.run(
        [sys.executable, "-c", "from xla_pcache.config import Settings; Settings.from_env()"],
        env=clean_env(**{var: value}),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 1 and "not a regular file" in r.stderr and var in r.stderr, r.stderr


def test_a_trusted_list_others_could_change_is_refused_naming_it(tmp_path: Path) -> None:
    _, ci_pub = _pair("ci-1")
    line = f"ci-1:{base64.b64encode(ci_pub[1]).decode()}\n"
    good = tmp_path / "trusted"
    good.write_text(line)
    good.chmod(0o644)
    assert Settings.from_env({"XLA_PCACHE_TRUSTED_KEYS": f"@{good}"}).trusted_keys == (ci_pub,)
    for mode in (0o664, 0o646):
        good.chmod(mode)
        with pytest.raises(ValueError, match=r"TRUSTED_KEYS.*trusted.*writable by group"):
            Settings.from_env({"XLA_PCACHE_TRUSTED_KEYS": f"@{good}"})
    good.chmod(0o644)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(ValueError, match=r"XLA_PCACHE_TRUSTED_KEYS.*link.*symbolic link"):
        Settings.from_env({"XLA_PCACHE_TRUSTED_KEYS": f"@{link}"})
    key_link = tmp_path / "key-link"
    key_file, _ = keygen(tmp_path, "ci-1")
    key_link.symlink_to(key_file)
    with pytest.raises(ValueError, match=r"XLA_PCACHE_SIGNING_KEY.*symbolic link"):
        Settings.from_env({"XLA_PCACHE_SIGNING_KEY": str(key_link)})


def test_one_rule_for_key_names(tmp_path: Path) -> None:
    """What keygen writes, both variables take: the core's rule, everywhere."""
    key_file, public = keygen(tmp_path, "ci--1")
    s = Settings.from_env({"XLA_PCACHE_SIGNING_KEY": key_file, "XLA_PCACHE_TRUSTED_KEYS": public})
    assert s.signing_key is not None and s.signing_key.name == "ci--1"
    assert s.trusted_keys is not None and s.trusted_keys[0][0] == "ci--1"
    bad = cli("keygen", "ci", "--out", str(tmp_path / "x.key"))
    assert bad.returncode == 2
    with pytest.raises(ValueError, match="XLA_PCACHE_TRUSTED_KEYS"):
        Settings.from_env({"XLA_PCACHE_TRUSTED_KEYS": "ci:" + public.split(":", 1)[1]})


# Passwords holding what URLs use as separators; each part is a distinct marker, so that any
# piece of the password showing anywhere is caught.
PASSWORDS = ["K9Q,Z4W", "K9Q?Z4W", "K9Q#Z4W", "K9Q@Z4W", "K9Q%Z4W", "K9Q%41Z4W,X7V?J2P#"]
MARKERS = ("K9Q", "Z4W", "X7V", "J2P")


@pytest.mark.parametrize("password", PASSWORDS)
def test_no_part_of_a_password_is_ever_shown(
    tmp_path: Path, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis password with unencoded separators, in stats, stats --json, doctor and the
    warnings: whatever the URL parses into, no piece of it shows."""
    url = f"redis://user:{password}@127.0.0.1:1/0"
    root = tmp_path / "c"
    env = {"XLA_PERSISTENT_CACHE_PATH": str(root), "XLA_PCACHE_REMOTE": url}
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG, logger="xla_pcache"):
        with Store(root, remote=url) as s:
            shown.append(json.dumps(s.stats()))
            assert s.put("k", b"v")  # opens the chain: its warnings
            assert s.remote is not None
            s.remote.flush()
            shown.append(json.dumps(s.stats()))
        from xla_pcache.cli import _doctor as doctor

        with pytest.MonkeyPatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            config, problems = doctor._configuration(None)
            store, info, more = doctor._open_store(config)
            if store is not None:
                store.close()
        shown += [json.dumps(config), json.dumps(info), *problems, *more]
    shown += [r.getMessage() for r in caplog.records]
    for args in (("stats",), ("stats", "--json")):
        r = cli(*args, **env)
        shown += [r.stdout, r.stderr]
    text = "\n".join(shown)
    # What can be shown is (a ',' cuts the URL in two, and neither half is a URL).
    assert "127.0.0.1" in text or "," in password
    for marker in MARKERS:
        assert marker not in text, (password, marker, text)


SIGNING_ALONE = """
import logging, sys
from xla_pcache import Store, _core
from xla_pcache.config import Settings
logging.basicConfig(level=logging.WARNING)
seed = _core.generate_signing_key()
pub = ("ci-1", _core.signing_public_key(seed))
for root in sys.argv[1:3]:
    Store(root, settings=Settings(), signing_key=("ci-1", seed)).close()
Store(sys.argv[3], settings=Settings(), signing_key=("ci-1", seed), trusted_keys=[pub]).close()
"""


def test_a_signer_without_trusted_keys_says_so_once(tmp_path: Path) -> None:
    roots = [str(tmp_path / n) for n in ("a", "b", "c")]
    r = subprocess.run(
        [sys.executable, "-c", SIGNING_ALONE, *roots],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("trusts no key") == 1, r.stderr
    assert "XLA_PCACHE_TRUSTED_KEYS" in r.stderr


# A token pasted into a bucket path (its query, its fragment), in the forms above.
TOKENS = [*PASSWORDS, "ghp_K9QZ4WX7VJ2P"]
JAX_ACTIVATION = """
import logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
import xla_pcache.jax as xj
for url in sys.argv[1:]:
    os.environ["XLA_PERSISTENT_CACHE_PATH"] = url
    xj.install()
    xj.uninstall()
"""


def _bucket_paths(token: str) -> list[str]:
    return [f"s3://bkt/cache?{token}", f"gs://bkt/cache?x={token}", f"az://ctr/cache#{token}"]


@pytest.fixture(scope="module")
def jax_activation_warnings() -> str:
    """JAX's activation warnings for every path below, from one fresh process (the path in
    ``XLA_PERSISTENT_CACHE_PATH``, as zero-code activation reads it)."""
    urls = [url for token in TOKENS for url in _bucket_paths(token)]
    r = subprocess.run(
        [sys.executable, "-c", JAX_ACTIVATION, *urls],
        env=clean_env(JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.mark.parametrize("token", TOKENS)
def test_no_part_of_a_token_in_a_bucket_path_is_ever_shown(
    tmp_path: Path, token: str, jax_activation_warnings: str
) -> None:
    """A bucket path with a token in its query or fragment, which no bucket URL takes: the
    command's error (stats, prune, config), doctor's report, JAX's activation warning, the
    API's error (``open_store``) and the local-path variable's error each say it cannot be
    served, and show no piece of the token."""
    from typer.testing import CliRunner
    from xla_pcache import open_store
    from xla_pcache.cli import _doctor as doctor
    from xla_pcache.cli import app
    from xla_pcache.tiers import redact

    shown: list[str] = [jax_activation_warnings]
    for url in _bucket_paths(token):
        for args in (("stats",), ("prune", "--max-size", "1G"), ("config", "--show")):
            r = CliRunner().invoke(app, [*args, "--path", url])
            assert r.exit_code == 2 and "cannot be served" in r.output, r.output
            shown.append(r.output)
        config, problems = doctor._configuration(url)
        assert any("cannot be served" in p for p in problems), problems
        shown += [json.dumps(config), *problems]
        with pytest.raises(ValueError, match="cannot be served") as e:
            open_store(url, settings=Settings())
        shown.append(str(e.value))
        shown.append(redact(url))
        with pytest.raises(ValueError, match="XLA_PCACHE_LOCAL_PATH") as e:
            Settings.from_env({"XLA_PCACHE_LOCAL_PATH": url})
        shown.append(str(e.value))
    text = "\n".join(shown)
    assert "s3://" in text and "cannot be served" in text
    for marker in MARKERS:
        assert marker not in text, (token, marker, text)
    # Each of this token's paths got its activation warning (a '#' part is refused too).
    for url in _bucket_paths(token):
        assert f"{redact(url)} cannot be served" in jax_activation_warnings, url
