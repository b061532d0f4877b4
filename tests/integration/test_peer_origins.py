"""Origins in equinox and flax code, as a user of those libraries reads them: equinox's
``error_if(on_error="nan")`` is named as the check that fired, at the user's call and with its
condition (not "already in the input: a constant holds nan"); a NaN born inside a library
module is located at the user's line that called into it, with the library function's public
name (``eqx.nn.MLP.__call__``, ``nnx.LayerNorm.__call__``), not ``equinox (call__)``."""

import pytest

eqx = pytest.importorskip("equinox")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import gradsan.jax as gsj  # noqa: E402
from tests.conftest import line_of  # noqa: E402


def checked(x):
    y = eqx.error_if(x, x < 0, "negative input", on_error="nan")  # the check
    return jnp.sum(y**2)


@eqx.filter_jit
def two_checks(x):
    y = eqx.error_if(
        x,
        jnp.any(x > 10),  # the multi-line check
        "too big",
    )
    z = eqx.error_if(x * 2, x < -5, "too small", on_error="nan")  # the second check
    return jnp.sum(y**2) + jnp.sum(z)


def test_error_if_nan_is_the_check_at_the_users_call():
    r = gsj.explain(jax.grad(checked))(jnp.array([1.0, -1.0]))
    (f,) = r.findings
    assert f.where.line == line_of("the check") and f.where.function == "checked"
    assert f.primitive == 'eqx.error_if (on_error="nan")'
    assert f.catalog_id != "nonfinite-input"
    text = str(r)
    assert "already in the input" not in text and "a constant holds" not in text
    assert "its condition `x < 0` held" in text.splitlines()[0]
    assert 'its message: "negative input"' in text
    assert 'on_error="raise"' in text
    # the forward value too (no grad)
    (g,) = gsj.explain(checked)(jnp.array([-1.0, 2.0])).findings
    assert g.where.line == line_of("the check") and g.primitive == f.primitive


def test_the_check_that_fired_among_several_under_filter_jit_and_vmap(monkeypatch):
    import equinox._errors as errors

    monkeypatch.setattr(errors, "EQX_ON_ERROR", "nan")  # the default on_error, from the env
    (f,) = gsj.explain(jax.grad(two_checks))(jnp.array([1.0, 11.0])).findings
    assert f.where.line == line_of("the multi-line check") - 2  # the call's first line
    assert f.primitive == "eqx.error_if (EQX_ON_ERROR=nan)"
    assert f.detail["note"] == "its condition `jnp.any(x > 10)` held"
    (g,) = gsj.explain(jax.vmap(two_checks))(jnp.array([[1.0, -11.0]])).findings
    assert g.where.line == line_of("the second check")
    assert g.detail["note"] == "its condition `x < -5` held"


def test_a_real_nan_next_to_an_error_if_is_still_the_real_one():
    def loss(x):
        y = eqx.error_if(x, x > 100, "too big", on_error="nan")  # fine here
        return jnp.sum(jnp.sqrt(y))  # the sqrt

    (f,) = gsj.explain(jax.grad(loss))(jnp.array([0.0, 1.0])).findings
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of("the sqrt")


def mlp_loss(model, x):
    return jnp.sum(model(x))  # the call into equinox


def test_origin_inside_an_equinox_module_is_the_users_call_with_the_library_named():
    mlp = eqx.nn.MLP(2, 1, 4, 1, activation=jnp.log, key=jax.random.key(0))
    r = gsj.explain(eqx.filter_grad(mlp_loss))(mlp, jnp.array([1.0, -3.0]))
    f = r.findings[0]
    assert f.where.line == line_of("the call into equinox") and f.where.function == "mlp_loss"
    assert f.library == "eqx.nn.MLP.__call__"
    assert "(inside eqx.nn.MLP.__call__) at " in str(r).splitlines()[0]
    assert "call__)" not in str(r).replace("__call__", "")
    ln = eqx.nn.LayerNorm(3, eps=0.0)
    (g,) = gsj.explain(eqx.filter_grad(mlp_loss))(ln, jnp.ones(3)).findings
    assert g.library == "eqx.nn.LayerNorm.__call__" and g.catalog_id == "rsqrt-at-zero"
    # through equinox's own vmap wrapper: still the module's function
    (h, *_) = gsj.explain(eqx.filter_grad(lambda m, x: jnp.sum(eqx.filter_vmap(m)(x))))(
        mlp, -jnp.ones((3, 2))
    ).findings
    assert h.library == "eqx.nn.MLP.__call__"


def test_origin_inside_flax_nnx_and_linen_modules():
    nnx = pytest.importorskip("flax.nnx")
    import flax.linen as nn

    ln = nnx.LayerNorm(3, epsilon=0.0, rngs=nnx.Rngs(0))

    def loss(m, x):
        return jnp.sum(m(x))  # the nnx call

    (f, *_) = gsj.explain(nnx.grad(loss))(ln, jnp.ones((1, 3))).findings
    assert f.library == "nnx.LayerNorm.__call__" and f.where.line == line_of("the nnx call")

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.LayerNorm(epsilon=0.0)(x)  # the linen call

    m = M()
    p = m.init(jax.random.key(0), jnp.ones((1, 3)))
    (g, *_) = gsj.explain(jax.grad(lambda p, x: jnp.sum(m.apply(p, x))))(
        p, jnp.ones((1, 3))
    ).findings
    # linen's method wrappers are skipped: the module's own function is named
    assert g.library == "flax.linen.LayerNorm.__call__"
    assert g.where.line == line_of("the linen call")
