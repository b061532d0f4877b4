"""gradsan.jax.subgradient: branch-locked backprop gives lim_{t->0+} grad f(x0 + t v)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj


def test_relu_minus_relu_is_one():
    g, report = gsj.subgradient(lambda x: jax.nn.relu(x) - jax.nn.relu(-x))(0.0)
    assert float(g) == 1.0
    assert float(jax.grad(lambda x: jax.nn.relu(x) - jax.nn.relu(-x))(0.0)) == 0.0
    assert {f.catalog_id for f in report.findings} == {"relu-at-zero"}
    assert report.ok


def test_smooth_function_is_plain_gradient():
    f = lambda x: jnp.sum(jnp.sin(x) * jnp.exp(x))
    x = jnp.arange(3.0)
    g, report = gsj.subgradient(f)(x)
    np.testing.assert_allclose(g, jax.grad(f)(x), rtol=1e-6)
    assert report.findings == []


def _direction(key, x):
    return jax.random.normal(jax.random.split(key)[1], jnp.shape(x), jnp.float32)


@pytest.mark.parametrize(
    "name,f,x0",
    [
        ("abs", lambda x: jnp.sum(jnp.abs(x * jnp.array([1.0, -2.0, 3.0]))), jnp.zeros(3)),
        ("max", lambda x: jnp.max(x * jnp.array([1.0, 2.0, 3.0])), jnp.zeros(3)),
        ("maximum", lambda x: jnp.sum(jnp.maximum(x, 2 * x[::-1])), jnp.zeros(3)),
        (
            "clip",
            lambda x: jnp.sum(jnp.clip(3 * x, 0.0, 1.0) * jnp.array([1.0, 2.0, 3.0])),
            jnp.zeros(3),
        ),
        ("sort", lambda x: jnp.sort(x * jnp.array([1.0, 2.0, 3.0]))[1], jnp.zeros(3)),
        ("where", lambda x: jnp.sum(jnp.where(x > 0, 2 * x, -x)), jnp.zeros(3)),
        ("floor", lambda x: jnp.sum(jnp.floor(x + 1.0) * x), jnp.zeros(3)),
        (
            "pool",
            lambda x: jnp.sum(
                jax.lax.reduce_window(
                    x * jnp.arange(1.0, 5.0), -jnp.inf, jax.lax.max, (2,), (1,), "VALID"
                )
            ),
            jnp.zeros(4),
        ),
        (
            "relu-net",
            lambda x: jnp.sum(jax.nn.relu(jnp.array([[1.0, -1.0], [2.0, 1.0]]) @ x)),
            jnp.zeros(2),
        ),
    ],
)
def test_limit_gradient_along_the_direction(name, f, x0):
    key = jax.random.PRNGKey(3)
    g, report = gsj.subgradient(f, key=key)(x0)
    assert report.findings, name
    # the same direction the function drew: the first split of the key
    v = np.asarray(_direction(key, x0), np.float64)
    with jax.enable_x64(True):
        x = np.asarray(x0, np.float64) + 1e-6 * v
        ref = np.asarray(jax.grad(f)(jnp.asarray(x)))
    np.testing.assert_allclose(np.asarray(g), ref, rtol=1e-5, atol=1e-6, err_msg=name)


def test_unbreakable_tie_is_reported_not_guessed():
    f = lambda x: jnp.where(x[0] ** 2 - x[1] ** 2 > 0, x[0], x[1])
    g, report = gsj.subgradient(f)(jnp.zeros(2))
    assert [f.kind for f in report.findings] == ["unresolved"]
    assert not report.ok


def test_first_order_tie_of_identical_candidates_is_harmless():
    g, report = gsj.subgradient(lambda x: jnp.maximum(x, x))(1.0)
    assert float(g) == 1.0
    (f,) = report.findings
    assert f.kind == "kink" and f.detail["unbroken"] == 1
