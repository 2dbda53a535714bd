"""Warm start of multi-program JAX workloads: xla_pcache loading ahead, xla_pcache reading as
JAX asks (plain), JAX's own cache, and a cold start, side by side in fresh processes.

    python bench/warm_start.py                           # CPU: every scenario, small sizes
    python bench/warm_start.py --scenario lm --quick     # one scenario, 2 repeats
    python bench/warm_start.py --scenario lm --size 300m --repeats 3 --out DIR   # a TPU run
    python bench/warm_start.py --scenario removed --repeats 3   # the start after eviction
    python bench/warm_start.py --scenario planted --repeats 3   # a planted heavy record

Scenarios (``--scenario``, default ``all``):

- ``lm``: one program, a transformer language model in plain JAX (``workload``): embedding,
  ``layers`` blocks of attention and MLP, Adam, with a jitted training step, a jitted
  evaluation and a jitted greedy next-token step at each of four sequence lengths, after
  eager parameter and optimizer initialisation: a few dozen executables, most of them small,
  the training steps large. ``--size small`` is for CPUs; ``--size 300m`` (d_model 2048, 5
  layers, vocabulary 32,768: about 319 M parameters) for an accelerator. Layers are a Python
  loop (unrolled in the program); with ``--scan`` they go through ``lax.scan``.
- ``alternating``: two programs behind one script, with the same command line, the program
  chosen by a variable (``BENCH_PROGRAM``), as many training scripts choose a configuration:
  A is the LM above, B the same model narrower (d_model three quarters, so every program
  but the tiniest differs). Each warm row runs A then B, ``--repeats`` times.
- ``suite``: a test suite of many small programs (``--suite-files`` files of 6 tests, each
  test jitting programs of its own shapes), run by ``python -m pytest`` in its directory.
  Its measure is the whole run.
- ``removed``: the LM's start after the store's executables are removed (as a budget's
  eviction or a prune would), its plan and module records kept: after the cold process,
  each process starts from its own copy of that store (a run puts its executables back), in
  rows of its own (``REMOVED``): compiling ahead off (``XLA_PCACHE_COMPILE_AHEAD=0``: each
  program compiled when the run reaches it, as in a cold start), compiling ahead on (as
  installed: the plan's programs compiled from their records in a compiler process started
  when the plan is read, each served at JAX's read of it), and JAX's own cache, empty (JAX's
  cold start). The ratios are of the first steps, to the start with compiling ahead off.
- ``planted``: the LM's warm start when a writer of the cache without a key planted a heavy
  program (``--heavy-ops`` operations in one chain: seconds of XLA's compile) first in the
  plan, under a made-up key and under its own key with its executable removed, against the
  same store unplanted; a writer and a read-only worker. Its measure is each process's exit
  after its work (the time from the program's last step to the process's end).

Each row is a fresh process configured by the environment alone, as a user would; the
command line is the same in every row (what a process is to do comes in ``BENCH_SPEC``):

- ``cold``: an empty xla_pcache store; it fills the store (and its plan) for the warm rows;
- ``jax``: JAX's own cache (``JAX_COMPILATION_CACHE_DIR``, every program cached, no side
  caches so that its keys are xla_pcache's), with ``XLA_PCACHE_DISABLE=1``; its directory
  holds the very entries the cold processes put in the store, copied as JAX names them
  (``<key>-cache``), so both caches serve the same bytes and no second cold compile is paid;
- ``plain``: that store with ``XLA_PCACHE_PREFETCH=0``: each read on the main thread when
  JAX asks;
- ``prefetch``: that store as installed (loading ahead on).

The warm rows run round-robin, so a change in the machine's load falls on each alike. Per
LM process: the first steps (from the backend's being up, model initialisation included,
until the first training step, evaluation and greedy step at every length are done; the
ratios are of these), the backend's start before them (``jax.devices()`` first: seconds on
a TPU, the same in every row), the same from the process's start, the process wall time,
its CPU time, JAX's own hit events and the time its cache reads took on the main thread
(its ``cache_retrieval_time_sec`` events), split for the rows that read on the main thread
into the cache's get and JAX's decompression; with loading ahead, what it loaded, used and
wasted, the plans it wrote, and the main-thread time it counted saved (``prefetch_saved_ms``)
beside the time measured (plain's reads on the main thread less loading ahead's) and the
loads' wall time on the workers less the waits (what the counter said before this release).
Medians, and the ratios of the warm rows to JAX's own cache and to plain. Every row must
compute the same results. Results (JSON) and the tables (markdown) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import cpu_model, fmt_time, loadavg, versions  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    "small": {
        "d_model": 128,
        "layers": 4,
        "heads": 4,
        "vocab": 2048,
        "batch": 4,
        "seqs": [32, 64, 128, 256],
    },
    "300m": {
        "d_model": 2048,
        "layers": 5,
        "heads": 16,
        "vocab": 32768,
        "batch": 2,
        "seqs": [64, 128, 256, 512],
    },
}
CASES = {
    "cold": "cold (empty store)",
    "jax": "JAX's own cache",
    "plain": "xla_pcache, reads as JAX asks",
    "prefetch": "xla_pcache, loading ahead",
}
WARM = ("jax", "plain", "prefetch")
# The warm start with a planted heavy record (``--scenario planted``).
PLANTED = {
    "clean": "as stored, nothing planted",
    "planted": "planted, a writer",
    "planted_ro": "planted, a read-only worker",
}
# The start after the entries are removed (``--scenario removed``).
REMOVED = {
    "removed": "entries removed, compiling ahead off",
    "ahead": "entries removed, compiling ahead",
    "jax_cold": "JAX's own cache, empty (cold)",
}
RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
HIT = "/jax/compilation_cache/cache_hits"
MISS = "/jax/compilation_cache/cache_misses"


# ----------------------------------------------------------------------- the workload


def workload(cfg: dict[str, Any], spawned: float) -> dict[str, Any]:
    """One process's run: the model's first steps, timed. Knows nothing of any cache."""
    import numpy as np

    t_import = time.perf_counter()
    import jax
    import jax.numpy as jnp
    from jax._src import compilation_cache

    cc: Any = compilation_cache
    import_s = time.perf_counter() - t_import
    events: list[str] = []
    reads: list[float] = []
    # Every duration JAX reports (tracing, lowering, cache reads, compiles), with when it
    # ended and on which thread: the phases of a start, summed per event, and its timeline.
    timeline: list[tuple[float, str, float, bool]] = []
    main_thread = threading.main_thread()

    def _duration(event: str, duration_secs: float, **_: Any) -> None:
        if event == RETRIEVAL:
            reads.append(duration_secs)
        timeline.append(
            (time.perf_counter(), event, duration_secs, threading.current_thread() is main_thread)
        )

    jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
    jax.monitoring.register_event_duration_secs_listener(_duration)
    split: dict[str, float] = {"get_s": 0.0, "decompress_s": 0.0}
    read_keys: dict[str, list[float]] = {}
    if cfg["split_reads"]:
        # Measurement wrappers around the real functions, on the rows that read on the main
        # thread (loading ahead decompresses on its own threads).
        def timed(name: str, fn: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    split[name] += time.perf_counter() - start

            return wrapper

        cc.decompress_executable = timed("decompress_s", cc.decompress_executable)
        original_get = cc._get_cache

        def get_cache(backend: Any) -> Any:
            cache = original_get(backend)
            base: Any = getattr(cache, "_base_cache", cache)
            if base is not None and not getattr(base, "_timed", False):
                base.get = timed("get_s", base.get)
                base._timed = True
            return cache

        cc._get_cache = get_cache

        time_reads(cc, read_keys)

    d, n_layers, heads = cfg["d_model"], cfg["layers"], cfg["heads"]
    vocab, batch = cfg["vocab"], cfg["batch"]
    # The backend is brought up first, on its own clock: no cache does anything before it
    # exists (on a TPU it is seconds, the same in every row), and the first steps are the
    # program's work from there, as a warm start's first calls are measured.
    t_backend = time.perf_counter()
    jax.devices()
    backend_s = time.perf_counter() - t_backend
    t_first = time.perf_counter()

    # Eager initialisation, as most programs do it: one small program per shape.
    key = jax.random.PRNGKey(0)
    keys = jax.random.split(key, 2 + 4 * n_layers)

    def dense(k: Any, shape: tuple[int, int]) -> Any:
        return jax.random.normal(k, shape, jnp.float32) * (shape[0] ** -0.5)

    if cfg.get("scan"):
        # The layers' parameters stacked, one array per kind, for lax.scan.
        n = n_layers

        def stacked(k: Any, shape: tuple[int, int]) -> Any:
            return jax.random.normal(k, (n, *shape), jnp.float32) * (shape[0] ** -0.5)

        layers: Any = {
            "ln1": jnp.ones((n, d), jnp.float32),
            "qkv": stacked(keys[2], (d, 3 * d)),
            "out": stacked(keys[3], (d, d)),
            "ln2": jnp.ones((n, d), jnp.float32),
            "up": stacked(keys[4], (d, 4 * d)),
            "down": stacked(keys[5], (4 * d, d)),
        }
    else:
        layers = [
            {
                "ln1": jnp.ones((d,), jnp.float32),
                "qkv": dense(keys[2 + 4 * i], (d, 3 * d)),
                "out": dense(keys[3 + 4 * i], (d, d)),
                "ln2": jnp.ones((d,), jnp.float32),
                "up": dense(keys[4 + 4 * i], (d, 4 * d)),
                "down": dense(keys[5 + 4 * i], (4 * d, d)),
            }
            for i in range(n_layers)
        ]
    params: dict[str, Any] = {
        "embed": dense(keys[0], (vocab, d)),
        "ln_f": jnp.ones((d,), jnp.float32),
        "layers": layers,
    }
    opt = {
        "m": jax.tree_util.tree_map(jnp.zeros_like, params),
        "v": jax.tree_util.tree_map(jnp.zeros_like, params),
        "t": jnp.zeros((), jnp.float32),
    }

    def norm(x: Any, g: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

    def block(x: Any, layer: Any, mask: Any) -> Any:
        length = x.shape[1]
        h = norm(x, layer["ln1"])
        q, k, v = jnp.split(h @ layer["qkv"], 3, axis=-1)
        q, k, v = (t.reshape(batch, length, heads, d // heads) for t in (q, k, v))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads)
        att = jax.nn.softmax(jnp.where(mask, att, -1e9), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(batch, length, d) @ layer["out"]
        return x + jax.nn.gelu(norm(x, layer["ln2"]) @ layer["up"]) @ layer["down"]

    def logits(p: Any, tokens: Any) -> Any:
        length = tokens.shape[1]
        x = p["embed"][tokens]
        mask = jnp.tril(jnp.ones((length, length), bool))
        if cfg.get("scan"):
            x, _ = jax.lax.scan(lambda x, layer: (block(x, layer, mask), None), x, p["layers"])
        else:
            for layer in p["layers"]:
                x = block(x, layer, mask)
        return norm(x, p["ln_f"]) @ p["embed"].T

    def loss_fn(p: Any, tokens: Any) -> Any:
        out = logits(p, tokens[:, :-1])
        target = tokens[:, 1:]
        logp = jax.nn.log_softmax(out, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, target[..., None], axis=-1))

    def train_step(p: Any, o: Any, tokens: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens)
        t = o["t"] + 1
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, o["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, o["v"], grads)
        scale = 1e-3 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        p = jax.tree_util.tree_map(lambda w, m, v: w - scale * m / (jnp.sqrt(v) + 1e-8), p, m, v)
        return p, {"m": m, "v": v, "t": t}, loss

    train = jax.jit(train_step, donate_argnums=(0, 1))
    evaluate = jax.jit(loss_fn)
    greedy = jax.jit(lambda p, tokens: jnp.argmax(logits(p, tokens)[:, -1], axis=-1))

    rng = np.random.default_rng(0)
    losses: list[float] = []
    for length in cfg["seqs"]:
        tokens = rng.integers(0, vocab, (batch, length + 1), dtype=np.int32)
        params, opt, loss = train(params, opt, tokens)
        losses.append(float(loss))
        losses.append(float(evaluate(params, tokens)))
        losses.append(float(jnp.sum(greedy(params, tokens[:, :length]))))
    ready = time.time() - spawned
    first_calls_s = time.perf_counter() - t_first
    out: dict[str, Any] = {
        "ready_s": ready,
        "first_calls_s": first_calls_s,
        "import_s": import_s,
        "backend_s": backend_s,
        "hits": events.count(HIT),
        "misses": events.count(MISS),
        "reads_s": sum(reads),
        "losses": losses,
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "phases": phase_sums(timeline, t_first),
        "timeline": [
            (round(t - t_first, 4), e, round(d, 4), on_main) for t, e, d, on_main in timeline
        ],
        **(split if cfg["split_reads"] else {}),
        **({"read_keys": read_keys} if cfg["split_reads"] else {}),
    }
    if os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
        import xla_pcache.jax as xj

        report = xj.prefetch_report(loads=True)
        if report is not None:
            out["prefetch"] = prefetch_fields(report)
    # When the program's work ended: what the process takes after it is its exit.
    out["ended"] = time.time()
    return out


def time_reads(cc: Any, into: dict[str, list[float]]) -> None:
    """Each key's read on the main thread (JAX's ``get_executable_and_time``, wrapped), into
    ``into``: its wall time and the process's CPU time meanwhile (XLA's threads deserialize
    while the main thread waits; on a busy machine the wall time also counts waiting for the
    cores), to set beside what loading ahead counted for it."""
    real_read = cc.get_executable_and_time

    def read_timed(*args: Any, **kwargs: Any) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return real_read(*args, **kwargs)
        finally:
            key = args[0] if args else kwargs.get("cache_key")
            wall = time.perf_counter() - start
            into[str(key)] = [round(wall, 6), round(time.process_time() - cpu, 6)]

    cc.get_executable_and_time = read_timed


def phase_sums(timeline: list[tuple[float, str, float, bool]], t_first: float) -> dict[str, float]:
    """Each of JAX's duration events summed over the first steps (from ``t_first``), by its
    last path component; ``_main`` for the part on the main thread."""
    sums: dict[str, float] = {}
    for t, event, duration, on_main in timeline:
        if t < t_first:
            continue
        name = event.rsplit("/", 1)[-1]
        sums[name] = round(sums.get(name, 0.0) + duration, 4)
        if on_main:
            sums[name + "_main"] = round(sums.get(name + "_main", 0.0) + duration, 4)
    return sums


def prefetch_fields(report: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of ``xla_pcache.jax.prefetch_report()``."""
    keys = ("began", "waited", "waited_s", "longest_wait", "last_load_s", "saved_s")
    keys += ("load_cpu_s", "load_wall_s", "variants", "candidates", "compile_ahead")
    keys += ("served_s", "main_reads", "main_reads_s", "loads")
    return {
        "states": report["states"],
        **{k: report.get(k) for k in keys},
        **report.get("counters", {}),
    }


