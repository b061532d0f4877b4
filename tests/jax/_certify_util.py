"""Shared by the certify rule tests: run certify in float64, read each ray's gradient, and check
a kink against the one-sided gradients beside it."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import gradsan.jax as gsj  # noqa: E402
from gradsan.jax.certify._hull import min_norm_hull  # noqa: E402

# certify(loss) and certify(jax.grad(loss)) certify the same gradient
WRAPS = [pytest.param(lambda f: f, id="loss"), pytest.param(jax.grad, id="grad")]


def run(f, x0, directions=None):
    with jax.enable_x64(True):
        r = gsj.certify(f, directions=directions)(x0)
    (fd,) = r.findings
    assert fd.kind == "certified"
    assert fd.detail["unverified"] == []
    return r, fd.detail


def ray_grads(d):
    return [
        None if v["gradient"] is None else [np.asarray(g) for g in v["gradient"]]
        for v in d["verdicts"]
    ]


def grad_beside(loss, x):
    """jax.grad of a one-array loss at x, in float64."""
    with jax.enable_x64(True):
        return np.asarray(jax.jit(jax.grad(loss))(jnp.asarray(x)))


def assert_kink(r, d, loss, x0, v, along_v, along_minus_v):
    """Rays v and -v at a kink: each ray's gradient limit is the given one, equal to jax.grad
    just beside x0 on its side; the label is a Clarke subgradient, the minimum-norm point of
    the two."""
    g1, g2 = (g[0] for g in ray_grads(d))
    np.testing.assert_array_equal(g1, along_v)
    np.testing.assert_array_equal(g2, along_minus_v)
    np.testing.assert_array_equal(g1, grad_beside(loss, x0 + 1e-6 * v))
    np.testing.assert_array_equal(g2, grad_beside(loss, x0 - 1e-6 * v))
    assert d["label"] == "clarke-subgradient"
    np.testing.assert_allclose(r.outputs, min_norm_hull([g1, g2]), atol=1e-15)
