"""norm over an ord x axis x keepdims grid (after optax's test_safe_norm), and eigh."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

ORDS = [None, "fro", "nuc", 1, 2, math.inf, -math.inf, 3]
AXES = [None, 0, 1, (0, 1)]


def _valid(ord, axis):
    matrix = axis in (None, (0, 1))
    if ord in ("fro", "nuc") and not matrix:
        return False
    if ord == 3 and matrix:
        return False
    return True


GRID = [(o, a, k) for o, a, k in itertools.product(ORDS, AXES, [False, True]) if _valid(o, a)]


@pytest.mark.parametrize("ord, axis, keepdims", GRID, ids=str)
def test_norm_grad_at_zero_is_zero(backend, ord, axis, keepdims):
    """The Jacobian at the zero matrix is exactly 0: the minimum-norm subgradient."""
    f = lambda s, xp, x: s.norm(x, ord=ord, axis=axis, keepdims=keepdims)
    jac = backend.jacobian(f, np.zeros((2, 3)))
    np.testing.assert_array_equal(jac, np.zeros_like(jac))


@pytest.mark.parametrize("ord, axis, keepdims", GRID, ids=str)
def test_norm_matches_naive_away_from_zero(backend, ord, axis, keepdims):
    """Same value bit for bit, and the naive gradient, at a generic point."""
    x = np.random.default_rng(1).normal(size=(2, 3))
    out = backend.value(lambda s, xp, a: s.norm(a, ord=ord, axis=axis, keepdims=keepdims), x)
    if backend.is_jax:
        import jax.numpy as jnp

        naive = lambda s, xp, a: jnp.linalg.norm(a, ord=ord, axis=axis, keepdims=keepdims)
    else:
        import torch

        naive = lambda s, xp, a: torch.linalg.norm(a, ord=ord, dim=axis, keepdim=keepdims)
    np.testing.assert_array_equal(out, backend.value(naive, x))
    (g,) = backend.grad(lambda s, xp, a: s.norm(a, ord=ord, axis=axis, keepdims=keepdims), x)
    (g0,) = backend.grad(naive, x)
    np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-12)


def test_norm_ties_split_equally(backend):
    x = np.array([[3.0, -3.0], [1.0, 1.0]])
    (g,) = backend.grad(lambda s, xp, a: s.norm(a, ord=2), x * 0 + np.eye(2) * 2)
    np.testing.assert_allclose(g, np.eye(2) / 2, atol=1e-14)  # repeated top singular value
    (g,) = backend.grad(lambda s, xp, a: s.norm(a, ord=math.inf, axis=1), x)
    np.testing.assert_array_equal(g, [[0.5, -0.5], [0.5, 0.5]])


def _projector_case():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    w = np.array([1.0, 1.0, 2.0, 5.0])  # repeated eigenvalue 1
    a = (q * w) @ q.T
    b = rng.normal(size=(4, 4))
    b = b + b.T
    return a, b, q, w


def test_eigh_projector_gradient_on_repeated_eigenvalues(backend):
    """``trace(P B)`` with ``P`` the projector on the repeated eigenspace: exact gradient."""
    a, b, q, w = _projector_case()

    def f(s, xp, x):
        _, v = s.eigh(x)
        p = v[:, :2] @ v[:, :2].T
        return (p * xp.asarray(b)).sum()

    (g,) = backend.grad(f, a)
    assert np.isfinite(g).all()
    # dP = sum_{i in S, j not in S} (q_i q_i^T dA q_j q_j^T + transpose) / (w_i - w_j)
    expected = np.zeros((4, 4))
    for i in (0, 1):
        for j in (2, 3):
            qi, qj = q[:, i : i + 1], q[:, j : j + 1]
            c = (qi.T @ b @ qj).item() / (w[i] - w[j])
            expected += c * (qi @ qj.T + qj @ qi.T)
    np.testing.assert_allclose(g, expected, atol=1e-10)


def test_eigh_matches_naive_on_distinct_eigenvalues(backend):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, 3))
    a = a + a.T
    cot = rng.normal(size=(3, 3))

    def f(s, xp, x):
        w, v = s.eigh(x)
        return w.sum() + (v[:, 0] * v[:, 0] * xp.asarray(cot[0])).sum()

    def naive(s, xp, x):
        w, v = xp.linalg.eigh((x + x.T) / 2)
        return w.sum() + (v[:, 0] * v[:, 0] * xp.asarray(cot[0])).sum()

    np.testing.assert_allclose(backend.grad(f, a)[0], backend.grad(naive, a)[0], atol=1e-10)
