"""Regression with a flax linen model with dropout (a `TrainState` holding the optax
optimizer, a dropout key split every step), trained with `jax.jit` and `jax.value_and_grad`.

The model scales every input row to unit length (``x / |x|``). The data loader pads its last
batch with all-zero rows; a zero row has length 0, so 0 / 0 = NaN flows into the loss and
every gradient. Run it under gradsan:

    gradsan run examples/flax_linen_dropout.py            # stops at the padded batch (exit 3)
    gradsan run examples/flax_linen_dropout.py --no-pad   # trains to the end, unchanged

The batch size is read from the environment (``BATCH``, default 16).
"""

import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, *, train: bool):
        x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # unit-length rows
        x = nn.gelu(nn.Dense(16)(x))
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(1)(x)[:, 0]


@jax.jit
def train_step(state, x, y, key):
    dropout_key = jax.random.fold_in(key, state.step)

    def loss_fn(params):
        pred = state.apply_fn({"params": params}, x, train=True, rngs={"dropout": dropout_key})
        return jnp.mean((pred - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def batches(n_batches: int, batch: int, pad: bool):
    rng = np.random.default_rng(0)
    for i in range(n_batches):
        x = rng.normal(size=(batch, 4)).astype(np.float32)
        if pad and i == n_batches - 1:
            x[batch // 2 :] = 0.0  # the loader pads the last, short batch with zeros
        y = np.sin(x.sum(-1)).astype(np.float32)
        yield jnp.asarray(x), jnp.asarray(y)


def main(pad: bool) -> None:
    batch = int(os.environ.get("BATCH", "16"))
    model = Net()
    key = jax.random.PRNGKey(0)
    params = model.init(key, jnp.ones((1, 4)), train=False)["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    for step, (x, y) in enumerate(batches(6, batch, pad)):
        print(f"step {step}", flush=True)
        state, loss = train_step(state, x, y, key)
        print(f"  loss {float(loss):.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main(pad="--no-pad" not in sys.argv[1:])
