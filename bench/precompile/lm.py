"""A small LM-like program for the TPU proof of `xla-pcache precompile`: six jitted programs
(init, forward, loss, train step, eval step, sample step), each called once, first steps
timed. Prints one JSON line: the label, import and first-steps seconds, each program's first
call, and JAX's own cache hits and misses. xla_pcache is installed when
XLA_PERSISTENT_CACHE_PATH is set (explicitly: the checkout is on PYTHONPATH, no wheel).
The steps: bench/precompile/*.sh, docs/jax.md "Precompiling for a TPU fleet"."""

import json
import os
import sys
import time

t0 = time.perf_counter()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

counts = {"hits": 0, "misses": 0}


def _listener(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        counts["hits"] += 1
    elif event == "/jax/compilation_cache/cache_misses":
        counts["misses"] += 1


jax.monitoring.register_event_listener(_listener)
if os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
    import xla_pcache.jax

    xla_pcache.jax.install()
import_s = time.perf_counter() - t0

V, D, H, L, T, B = 8192, 512, 8, 4, 256, 8


@jax.jit
def init(key):
    keys = jax.random.split(key, 2 + 4 * L)
    p = {
        "emb": jax.random.normal(keys[0], (V, D)) * 0.02,
        "out": jax.random.normal(keys[1], (D, V)) * 0.02,
    }
    for i in range(L):
        k = keys[2 + 4 * i : 6 + 4 * i]
        p[f"qkv{i}"] = jax.random.normal(k[0], (D, 3 * D)) * 0.02
        p[f"o{i}"] = jax.random.normal(k[1], (D, D)) * 0.02
        p[f"up{i}"] = jax.random.normal(k[2], (D, 4 * D)) * 0.02
        p[f"down{i}"] = jax.random.normal(k[3], (4 * D, D)) * 0.02
    return p


def _forward(p, tokens):
    x = p["emb"][tokens]
    mask = jnp.tril(jnp.ones((T, T), bool))
    for i in range(L):
        q, k, v = jnp.split(x @ p[f"qkv{i}"], 3, axis=-1)
        q, k, v = (a.reshape(B, T, H, D // H) for a in (q, k, v))
        att = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(D // H)
        att = jax.nn.softmax(jnp.where(mask, att, -1e9), axis=-1)
        x = x + jnp.einsum("bhts,bshd->bthd", att, v).reshape(B, T, D) @ p[f"o{i}"]
        x = x + jax.nn.gelu(x @ p[f"up{i}"]) @ p[f"down{i}"]
    return x @ p["out"]


def _loss(p, tokens):
    logits = _forward(p, tokens[:, :-1] if tokens.shape[1] > T else tokens)
    labels = jnp.roll(tokens, -1, axis=1)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))


forward = jax.jit(_forward)
loss = jax.jit(_loss)


@jax.jit
def train_step(p, m, tokens):
    value, g = jax.value_and_grad(_loss)(p, tokens)
    m = jax.tree.map(lambda a, b: 0.9 * a + b, m, g)
    p = jax.tree.map(lambda a, b: a - 1e-3 * b, p, m)
    return p, m, value


@jax.jit
def eval_step(p, tokens):
    logits = _forward(p, tokens)
    return _loss(p, tokens), jnp.mean(jnp.argmax(logits, -1) == jnp.roll(tokens, -1, 1))


@jax.jit
def sample_step(p, tokens, i):
    logits = _forward(p, tokens)
    nxt = jnp.argmax(logits[:, i], -1)
    return tokens.at[:, (i + 1) % T].set(nxt)


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    per = {}
    start = time.perf_counter()

    def timed(name, fn, *args):
        t = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        per[name] = round(time.perf_counter() - t, 3)
        return out

    p = timed("init", init, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, V)
    timed("forward", forward, p, tokens)
    timed("loss", loss, p, tokens)
    m = jax.tree.map(jnp.zeros_like, p)
    p, m, _ = timed("train_step", train_step, p, m, tokens)
    timed("eval_step", eval_step, p, tokens)
    timed("sample_step", sample_step, p, tokens, 0)
    first_steps = time.perf_counter() - start
    print(
        json.dumps(
            {
                "label": label,
                "import_s": round(import_s, 3),
                "first_steps_s": round(first_steps, 3),
                "per_program_s": per,
                "hits": counts["hits"],
                "misses": counts["misses"],
                "jax": jax.__version__,
                "backend": jax.default_backend(),
                "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
            }
        )
    )


if __name__ == "__main__":
    main()
