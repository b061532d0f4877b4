"""Metric learning with a pairwise-distance loss (JAX + flax + optax).

A small MLP embeds points so that embedding distances match the original distances. The
sampler draws each batch *with replacement* from a pool of 256 points; at step 7 it draws the
same point twice. Those two rows embed to the same vector, their distance is
sqrt(0) = 0 (a fine value) but sqrt's derivative there is inf, and inf * 0 = NaN poisons every
parameter. Run it under gradsan:

    gradsan run examples/jax_pairwise_distance.py
"""

import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


class Embed(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = jnp.tanh(nn.Dense(32)(x))
        return nn.Dense(4)(x)


model = Embed()
tx = optax.adam(1e-2)


def pairwise_distance(z):
    i, j = jnp.triu_indices(z.shape[0], k=1)  # every pair once, no diagonal
    d = z[i] - z[j]
    return jnp.sqrt(jnp.sum(d**2, axis=-1))  # embedding distance


def loss_fn(params, points):
    z = model.apply({"params": params}, points)
    target = pairwise_distance(points)
    return jnp.mean((pairwise_distance(z) - target) ** 2)


@jax.jit
def train_step(params, opt_state, points):
    loss, grads = jax.value_and_grad(loss_fn)(params, points)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def main(steps: int = 12) -> None:
    pool = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
    sampler = np.random.default_rng(13)  # with this seed the first repeated index is at step 7
    params = model.init(jax.random.key(0), jnp.zeros((1, 8)))["params"]
    opt_state = tx.init(params)
    for step in range(steps):
        print(f"step {step}", flush=True)
        points = jnp.asarray(pool[sampler.integers(0, len(pool), size=8)])
        params, opt_state, loss = train_step(params, opt_state, points)
        print(f"  loss {float(loss):.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