# ----------------------------------------------------------------------- a test suite

# The suite's conftest: JAX's events counted over the whole run, written at its end with what
# loading ahead did, to the file BENCH_REPORT names. Knows nothing of the cache otherwise.
SUITE_CONFTEST = """
import json, os, threading, time
import jax

EVENTS = {"hits": 0, "misses": 0, "reads_s": 0.0}
START = time.perf_counter()
# Each of JAX's duration events summed over the run (by its last path component; "_main":
# the part on the main thread), and, in the rows reading on the main thread, each key's read.
PHASES = {}
READ_KEYS = {}
MAIN = threading.main_thread()
if os.environ.get("BENCH_SPLIT") == "1":
    import sys
    from jax._src import compilation_cache
    sys.path.insert(0, os.environ["BENCH_ROOT"])
    from bench.warm_start import time_reads
    time_reads(compilation_cache, READ_KEYS)

def _event(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
        EVENTS["hits"] += 1
    elif event == "/jax/compilation_cache/cache_misses":
        EVENTS["misses"] += 1

def _duration(event, duration_secs, **_):
    if event == "/jax/compilation_cache/cache_retrieval_time_sec":
        EVENTS["reads_s"] += duration_secs
    name = event.rsplit("/", 1)[-1]
    PHASES[name] = PHASES.get(name, 0.0) + duration_secs
    if threading.current_thread() is MAIN:
        PHASES[name + "_main"] = PHASES.get(name + "_main", 0.0) + duration_secs

jax.monitoring.register_event_listener(_event)
jax.monitoring.register_event_duration_secs_listener(_duration)

def pytest_sessionfinish(session, exitstatus):
    out = dict(EVENTS, run_s=time.perf_counter() - START, failed=session.testsfailed)
    # The table names the platform the suite ran on, as the LM's rows do.
    out.update(backend=jax.default_backend(), devices=len(jax.devices()))
    out["results"] = RESULTS
    out["threads_cpu_s"] = _threads_cpu()
    out["phases"] = {k: round(v, 4) for k, v in PHASES.items()}
    if READ_KEYS:
        out["read_keys"] = READ_KEYS
    if os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
        import xla_pcache.jax as xj
        report = xj.prefetch_report(loads=True)
        if report is not None:
            out["prefetch"] = report
    with open(os.environ["BENCH_REPORT"], "w") as f:
        json.dump(out, f)

RESULTS = {}

def _threads_cpu():
    # Each thread's CPU time by name (Python's names where it has them, else the kernel's,
    # digits dropped), to see where a row's extra CPU went.
    import collections, glob, threading
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    per = collections.Counter()
    for path in glob.glob("/proc/self/task/*/stat"):
        try:
            text = open(path).read()
        except OSError:
            continue
        tid = int(path.split("/")[4])
        name = names.get(tid) or text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        per[name.rstrip("0123456789-_")] += (int(fields[11]) + int(fields[12])) / tick
    return {k: round(v, 2) for k, v in per.most_common() if v >= 0.05}
"""

