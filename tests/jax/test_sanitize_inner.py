"""Issue 15: sanitize of a program that differentiates a gradient (jax.hessian, jax.jacfwd of
jax.grad, jax.grad of a gradient penalty). The function differentiated runs its own backward
pass; its derivative is AD's exactly where it is differentiable at the point. relu'' = 0 almost
everywhere, but relu' jumps at 0: the Hessian of a relu program at 0 does not exist (AD's 0 is
a convention) and is flagged; a smooth program (softplus, whose logaddexp has max/abs inside
its primal) is checked and left out."""

import jax
import jax.numpy as jnp

import gradsan.jax as gsj
from tests.conftest import line_of

W = jnp.array([1.0, 2.0, 3.0])
X0 = jnp.array([0.0, 1.0, -1.0])


def f_relu(x):
    return jnp.sum(jax.nn.relu(x) * W)  # relu line


def f_half_square(x):
    return jnp.sum(jax.nn.relu(x) ** 2 * W) / 2  # half square line


def f_softplus(x):
    return jnp.sum(jax.nn.softplus(x) * W)


def _kinks(r):
    return [f for f in r.findings if f.kind in ("kink", "convention")]


def test_hessian_of_relu_at_zero_is_flagged_its_gradient_jumps():
    for fun in (jax.hessian(f_relu), jax.jit(jax.hessian(f_relu))):
        r = gsj.sanitize(fun)(X0)
        (f,) = _kinks(r)
        assert f.catalog_id == "relu-at-zero" and f.where.line == line_of("relu line")
        (note,) = r.notes
        assert "the Jacobian of f_relu" in note and "jumps at the point" in note


def test_hessian_of_a_kink_of_the_gradient_is_flagged():
    # relu(x)**2 / 2: its gradient relu(x) is continuous with a corner at 0
    r = gsj.sanitize(jax.jacfwd(jax.grad(f_half_square)))(X0)
    assert [f.where.line for f in _kinks(r)] == [line_of("half square line")]
    (note,) = r.notes
    assert "one-sided derivatives" in note


def test_hessian_of_a_smooth_program_has_no_flag():
    r = gsj.sanitize(jax.hessian(f_softplus))(X0)
    assert _kinks(r) == []
    (note,) = r.notes
    assert note.startswith("2 kink(s) or tie(s) checked and left out") and "f_softplus" in note


def test_gradient_penalty_through_a_jump_is_flagged_smooth_one_is_not():
    def penalty(x):
        return jnp.sum(jax.grad(f_relu)(x) ** 2)

    def smooth_penalty(x):
        return jnp.sum(jax.grad(f_softplus)(x) ** 2)

    r = gsj.sanitize(jax.grad(penalty))(X0)
    assert [f.where.line for f in _kinks(r)] == [line_of("relu line")]
    assert any("penalty" in n and "jumps" in n for n in r.notes), r.notes
    r = gsj.sanitize(jax.grad(smooth_penalty))(X0)
    assert _kinks(r) == [] and "checked and left out" in r.notes[0]


def test_outputs_that_are_a_derivative_already_are_said_not_checked():
    """jax.jvp of jax.grad inside the function: its outputs are the outer derivative itself,
    so checking them cannot tell (the Hessian of relu is 0 along every direction): listed,
    with the line that says why."""
    r = gsj.sanitize(lambda x: jax.jvp(jax.grad(f_relu), (x,), (jnp.ones(3),))[1])(X0)
    assert [f.catalog_id for f in _kinks(r)] == ["relu-at-zero"]
    assert any("a check of the outputs cannot tell" in n for n in r.notes)
