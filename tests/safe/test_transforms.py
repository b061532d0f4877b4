"""Transformations: vmap, jacfwd/jacrev, second derivatives (JAX); double backward and
torch.compile (PyTorch); hypothesis properties on both backends."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradsan.jax.safe as jsafe
import gradsan.torch.safe as tsafe


def test_jax_vmap_jacfwd_jacrev_agree_at_singular_points():
    x = jnp.array([0.0, 0.0, 1.0])
    for f in (jsafe.sqrt, jsafe.log, jsafe.cbrt, jsafe.arccos, lambda x: jsafe.xlogy(x, x)):
        fwd = jax.jit(jax.jacfwd(lambda x: jnp.sum(f(x))))(x)
        rev = jax.jit(jax.jacrev(lambda x: jnp.sum(f(x))))(x)
        vm = jax.vmap(jax.grad(f))(x)
        np.testing.assert_array_equal(fwd, rev)
        np.testing.assert_array_equal(fwd, vm)
    xs = jnp.zeros((4, 3))
    np.testing.assert_array_equal(jax.vmap(jax.grad(jsafe.norm))(xs), np.zeros((4, 3)))
    np.testing.assert_array_equal(jax.vmap(jax.grad(jsafe.std))(xs), np.zeros((4, 3)))


def test_jax_second_derivatives():
    # sinc: the true second derivative -pi**2/3 at 0
    np.testing.assert_allclose(jax.grad(jax.grad(jsafe.sinc))(0.0), -(math.pi**2) / 3, rtol=1e-14)
    # sqrt: finite (0) at 0, true away from it
    assert jax.grad(jax.grad(jsafe.sqrt))(0.0) == 0
    np.testing.assert_allclose(jax.grad(jax.grad(jsafe.sqrt))(4.0), -0.25 * 4.0**-1.5)
    # norm: Hessian at 0 is finite, the true (I - x x^T / n^2) / n elsewhere
    assert np.isfinite(jax.hessian(jsafe.norm)(jnp.zeros(3))).all()
    x = jnp.array([3.0, 4.0])
    np.testing.assert_allclose(
        jax.jit(jax.hessian(jsafe.norm))(x), (np.eye(2) - np.outer(x, x) / 25) / 5, rtol=1e-12
    )
    # std_eps standardize: second derivative at constant data finite
    h = jax.hessian(lambda x: jnp.sum(jnp.sin(jsafe.standardize(x, form="std_eps"))))(jnp.ones(3))
    assert np.isfinite(h).all()


def test_torch_double_backward():
    for f, x0, expected in (
        (tsafe.sinc, 0.0, -(math.pi**2) / 3),
        (tsafe.sqrt, 0.0, 0.0),
        (tsafe.sqrt, 4.0, -0.25 * 4.0**-1.5),
        (tsafe.log, 2.0, -0.25),
    ):
        x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        (h,) = torch.autograd.grad(g, x)
        np.testing.assert_allclose(h.item(), expected, rtol=1e-13)
    x = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    h = torch.autograd.functional.hessian(tsafe.norm, x)
    np.testing.assert_allclose(h.numpy(), (np.eye(2) - np.outer([3, 4], [3, 4]) / 25) / 5)


@pytest.mark.slow
def test_torch_compile():
    """sqrt and norm under torch.compile: the same values and gradients as eager."""
    try:
        fs = {
            "sqrt": lambda x: tsafe.sqrt(x).sum(),
            "norm": lambda x: tsafe.norm(x, axis=-1).sum(),
        }
        for name, f in fs.items():
            cf = torch.compile(f, backend="inductor")
            x = torch.tensor([[0.0, 4.0], [0.0, 0.0]], requires_grad=True)
            (g,) = torch.autograd.grad(cf(x), x)
            (g0,) = torch.autograd.grad(f(x), x)
            torch.testing.assert_close(g, g0, rtol=0, atol=0, msg=name)
    except Exception as e:  # noqa: BLE001
        if "compile" in type(e).__name__.lower() or "Backend" in type(e).__name__:
            pytest.skip(f"torch.compile is unavailable on this machine: {e!r:.200}")
        raise


# ------------------------------------------------------------------ hypothesis properties

# name: (jax naive, torch naive, domain (lo, hi) away from the singular points)
PROPS = {
    "sqrt": (jnp.sqrt, torch.sqrt, (1e-3, 1e3)),
    "log": (jnp.log, torch.log, (1e-3, 1e3)),
    "cbrt": (jnp.cbrt, None, (1e-3, 1e3)),
    "arccos": (jnp.arccos, torch.arccos, (-0.999, 0.999)),
    "arcsin": (jnp.arcsin, torch.arcsin, (-0.999, 0.999)),
    "arctanh": (jnp.arctanh, torch.arctanh, (-0.999, 0.999)),
    "sinc": (jnp.sinc, torch.sinc, (0.6, 50.0)),
    "abs": (jnp.abs, torch.abs, (1e-3, 1e3)),
}

_eager = {name: jax.jit(jax.vmap(jax.grad(getattr(jsafe, name)))) for name in PROPS}
_naive = {name: jax.jit(jax.vmap(jax.grad(v[0]))) for name, v in PROPS.items()}


@pytest.mark.parametrize("name", sorted(PROPS))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_property_equals_naive(name, data):
    jnaive, tnaive, (lo, hi) = PROPS[name]
    sign = data.draw(st.sampled_from([1.0, -1.0])) if name in ("abs", "sinc", "cbrt") else 1.0
    x = sign * data.draw(hnp.arrays(np.float64, 6, elements=st.floats(lo, hi)))
    # values: bit-identical to the naive function on both backends
    np.testing.assert_array_equal(getattr(jsafe, name)(x), jnaive(x))
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    ty = getattr(tsafe, name)(tx)
    if tnaive is not None:
        assert torch.equal(ty, tnaive(torch.from_numpy(x.copy())))
    # gradients: agree with the naive ones and across backends
    g = np.asarray(_eager[name](x))
    np.testing.assert_allclose(g, np.asarray(_naive[name](x)), rtol=1e-10)
    (tg,) = torch.autograd.grad(ty.sum(), tx)
    np.testing.assert_allclose(tg.numpy(), g, rtol=1e-10)


@settings(max_examples=15, deadline=None)
@given(
    hnp.arrays(np.float64, (3, 4), elements=st.floats(-100, 100, allow_subnormal=False)),
    st.sampled_from([None, 0, 1, -1]),
)
def test_property_norm_std_and_binary(x, axis):
    x = x + np.arange(12).reshape(3, 4)  # keep away from the zero vector / constant rows
    for f, naive in (
        (lambda m, a: m.norm(a, axis=axis), lambda a: jnp.linalg.norm(a, axis=axis)),
        (lambda m, a: m.std(a, axis=axis), lambda a: jnp.std(a, axis=axis)),
    ):
        np.testing.assert_array_equal(f(jsafe, x), naive(x))
        g = jax.grad(lambda a: jnp.sum(f(jsafe, a)))(x)
        np.testing.assert_allclose(
            g, jax.grad(lambda a: jnp.sum(naive(a)))(x), rtol=1e-9, atol=1e-12
        )
        tx = torch.from_numpy(x.copy()).requires_grad_(True)
        (tg,) = torch.autograd.grad(f(tsafe, tx).sum(), tx)
        np.testing.assert_allclose(tg.numpy(), g, rtol=1e-9, atol=1e-12)
    y = np.abs(x[::-1]) + 0.5  # away from div's singular point y = 0
    for name in ("atan2", "hypot", "div"):
        np.testing.assert_allclose(
            getattr(jsafe, name)(x, y),
            getattr(tsafe, name)(torch.tensor(x), torch.tensor(y)),
            rtol=1e-15,
            atol=np.finfo(np.float64).tiny,  # XLA:CPU flushes subnormals, torch not
        )
    np.testing.assert_array_equal(jsafe.atan2(x, y), jnp.arctan2(x, y))
    np.testing.assert_array_equal(jsafe.hypot(x, y), jnp.hypot(x, y))
    np.testing.assert_array_equal(jsafe.div(x, y), jnp.asarray(x) / jnp.asarray(y))
