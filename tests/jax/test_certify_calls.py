"""gradsan.jax.certify as people call it (issue 17): on a function with Python control flow on a
traced value (a clear UsageError naming the user's line; a branch on a static value or on
the data works), called inside jax.jit / vmap / grad or on a function closing over an outer
tracer (a clear UsageError), and on jitted functions, with static_argnums / static_argnames."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from gradsan import UsageError
from tests.conftest import line_of

HERE = __file__


def label(report):
    (f,) = report.findings
    assert f.kind == "certified"
    return f.detail["label"]


def branchy(x):
    if x.sum() > 0:  # a branch on the parameters
        return jnp.sum(jnp.sqrt(x))
    return jnp.sum(x**2)


def converts(x):
    return jnp.sum(x) * int(x[0])  # a conversion of a traced value


@pytest.mark.parametrize(
    "fun, where, text",
    [
        (branchy, "branchy", "a branch on the parameters"),
        (jax.grad(branchy), "branchy", "a branch on the parameters"),
        (converts, "converts", "a conversion of a traced value"),
    ],
    ids=["if", "grad-of-if", "int"],
)
def test_python_control_flow_on_the_parameters_names_the_users_line(fun, where, text):
    with pytest.raises(UsageError) as e:
        gsj.certify(fun)(jnp.ones(3))
    msg = str(e.value)
    assert f"{HERE}:{line_of(HERE, text)} ({where})" in msg
    assert "jnp.where" in msg and "jax.lax.cond" in msg
    assert "_api.py" not in msg and "Tracer" not in msg  # nothing of gradsan's or JAX's


def test_a_branch_on_a_static_value_or_on_the_data_works():
    """certify traces the parameters only: a branch on a Python argument or on a data array is
    followed at its value, as when the function runs eagerly."""

    def loss(w, n):
        if n > 1:
            return jnp.sum(w**n)
        return jnp.sum(w)

    def loss_data(w, scale):
        if scale > 0:  # scale is a jax array, but data: its value is known
            return jnp.sum(jnp.sqrt(w**2) * scale)
        return jnp.sum(w)

    r = gsj.certify(loss)(jnp.full(2, 3.0), 2)
    assert label(r) == "gradient" and np.allclose(np.asarray(r.outputs), 6.0)
    r = gsj.certify(loss)(jnp.full(2, 3.0), 1)
    assert label(r) == "gradient" and np.allclose(np.asarray(r.outputs), 1.0)
    r = gsj.certify(loss_data)(jnp.zeros(1), jnp.float32(2.0))
    assert label(r) == "clarke-subgradient"  # |w| * 2 at 0: the kink, certified
    r = gsj.certify(loss_data)(jnp.zeros(1), jnp.float32(-2.0))
    assert label(r) == "gradient" and np.allclose(np.asarray(r.outputs), 1.0)


def smooth(x):
    return jnp.sum(jnp.sqrt(x**2 + 1.0))


@pytest.mark.parametrize(
    "transform",
    [
        lambda c: jax.jit(c),
        lambda c: jax.vmap(c),
        lambda c: jax.grad(lambda x: c(x).sum()),
    ],
    ids=["jit", "vmap", "grad"],
)
def test_certify_inside_a_transformation_is_a_clear_error(transform):
    def call(x):
        return gsj.certify(smooth)(x).outputs

    with pytest.raises(UsageError) as e:
        transform(call)(jnp.ones((2, 3)))
    assert "inside a JAX transformation" in str(e.value)
    assert "Call it outside" in str(e.value)


@pytest.mark.parametrize("with_data", [False, True], ids=["params", "params-and-data"])
def test_certify_of_a_function_closing_over_an_outer_tracer_is_a_clear_error(with_data):
    def outer(y):
        if with_data:
            report = gsj.certify(lambda w, d: jnp.sum(w * d * y))(np.ones(3), np.ones(3))
        else:
            report = gsj.certify(lambda w: jnp.sum(jnp.sqrt(w * y)))(np.ones(3))
        return report.outputs

    with pytest.raises(UsageError) as e:
        jax.jit(outer)(2.0)
    assert "closes over a value traced by an enclosing transformation" in str(e.value)


def kinked(x):
    return jnp.sum(jnp.sqrt(x**2)) + jnp.sum(jnp.sin(x))


@pytest.mark.parametrize(
    "wrap",
    [jax.jit, lambda f: jax.grad(jax.jit(f)), lambda f: jax.jit(jax.grad(f))],
    ids=["jit", "grad-of-jit", "jit-of-grad"],
)
def test_certify_of_a_jitted_function_is_certify_of_the_function(wrap):
    for x0, want in ((jnp.full(2, 0.5), "gradient"), (jnp.zeros(2), "clarke-subgradient")):
        plain, jitted = gsj.certify(kinked)(x0), gsj.certify(wrap(kinked))(x0)
        assert label(plain) == label(jitted) == want
        if want == "gradient":
            x = np.asarray(x0, np.float64)
            expect = np.sign(x) + np.cos(x)
            assert np.allclose(np.asarray(jitted.outputs), expect, rtol=1e-12)
            assert np.array_equal(np.asarray(plain.outputs), np.asarray(jitted.outputs))


def powered(x, n, *, shift=0.0):
    return jnp.sum((x - shift) ** n)


@pytest.mark.parametrize(
    "make, call, shift",
    [
        (lambda: jax.jit(powered, static_argnums=1), lambda f, x: f(x, 3), 0.0),
        (lambda: jax.jit(powered, static_argnames="n"), lambda f, x: f(x, n=3), 0.0),
        (
            lambda: jax.grad(jax.jit(powered, static_argnums=1, static_argnames="shift")),
            lambda f, x: f(x, 3, shift=1.0),
            1.0,
        ),
    ],
    ids=["static_argnums", "static_argnames", "grad-of-jit-static-shift"],
)
def test_certify_with_static_arguments(make, call, shift):
    x0 = jnp.array([2.0, 3.0])
    got = call(gsj.certify(make()), x0)
    want = gsj.certify(functools.partial(powered, n=3, shift=shift))(x0)
    assert label(got) == label(want) == "gradient"
    assert np.allclose(np.asarray(got.outputs), 3 * (np.asarray(x0) - shift) ** 2, rtol=1e-12)
    assert np.array_equal(np.asarray(got.outputs), np.asarray(want.outputs))
