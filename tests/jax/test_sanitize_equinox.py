"""equinox's differentiation wrappers given to sanitize (session 15): filter_grad,
filter_value_and_grad, filter_jacfwd / filter_jacrev / filter_hessian (and under filter_jit)
are read as differentiating a known function, so their kinks are dependence-checked like
jax.grad's / jax.hessian's instead of listed unchecked (on main: every kink listed with the
"runs its own backward pass" line, softplus's inner max and abs included)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from tests.conftest import line_of

eqx = pytest.importorskip("equinox")


def relu_loss(x):
    return jnp.sum(jax.nn.relu(x))  # eq-relu


def softplus_loss(x):
    return jnp.sum(jax.nn.softplus(x))


def relu_aux(x):
    return jnp.sum(jax.nn.relu(x)), {"n": x.shape[0]}  # eq-aux


def _kinks(r):
    return [f for f in r.findings if f.kind in ("kink", "convention")]


def _unchecked(r):
    return any("listed without checking" in n for n in r.notes)


@pytest.mark.parametrize(
    "wrap",
    [
        eqx.filter_grad,
        lambda f: eqx.filter_jit(eqx.filter_grad(f)),
        lambda f: lambda x: eqx.filter_value_and_grad(f)(x)[1],
    ],
    ids=["filter_grad", "filter_jit(filter_grad)", "value_and_grad-in-lambda"],
)
def test_filter_grad_of_a_relu_loss_is_checked(wrap):
    fun = wrap(relu_loss)
    r = gsj.sanitize(fun)(jnp.zeros(3))
    assert [f.where.line for f in _kinks(r)] == [line_of("eq-relu")], r.notes
    np.testing.assert_array_equal(np.asarray(r.outputs), np.asarray(fun(jnp.zeros(3))))


def test_filter_grad_of_a_smooth_loss_has_no_finding():
    r = gsj.sanitize(eqx.filter_grad(softplus_loss))(jnp.zeros(3))
    assert _kinks(r) == [] and not _unchecked(r), (r.findings, r.notes)


def test_filter_value_and_grad_with_aux():
    r = gsj.sanitize(eqx.filter_value_and_grad(relu_aux, has_aux=True))(jnp.zeros(2))
    assert [f.where.line for f in _kinks(r)] == [line_of("eq-aux")]
    assert not _unchecked(r)


def test_filter_hessian_of_relu_is_flagged_with_the_jump():
    r = gsj.sanitize(eqx.filter_hessian(relu_loss))(jnp.zeros(3))
    assert [f.where.line for f in _kinks(r)] == [line_of("eq-relu")]
    assert any("the Jacobian of relu_loss" in n and "jumps" in n for n in r.notes), r.notes


def test_filter_hessian_of_a_smooth_loss_is_cleared():
    r = gsj.sanitize(eqx.filter_hessian(softplus_loss))(jnp.zeros(3))
    assert _kinks(r) == [], (r.findings, r.notes)
    assert any("the Jacobian of softplus_loss" in n and "differentiable" in n for n in r.notes)


def test_filter_jacfwd_of_filter_grad():
    # jacfwd(grad(relu(x)^2 / 2)) = jacfwd(relu): the gradient relu(x) has a kink at 0
    r = gsj.sanitize(
        eqx.filter_jacfwd(eqx.filter_grad(lambda x: jnp.sum(jax.nn.relu(x) ** 2) / 2))
    )(jnp.zeros(2))
    assert _kinks(r) and not _unchecked(r), r.notes
