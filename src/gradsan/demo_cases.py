"""The demo gallery: classic NaN-gradient cases, written as a user would write them.

Each case is a function returning (gradient function, arguments). `gradsan demo` diagnoses
every case with gradsan.jax.explain. This file counts as user code in reports.
"""

import jax
import jax.numpy as jnp


def zygote_sqrt_seed():
    """Zygote thread: sqrt(A0 ** theta) with a zero entry in A0."""
    A0 = jnp.array([[1.0, 0.0], [0.0, 3.0]])

    def loss(theta):
        A = A0**theta
        A = jnp.sqrt(A)
        return jnp.sqrt(jnp.sum((A - A0) ** 2))

    return jax.grad(loss), (4.0,)


def jax_abs_vs_norm():
    """JAX thread: grad(abs)(0) is 1 but grad(norm)(0) is NaN."""

    def g(x, y):
        return jnp.linalg.norm(x - y)

    return jax.grad(g, argnums=(0, 1)), (jnp.zeros(3), jnp.zeros(3))


def flux_normalise_zero_std():
    """Flux thread: (x - mean) / (std + eps) on constant data."""

    def loss(x):
        z = (x - jnp.mean(x, axis=0)) / (jnp.std(x, axis=0) + 1e-5)
        return jnp.sum(jnp.sin(z))

    return jax.grad(loss), (jnp.ones((3, 3)),)


def where_trap():
    """The where trap: the unselected branch still differentiates log(0)."""

    def loss(x):
        return jnp.sum(jnp.where(x > 0, jnp.log(x), 0.0))

    return jax.grad(loss), (jnp.array([0.0, 1.0, 2.0]),)


def masked_softmax_row():
    """Attention with a fully masked row: softmax of all -inf."""

    def loss(q, k):
        scores = q @ k.T
        mask = jnp.array([[True, True], [False, False]])
        scores = jnp.where(mask, scores, -jnp.inf)
        attn = jax.nn.softmax(scores, axis=-1)
        return jnp.sum(attn @ k)

    return jax.value_and_grad(loss), (jnp.ones((2, 3)), jnp.ones((2, 3)))


def pairwise_duplicate_point():
    """Pairwise distances with a duplicated point: sqrt of an exact 0."""

    def loss(x):
        d = x[:, None, :] - x[None, :, :]
        dist = jnp.sqrt(jnp.sum(d**2, axis=-1))
        return jnp.sum(jnp.exp(-dist))

    return jax.grad(loss), (jnp.array([[0.0, 0.0], [1.0, 2.0], [1.0, 2.0]]),)


def atan2_origin():
    """An angle of a vector that is exactly zero."""

    def loss(v):
        return jnp.arctan2(v[1], v[0])

    return jax.grad(loss), (jnp.zeros(2),)


def float16_overflow():
    """Mixed precision: exp overflows float16 in the forward pass."""

    def loss(x):
        y = jnp.exp(x.astype(jnp.float16))
        return jnp.sum(y).astype(jnp.float32)

    return jax.grad(loss), (jnp.array([1.0, 12.0]),)


CASES = {
    "zygote-sqrt": zygote_sqrt_seed,
    "abs-vs-norm": jax_abs_vs_norm,
    "flux-normalise": flux_normalise_zero_std,
    "where-trap": where_trap,
    "masked-softmax": masked_softmax_row,
    "pairwise-distance": pairwise_duplicate_point,
    "atan2-origin": atan2_origin,
    "float16-overflow": float16_overflow,
}
