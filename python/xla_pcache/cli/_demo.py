"""``xla-pcache demo``: compile a real JAX model twice, in two fresh processes.

The first process compiles a small transformer's train step (seconds on CPU) and stores the
executable; the second, a new process as after a restart, loads it from the cache. The
program's name carries a fresh nonce, so the first run is cold even in a cache that
already holds earlier demos' entries.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xla_pcache._text import raw_stream, shown
from xla_pcache.metrics import human_duration
from xla_pcache.sizes import format_size

__all__ = ["build_model", "main"]

# JAX keys start with the module name: "jit_" + the function's name.
DEMO_PREFIX = "xla_pcache_demo_"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_CHILD_TIMEOUT_S = 600

# The model: a small decoder-only transformer (causal self-attention and a GELU MLP per
# layer, pre-layer-norm) learning next-token prediction, trained with Adam, several steps per
# call in a lax.scan. About 2 s to compile on a quiet 2-core machine, while loading it from
# the cache takes about a tenth of that. (A plain MLP big enough to take seconds loads
# slowly too: on CPU an executable's load time grows with its code size, and an MLP's
# compile time does not grow much faster.)
_LAYERS = 4
_WIDTH = 128
_HEADS = 4
_VOCAB = 256
_SEQ = 32
_BATCH = 4
_STEPS_PER_CALL = 8


def build_model(name: str) -> tuple[Any, tuple[Any, ...]]:
    """The demo's jitted train step, named ``name``, and its arguments (imports jax).

    Parameters and data come from numpy, not jax.random, so the train step is the only
    program compiled.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)

    def dense(n_in: int, n_out: int) -> Any:
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    params = {
        "embed": dense(_VOCAB, _WIDTH),
        "pos": dense(_SEQ, _WIDTH),
        "layers": [
            {
                "qkv": dense(_WIDTH, 3 * _WIDTH),
                "out": dense(_WIDTH, _WIDTH),
                "up": dense(_WIDTH, 4 * _WIDTH),
                "down": dense(4 * _WIDTH, _WIDTH),
            }
            for _ in range(_LAYERS)
        ],
    }
    zeros = jax.tree.map(np.zeros_like, params)
    state = (params, zeros, zeros, np.float32(0))
    tokens = rng.integers(0, _VOCAB, size=(_BATCH, _SEQ + 1)).astype(np.int32)
    causal = np.tril(np.ones((_SEQ, _SEQ), dtype=bool))

    def norm(h: Any) -> Any:
        mu = h.mean(-1, keepdims=True)
        return (h - mu) * jax.lax.rsqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    def attention(layer: Any, h: Any) -> Any:
        q, k, v = jnp.split(norm(h) @ layer["qkv"], 3, axis=-1)

        def heads(t: Any) -> Any:
            return t.reshape(_BATCH, _SEQ, _HEADS, -1)

        scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / np.sqrt(_WIDTH // _HEADS)
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, heads(v)).reshape(h.shape)
        return mixed @ layer["out"]

    def loss(params: Any, tokens: Any) -> Any:
        h = params["embed"][tokens[:, :-1]] + params["pos"]
        for layer in params["layers"]:
            h = h + attention(layer, h)
            h = h + jax.nn.gelu(norm(h) @ layer["up"]) @ layer["down"]
        logp = jax.nn.log_softmax(norm(h) @ params["embed"].T)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    def adam(p: Any, m: Any, v: Any, t: Any) -> Any:
        return p - 1e-3 * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8)

    def one_step(state: Any, tokens: Any) -> Any:
        params, m, v, t = state
        value, grads = jax.value_and_grad(loss)(params, tokens)
        t = t + 1
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        params = jax.tree.map(lambda p, m, v: adam(p, m, v, t), params, m, v)
        return (params, m, v, t), value

    def train_step(state: Any, tokens: Any) -> Any:
        state, values = jax.lax.scan(
            lambda s, _: one_step(s, tokens), state, None, length=_STEPS_PER_CALL
        )
        return state, values[-1]

    train_step.__name__ = train_step.__qualname__ = name
    return jax.jit(train_step), (state, tokens)


def _child(path: str, nonce: str) -> int:
    """One demo process: install the cache, compile the train step, report JSON."""
    started = time.perf_counter()
    import jax

    import xla_pcache.jax as xj

    import_s = time.perf_counter() - started
    events: list[str] = []
    jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
    # What is cached is left to the adapter's default (every program), as for a user.
    xj.install(path, read_only=False)

    step, args = build_model(DEMO_PREFIX + nonce)
    t0 = time.perf_counter()
    lowered = step.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    _, value = compiled(*args)
    report = {
        "import_s": import_s,
        "lower_s": t1 - t0,
        "compile_s": t2 - t1,
        "hit": events.count(_HIT_EVENT) > 0,
        "loss": float(value),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        # What this process's hits saved, as the cache counts it (the compile time the
        # cold run recorded in the entry).
        "saved_s": _saved_seconds(xj.installed_store()),
        # The loading-ahead plan the demo's processes share (docs/jax.md), removed with
        # the demo's entries.
        "plan_key": (xj.prefetch_report() or {}).get("plan_key"),
    }
    print(json.dumps(report))
    return 0


def _saved_seconds(store: Any) -> float:
    return 0.0 if store is None else store.process_stats().get("compile_saved_ms", 0) / 1000


