"""Suggested fixes are written with the user's own names."""

from gradsan import Frame
from gradsan._report._build import adapt_fix


def frame(code: str, expr: str) -> Frame:
    col = code.index(expr)
    return Frame("f.py", 3, col, "loss", code, col + len(expr))


def test_unary_operand_and_target():
    f = frame("    A = jnp.sqrt(A)", "jnp.sqrt(A)")
    assert adapt_fix("y = gradsan.jax.safe.sqrt(x)", f) == "A = gradsan.jax.safe.sqrt(A)"
    dw = "ok = x > 0\ny = jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0)"
    assert adapt_fix(dw, f) == "ok = A > 0\nA = jnp.where(ok, jnp.sqrt(jnp.where(ok, A, 1.0)), 0.0)"


def test_binary_operator():
    f = frame("    r = num / den", "num / den")
    assert adapt_fix("z = gradsan.jax.safe.div(x, y)", f) == "r = gradsan.jax.safe.div(num, den)"


def test_long_operand_is_bound_first():
    f = frame("    return jnp.sqrt(jnp.sum((A - A0) ** 2))", "jnp.sqrt(jnp.sum((A - A0) ** 2))")
    out = adapt_fix("y = gradsan.jax.safe.sqrt(x)", f)
    assert out == "y = gradsan.jax.safe.sqrt(jnp.sum((A - A0) ** 2))"
    dw = "ok = x > 0\ny = jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0)"
    assert adapt_fix(dw, f).splitlines()[0] == "x = jnp.sum((A - A0) ** 2)"


def test_unknown_shapes_are_left_alone():
    assert (
        adapt_fix("y = a ** (p / 2)", frame("    A = jnp.sqrt(A)", "jnp.sqrt(A)"))
        == "y = a ** (p / 2)"
    )
    assert adapt_fix("y = f(x)", None) == "y = f(x)"
