"""Regression with a flax NNX model (dropout, an `nnx.Optimizer`), trained with `nnx.jit` and
`nnx.value_and_grad`; the step updates the model in place.

The model scales every input row to unit length (``x / |x|``). The data loader pads its last
batch with all-zero rows; a zero row has length 0, so 0 / 0 = NaN flows into the loss and
every gradient. Run it under gradsan:

    gradsan run examples/flax_nnx_mlp.py            # stops at the padded batch (exit 3)
    gradsan run examples/flax_nnx_mlp.py --no-pad   # trains to the end, unchanged

The batch size is read from the environment (``BATCH``, default 16).
"""

import os
import sys

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(4, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # unit-length rows
        return self.out(self.drop(nnx.gelu(self.hidden(x))))[:, 0]


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


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
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    for step, (x, y) in enumerate(batches(6, batch, pad)):
        print(f"step {step}", flush=True)
        loss = train_step(model, optimizer, x, y)
        print(f"  loss {float(loss):.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main(pad="--no-pad" not in sys.argv[1:])