# One file of the suite: six tests, each jitting programs of its own shapes (a file's index
# in every shape, so no two files share a program).
SUITE_FILE = """
import jax, jax.numpy as jnp
import numpy as np
import conftest

N = {n}

def _record(name, value):
    conftest.RESULTS[f"{{__name__}}.{{name}}"] = float(np.asarray(value).sum())

def test_elementwise():
    x = jnp.linspace(0, 1, N + 3)
    _record("elementwise", jax.jit(lambda a: jnp.tanh(a) * jnp.cos(a) + a ** 2)(x))

def test_matmul():
    x = jnp.ones((N + 2, 8), jnp.float32)
    _record("matmul", jax.jit(lambda a: jax.nn.relu(a @ a.T).sum(axis=0))(x))

def test_grad():
    w = jnp.full((N + 4,), 0.5)
    loss = lambda w: jnp.sum(jnp.sin(w) ** 2)
    _record("grad", jax.jit(jax.grad(loss))(w))

def test_vmap():
    x = jnp.arange((N + 1) * 4, dtype=jnp.float32).reshape(N + 1, 4)
    _record("vmap", jax.jit(jax.vmap(lambda r: jnp.dot(r, r)))(x))

def test_scan():
    x = jnp.arange(N + 5, dtype=jnp.float32)
    step = lambda c, v: (c * 0.9 + v, c)
    _record("scan", jax.jit(lambda xs: jax.lax.scan(step, 0.0, xs)[0])(x))

def test_softmax():
    x = jnp.linspace(-2, 2, 3 * (N + 2)).reshape(3, N + 2)
    _record("softmax", jax.jit(lambda a: jax.nn.log_softmax(a, axis=-1))(x))
"""


def make_suite(root: Path, files: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "conftest.py").write_text(SUITE_CONFTEST)
    for i in range(files):
        (root / f"test_part_{i:03d}.py").write_text(SUITE_FILE.format(n=i))


# ----------------------------------------------------------------------- the processes


