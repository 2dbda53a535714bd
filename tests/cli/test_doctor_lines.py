"""doctor's lines are true and whole: activation is "on" only where the framework is
installed, and piped output is not cut at 80 columns. Run by the main venv (jax and
torch_xla installed) and by the torch_xla 2.7 venv, which has no jax (scripts/test.sh)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import clean_env


def _python(code: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_activation_is_on_only_for_installed_frameworks(tmp_path: Path) -> None:
    out = _python(
        """
        import json
        from xla_pcache.cli._doctor import _activation
        print(json.dumps(_activation()))
        """,
        XLA_PERSISTENT_CACHE_PATH=str(tmp_path / "cache"),
    )
    states = json.loads(out)
    for framework in ("jax", "torch_xla"):
        if importlib.util.find_spec(framework) is None:
            assert states[framework] == f"off ({framework} is not installed in this environment)"
        else:
            assert not states[framework].startswith("off (" + framework), states


def test_piped_output_keeps_whole_lines(tmp_path: Path) -> None:
    problem = "a problem " + "x" * 300 + " END"
    out = _python(
        f"""
        from xla_pcache.cli import _doctor as doctor
        report = {{
            "xla_pcache": "0", "format_version": 1, "python": "3",
            "config": {{"path": "/nowhere", "path_source": "--path"}},
            "cache": {{}}, "frameworks": {{}}, "activation": {{}},
            "problems": [{problem!r}],
        }}
        doctor._render(doctor._console(), report)
        """
    )
    assert any(line.endswith(problem) for line in out.splitlines()), out


def test_no_jax_section_where_jax_is_not_importable() -> None:
    """Where jax cannot be imported (hidden here as a venv without it would have it; the
    torch_xla 2.7 venv has none), doctor says nothing of what JAX stores: no section, no
    thresholds (on e1a808d both were printed)."""
    out = _python(
        """
        import sys
        sys.modules["jax"] = None  # `import jax` fails, find_spec finds nothing
        import json
        from xla_pcache.cli import _doctor as doctor
        report = {
            "xla_pcache": "0", "format_version": 1, "python": "3",
            "config": {"path": "/nowhere", "path_source": "--path"},
            "cache": {}, "frameworks": {}, "problems": [],
            "activation": doctor._activation(), "jax_caching": doctor._jax_caching(),
        }
        doctor._render(doctor._console(), report)
        print(json.dumps(report["jax_caching"]))
        """
    )
    assert "What JAX stores" not in out, out
    assert "jax_persistent_cache" not in out, out
    assert out.splitlines()[-1] == "{}", out
    assert "jax is not installed in this environment" in out, out


def test_compiling_ahead_is_said_with_its_bounds_and_counts() -> None:
    """Compiling ahead: its state, threads and the memory it leaves free; a JAX whose compile
    function is not one it knows says so; what it did, across processes."""
    out = _python(
        """
        from xla_pcache.cli import _doctor as doctor
        ahead = {"state": "on", "threads": 3, "memory_kept_free": 8 << 30}
        report = {
            "cache": {"prefetch": {"compiled": 7, "compiled_used": 5, "modules_refused": 1}},
            "frameworks": {"jax": {"prefetch": "ok", "compile_ahead": "backend_x() is new"}},
            "prefetch": {
                "state": "on", "threads": 2, "memory": 1 << 30, "name": None,
                "compile_ahead": ahead,
            },
        }
        doctor._render_prefetch(doctor._console(), report)
        """
    )
    (line,) = [line for line in out.splitlines() if line.startswith("Compiling ahead")]
    assert "on, in a compiler process of 3 threads (CPU and TPU programs)" in line, out
    assert "8.0G of memory" in line, out
    assert "off in this JAX: backend_x() is new" in line, out
    assert "compiled ahead 7, used 5, module records refused 1" in out, out


def test_the_jobs_memory_is_said_with_the_limit_found_and_the_reserve() -> None:
    """Under compiling ahead: the cgroup limit of least room (version, path, limit, use,
    the file it is from) and the memory kept free with where that comes from; without a
    limit, the host's."""
    out = _python(
        """
        from xla_pcache.cli import _doctor as doctor
        v1 = {"version": 1, "cgroup": "/slurm/job_7", "source": "memory.limit_in_bytes",
              "directory": "/sys/fs/cgroup/memory/slurm/job_7", "limit": 900 << 20,
              "use": 300 << 20, "room": 600 << 20}
        v2 = dict(v1, version=2, cgroup="/", limit=4 << 30, room=3 << 30)
        for tightest, limits in ((0, [v1, v2]), (None, [])):
            job = {"host_total": 16 << 30, "host_available": 12 << 30, "limits": limits,
                   "tightest": tightest}
            ahead = {"state": "on", "threads": 3, "memory_kept_free": 225 << 20,
                     "memory_kept_free_from": "a quarter of the job's memory"}
            report = {
                "cache": {}, "frameworks": {"jax": {"prefetch": "ok", "compile_ahead": "ok"}},
                "prefetch": {"state": "on", "threads": 2, "memory": 225 << 20, "name": None,
                             "compile_ahead": ahead, "job_memory": job},
            }
            doctor._render_prefetch(doctor._console(), report)
        """
    )
    limited, host = [line for line in out.splitlines() if "the job's memory:" in line]
    assert "cgroup v1 /slurm/job_7 limits it to 900.0M (300.0M used;" in limited, out
    assert "memory.limit_in_bytes in /sys/fs/cgroup/memory/slurm/job_7" in limited, out
    assert "225.0M kept free (a quarter of the job's memory)" in limited, out
    assert "no cgroup limit found: host 16.0G, 12.0G available" in host, out
    assert "up to 225.0M loaded" in out, out
