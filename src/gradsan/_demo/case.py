"""The demo gallery: classic NaN-gradient cases, written as a user would write them.

Each case returns a Case: the gradient program, its arguments, the same program fixed with
gradsan.jax.safe, and the true gradient computed another way (a smooth rewrite of the same
function, or the mathematics when there is no derivative). This file counts as user code.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from gradsan.jax import safe


class Case(NamedTuple):
    grad: Callable
    args: tuple
    fixed: Callable
    truth: Any  # a callable computing the true gradient, or a sentence when there is none


def zygote_sqrt_seed():
    """Zygote thread: sqrt(A0 ** theta) with a zero entry in A0."""
    A0 = jnp.array([[1.0, 0.0], [0.0, 3.0]])

    def loss(theta):
        A = A0**theta
        A = jnp.sqrt(A)
        return jnp.sqrt(jnp.sum((A - A0) ** 2))

    def fixed(theta):
        A = safe.sqrt(A0**theta)
        return jnp.sqrt(jnp.sum((A - A0) ** 2))

    def smooth(theta):  # the thread's own rewrite: the same values, smooth in theta
        return jnp.sqrt(jnp.sum((A0 ** (theta / 2) - A0) ** 2))

    return Case(jax.grad(loss), (4.0,), jax.grad(fixed), jax.grad(smooth))


def jax_abs_vs_norm():
    """JAX thread: grad(abs)(0) is 1 but grad(norm)(0) is NaN."""

    def g(x, y):
        return jnp.linalg.norm(x - y)

    def fixed(x, y):
        return safe.norm(x - y)

    truth = ("no gradient: norm has a cone at 0; the Clarke subdifferential is the unit ball, "
             "whose minimum-norm element is 0")
    return Case(jax.grad(g, argnums=(0, 1)), (jnp.zeros(3), jnp.zeros(3)),
                jax.grad(fixed, argnums=(0, 1)), truth)


def flux_normalise_zero_std():
    """Flux thread: (x - mean) / (std + eps) on constant data."""

    def loss(x):
        z = (x - jnp.mean(x, axis=0)) / (jnp.std(x, axis=0) + 1e-5)
        return jnp.sum(jnp.sin(z))

    def fixed(x):
        z = safe.standardize(x, axis=0, eps=1e-5, form="std_eps")
        return jnp.sum(jnp.sin(z))

    def truth(x):  # d/dx of (x - mean)/(std + eps) at zero spread is (I - 11^T/n)/eps
        w = jnp.cos(jnp.zeros_like(x))
        return (w - jnp.mean(w, axis=0)) / 1e-5

    return Case(jax.grad(loss), (jnp.ones((3, 3)),), jax.grad(fixed), truth)


def where_trap():
    """The where trap: a masked-out log(0) still poisons the gradient."""
    mask = jnp.array([False, True, True])

    def loss(p):
        return jnp.sum(jnp.where(mask, jnp.log(p), 0.0))

    def fixed(p):
        return jnp.sum(safe.where(mask, jnp.log, 0.0, p))

    def truth(p):  # d/dp log(p) = 1/p where selected; the constant branch has derivative 0
        return jnp.where(mask, 1.0 / jnp.where(mask, p, 1.0), 0.0)

    return Case(jax.grad(loss), (jnp.array([0.0, 0.5, 0.25]),), jax.grad(fixed), truth)


def masked_softmax_row():
    """Attention with a fully masked row: softmax of all -inf."""
    mask = jnp.array([[True, True], [False, False]])

    def loss(q, k):
        scores = q @ k.T
        scores = jnp.where(mask, scores, -jnp.inf)
        attn = jax.nn.softmax(scores, axis=-1)
        return jnp.sum(attn @ k)

    def fixed(q, k):
        attn = safe.softmax(q @ k.T, axis=-1, where=mask)
        return jnp.sum(attn @ k)

    truth = "no value: the masked row's softmax is 0 / 0; with the row defined as 0 the loss is finite"
    return Case(jax.value_and_grad(loss), (jnp.ones((2, 3)), jnp.ones((2, 3))),
                jax.value_and_grad(fixed), truth)


def pairwise_duplicate_point():
    """Pairwise distances with a duplicated point: sqrt of an exact 0."""

    def loss(x):
        d = x[:, None, :] - x[None, :, :]
        dist = jnp.sqrt(jnp.sum(d**2, axis=-1))
        return jnp.sum(jnp.exp(-dist))

    def fixed(x):
        return jnp.sum(jnp.exp(-safe.cdist(x, x)))

    truth = ("no gradient at the duplicate: |x_i - x_j| has a cone there; every pair's term "
             "contributes a subgradient of norm at most 1, and the minimum-norm choice is 0")
    return Case(jax.grad(loss), (jnp.array([[0.0, 0.0], [1.0, 2.0], [1.0, 2.0]]),),
                jax.grad(fixed), truth)


def atan2_origin():
    """An angle of a vector that is exactly zero."""

    def loss(v):
        return jnp.arctan2(v[1], v[0])

    def fixed(v):
        return safe.atan2(v[1], v[0])

    truth = "no gradient: atan2 is discontinuous at the origin (0 is a convention)"
    return Case(jax.grad(loss), (jnp.zeros(2),), jax.grad(fixed), truth)


def float16_overflow():
    """Mixed precision: exp overflows float16 in the forward pass."""

    def loss(x):
        y = jnp.exp(x.astype(jnp.float16))
        return jnp.sum(y).astype(jnp.float32)

    def fixed(x):
        y = jnp.exp(x.astype(jnp.float32))
        return jnp.sum(y)

    return Case(jax.grad(loss), (jnp.array([1.0, 12.0]),), jax.grad(fixed), jnp.exp)


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