def _env(
    case: str, store: Path, jax_dir: Path, spec: dict[str, Any] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_P", "BENCH_"))}
    # As installed packages run: from bytecode (pip compiles it at install; the cold row
    # writes it for a source checkout). Without it every process compiles xla_pcache's
    # modules again, about 55 ms on this bench's CPU, while JAX's come compiled from its wheel.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if "JAX_PLATFORMS" in os.environ:
        env["JAX_PLATFORMS"] = os.environ["JAX_PLATFORMS"]
    if spec is not None:
        env["BENCH_SPEC"] = json.dumps(spec)
    if case in ("jax", "jax_cold"):
        env.update(
            XLA_PCACHE_DISABLE="1",
            JAX_COMPILATION_CACHE_DIR=str(jax_dir),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
            JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none",
        )
    else:
        env["XLA_PERSISTENT_CACHE_PATH"] = str(store)
        if case == "plain":
            env["XLA_PCACHE_PREFETCH"] = "0"
        if case == "removed":
            env["XLA_PCACHE_COMPILE_AHEAD"] = "0"
        # Loading and compiling ahead as this shell sets them, else their defaults.
        for name in (
            "XLA_PCACHE_PREFETCH_THREADS",
            "XLA_PCACHE_PREFETCH_LOADS",
            "XLA_PCACHE_PREFETCH_MEMORY",
            "XLA_PCACHE_COMPILE_AHEAD_THREADS",
            "XLA_PCACHE_COMPILE_AHEAD_MEMORY",
        ):
            if name in os.environ:
                env[name] = os.environ[name]
    return env


def _process(
    case: str, argv: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Runs one process: it, its wall time and its CPU time (every thread's)."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{case} process failed ({proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


def run_lm(
    case: str, cfg: dict[str, Any], store: Path, jax_dir: Path, timeout: float, **env_extra: str
) -> dict[str, Any]:
    """One LM process. The command line is the same for every row and program."""
    spec = {**cfg, "split_reads": case in ("jax", "plain"), "spawned": time.time()}
    env = {**_env(case, store, jax_dir, spec), **env_extra}
    proc, wall, cpu = _process(case, [sys.executable, __file__, "--worker"], env, timeout)
    exited = time.time()
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(wall_s=wall, cpu_s=cpu, case=case, **env_extra)
    result["exit_s"] = max(0.0, exited - result.get("ended", exited))
    return result


def run_suite(case: str, suite: Path, store: Path, jax_dir: Path, timeout: float) -> dict[str, Any]:
    """The test suite in one process: ``python -m pytest`` in its directory."""
    report = suite.parent / "suite-report.json"
    report.unlink(missing_ok=True)
    env = {**_env(case, store, jax_dir), "BENCH_REPORT": str(report)}
    if case in ("jax", "plain"):
        env.update(BENCH_SPLIT="1", BENCH_ROOT=str(ROOT))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    proc, wall, cpu = _process(case, argv, env, timeout, cwd=suite)
    result: dict[str, Any] = json.loads(report.read_text())
    if result.get("failed"):
        raise RuntimeError(f"{case}: the suite failed:\n{proc.stdout[-3000:]}")
    if "prefetch" in result:
        result["prefetch"] = prefetch_fields(result["prefetch"])
    result.update(wall_s=wall, cpu_s=cpu, case=case)
    return result


# What any module record's key starts with (this release's and the one before, so that the
# bench runs against either).
RECORD_PREFIX = "xla_pcache-module-"


def _plan_module() -> Any:
    """The plan's module, where this release keeps it (``jax/ahead/``) or where the release
    before kept it, so that the bench runs against either."""
    import importlib

    try:
        return importlib.import_module("xla_pcache.jax.ahead._plan")
    except ImportError:
        return importlib.import_module("xla_pcache.jax._plan")


def _beside(key: object) -> bool:
    """Whether ``key`` is a plan's or a module record's, not an executable's."""
    return str(key).startswith((_plan_module().ANY_PREFIX, RECORD_PREFIX))


def fill_jax_dir(store: Path, jax_dir: Path) -> int:
    """JAX's own cache directory holding the store's executables, as JAX names its files
    (by JAX's key: the store's less its runtime build)."""
    from xla_pcache import Store, build_key
    from xla_pcache.config import Settings

    jax_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    with Store(store, read_only=True, settings=Settings()) as s:
        keys = s.keys()
        for key in keys:
            if not isinstance(key, str) or _beside(key):
                continue
            blob = s.get(key)
            if blob is not None:
                jax_key = build_key.split(key)[0]
                (jax_dir / f"{jax_key}-cache").write_bytes(bytes(blob))
                n += 1
    return n


def stored_executables(store: Path) -> tuple[int, int]:
    """How many executables the store holds and their payload bytes (its plan and module
    records left out)."""
    from xla_pcache import Store
    from xla_pcache.config import Settings

    with Store(store, read_only=True, settings=Settings()) as s:
        rows = [e for e in s.entries() if not _beside(e["key"])]
    return len(rows), sum(int(e["size"]) for e in rows)


def without_executables(store: Path, dst: Path) -> tuple[int, int]:
    """A copy of ``store`` at ``dst`` without its executables, as a budget's eviction or a
    prune would leave it: how many were removed, and how many module records stay."""
    from xla_pcache import Store
    from xla_pcache.config import Settings

    shutil.copytree(store, dst, symlinks=True)
    removed = records = 0
    with Store(dst, settings=Settings()) as s:
        keys = s.keys()
        for key in keys:
            if str(key).startswith(RECORD_PREFIX):
                records += 1
            elif not _beside(key) and s.delete(key):
                removed += 1
    return removed, records


# ----------------------------------------------------------------------- the report


def med(rows: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(float(r[field]) for r in rows))


def pf_med(rows: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(float(r.get("prefetch", {}).get(field) or 0) for r in rows))


def header(results: dict[str, Any]) -> str:
    return (
        f"{results['model']}; {results['executables']} executables stored "
        f"({results['stored_mb']:.1f} MB as JAX compresses them); {results['backend']} "
        f"({results['devices']} device(s)), {results['cpu']}, {results['cpus']} CPUs; "
        f"jax {results['versions'].get('jax')}; {results['repeats']} warm process(es) per row, "
        f"medians; load average {results['load_start']} at start, {results['load_end']} at end."
    )


def ahead(rows: list[dict[str, Any]]) -> str:
    """Loading ahead's used / wasted of planned (medians), and plans written (all rows)."""
    if not rows or "prefetch" not in rows[0]:
        return ""
    used, wasted = pf_med(rows, "prefetch_used"), pf_med(rows, "prefetch_wasted")
    planned = pf_med(rows, "prefetch_planned")
    written = sum(int(r.get("prefetch", {}).get("prefetch_plans_written", 0)) for r in rows)
    return f"{used:.0f} / {wasted:.0f} of {planned:.0f}; {written} written"


def saved_line(plain: list[dict[str, Any]], prefetch: list[dict[str, Any]]) -> str:
    """The main-thread time loading ahead saved: measured (JAX's own read times, loading
    ahead off less on), counted (``prefetch_saved_ms``), and what the loads' CPU and wall
    time on the workers, less the reads' own time, would have said."""
    measured = med(plain, "reads_s") - med(prefetch, "reads_s")
    counted = pf_med(prefetch, "prefetch_saved_ms") / 1000

    def less_reads(field: str) -> float:
        return statistics.median(
            float(r["prefetch"].get(field) or 0)
            - float(r["prefetch"].get("served_s", r["prefetch"].get("waited_s")) or 0)
            for r in prefetch
        )

    cpu, wall = less_reads("load_cpu_s"), less_reads("load_wall_s")
    return (
        f"Main-thread time of the reads saved by loading ahead: measured {fmt_time(measured)} "
        f"(JAX's `cache_retrieval_time_sec`, plain's less loading ahead's), counted "
        f"{fmt_time(counted)} (`prefetch_saved_ms`, {counted / measured:.2f}x); the loads' CPU "
        f"time less the reads' {fmt_time(cpu)} ({cpu / measured:.2f}x), their wall time on "
        f"the workers less the reads' {fmt_time(wall)} ({wall / measured:.2f}x)."
        + per_key(plain, prefetch)
        if measured > 0
        else f"No main-thread time measured saved; counted {fmt_time(counted)}."
    )


def per_key(plain: list[dict[str, Any]], prefetch: list[dict[str, Any]]) -> str:
    """Key by key, what loading ahead took each read to cost the main thread against what
    plain's read of the same key took there, in wall time and in the process's CPU time
    (medians over the rows): how near the counter's estimate is, and whether the small
    reads or the large ones make the difference."""
    off: dict[str, list[list[float]]] = {}
    for r in plain:
        for key, took in (r.get("read_keys") or {}).items():
            off.setdefault(key, []).append(took if isinstance(took, list) else [took, took])
    cost: dict[str, list[float]] = {}
    for r in prefetch:
        for load in r.get("prefetch", {}).get("loads") or []:
            cost.setdefault(load["key"], []).append(float(load["cost_s"]))
    keys = sorted(set(off) & set(cost))
    if not keys:
        return ""
    wall = [statistics.median(t[0] for t in off[k]) for k in keys]
    cpu = [statistics.median(t[1] for t in off[k]) for k in keys]
    counted = [statistics.median(cost[k]) for k in keys]
    # The largest tenth of the reads on their own (the training steps of the LM).
    big = sorted(range(len(keys)), key=lambda i: wall[i], reverse=True)[: max(1, len(keys) // 10)]

    def ratio(of: list[float], to: list[float], among: list[int] | range) -> str:
        return f"{sum(of[i] for i in among) / max(sum(to[i] for i in among), 1e-9):.2f}x"

    every = range(len(keys))
    return (
        f" Key by key ({len(keys)} keys), the cost counted for a read ({fmt_time(sum(counted))}) "
        f"is {ratio(counted, wall, every)} plain's read of it on the main thread "
        f"({fmt_time(sum(wall))}; the largest tenth {ratio(counted, wall, big)}) and "
        f"{ratio(counted, cpu, every)} the process's CPU time during that read "
        f"({fmt_time(sum(cpu))}; the largest tenth {ratio(counted, cpu, big)})."
    )


# JAX's duration events the phases table shows, by the last part of their names.
PHASES = {
    "jaxpr_trace_duration": "tracing",
    "jaxpr_to_mlir_module_duration": "lowering",
    "backend_compile_duration": "compile_or_get_cached",
    "cache_retrieval_time_sec": "cache reads",
}


def phase_med(rows: list[dict[str, Any]], name: str) -> float:
    return float(statistics.median(float(r.get("phases", {}).get(name, 0.0)) for r in rows))


def phases_table(rows: dict[str, list[dict[str, Any]]], what: str) -> str:
    """Where the main thread's time went, per row, from JAX's own monitoring events (summed
    over ``what``, medians): tracing, lowering (to MLIR), JAX's compile-or-read of each
    program (its cache key, the cache read and, on a miss, the compile and the put), and the
    cache reads alone: what no executable cache can take away is the first two."""
    lines = [
        f"JAX's phases over {what} (its monitoring events, summed per process, medians):",
        "",
        "| row | " + " | ".join(PHASES.values()) + " |",
        "|---|" + "---:|" * len(PHASES),
    ]
    for case, label in CASES.items():
        rs = rows.get(case) or []
        if not rs or "phases" not in rs[0]:
            continue
        cells = [fmt_time(phase_med(rs, name)) for name in PHASES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    plain, ahead = rows.get("plain") or [], rows.get("prefetch") or []
    if plain and ahead and "phases" in plain[0] and "phases" in ahead[0]:
        ratios = []
        for name in ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration"):
            off = phase_med(plain, name)
            if off > 0:
                ratios.append(f"{PHASES[name]} {phase_med(ahead, name) / off:.2f}x")
        reads = phase_med(ahead, "cache_retrieval_time_sec")
        lines += [
            "",
            f"Loading ahead against plain: {', '.join(ratios)}; the cache reads left on the "
            f"main thread {fmt_time(reads)} (plain's "
            f"{fmt_time(phase_med(plain, 'cache_retrieval_time_sec'))}).",
        ]
    return "\n".join(lines)


def table_lm(results: dict[str, Any]) -> str:
    rows: dict[str, list[dict[str, Any]]] = results["rows"]
    # The first steps from the backend's being up: the process's start (Python, importing
    # JAX, bringing the backend up) is the same in every row and is in the other columns.
    jax_steps = med(rows["jax"], "first_calls_s")
    plain_steps = med(rows["plain"], "first_calls_s")
    lines = [
        header(results),
        "",
        "| row | first steps | backend start | from the process's start | process wall | CPU time "
        "| hits / reads | reads on the main thread (get, decompress) "
        "| loaded ahead: used / wasted; plans written | first steps vs JAX's cache | vs plain |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for case, label in CASES.items():
        rs = rows[case]
        steps = med(rs, "first_calls_s")
        reads = fmt_time(med(rs, "reads_s")) if case != "cold" else "(misses)"
        if "get_s" in rs[0] and case != "cold":
            reads += f" ({fmt_time(med(rs, 'get_s'))}, {fmt_time(med(rs, 'decompress_s'))})"
        lookups = rs[0]["hits"] + rs[0]["misses"]
        lines.append(
            f"| {label} | {fmt_time(steps)} | {fmt_time(med(rs, 'backend_s'))} "
            f"| {fmt_time(med(rs, 'ready_s'))} "
            f"| {fmt_time(med(rs, 'wall_s'))} | {fmt_time(med(rs, 'cpu_s'))} "
            f"| {rs[0]['hits']} / {lookups} | {reads} "
            f"| {ahead(rs) if case == 'prefetch' else ''} "
            f"| {steps / jax_steps:.2f} | {steps / plain_steps:.2f} |"
        )
    pf_steps = med(rows["prefetch"], "first_calls_s")
    spread = [r["first_calls_s"] for r in rows["plain"]]
    lines += [
        "",
        f"Loading ahead: first steps {pf_steps / jax_steps:.2f}x JAX's own cache's (from the "
        f"process's start {med(rows['prefetch'], 'ready_s') / med(rows['jax'], 'ready_s'):.2f}x,"
        f" process wall {med(rows['prefetch'], 'wall_s') / med(rows['jax'], 'wall_s'):.2f}x), "
        f"{pf_steps / plain_steps:.2f}x plain (plain's own spread "
        f"{min(spread) / plain_steps:.2f}-{max(spread) / plain_steps:.2f}x).",
        "",
        saved_line(rows["plain"], rows["prefetch"]),
        "",
        phases_table(rows, "the first steps"),
    ]
    return "\n".join(lines)


def table_alternating(results: dict[str, Any]) -> str:
    rows: dict[str, list[dict[str, Any]]] = results["rows"]
    lines = [
        header(results),
        "",
        "| program | row | first steps | from the process's start | process wall | hits / reads "
        "| reads on the main thread | loaded ahead: used / wasted; plans written "
        "| first steps vs JAX's cache | vs plain |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for prog in ("a", "b"):
        by = {c: [r for r in rows[c] if r.get("BENCH_PROGRAM") == prog] for c in CASES}
        jax_steps = med(by["jax"], "first_calls_s")
        plain_steps = med(by["plain"], "first_calls_s")
        for case, label in CASES.items():
            rs = by[case]
            steps = med(rs, "first_calls_s")
            lookups = rs[0]["hits"] + rs[0]["misses"]
            reads = fmt_time(med(rs, "reads_s")) if case != "cold" else "(misses)"
            lines.append(
                f"| {prog.upper()} | {label} | {fmt_time(steps)} | {fmt_time(med(rs, 'ready_s'))} "
                f"| {fmt_time(med(rs, 'wall_s'))} | {rs[0]['hits']} / {lookups} | {reads} "
                f"| {ahead(rs) if case == 'prefetch' else ''} "
                f"| {steps / jax_steps:.2f} | {steps / plain_steps:.2f} |"
            )
    warm = rows["prefetch"]

    def total(rs: list[dict[str, Any]], counter: str) -> int:
        return sum(int(r.get("prefetch", {}).get(counter, 0)) for r in rs)

    lines += [
        "",
        f"Plans written by the {len(warm)} warm starts with loading ahead: "
        f"{total(warm, 'prefetch_plans_written')} (the two cold starts wrote "
        f"{total(rows['cold'], 'prefetch_plans_written')}); loaded and never used: "
        f"{total(warm, 'prefetch_wasted')}.",
        "",
        saved_line(rows["plain"], rows["prefetch"]),
    ]
    return "\n".join(lines)


def table_suite(results: dict[str, Any]) -> str:
    rows: dict[str, list[dict[str, Any]]] = results["rows"]
    jax_run = med(rows["jax"], "wall_s")
    plain_run = med(rows["plain"], "wall_s")
    lines = [
        header(results),
        "",
        "| row | suite's process wall | tests' run (import to end) | CPU time | hits / reads "
        "| reads on the main thread | loaded ahead: used / wasted; plans written "
        "| wall vs JAX's cache | vs plain |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for case, label in CASES.items():
        rs = rows[case]
        wall = med(rs, "wall_s")
        lookups = rs[0]["hits"] + rs[0]["misses"]
        reads = fmt_time(med(rs, "reads_s")) if case != "cold" else "(misses)"
        lines.append(
            f"| {label} | {fmt_time(wall)} | {fmt_time(med(rs, 'run_s'))} "
            f"| {fmt_time(med(rs, 'cpu_s'))} | {rs[0]['hits']} / {lookups} | {reads} "
            f"| {ahead(rs) if case == 'prefetch' else ''} "
            f"| {wall / jax_run:.2f} | {wall / plain_run:.2f} |"
        )
    lines += ["", saved_line(rows["plain"], rows["prefetch"])]
    lines += ["", phases_table(rows, "the whole run")]
    return "\n".join(lines)


def table_removed(results: dict[str, Any]) -> str:
    rows: dict[str, list[dict[str, Any]]] = results["rows"]
    cold = rows["cold"][0]
    # Rows left out (--removed-rows) compare with the cold process that filled the store.
    base = med(rows["removed"] or rows["cold"], "first_calls_s")
    jax = med(rows["jax_cold"] or rows["cold"], "first_calls_s")
    lines = [
        header(results),
        "",
        f"The start after the entries are removed: {results['executables_removed']} "
        f"executables deleted, the plan and {results['records']} module records kept (the "
        f"cold process that filled the store: first steps {fmt_time(cold['first_calls_s'])}).",
        "",
        "| row | first steps | from the process's start | process wall | CPU time "
        "| hits / reads | compiled ahead: used / compiled; records refused "
        "| first steps vs ahead off "
        "| vs JAX's cold |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for case, label in REMOVED.items():
        rs = rows[case]
        if not rs:
            continue
        steps = med(rs, "first_calls_s")
        used = "" if case == "jax_cold" else f"{pf_med(rs, 'prefetch_compiled_used'):.0f}"
        if used:
            used += f" / {pf_med(rs, 'prefetch_compiled'):.0f}"
            used += f"; {pf_med(rs, 'prefetch_modules_refused'):.0f}"
        lines.append(
            f"| {label} | {fmt_time(steps)} | {fmt_time(med(rs, 'ready_s'))} "
            f"| {fmt_time(med(rs, 'wall_s'))} | {fmt_time(med(rs, 'cpu_s'))} "
            f"| {rs[0]['hits']} / {rs[0]['hits'] + rs[0]['misses']} | {used} "
            f"| {steps / base:.2f} | {steps / jax:.2f} |"
        )
    steps = med(rows["ahead"], "first_calls_s")
    spread = [r["first_calls_s"] / base for r in rows["removed"] or rows["cold"]]
    lines += [
        "",
        f"Compiling ahead: first steps {steps / base:.2f}x the start with it off (whose own "
        f"spread is {min(spread):.2f}-{max(spread):.2f}x), {steps / jax:.2f}x JAX's own cold "
        "start.",
    ]
    return "\n".join(lines)


def check_removed(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    failures = []
    if any(r.get("prefetch", {}).get("prefetch_compiled_used", 0) == 0 for r in rows["ahead"]):
        failures.append("ahead: nothing compiled ahead was used")
    if any(r.get("prefetch", {}).get("prefetch_compiled", 0) for r in rows["removed"]):
        failures.append("removed: compiled ahead with compiling ahead off")
    for case in REMOVED:
        # A read served what was compiled ahead is a hit to JAX's events: those alone.
        if any(
            r["hits"] != r.get("prefetch", {}).get("prefetch_compiled_used", 0) for r in rows[case]
        ):
            failures.append(f"{case}: a process hit (its entries were to be gone)")
    return failures


def check(results: dict[str, Any], field: str) -> list[str]:
    rows = results["rows"]
    if results["scenario"] in ("removed", "planted"):
        outs = {json.dumps(r["losses"]) for rs in rows.values() for r in rs}
        same = [] if len(outs) == 1 else ["the rows computed different results"]
        return same + (check_removed(rows) if results["scenario"] == "removed" else [])
    failures = []
    if field == "results":
        outs = {json.dumps(r["results"], sort_keys=True) for rs in rows.values() for r in rs}
    else:
        outs = {
            json.dumps([r.get("BENCH_PROGRAM"), r["losses"]]) for rs in rows.values() for r in rs
        }
    if len(outs) != (2 if results["scenario"] == "alternating" else 1):
        failures.append("the rows computed different results")
    for case in WARM:
        if any(r["misses"] for r in rows[case]):
            failures.append(f"{case}: a warm process compiled")
    if any(r.get("prefetch", {}).get("prefetch_used", 0) == 0 for r in rows["prefetch"]):
        failures.append("prefetch: nothing was loaded ahead and used")
    return failures


# ----------------------------------------------------------------------- the scenarios


def _warm_rounds(repeats: int, run: Callable[[str], None]) -> None:
    for i in range(repeats):
        # Round-robin, each round in another order: no row always follows the same one.
        for case in WARM[i % 3 :] + WARM[: i % 3]:
            run(case)


def scenario_lm(a: argparse.Namespace, cfg: dict[str, Any], scratch: Path, note: Any) -> dict:
    store, jax_dir = scratch / "store", scratch / "jax"
    rows: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    rows["cold"].append(note(run_lm("cold", cfg, store, jax_dir, a.timeout)))
    fill_jax_dir(store, jax_dir)
    _warm_rounds(
        a.repeats,
        lambda case: rows[case].append(note(run_lm(case, cfg, store, jax_dir, a.timeout))),
    )
    return {"rows": rows, "store": store, "model": model_text(a, cfg)}


def scenario_alternating(
    a: argparse.Namespace, cfg: dict[str, Any], scratch: Path, note: Any
) -> dict:
    store, jax_dir = scratch / "store", scratch / "jax"
    rows: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    narrow = {**cfg, "d_model": cfg["d_model"] * 3 // 4}
    configs = {"a": cfg, "b": narrow}
    for prog in "ab":
        rows["cold"].append(
            note(run_lm("cold", configs[prog], store, jax_dir, a.timeout, BENCH_PROGRAM=prog))
        )
    fill_jax_dir(store, jax_dir)

    def both(case: str) -> None:
        for prog in "ab":
            result = run_lm(case, configs[prog], store, jax_dir, a.timeout, BENCH_PROGRAM=prog)
            rows[case].append(note(result))

    _warm_rounds(a.repeats, both)
    text = f"two programs alternating under one script: A {model_text(a, cfg)}; B the same "
    text += f"with d_model {narrow['d_model']}"
    return {"rows": rows, "store": store, "model": text}


def scenario_suite(a: argparse.Namespace, cfg: dict[str, Any], scratch: Path, note: Any) -> dict:
    store, jax_dir, suite = scratch / "store", scratch / "jax", scratch / "suite"
    make_suite(suite, a.suite_files)
    rows: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    rows["cold"].append(note(run_suite("cold", suite, store, jax_dir, a.timeout)))
    fill_jax_dir(store, jax_dir)
    _warm_rounds(
        a.repeats,
        lambda case: rows[case].append(note(run_suite(case, suite, store, jax_dir, a.timeout))),
    )
    text = f"a test suite: {a.suite_files} files of 6 tests, each jitting programs of its own "
    text += "shapes, run by `python -m pytest`"
    return {"rows": rows, "store": store, "model": text}


def scenario_removed(a: argparse.Namespace, cfg: dict[str, Any], scratch: Path, note: Any) -> dict:
    store, kept = scratch / "store", scratch / "kept"
    rows: dict[str, list[dict[str, Any]]] = {"cold": [], **{case: [] for case in REMOVED}}
    rows["cold"].append(note(run_lm("cold", cfg, store, scratch / "unused", a.timeout)))
    removed, records = without_executables(store, kept)
    order = [case for case in REMOVED if case in a.removed_rows.split(",")]
    for i in range(a.repeats):
        # Round-robin; each process from a fresh copy of the store (or an empty JAX cache).
        for case in order[i % len(order) :] + order[: i % len(order)]:
            own, jax_dir = scratch / f"{case}-{i}", scratch / f"{case}-{i}-jax"
            if case != "jax_cold":
                shutil.copytree(kept, own, symlinks=True)
            jax_dir.mkdir(parents=True)
            try:
                rows[case].append(note(run_lm(case, cfg, own, jax_dir, a.timeout)))
            finally:
                shutil.rmtree(own, ignore_errors=True)
                shutil.rmtree(jax_dir, ignore_errors=True)
    return {
        "rows": rows,
        "store": store,
        "model": model_text(a, cfg),
        "executables_removed": removed,
        "records": records,
    }


# A program of one long chain of operations (``--heavy-ops`` of them): seconds of XLA's
# compile, its record planted where a run never reads it (``planted``).
HEAVY = """
import os, sys
import jax, jax.numpy as jnp

def heavy(a):
    for i in range(int(sys.argv[1])):
        a = jnp.sin(a * 1.0001 + i) @ a
    return a

jax.jit(heavy)(jnp.ones((8, 8), jnp.float32)).block_until_ready()
"""


def plant(store: Path, heavy_ops: int, cfg: dict[str, Any], timeout: float) -> tuple[str, str]:
    """The heavy program compiled once into ``store`` (its record stays, its executable
    goes), then named first in the plan twice over, as a writer of the cache without a key
    could: under a made-up key (its record copied there) and under its own key. The two
    keys."""
    from xla_pcache import Store
    from xla_pcache.config import Settings

    _plan = _plan_module()
    with Store(store, read_only=True, settings=Settings()) as s:
        listed = s.keys()  # a list (Store is not a mapping)
        plans = [str(k) for k in listed if str(k).startswith(_plan.ANY_PREFIX)]
    env = _env("prefetch", store, store)
    _process("heavy", [sys.executable, "-c", HEAVY, str(heavy_ops)], env, timeout)
    with Store(store, settings=Settings()) as s:
        listed = s.keys()
        keys = [str(k) for k in listed]
        (record,) = [k for k in keys if k.startswith(RECORD_PREFIX) and "jit_heavy-" in k]
        prefix, _, true_key = record.partition("jit_heavy-")
        true_key = "jit_heavy-" + true_key
        fake = "jit_heavy-" + os.urandom(32).hex()
        blob = s.get(record)
        assert blob is not None
        assert s.put(prefix + fake, bytes(blob), meta={"kind": "module-record"})
        # The heavy program's own plan: its compile options and devices, as its read had them.
        (own,) = [k for k in keys if k.startswith(_plan.ANY_PREFIX) and k not in plans]
        held = s.get(own)
        assert held is not None
        variants = _plan.decode(memoryview(held)).variants
        (entry,) = [e for v in variants for e in v.entries if e.key == true_key]
        del held
        assert s.delete(own)
        for k in keys:
            if k.startswith(true_key):
                s.delete(k)  # its executable: absent, so compiled ahead
        (plan_key,) = plans
        held = s.get(plan_key)
        assert held is not None
        plan = _plan.decode(memoryview(held))
        named = tuple(_plan.Entry(k, entry.options, entry.devices) for k in (fake, true_key))
        variants = tuple(
            _plan.Variant(v.written, v.platform, v.device_count, named + v.entries)
            for v in plan.variants
        )
        assert s.replace(plan_key, _plan.encode(_plan.Plan(variants)), meta=held.meta)
    return fake, true_key


def scenario_planted(a: argparse.Namespace, cfg: dict[str, Any], scratch: Path, note: Any) -> dict:
    """The warm start of a store whose plan names first a heavy record under a made-up key
    and the same record under its own key, never read by the run (its executable absent),
    against the same store unplanted: each process's exit after its work, a writer and a
    read-only worker. Each process from a fresh copy (a writer drops what it never read)."""
    store, planted = scratch / "store", scratch / "planted"
    rows: dict[str, list[dict[str, Any]]] = {"cold": [], **{case: [] for case in PLANTED}}
    rows["cold"].append(note(run_lm("cold", cfg, store, scratch / "unused", a.timeout)))
    shutil.copytree(store, planted, symlinks=True)
    plant(planted, a.heavy_ops, cfg, a.timeout)
    order = list(PLANTED)
    for i in range(a.repeats):
        for case in order[i % len(order) :] + order[: i % len(order)]:
            own = scratch / f"{case}-{i}"
            shutil.copytree(store if case == "clean" else planted, own, symlinks=True)
            extra = {"XLA_PERSISTENT_CACHE_READ_ONLY": "1"} if case == "planted_ro" else {}
            try:
                row = run_lm("prefetch", cfg, own, scratch / "unused", a.timeout, **extra)
                row["case"] = case
                rows[case].append(note(row))
            finally:
                shutil.rmtree(own, ignore_errors=True)
    return {"rows": rows, "store": store, "model": model_text(a, cfg), "heavy": a.heavy_ops}


def table_planted(results: dict[str, Any]) -> str:
    rows: dict[str, list[dict[str, Any]]] = results["rows"]
    lines = [
        header(results),
        "",
        f"A heavy program ({results['heavy']} operations in one chain) recorded, then named "
        "first in the plan under a made-up key (its record copied there) and under its own key "
        "(its executable removed): neither ever read by the run.",
        "",
        "| row | exit after the work | process wall | first steps | CPU time "
        "| compiled ahead: used / compiled; records refused |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for case, label in PLANTED.items():
        rs = rows[case]
        counts = (
            f"{pf_med(rs, 'prefetch_compiled_used'):.0f} / {pf_med(rs, 'prefetch_compiled'):.0f}"
            f"; {pf_med(rs, 'prefetch_modules_refused'):.0f}"
        )
        lines.append(
            f"| {label} | {fmt_time(med(rs, 'exit_s'))} | {fmt_time(med(rs, 'wall_s'))} "
            f"| {fmt_time(med(rs, 'first_calls_s'))} | {fmt_time(med(rs, 'cpu_s'))} | {counts} |"
        )
    worst = max(r["exit_s"] for case in PLANTED for r in rows[case])
    lines += ["", f"The longest exit after the work, of every process: {fmt_time(worst)}."]
    return "\n".join(lines)


def model_text(a: argparse.Namespace, cfg: dict[str, Any]) -> str:
    params = cfg["d_model"] ** 2 * 12 * cfg["layers"] + cfg["vocab"] * cfg["d_model"]
    return (
        f"transformer LM {a.size} (d_model {cfg['d_model']}, {cfg['layers']} layers"
        f"{' through lax.scan' if a.scan else ', unrolled'}, "
        f"vocabulary {cfg['vocab']}, about {params / 1e6:.0f} M parameters; batch "
        f"{cfg['batch']}, lengths {', '.join(map(str, cfg['seqs']))})"
    )


# What each scenario runs, how its table is made, and what its rows must agree on.
SCENARIOS: dict[str, tuple[Callable[..., dict], Callable[[dict[str, Any]], str], str]] = {
    "lm": (scenario_lm, table_lm, "losses"),
    "alternating": (scenario_alternating, table_alternating, "losses"),
    "suite": (scenario_suite, table_suite, "results"),
    "removed": (scenario_removed, table_removed, "losses"),
    "planted": (scenario_planted, table_planted, "losses"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--quick", action="store_true", help="2 warm processes per row")
    parser.add_argument("--repeats", type=int, default=None, help="warm processes per row")
    parser.add_argument("--layers", type=int, default=None, help="override the size's layers")
    parser.add_argument(
        "--scan",
        action="store_true",
        help="the layers through lax.scan (stacked parameters), as large models are written",
    )
    parser.add_argument(
        "--removed-rows",
        default=",".join(REMOVED),
        help="the removed scenario's rows to run, comma-separated (default: all)",
    )
    parser.add_argument("--suite-files", type=int, default=40, help="the suite's test files")
    parser.add_argument(
        "--heavy-ops", type=int, default=3000, help="the planted program's operations"
    )
    parser.add_argument("--dir", default=None, help="where the scratch caches go")
    parser.add_argument("--out", default=None, help="write results.json and table.md here")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        spec = json.loads(os.environ["BENCH_SPEC"])
        print(json.dumps(workload(spec, spec.get("spawned") or time.time())))
        return 0

    cfg = dict(SIZES[a.size])
    if a.layers:
        cfg["layers"] = a.layers
    cfg["scan"] = a.scan
    a.repeats = a.repeats or (2 if a.quick else 5)
    out = Path(a.out) if a.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    def note(row: dict[str, Any]) -> dict[str, Any]:
        print(
            f"  {row['case']}{' ' + row['BENCH_PROGRAM'] if 'BENCH_PROGRAM' in row else ''}: "
            f"wall {row['wall_s']:.2f} s, hits {row['hits']}",
            file=sys.stderr,
            flush=True,
        )
        if out is not None:
            with (out / "rows.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
        return row

    names = list(SCENARIOS) if a.scenario == "all" else [a.scenario]
    texts, everything, failed = [], {}, False
    for name in names:
        run, table, agree = SCENARIOS[name]
        print(f"{name}:", file=sys.stderr, flush=True)
        scratch = Path(tempfile.mkdtemp(prefix="xla-pcache-warm-", dir=a.dir))
        load_start = loadavg()
        try:
            done = run(a, cfg, scratch, note)
            executables, stored = stored_executables(done["store"])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        first = done["rows"]["cold"][0]
        results: dict[str, Any] = {
            "scenario": name,
            "model": done["model"],
            "config": cfg,
            "executables": executables,
            "stored_mb": stored / 1e6,
            "backend": first.get("backend", "cpu"),
            "devices": first.get("devices", 1),
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "versions": versions(),
            "repeats": a.repeats,
            "load_start": load_start,
            "load_end": loadavg(),
            "rows": done["rows"],
            **{k: done[k] for k in ("executables_removed", "records", "heavy") if k in done},
        }
        results["failures"] = check(results, agree)
        text = f"### {name}\n\n" + table(results)
        for failure in results["failures"]:
            text += f"\n- FAILED: {failure}"
        failed = failed or bool(results["failures"])
        texts.append(text)
        everything[name] = results
        print(text + "\n", flush=True)
    if out is not None:
        (out / "results.json").write_text(json.dumps(everything, indent=1) + "\n")
        (out / "table.md").write_text("\n\n".join(texts) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
