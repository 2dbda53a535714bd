"""Real training programs as flax's and equinox's examples write them, for the warm-start tests.

Knows nothing of xla_pcache: it is run with ``XLA_PERSISTENT_CACHE_PATH`` set and nothing
else, as the README says. Three small programs in the style of those libraries' examples,
each with parameters initialised from PRNG keys, an optax optimiser, a jitted training step
run in a loop and a jitted evaluation step:

- flax linen: a CNN classifier (``flax/examples/mnist`` style, with a ``TrainState``);
- flax nnx: an MLP regression (``flax/examples/nnx_toy_examples`` style, ``nnx.jit``,
  ``nnx.Optimizer``), and a batched prediction with ``jax.vmap``;
- equinox: a GRU over sequences with ``jax.lax.scan`` (``equinox/docs/examples/train_rnn``
  style, ``eqx.filter_jit``, ``eqx.filter_value_and_grad``), evaluated with ``jax.vmap``.

``python real_programs.py [linen|nnx|equinox ...]`` runs the named ones (all by default) and
prints one JSON line: what JAX's own monitoring events counted (persistent-cache lookups,
hits, and every backend compile's duration) and each program's final loss.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

LOOKUP = "/jax/compilation_cache/compile_requests_use_cache"
HIT = "/jax/compilation_cache/cache_hits"
COMPILE = "/jax/core/compile/backend_compile_duration"

events: list[str] = []
compile_seconds: list[float] = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: compile_seconds.append(duration) if event == COMPILE else None
)


def synthetic_images(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = rng.standard_normal((n, 12, 12, 1)).astype(np.float32) + labels[:, None, None, None]
    return images / 10.0, labels


def linen_cnn() -> float:
    from flax import linen as nn
    from flax.training import train_state

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.Conv(features=16, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = nn.Conv(features=32, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = x.reshape((x.shape[0], -1))
            x = nn.Dense(features=64)(x)
            x = nn.relu(x)
            return nn.Dense(features=10)(x)

    images, labels = synthetic_images(0, 256)
    cnn = CNN()
    params = cnn.init(jax.random.PRNGKey(0), jnp.ones((1, 12, 12, 1)))["params"]
    state = train_state.TrainState.create(
        apply_fn=cnn.apply, params=params, tx=optax.sgd(0.05, momentum=0.9)
    )

    @jax.jit
    def apply_model(state: Any, images: Any, labels: Any) -> tuple[Any, Any, Any]:
        def loss_fn(params: Any) -> tuple[Any, Any]:
            logits = state.apply_fn({"params": params}, images)
            one_hot = jax.nn.one_hot(labels, 10)
            return jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot)), logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        return grads, loss, jnp.mean(jnp.argmax(logits, -1) == labels)

    @jax.jit
    def update_model(state: Any, grads: Any) -> Any:
        return state.apply_gradients(grads=grads)

    @jax.jit
    def eval_step(params: Any, images: Any, labels: Any) -> Any:
        logits = cnn.apply({"params": params}, images)
        return jnp.mean(jnp.argmax(logits, -1) == labels)

    perm = jax.random.permutation(jax.random.PRNGKey(1), len(images))
    loss = jnp.zeros(())
    for _epoch in range(2):
        for i in range(0, len(images), 64):
            idx = np.asarray(perm[i : i + 64])
            grads, loss, _ = apply_model(state, images[idx], labels[idx])
            state = update_model(state, grads)
        eval_step(state.params, images, labels).block_until_ready()
    return float(loss)


def nnx_mlp() -> float:
    from flax import nnx

    x_all = np.linspace(0, 1, 128, dtype=np.float32)[:, None]
    y_all = 0.8 * x_all**2 + 0.1

    class MLP(nnx.Module):
        def __init__(self, din: int, dhidden: int, dout: int, *, rngs: nnx.Rngs) -> None:
            self.linear1 = nnx.Linear(din, dhidden, rngs=rngs)
            self.dropout = nnx.Dropout(0.1, rngs=rngs)
            self.linear2 = nnx.Linear(dhidden, dhidden, rngs=rngs)
            self.linear3 = nnx.Linear(dhidden, dout, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = nnx.relu(self.linear1(x))
            x = self.dropout(nnx.relu(self.linear2(x)))
            return self.linear3(x)

    model = MLP(1, 64, 1, rngs=nnx.Rngs(0))
    tx = optax.adam(1e-2)
    # flax 0.11 made ``wrt`` and the model argument of ``update`` explicit.
    params_of_init = inspect.signature(nnx.Optimizer.__init__).parameters
    optimizer = (
        nnx.Optimizer(model, tx, wrt=nnx.Param)
        if "wrt" in params_of_init
        else nnx.Optimizer(model, tx)
    )
    takes_model = "model" in inspect.signature(optimizer.update).parameters

    @nnx.jit
    def train_step(model: MLP, optimizer: Any, x: Any, y: Any) -> Any:
        def loss_fn(model: MLP) -> Any:
            return jnp.mean((model(x) - y) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        if takes_model:
            optimizer.update(model, grads)
        else:
            optimizer.update(grads)
        return loss

    @nnx.jit
    def eval_step(model: MLP, x: Any, y: Any) -> Any:
        return jnp.mean((model(x) - y) ** 2)

    rng = np.random.default_rng(2)
    model.train()
    loss = jnp.zeros(())
    for _ in range(30):
        idx = rng.choice(len(x_all), size=32)
        loss = train_step(model, optimizer, x_all[idx], y_all[idx])
    model.eval()
    eval_step(model, x_all, y_all).block_until_ready()
    # Per-example predictions for several batches at once.
    graphdef, state = nnx.split(model)
    predict = jax.jit(
        jax.vmap(lambda xs: nnx.merge(graphdef, state)(xs), in_axes=0)  # batch of batches
    )
    predict(x_all.reshape(4, 32, 1)).block_until_ready()
    return float(loss)


def equinox_rnn() -> float:
    import equinox as eqx

    class RNN(eqx.Module):
        hidden_size: int
        cell: eqx.nn.GRUCell
        linear: eqx.nn.Linear
        bias: jax.Array

        def __init__(self, in_size: int, out_size: int, hidden_size: int, *, key: Any) -> None:
            ckey, lkey = jax.random.split(key)
            self.hidden_size = hidden_size
            self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
            self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
            self.bias = jnp.zeros(out_size)

        def __call__(self, xs: Any) -> Any:
            hidden = jnp.zeros((self.hidden_size,))

            def f(carry: Any, inp: Any) -> tuple[Any, None]:
                return self.cell(inp, carry), None

            out, _ = jax.lax.scan(f, hidden, xs)
            return jax.nn.sigmoid(self.linear(out) + self.bias)

    def dataloader(arrays: tuple[Any, ...], batch_size: int, *, key: Any) -> Any:
        size = arrays[0].shape[0]
        indices = np.arange(size)
        while True:
            key, subkey = jax.random.split(key)
            perm = np.asarray(jax.random.permutation(subkey, indices))
            for start in range(0, size - batch_size + 1, batch_size):
                yield tuple(a[perm[start : start + batch_size]] for a in arrays)

    def get_data(size: int, *, key: Any) -> tuple[Any, Any]:
        t = jnp.linspace(0, 2 * np.pi, 16)
        offset = jax.random.uniform(key, (size,), minval=0, maxval=2 * np.pi)
        x1 = jnp.sin(t + offset[:, None]) / (1 + t)
        x2 = jnp.cos(t + offset[:, None]) / (1 + t)
        y = jnp.ones((size, 1))
        half = size // 2
        x1 = x1.at[:half].set(-x1[:half])
        y = y.at[:half].set(0)
        return jnp.stack([x1, x2], axis=-1), y

    data_key, loader_key, model_key = jax.random.split(jax.random.PRNGKey(5678), 3)
    xs, ys = get_data(256, key=data_key)
    iter_data = dataloader((xs, ys), 32, key=loader_key)
    model = RNN(in_size=2, out_size=1, hidden_size=16, key=model_key)

    @eqx.filter_value_and_grad
    def compute_loss(model: RNN, x: Any, y: Any) -> Any:
        pred_y = jax.vmap(model)(x)
        return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

    @eqx.filter_jit
    def make_step(model: RNN, x: Any, y: Any, opt_state: Any) -> tuple[Any, Any, Any]:
        loss, grads = compute_loss(model, x, y)
        updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return loss, model, opt_state

    @eqx.filter_jit
    def accuracy(model: RNN, x: Any, y: Any) -> Any:
        pred_y = jax.vmap(model)(x)
        return jnp.mean((pred_y > 0.5) == (y > 0.5))

    optim = optax.adam(3e-3)
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    loss = jnp.zeros(())
    for _, (x, y) in zip(range(40), iter_data, strict=False):
        loss, model, opt_state = make_step(model, x, y, opt_state)
    accuracy(model, xs, ys).block_until_ready()
    return float(loss)


PROGRAMS = {"linen": linen_cnn, "nnx": nnx_mlp, "equinox": equinox_rnn}


def main() -> int:
    names = sys.argv[1:] or list(PROGRAMS)
    losses = {name: PROGRAMS[name]() for name in names}
    print(
        json.dumps(
            {
                "jax": jax.__version__,
                "lookups": events.count(LOOKUP),
                "hits": events.count(HIT),
                "compiles": len(compile_seconds),
                "compile_seconds": sum(compile_seconds),
                "losses": losses,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
