"""Warm start of a multi-program JAX workload: xla_pcache loading ahead, xla_pcache reading as
JAX asks (plain), JAX's own cache, and a cold start, side by side in fresh processes.

    python bench/warm_start.py                      # CPU, the small model, 5 repeats
    python bench/warm_start.py --quick              # 2 repeats
    python bench/warm_start.py --size 300m --repeats 3 --out DIR   # the TPU run
    python bench/warm_start.py --removed-only --repeats 3   # the start after eviction

The workload (``workload``) is a transformer language model in plain JAX: embedding,
``layers`` blocks of attention and MLP, Adam, with a jitted training step, a jitted evaluation
and a jitted greedy next-token step at each of four sequence lengths, after eager parameter
and optimizer initialisation: a few dozen executables, most of them small, the training steps
large. ``--size small`` is for CPUs; ``--size 300m`` (d_model 2048, 5 layers, vocabulary
32,768: about 319 M parameters) for an accelerator. Layers are a Python loop (unrolled in
the program), as in most hand-written models; with ``--scan`` they go through ``lax.scan``
over stacked parameters, as large models are written to keep tracing and compiling short:
the same executables, each traced in a fraction of the time, so that reading them is a
larger share of a warm start.

Each row is a fresh process configured by the environment alone, as a user would:

- ``cold``: an empty xla_pcache store; it fills the store (and its plan) for the warm rows;
- ``jax``: JAX's own cache (``JAX_COMPILATION_CACHE_DIR``, every program cached, no side
  caches so that its keys are xla_pcache's), with ``XLA_PCACHE_DISABLE=1``; its directory
  holds the very entries the cold process put in the store, copied as JAX names them
  (``<key>-cache``), so both caches serve the same bytes and no second cold compile is paid;
- ``plain``: that store with ``XLA_PCACHE_PREFETCH=0``: each read on the main thread when
  JAX asks;
- ``prefetch``: that store as installed (loading ahead on).

The warm rows run round-robin, ``--repeats`` times, so a change in the machine's load falls
on each alike. Per process: the first steps (from the backend's being up, model
initialisation included, until the first training step, evaluation and greedy step at every
length are done; the ratios are of these), the backend's start before them (``jax.devices()``
first: seconds on a TPU, the same in every row, when no cache can do anything yet), the same
from the process's start (Python, importing JAX and bringing the backend up added), the process
wall time, its CPU time, JAX's own hit events and the time its cache reads took on the main
thread (its ``cache_retrieval_time_sec`` events), split for the rows that read on the main
thread into the cache's get and JAX's decompression; with loading ahead, what it loaded, used
and wasted.
Medians, and the ratios of the warm rows to JAX's own cache and to plain. Every row must
compute the same losses. Results (JSON) and the table (markdown) go to ``--out``.

``--removed`` adds, and ``--removed-only`` runs alone, the start after the entries are
removed (``bench/warm_start_removed.py``): compiling ahead against the same start with it
off and JAX's own cold start.
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
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import warm_start_removed as removed_rows  # noqa: E402
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
    jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration_secs, **_: (
            reads.append(duration_secs) if event == RETRIEVAL else None
        )
    )
    split: dict[str, float] = {"get_s": 0.0, "decompress_s": 0.0}
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
        **(split if cfg["split_reads"] else {}),
    }
    if os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
        import xla_pcache.jax as xj

        report = xj.prefetch_report()
        if report is not None:
            out["prefetch"] = {
                "states": report["states"],
                **{k: report[k] for k in ("waited", "waited_s", "longest_wait", "last_load_s")},
                **report.get("counters", {}),
            }
    return out


# ----------------------------------------------------------------------- the processes


def _env(case: str, store: Path, jax_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_P"))}
    # As installed packages run: from bytecode (pip compiles it at install; the cold row
    # writes it for a source checkout). Without it every process compiles xla_pcache's
    # modules again, about 55 ms on this bench's CPU, while JAX's come compiled from its wheel.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if "JAX_PLATFORMS" in os.environ:
        env["JAX_PLATFORMS"] = os.environ["JAX_PLATFORMS"]
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
            "XLA_PCACHE_PREFETCH_MEMORY",
            "XLA_PCACHE_COMPILE_AHEAD_THREADS",
            "XLA_PCACHE_COMPILE_AHEAD_MEMORY",
        ):
            if name in os.environ:
                env[name] = os.environ[name]
    return env


def run_process(
    case: str, cfg: dict[str, Any], store: Path, jax_dir: Path, timeout: float
) -> dict[str, Any]:
    spec = {**cfg, "split_reads": case in ("jax", "plain")}
    spawned = time.time()
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec), "--spawned", repr(spawned)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(case, store, jax_dir),
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    # CPU time the process used, all its threads (and XLA's) together.
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["case"] = case
    return result


def fill_jax_dir(store: Path, jax_dir: Path) -> int:
    """JAX's own cache directory holding the store's executables, as JAX names its files
    (by JAX's key: the store's less its runtime build)."""
    from xla_pcache import Store, builds
    from xla_pcache.config import Settings
    from xla_pcache.jax._module_record import KEY_PREFIX as RECORD
    from xla_pcache.jax._plan import KEY_PREFIX

    jax_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    with Store(store, read_only=True, settings=Settings()) as s:
        keys = s.keys()
        for key in keys:
            if not isinstance(key, str) or key.startswith((KEY_PREFIX, RECORD)):
                continue
            blob = s.get(key)
            if blob is not None:
                jax_key = builds.split_key(key)[0]
                (jax_dir / f"{jax_key}-cache").write_bytes(bytes(blob))
                n += 1
    return n


def stored_executables(store: Path) -> tuple[int, int]:
    """How many executables the store holds and their payload bytes (its plan and module
    records left out)."""
    from xla_pcache import Store
    from xla_pcache.config import Settings
    from xla_pcache.jax._module_record import KEY_PREFIX as RECORD
    from xla_pcache.jax._plan import KEY_PREFIX

    with Store(store, read_only=True, settings=Settings()) as s:
        rows = [e for e in s.entries() if not str(e["key"]).startswith((KEY_PREFIX, RECORD))]
    return len(rows), sum(int(e["size"]) for e in rows)


# ----------------------------------------------------------------------- the report


def med(rows: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(float(r[field]) for r in rows))


def header(results: dict[str, Any]) -> str:
    return (
        f"{results['model']}; {results['executables']} executables stored "
        f"({results['stored_mb']:.1f} MB as JAX compresses them); {results['backend']} "
        f"({results['devices']} device(s)), {results['cpu']}, {results['cpus']} CPUs; "
        f"jax {results['versions'].get('jax')}; {results['repeats']} warm process(es) per row, "
        f"medians; load average {results['load_start']} at start, {results['load_end']} at end."
    )


def table(results: dict[str, Any]) -> str:
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
        "| loaded ahead: used / wasted | first steps vs JAX's cache | vs plain |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for case, label in CASES.items():
        rs = rows[case]
        steps = med(rs, "first_calls_s")
        reads = fmt_time(med(rs, "reads_s")) if case != "cold" else "(misses)"
        if "get_s" in rs[0] and case != "cold":
            reads += f" ({fmt_time(med(rs, 'get_s'))}, {fmt_time(med(rs, 'decompress_s'))})"
        pf = rs[0].get("prefetch")
        ahead = (
            f"{pf.get('prefetch_used', 0)} / {pf.get('prefetch_wasted', 0)} of "
            f"{pf.get('prefetch_planned', 0)}"
            if pf and case == "prefetch"
            else ""
        )
        lookups = rs[0]["hits"] + rs[0]["misses"]
        lines.append(
            f"| {label} | {fmt_time(steps)} | {fmt_time(med(rs, 'backend_s'))} "
            f"| {fmt_time(med(rs, 'ready_s'))} "
            f"| {fmt_time(med(rs, 'wall_s'))} | {fmt_time(med(rs, 'cpu_s'))} "
            f"| {rs[0]['hits']} / {lookups} | {reads} "
            f"| {ahead} | {steps / jax_steps:.2f} | {steps / plain_steps:.2f} |"
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
    ]
    for failure in results["failures"]:
        lines.append(f"- FAILED: {failure}")
    return "\n".join(lines)


def check(results: dict[str, Any]) -> list[str]:
    rows = results["rows"]
    failures = []
    losses = {json.dumps(r["losses"]) for rs in rows.values() for r in rs}
    if len(losses) != 1:
        failures.append("the rows computed different losses")
    for case in WARM:
        if any(r["misses"] for r in rows[case]):
            failures.append(f"{case}: a warm process compiled")
    if any(r.get("prefetch", {}).get("prefetch_used", 0) == 0 for r in rows["prefetch"]):
        failures.append("prefetch: nothing was loaded ahead and used")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
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
        "--removed",
        action="store_true",
        help="also the start after the entries are removed (plan and module records kept)",
    )
    parser.add_argument(
        "--removed-only", action="store_true", help="that start alone (after the cold one)"
    )
    parser.add_argument("--dir", default=None, help="where the scratch caches go")
    parser.add_argument("--out", default=None, help="write results.json and table.md here")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per process")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, default=None, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        print(json.dumps(workload(json.loads(a.worker), a.spawned or time.time())))
        return 0

    cfg = dict(SIZES[a.size])
    if a.layers:
        cfg["layers"] = a.layers
    cfg["scan"] = a.scan
    repeats = a.repeats or (2 if a.quick else 5)
    out = Path(a.out) if a.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="xla-pcache-warm-", dir=a.dir))
    store, jax_dir = scratch / "store", scratch / "jax"
    load_start = loadavg()
    rows: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    removed: dict[str, Any] = {}

    def note(row: dict[str, Any]) -> None:
        print(
            f"  {row['case']}: first steps {row['ready_s']:.2f} s, wall {row['wall_s']:.2f} s, "
            f"hits {row['hits']}",
            file=sys.stderr,
            flush=True,
        )
        if out is not None:
            (out / "rows.jsonl").open("a").write(json.dumps(row) + "\n")

    try:
        rows["cold"].append(run_process("cold", cfg, store, jax_dir, a.timeout))
        note(rows["cold"][0])
        executables, stored = stored_executables(store)
        fill_jax_dir(store, jax_dir)
        for i in range(0 if a.removed_only else repeats):
            # Round-robin, each round in another order: no row always follows the same one.
            order = WARM[i % 3 :] + WARM[: i % 3]
            for case in order:
                rows[case].append(run_process(case, cfg, store, jax_dir, a.timeout))
                note(rows[case][-1])
        if a.removed or a.removed_only:
            kept = scratch / "removed"
            gone, records = removed_rows.template(store, kept)
            after = removed_rows.run_rows(
                lambda case, s, j: run_process(case, cfg, s, j, a.timeout),
                kept,
                scratch,
                repeats,
                note,
            )
            removed = {"executables_removed": gone, "records": records, "rows": after}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    first = rows["cold"][0]
    params = cfg["d_model"] ** 2 * 12 * cfg["layers"] + cfg["vocab"] * cfg["d_model"]
    results: dict[str, Any] = {
        "model": (
            f"transformer LM {a.size} (d_model {cfg['d_model']}, {cfg['layers']} layers"
            f"{' through lax.scan' if a.scan else ', unrolled'}, "
            f"vocabulary {cfg['vocab']}, about {params / 1e6:.0f} M parameters; batch "
            f"{cfg['batch']}, lengths {', '.join(map(str, cfg['seqs']))})"
        ),
        "config": cfg,
        "executables": executables,
        "stored_mb": stored / 1e6,
        "backend": first["backend"],
        "devices": first["devices"],
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "versions": versions(),
        "repeats": repeats,
        "load_start": load_start,
        "load_end": loadavg(),
        "rows": rows,
    }
    results["failures"] = check(results)
    text = header(results) if a.removed_only else table(results)
    if a.removed or a.removed_only:
        results["removed"] = removed
        results["failures"] += removed_rows.check(removed["rows"])
        text += "\n\n" + removed_rows.table(
            removed["rows"], removed["executables_removed"], removed["records"]
        )
        text += "".join(f"\n- FAILED: {f}" for f in removed_rows.check(removed["rows"]))
    if out is not None:
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "table.md").write_text(text + "\n")
    print(text)
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
