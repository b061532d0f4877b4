"""Regression with an equinox MLP (equinox + optax), trained with `eqx.filter_jit` and
`eqx.filter_value_and_grad`.

The model scales every input row to unit length (``x / |x|``). The data loader pads its last
batch with all-zero rows; a zero row has length 0, so 0 / 0 = NaN flows into the loss and
every gradient. Run it under gradsan:

    gradsan run examples/equinox_mlp.py            # stops at the padded batch (exit 3)
    gradsan run examples/equinox_mlp.py --no-pad   # trains to the end, unchanged

The batch size is read from the environment (``BATCH``, default 16).
"""

import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax


class Net(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(4, 1, width_size=16, depth=2, activation=jax.nn.gelu, key=key)

    def __call__(self, x):
        x = x / jnp.linalg.norm(x)  # unit-length input
        return self.mlp(x)[0]


@eqx.filter_value_and_grad
def loss_fn(model, x, y):
    pred = jax.vmap(model)(x)
    return jnp.mean((pred - y) ** 2)


optim = optax.adam(1e-2)


@eqx.filter_jit
def train_step(model, opt_state, x, y):
    loss, grads = loss_fn(model, x, y)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


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
    model = Net(jax.random.key(0))
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    for step, (x, y) in enumerate(batches(6, batch, pad)):
        print(f"step {step}", flush=True)
        model, opt_state, loss = train_step(model, opt_state, x, y)
        print(f"  loss {float(loss):.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main(pad="--no-pad" not in sys.argv[1:])
