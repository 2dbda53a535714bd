"""Zero-code activation for torch_xla: an unmodified program, configured by the environment.

Needs a real install of the package (``pip install -e .`` or the wheel), which puts
``xla_pcache_autoload.pth`` in site-packages; a bare PYTHONPATH checkout has none, and these
tests are skipped there (and so fail in CI, where every test must run). PJRT_DEVICE=CPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import site
import textwrap
from pathlib import Path
from typing import Any

import pytest
from xla_pcache import Store
from xla_pcache.torch_xla._host_mirror import is_torch_xla_name

from tests.helpers import clean_env, cli, run_worker

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed"
    ),
    pytest.mark.skipif(
        not any(
            os.path.isfile(os.path.join(d, "xla_pcache_autoload.pth"))
            for d in [*site.getsitepackages(), site.getusersitepackages()]
        ),
        reason="xla_pcache is not installed (no xla_pcache_autoload.pth): pip install -e .",
    ),
]

# Knows nothing of xla_pcache; reports torch_xla's own persistent-cache counters.
PROGRAM = textwrap.dedent(
    """
    import json, torch, torch_xla
    import torch_xla.debug.metrics as met
    y = torch.arange(16, dtype=torch.float32).to(torch_xla.device()) * 3 + 1
    torch_xla.sync()
    counters = {n: int(met.counter_value(n) or 0)
                for n in ("PersistentCacheMiss", "PersistentCacheHit")}
    print(json.dumps({"sum": float(y.cpu().sum()), **counters}))
    """
)


def run_program(tmp: Path, env: dict[str, str], code: str = PROGRAM) -> tuple[dict[str, Any], str]:
    base = clean_env(("XLA_", "PJRT_", "JAX_"))
    base.update(
        PJRT_DEVICE="CPU",
        TF_CPP_MIN_LOG_LEVEL="1",
        XLA_PCACHE_TORCH_XLA_LOCAL_DIR=str(tmp / "host-local"),
        **env,
    )
    report = run_worker("-c", code, env=base, timeout=300)
    return report, report.pop("stderr")


def torch_xla_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and is_torch_xla_name(p.name)]


def test_environment_alone_sends_torch_xla_writes_through_the_store(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    report, stderr = run_program(tmp_path, {"XLA_PERSISTENT_CACHE_PATH": str(shared)})
    assert report["sum"] == 376.0
    assert report["PersistentCacheMiss"] >= 1
    assert "Traceback" not in stderr
    # Only the store's layout: torch_xla wrote nothing in place.
    assert (shared / "FORMAT").read_text().startswith("xla_pcache-format")
    assert torch_xla_files(shared) == []
    with Store(str(shared), read_only=True) as store:
        keys = [e["key"] for e in store.entries()]
    assert any(isinstance(k, str) and k.startswith("torch_xla/") for k in keys), keys
    verify = cli("verify", "--path", str(shared))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "no problems found" in verify.stdout


def test_disable_leaves_torch_xla_to_its_own_cache_and_activation_leaves_its_files(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    env = {"XLA_PERSISTENT_CACHE_PATH": str(shared), "XLA_PCACHE_DISABLE": "1"}
    report, _ = run_program(tmp_path, env)
    assert report["PersistentCacheMiss"] >= 1
    # torch_xla's own in-place cache: its files, and no store.
    own = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in torch_xla_files(shared)}
    assert own != []
    assert not (shared / "FORMAT").exists()
    # Activated on that directory: its files are left as they are (not adopted: written in
    # place, any could be torn, and an entry is forever) and it says so; the graph is
    # compiled once more, into the store.
    report, stderr = run_program(tmp_path, {"XLA_PERSISTENT_CACHE_PATH": str(shared)})
    assert stderr.count(f"holds {len(own)} file(s) of torch_xla's own persistent cache") == 1
    assert report["PersistentCacheMiss"] == 1
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in torch_xla_files(shared)} == own
    with Store(str(shared), read_only=True) as store:
        assert any(str(e["key"]).startswith("torch_xla/") for e in store.entries())


def test_an_explicit_install_before_the_import_wins(tmp_path: Path) -> None:
    shared, chosen = tmp_path / "shared", tmp_path / "chosen"
    code = (
        f"from xla_pcache import torch_xla as xt\n"
        f"inst = xt.install({str(chosen)!r})\n"
        + PROGRAM
        + "print(json.dumps({'via': xt.activation(), 'path': inst.store.path}))\n"
    )
    report, stderr = run_program(tmp_path, {"XLA_PERSISTENT_CACHE_PATH": str(shared)}, code)
    assert report == {"via": "install()", "path": str(chosen)}
    assert not shared.exists()
    assert "Traceback" not in stderr


def test_an_unusable_directory_is_one_warning_and_the_program_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    report, stderr = run_program(tmp_path, {"XLA_PERSISTENT_CACHE_PATH": str(blocker)})
    assert report["sum"] == 376.0
    assert "Traceback" not in stderr
    assert stderr.count("xla_pcache: cannot open the cache") == 1, stderr
    assert blocker.read_text() == "not a directory"


def test_doctor_names_the_hook_and_still_reports_what_cpu_cannot_load(tmp_path: Path) -> None:
    env = clean_env(("XLA_", "PJRT_", "JAX_"))
    env.update(PJRT_DEVICE="CPU", XLA_PERSISTENT_CACHE_PATH=str(tmp_path / "shared"))

    def report(extra: dict[str, str]) -> dict[str, Any]:
        proc = cli("doctor", "--json", env=env, timeout=600, **extra)
        assert proc.stdout, proc.stderr[-3000:]
        result: dict[str, Any] = json.loads(proc.stdout)
        return result

    on = report({})
    assert on["activation"]["torch_xla"].startswith("on (xla_pcache_autoload.pth import hook")
    assert "xla_pcache_autoload.pth)" in on["activation"]["torch_xla"]
    # The probe runs with activation off, so it still sees torch_xla's own behaviour:
    # measured, the CPU client loads entries back up to torch_xla 2.7, not from 2.8.
    version = importlib.metadata.version("torch_xla")
    loads = tuple(int(p) for p in version.split("+")[0].split(".")[:2]) < (2, 8)
    assert on["frameworks"]["torch_xla"]["load"] is loads
    detail = on["frameworks"]["torch_xla"]["detail"]
    if loads:
        assert "loads its entries back" in detail
    else:
        assert "cannot be loaded back" in detail
        assert "https://github.com/pytorch/xla/issues/9094" in detail
    off = report({"XLA_PCACHE_DISABLE": "1"})
    assert off["activation"]["torch_xla"] == "off (XLA_PCACHE_DISABLE=1)"


def test_a_failed_activation_leaves_torch_xla_without_the_store(tmp_path: Path) -> None:
    # A budget that cannot be parsed makes activation fail after the import, as an
    # unsupported torch_xla does: torch_xla must not then write in place into the store's
    # directory (it would, reading XLA_PERSISTENT_CACHE_PATH at its first execution).
    shared = tmp_path / "shared"
    Store(str(shared)).close()
    env = {"XLA_PERSISTENT_CACHE_PATH": str(shared), "XLA_PERSISTENT_CACHE_MAX_SIZE": "lots"}
    report, stderr = run_program(tmp_path, env)
    assert report["sum"] == 376.0
    assert "Traceback" not in stderr
    assert stderr.count("activation for torch_xla failed") == 1, stderr
    assert "runs with no persistent cache" in stderr
    assert (report["PersistentCacheMiss"], report["PersistentCacheHit"]) == (0, 0)
    assert torch_xla_files(shared) == []
