"""Kinks in series (session 15): an earlier kink is flagged when it changes the gradient with
the later kinks at their one-sided choice, and counted when its output reaches the loss only
through a zero-slope side of the later ones. Each case's one-sided derivatives are derived by
hand in its comment and checked against difference quotients of the function itself; the
expected findings follow from them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from tests.conftest import line_of


def relu_relu(x):
    y = jax.nn.relu(x)  # rr-inner
    return jnp.sum(jax.nn.relu(y))  # rr-outer


def abs_relu(x):
    y = jax.nn.relu(x)  # ar-relu
    return jnp.sum(jnp.abs(y))  # ar-abs


def where_where(x):
    y = jnp.where(x > 0, x, 0.0)  # ww-inner
    return jnp.sum(jnp.where(y > 0, 2 * y, 0.0))  # ww-outer


def clamp_relu(x):
    y = jax.nn.relu(x)  # cr-relu
    return jnp.sum(jnp.clip(y - 1.0, 0.0, 1.0))  # cr-clamp


def relu_pool(x):
    y = jax.nn.relu(x)  # rp-relu
    p = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (2,), (2,), "VALID")  # rp-pool
    return jnp.sum(p * jnp.array([1.0, 3.0]))


def min_relu(x):
    y = jax.nn.relu(x)  # mr-relu
    return jnp.sum(jnp.minimum(y, 0.0))  # mr-min


# name: (function, point, {marker: flagged?}, one-sided derivatives along +-e_0 (left, right),
# JAX's derivative along e_0)
CASES = {
    # relu(relu(x)) = relu(x): slopes 0 | 1 at 0, JAX's 0 * 0 = 0; with the outer relu on the
    # side the inner moves to (slope 1), the inner's choice is the gradient, and the inner's
    # one-sided tangent 1 meets the outer's corner
    "relu-relu": (relu_relu, jnp.zeros(2), {"rr-inner": True, "rr-outer": True}, (0.0, 1.0), 0.0),
    # |relu(x)| = relu(x): relu moves only to y >= 0, where abs's slope is 1 = JAX's abs'(0):
    # abs's choice changes nothing along any direction; relu's does
    "abs-relu": (abs_relu, jnp.zeros(2), {"ar-relu": True, "ar-abs": False}, (0.0, 1.0), 0.0),
    # where(where(x > 0, x, 0) > 0, 2y, 0) = 2 relu(x): slopes 0 | 2, JAX's 0
    "where-where": (
        where_where,
        jnp.zeros(2),
        {"ww-inner": True, "ww-outer": True},
        (0.0, 2.0),
        0.0,
    ),
    # x = [0, 1]: relu at 0 in element 0 feeds clamp(-1) (below the bound: slope 0 for every
    # choice); clamp at its bound 0 in element 1 (slopes 0 | 1). Along e_0 nothing moves.
    "clamp-relu": (
        clamp_relu,
        jnp.array([0.0, 1.0]),
        {"cr-relu": False, "cr-clamp": True},
        (0.0, 0.0),
        0.0,
    ),
    # x = [1, 1, 0, 2]: the first window ties (1, 1), the relu at 0 (element 2) sits in a window
    # whose max is 2: its output only meets the pool's zero-slope side. Along e_2: 0 both sides.
    "relu-in-pool": (
        relu_pool,
        jnp.array([1.0, 1.0, 0.0, 2.0]),
        {"rp-relu": False, "rp-pool": True},
        None,
        None,
    ),
    # min(relu(x), 0) = 0 everywhere: both kinks undo each other (one-sided 0 | 0 = JAX's 0)
    "min-relu": (min_relu, jnp.zeros(2), {"mr-relu": False, "mr-min": False}, (0.0, 0.0), 0.0),
}


def _one_sided(f, x, i, h=1e-3):
    e = jnp.zeros_like(x).at[i].set(1.0)
    f0 = float(f(x))
    return ((f0 - float(f(x - h * e))) / h, (float(f(x + h * e)) - f0) / h)


@pytest.mark.parametrize("name", sorted(CASES))
def test_kinks_in_series(name):
    fun, x, want, sides, ad = CASES[name]
    if sides is not None:  # the hand derivation, against the function's difference quotients
        left, right = _one_sided(fun, x, 0)
        np.testing.assert_allclose((left, right), sides, atol=2e-3)
        assert float(jax.grad(fun)(x)[0]) == pytest.approx(ad)
    r = gsj.sanitize(jax.grad(fun))(x)
    got = {f.where.line for f in r.findings if f.kind in ("kink", "convention") and f.where}
    for marker, flagged in want.items():
        assert (line_of(marker) in got) == flagged, (marker, r.findings, r.notes)
    assert got <= {line_of(m) for m in want}
    np.testing.assert_array_equal(np.asarray(r.outputs), np.asarray(jax.grad(fun)(x)))
    if name in NOTES:  # why the kink left out was left out
        assert any(NOTES[name] in n for n in r.notes), r.notes


NOTES = {"clamp-relu": "no effect on the output", "min-relu": "one-sided derivatives equal to AD's"}


def test_a_failed_one_sided_pass_is_said(monkeypatch):
    from gradsan.jax import _series

    def fail(*a, **k):
        raise RuntimeError("not here")

    monkeypatch.setattr(_series, "probes", fail)
    r = gsj.sanitize(jax.grad(relu_relu))(jnp.zeros(2))
    assert any(
        "kinks in series were checked with the others at JAX's choice only" in n for n in r.notes
    )
