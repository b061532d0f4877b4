"""certify through decompositions and solves (lu, custom_linear_solve, cholesky, eigh, svd, qr):
analytic where non-degenerate, expanded along the ray by nested JVPs and labelled "unverified";
at a degenerate point (repeated eigenvalues, a zero singular value) undecided, never a number
from a Taylor expansion that does not exist there."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import gradsan.jax as gsj  # noqa: E402

# slow: decompositions through nested-JVP Taylor series (~75 s)
pytestmark = pytest.mark.slow

_rng = np.random.default_rng(1)
_A = _rng.standard_normal((3, 3))
M = _A @ _A.T + 3 * np.eye(3)

SMOOTH = {
    "inv": (lambda x: jnp.sum(jnp.linalg.inv(M + x.reshape(3, 3)) ** 2), {"lu"}),
    "solve": (
        lambda x: jnp.sum(jnp.linalg.solve(M + x.reshape(3, 3), jnp.arange(3.0)) ** 3),
        {"lu", "custom_linear_solve"},
    ),
    "cholesky": (
        lambda x: jnp.sum(jnp.tanh(jnp.linalg.cholesky(M + x.reshape(3, 3) @ x.reshape(3, 3).T))),
        {"cholesky"},
    ),
    "eigvalsh": (
        lambda x: jnp.sum(jnp.linalg.eigvalsh(M + x.reshape(3, 3) + x.reshape(3, 3).T) ** 2),
        {"eigh"},
    ),
    "eigh vectors": (
        lambda x: jnp.sum(
            jnp.abs(jnp.linalg.eigh(M + x.reshape(3, 3) + x.reshape(3, 3).T)[1][:, 0]) ** 3
        ),
        {"eigh"},
    ),
    "svd": (lambda x: jnp.sum(jnp.linalg.svd(M + x.reshape(3, 3), compute_uv=False) ** 3), {"svd"}),
    "qr": (lambda x: jnp.sum(jnp.linalg.qr(M + x.reshape(3, 3))[1] ** 2), {"qr"}),
    "slogdet": (lambda x: jnp.linalg.slogdet(M + x.reshape(3, 3))[1], {"lu"}),
}


@pytest.mark.parametrize("name", sorted(SMOOTH))
def test_decompositions_at_smooth_points_are_jax_grad(name):
    f, prims = SMOOTH[name]
    x = jnp.asarray(0.1 * np.random.default_rng(2).standard_normal(9))
    with jax.enable_x64(True):
        want = np.asarray(jax.grad(f)(jnp.asarray(x, jnp.float64)))
    for fun in (f, jax.grad(f)):
        r = gsj.certify(fun)(x)
        d = r.findings[0].detail
        assert d["label"] == "gradient"
        assert prims <= set(d["unverified"])
        np.testing.assert_allclose(np.asarray(r.outputs), want, rtol=1e-9, atol=1e-12)


def test_a_kink_after_a_solve_is_a_clarke_subgradient():
    """|| M^-1 x || at x = 0: per ray the gradient limit is the one-sided gradient nearby."""
    f = lambda x: jnp.linalg.norm(jnp.linalg.solve(M, x))  # noqa: E731
    v = np.array([1.0, -2.0, 0.5])
    r = gsj.certify(f, directions=[v, -v])(jnp.zeros(3))
    d = r.findings[0].detail
    assert d["label"] == "clarke-subgradient"
    with jax.enable_x64(True):
        for s, ray in zip((1.0, -1.0), d["verdicts"]):
            near = np.asarray(jax.grad(f)(jnp.asarray(1e-7 * s * v)))
            np.testing.assert_allclose(ray["gradient"][0], near, rtol=1e-6)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: jnp.linalg.eigvalsh(jnp.eye(2) + x.reshape(2, 2) + x.reshape(2, 2).T)[-1],
        lambda x: jnp.linalg.svd(x.reshape(2, 2), compute_uv=False)[0],
        lambda x: jnp.sum(
            jnp.linalg.svd(jnp.diag(jnp.array([1.0, 0.0])) + x.reshape(2, 2), compute_uv=False)
        ),
    ],
    ids=["max-eigenvalue-at-identity", "svd-at-zero", "nuclear-norm-at-rank-1"],
)
def test_degenerate_decompositions_are_undecided(f):
    """The largest eigenvalue of I + S is a kink at S = 0; singular values are abs-like at 0. A
    Taylor expansion in the fixed basis of x0 would return a wrong number: undecided instead."""
    r = gsj.certify(f)(jnp.zeros(4))
    d = r.findings[0].detail
    assert d["label"] == "undecided" and r.outputs is None
    assert "not analytic" in d["certificate"]


def test_expm_at_zero_decides_its_branch():
    """expm picks its Pade degree from ceil(log2(|A| / theta)): at A = 0 that is ceil of log t,
    which tends to -inf, so the smallest degree is taken; the gradient of sum(expm(A)^2) at 0
    is 2 I."""
    f = lambda x: jnp.sum(jax.scipy.linalg.expm(x.reshape(2, 2)) ** 2)  # noqa: E731
    r = gsj.certify(f)(jnp.zeros(4))
    assert r.findings[0].detail["label"] == "gradient"
    np.testing.assert_allclose(np.asarray(r.outputs), [2.0, 0.0, 0.0, 2.0], atol=1e-12)