def _run_child(path: str, nonce: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "xla_pcache.cli._demo", "--child", path, nonce],
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the demo process failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"the demo process printed no report:\n{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def _resolve_path(path: str | None) -> str:
    from xla_pcache.cache_path import route
    from xla_pcache.config import Settings

    settings = Settings.from_env()
    # A directory made absolute; a bucket's URL as it is (never a directory named after it).
    where = route(path or settings.path or settings.default_cache_path())
    if where.read_only:
        # The demo's point is a cold process writing and a warm one reading it back.
        raise ValueError("the demo writes to the cache: give it a path without ?ro=1")
    return where.path


def _remove_demo_entries(path: str, nonce: str, plans: set[str]) -> tuple[int, int]:
    """Removes the demo's executables (with their module records) and its processes' plans:
    how many executables and plans."""
    from xla_pcache.cache_path import open_store
    from xla_pcache.jax.ahead._record import record_key

    program = f"jit_{DEMO_PREFIX}{nonce}"
    with open_store(path) as store:
        every = store.keys()  # a list, not a dict view
        mine = [k for k in every if str(k).startswith(program)]
        for k in every:
            if str(k).startswith(record_key(program)):
                store.delete(k)
        return sum(1 for k in mine if store.delete(k)), sum(1 for k in plans if store.delete(k))


# The closing summary's fixed part; other counters show only when not zero.
_SUMMARY = ("hits", "misses", "puts", "entries", "bytes", "max_size", "filesystem")
# Sizes and times of the work itself, not news: left out of the summary's second part.
_SUMMARY_LEFT_OUT = ("bytes_read", "bytes_written", "compile_saved_ms", "processes")


def main(path: str | None = None, keep: bool = False) -> int:
    """Run the demo against the cache at ``path`` (default: ``XLA_PERSISTENT_CACHE_PATH``,
    else the user's cache directory). Without ``keep`` the demo's entries are removed
    afterwards. Returns 0 when the second process hit the cache, 1 otherwise."""
    # Rich's colours go to the stream under the CLI's escaping one; the texts it is given
    # that come from outside (the path, an error) are escaped with shown() as well.
    console = Console(file=raw_stream(sys.stdout))
    if importlib.util.find_spec("jax") is None:
        console.print(
            "[red]The demo needs JAX.[/] Install it with: [bold]pip install 'xla-pcache\\[jax]'[/]"
        )
        return 1
    from xla_pcache.cache_path import open_store

    root = _resolve_path(path)
    nonce = secrets.token_hex(4)
    console.print(f"Cache: [bold]{escape(shown(root))}[/]")
    console.print(
        f"Model: {_LAYERS}-layer transformer (width {_WIDTH}), next-token loss, Adam, "
        f"{_STEPS_PER_CALL} steps per call; each run is a fresh Python process"
    )
    reports: list[dict[str, Any]] = []
    try:
        for label in ("cold", "warm"):
            with console.status(f"{label} run: starting Python, importing JAX, compiling..."):
                reports.append(_run_child(root, nonce))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        console.print(f"[red]demo failed:[/] {escape(shown(exc))}")
        return 1

    cold, warm = reports
    table = Table(title="xla-pcache demo")
    for column in ("run", "cache", "lower (s)", "compile (s)", "loss"):
        table.add_column(column, justify="right" if "(" in column else "left")
    for label, r in (("cold", cold), ("warm", warm)):
        table.add_row(
            label,
            "[green]hit[/]" if r["hit"] else "miss",
            f"{r['lower_s']:.2f}",
            f"{r['compile_s']:.2f}",
            f"{r['loss']:.6f}",
        )
    console.print(table)
    speedup = cold["compile_s"] / max(warm["compile_s"], 1e-9)
    console.print(
        f"Compile: cold {cold['compile_s']:.2f} s, warm {warm['compile_s']:.2f} s, "
        f"[bold]{speedup:.1f}x[/] faster (jax {cold['jax']}, {cold['backend']})"
    )

    with open_store(root, read_only=True) as store:
        stats = store.stats()
    console.print(
        f"Compile time saved: {human_duration(float(warm.get('saved_s', 0.0)))} by the warm "
        f"run, {human_duration(stats['compile_saved_ms'] / 1000)} by this "
        "cache in all"
    )
    # One line: what the demo is about, then any other counter that is not zero (trouble
    # shows; the many zeros do not). `xla-pcache stats` has them all.
    listed: dict[str, object] = {k: stats.get(k) for k in _SUMMARY}
    listed["bytes"] = format_size(int(stats["bytes"]))
    if stats["max_size"] is not None:
        listed["max_size"] = format_size(int(stats["max_size"]))
    listed |= {
        k: v
        for k, v in stats.items()
        if k not in listed
        and k not in _SUMMARY_LEFT_OUT
        and isinstance(v, int)
        and not isinstance(v, bool)
        and v
    }
    console.print("Cache stats: " + ", ".join(f"{k}={v}" for k, v in listed.items()), markup=False)
    if not keep:
        plans = {str(r["plan_key"]) for r in reports if r.get("plan_key")}
        removed, planned = _remove_demo_entries(root, nonce, plans)
        noun = "entry" if removed == 1 else "entries"
        also = " and its loading-ahead plan" if planned else ""
        console.print(f"Removed the demo's {removed} {noun}{also} (--keep keeps them).")

    ok = bool(warm["hit"]) and not cold["hit"] and warm["loss"] == cold["loss"]
    if not ok:
        console.print(
            "[red]The warm run did not load the executable from the cache.[/] "
            "Run `xla-pcache doctor` to check the backend."
        )
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2], sys.argv[3]))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
