"""Issue 15: sanitize flags a kink only when the gradient depends on it.

Clean controls (the gradient is exact there): no finding, and the checked ties are counted in
a note. Real kinks: flagged at the user's line. NaN cases: still located."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from tests.conftest import line_of


def kinks(report):
    return [f for f in report.findings if f.kind in ("kink", "convention")]


def _optax():
    return pytest.importorskip("optax")


CLEAN = {
    "softplus": (lambda x: jnp.sum(jax.nn.softplus(x)), (jnp.zeros(3),)),
    "logaddexp": (lambda x, y: jnp.sum(jnp.logaddexp(x, y)), (jnp.ones(2), jnp.ones(2))),
    "relu-rule-through-custom-jvp": (lambda x: jnp.sum(jax.nn.log_sigmoid(x)), (jnp.zeros(2),)),
    "elu-alpha-1": (lambda x: jnp.sum(jax.nn.elu(x, alpha=1.0)), (jnp.zeros(2),)),
    "sparse_plus": (lambda x: jnp.sum(jax.nn.sparse_plus(x)), (jnp.array([-1.0, 1.0]),)),
    "switch-index-clamp": (
        lambda i, x: jax.lax.switch(i, [lambda v: 2 * v, lambda v: v**2], x),
        (1, 3.0),
    ),
    "masked-softmax-max": (
        lambda s: jnp.sum(
            jax.nn.softmax(s, where=jnp.array([[True, True], [False, False]])) * s,
            where=jnp.array([[True, True], [False, False]]),
        ),
        (jnp.ones((2, 2)),),
    ),
    "straight-through-floor": (
        lambda x: jnp.sum((x + jax.lax.stop_gradient(jnp.floor(x) - x)) ** 2),
        (jnp.array([1.0, 2.0]),),
    ),
    "same-function-tie": (lambda x: jnp.maximum(2 * x, x + x), (1.5,)),
}


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_controls_have_no_findings(name):
    fun, args = CLEAN[name]
    argnums = 1 if name == "switch-index-clamp" else 0
    r = gsj.sanitize(jax.grad(fun, argnums=argnums))(*args)
    assert kinks(r) == [], [(f.catalog_id, f.where) for f in r.findings]
    np.testing.assert_allclose(r.outputs, jax.grad(fun, argnums=argnums)(*args))


@pytest.mark.slow  # several programs, each traced and checked
def test_library_clean_controls():
    optax = _optax()
    progs = [
        (lambda p: jnp.mean(optax.losses.log_cosh(p)), jnp.zeros(3)),
        (lambda p: jnp.mean(optax.losses.huber_loss(p, delta=1.0)), jnp.array([1.0, -1.0])),
        (
            lambda x: jnp.sum(optax.projections.projection_simplex(x) ** 2 * jnp.arange(3.0)),
            jnp.full(3, 0.5),
        ),
    ]
    for fun, x in progs:
        r = gsj.sanitize(jax.grad(fun))(x)
        assert kinks(r) == [], [(f.catalog_id, f.where) for f in r.findings]
        assert r.notes and "left out" in r.notes[-1], r.notes


def test_layernorm_zero_row_is_clean():
    nn = pytest.importorskip("flax.linen")
    ln = nn.LayerNorm()
    x = jnp.zeros((2, 4)).at[0].set(jnp.arange(4.0))
    p = ln.init(jax.random.PRNGKey(0), x)
    r = gsj.sanitize(jax.grad(lambda x: jnp.sum(ln.apply(p, x) ** 2)))(x)
    assert kinks(r) == []
    assert any("no effect on the output" in n or "same function" in n for n in r.notes)


def test_loss_function_directly_is_checked_too():
    r = gsj.sanitize(lambda x: jnp.sum(jax.nn.softplus(x)))(jnp.zeros(3))
    assert kinks(r) == []


# -- real kinks: flagged at their line --------------------------------------------------------


@pytest.mark.slow  # several programs, each traced and checked
def test_real_kinks_are_flagged_at_their_lines():
    def l1(p):
        return jnp.mean(jnp.abs(p - 1.0))  # k-abs

    def leaky(x):
        return jnp.sum(jnp.where(x > 0, x, 0.1 * x))  # k-where

    def jump(x):
        return jnp.sum(jnp.where(x > 0, 1.0 + x, x))  # k-jump

    def relu(x):
        return jnp.sum(jax.nn.relu(x))  # k-relu

    def signx(x):
        return jnp.sign(x) * x  # k-sign

    def i0(t):
        return jax.scipy.special.i0(2 * t - 1)  # k-i0

    def coupled(x):
        return jnp.sum(jax.nn.elu(x)) + jnp.sum(jax.nn.relu(x))  # k-coupled

    cases = [
        (l1, jnp.ones(2), "abs-at-zero", "k-abs"),
        (leaky, jnp.zeros(2), "where-at-boundary", "k-where"),
        (jump, jnp.zeros(1), "where-at-boundary", "k-jump"),
        (relu, jnp.zeros(2), "relu-at-zero", "k-relu"),
        (signx, 0.0, "sign-at-zero", "k-sign"),
        (i0, 0.5, "abs-at-zero", "k-i0"),  # JAX's gradient of I0 at 0 is 1.0, not 0
        (coupled, jnp.zeros(2), "relu-at-zero", "k-coupled"),
    ]
    for fun, x, entry, marker in cases:
        r = gsj.sanitize(jax.grad(fun))(x)
        got = {(f.catalog_id, f.where.line) for f in kinks(r) if f.where}
        assert (entry, line_of(marker)) in got, (marker, got)


def test_jump_is_told_from_a_kink():
    r = gsj.sanitize(jax.grad(lambda x: jnp.sum(jnp.where(x > 0, 1.0 + x, x))))(jnp.zeros(1))
    (f,) = kinks(r)
    assert f.detail["branches_agree"] is False and f.detail["admissible"] is False


@pytest.mark.slow  # several programs, each traced and checked
def test_small_kink_among_large_smooth_terms_is_kept():
    x = jnp.concatenate([jnp.zeros(1), jnp.linspace(1.0, 3.0, 200)])
    r = gsj.sanitize(jax.grad(lambda x: jnp.sum(jax.nn.relu(x)) + 1e4 * jnp.sum(x**2)))(x)
    assert [f.catalog_id for f in kinks(r)] == ["relu-at-zero"]


# -- NaN cases: still located ------------------------------------------------------------------


def test_nan_cases_are_still_located():
    def f(x):
        return jnp.linalg.norm(x)  # n-norm

    r = gsj.sanitize(jax.grad(f))(jnp.zeros(3))
    assert any(f.kind == "nonfinite" and f.where.line == line_of("n-norm") for f in r.findings)

    def g(x):
        return jnp.sqrt(x) + jnp.abs(x)  # n-sqrt

    r = gsj.sanitize(jax.grad(g))(0.0)
    lines = {(f.kind, f.where.line) for f in r.findings if f.where}
    assert ("nonfinite", line_of("n-sqrt")) in lines and ("kink", line_of("n-sqrt")) in lines


def test_own_backward_pass_is_said_not_checked():
    r = gsj.sanitize(lambda x: jax.grad(lambda y: jnp.abs(y))(x))(0.0)
    assert [f.catalog_id for f in kinks(r)] == ["abs-at-zero"]
    assert any("own backward pass" in n for n in r.notes), r.notes
