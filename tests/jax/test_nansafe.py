"""gradsan.jax.nansafe: structural zeros repaired with a proof (G3), numerical zeros never
silently set to 0 (G6), the strong-zero convention labelled, finite programs bit-identical."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import gradsan.jax as gsj
from tests.conftest import line_of


def bits(tree):
    return [
        np.atleast_1d(np.asarray(x)).view(np.uint8).tobytes()
        for x in jax.tree_util.tree_leaves(tree)
    ]


# -- the where trap: structural zeros give the analytic gradient exactly ---------------------------


def where_sqrt(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))  # L:where_sqrt


def where_log(x):
    return jnp.sum(jnp.where(x > 0, jnp.log(x), 0.0))


def where_div(x):
    return jnp.sum(jnp.where(x > 0, 1.0 / x, 0.0))


def where_arcsin(x):
    return jnp.sum(jnp.where(jnp.abs(x) < 1, jnp.arcsin(x), 0.0))


TRAPS = [
    (where_sqrt, [-1.0, 4.0, -2.5], lambda x: np.where(x > 0, 0.5 / np.sqrt(np.abs(x)), 0.0)),
    (where_log, [-1.0, 2.0, -3.0], lambda x: np.where(x > 0, 1.0 / np.abs(x), 0.0)),
    (where_div, [-1.0, 2.0, 0.0], None),
    (
        where_arcsin,
        [2.0, 0.5, -3.0],
        lambda x: np.where(np.abs(x) < 1, 1.0 / np.sqrt(np.abs(1 - x * x)), 0.0),
    ),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fun,xs,truth", TRAPS, ids=[t[0].__name__ for t in TRAPS])
def test_where_trap_gives_the_analytic_gradient(fun, xs, truth, dtype, maybe_jit):
    with jax.enable_x64(dtype == "float64"):
        x = jnp.asarray(xs, dtype=dtype)
        plain = jax.grad(fun)(x)
        out = maybe_jit(gsj.nansafe(jax.grad(fun)))(x)
        assert out.dtype == x.dtype
        if truth is None:  # 1/x at 0 is a genuine pole: only the structural entries change
            assert np.isfinite(np.asarray(out)[:2]).all()
            np.testing.assert_array_equal(out[1], plain[1])
            return
        want = truth(np.asarray(xs, dtype=np.float64)).astype(dtype)
        assert np.isfinite(np.asarray(out)).all()
        np.testing.assert_allclose(
            np.asarray(out), want, rtol=1e-6 if dtype == "float32" else 1e-12
        )
        # the entries plain AD got right are untouched, bit for bit
        ok = np.isfinite(np.asarray(plain))
        np.testing.assert_array_equal(np.asarray(out)[ok], np.asarray(plain)[ok])


def test_where_trap_report_names_the_rule_and_the_line():
    x = jnp.asarray([-1.0, 4.0])
    out, rep = gsj.nansafe(jax.grad(where_sqrt), report=True)(x)
    np.testing.assert_array_equal(out, [0.0, 0.25])
    (f,) = rep.findings
    assert f.kind == "resolved"
    assert f.where.line == line_of("L:where_sqrt")
    assert f.primitive == "sqrt" and f.catalog_id == "sqrt-at-zero"
    assert "structural zero: unselected where branch, margin 1" in f.detail["rule"]
    assert f.detail["repaired"] == 1 and f.detail["proven"] is True
    assert rep.ok


# -- numerical zeros: never a silent wrong finite number ---------------------------------------


def sqrt_sqrt(x):
    return jnp.sqrt(x) * jnp.sqrt(x)  # L:sqrt_sqrt


def exp_log(x):
    return jnp.exp(jnp.log(x))


def cbrt_cubed(x):
    return jnp.cbrt(x) ** 3


def pow_pow(x):
    return x**0.3 * x**0.7


def sqrt_norm(x):
    return jnp.sqrt(jnp.linalg.norm(jnp.stack([x, x])))  # L:sqrt_norm


def where_boundary(x):
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


def x_sqrt_x(x):
    return x * jnp.sqrt(x)


NUMERICAL = [sqrt_sqrt, exp_log, cbrt_cubed, pow_pow, sqrt_norm, where_boundary, x_sqrt_x]
# strong-zero convention values at 0 (theory.md 6.3): all 0, none proven
STRONG = {
    sqrt_sqrt: 0.0,
    exp_log: 0.0,
    cbrt_cubed: 0.0,
    pow_pow: 0.0,
    sqrt_norm: 0.0,
    where_boundary: 0.0,
    x_sqrt_x: 0.0,
}


# the true one-sided derivative at 0 along t > 0 (theory.md 6.3), or None where there is none
# (sqrt(norm) and where at its boundary have an infinite slope)
TRUE = {
    sqrt_sqrt: 1.0,
    exp_log: 1.0,
    cbrt_cubed: 1.0,
    pow_pow: 1.0,
    x_sqrt_x: 0.0,
    sqrt_norm: None,
    where_boundary: None,
}


@pytest.mark.parametrize("fun", NUMERICAL, ids=[f.__name__ for f in NUMERICAL])
def test_numerical_zero_is_never_a_silent_wrong_number(fun, maybe_jit):
    x = jnp.asarray(0.0)
    if maybe_jit is jax.jit:  # the limit engine runs on the host, through a callback
        out = np.asarray(jax.jit(gsj.nansafe(jax.grad(fun)))(x))
        if TRUE[fun] is None:
            assert not np.isfinite(out)
        else:
            np.testing.assert_allclose(out, TRUE[fun], atol=1e-6)
        return
    out, rep = gsj.nansafe(jax.grad(fun), report=True)(x)
    if TRUE[fun] is None:
        assert not np.isfinite(np.asarray(out))
        assert {f.kind for f in rep.findings} == {"unresolved"}, rep.findings
        assert not rep.ok
        for f in rep.findings:
            assert "certify" in f.detail["note"] and f.catalog_id is not None
    else:  # certified by the limit engine, and labelled so
        np.testing.assert_allclose(float(out), TRUE[fun], atol=1e-6)
        [f] = [f for f in rep.findings if f.kind == "resolved"]
        assert f.detail["rule"].startswith("limit engine")
        assert rep.ok


def test_unresolved_finding_has_user_line_and_catalog_entry():
    _, rep = gsj.nansafe(jax.grad(sqrt_norm), report=True)(jnp.asarray(0.0))
    assert rep.findings
    for f in rep.findings:
        assert f.where.line == line_of("L:sqrt_norm")
        assert f.primitive in ("sqrt", "norm") and f.catalog_id in ("sqrt-at-zero", "norm-at-zero")


@pytest.mark.parametrize("fun", NUMERICAL, ids=[f.__name__ for f in NUMERICAL])
def test_strong_zero_mode_returns_the_labelled_convention(fun, maybe_jit):
    x = jnp.asarray(0.0)
    if maybe_jit is jax.jit:
        assert float(jax.jit(gsj.nansafe(jax.grad(fun), mode="strong_zero"))(x)) == STRONG[fun]
        return
    out, rep = gsj.nansafe(jax.grad(fun), mode="strong_zero", report=True)(x)
    assert float(out) == STRONG[fun]
    conv = [f for f in rep.findings if f.detail.get("rule") == "strong-zero convention"]
    assert conv and all(f.kind == "resolved" and f.detail["proven"] is False for f in conv)
    assert any("convention" in n for n in rep.notes)


def test_seed_case_is_structural_and_exact():
    """Zygote's seed: the zero entries of A0 give A0 ** t == 0 for every t > 0, a structural
    zero, so the repaired gradient is the true one (d/dt of A0 ** (t/2))."""
    a0 = jnp.asarray([[0.0, 1.0], [3.0, 0.0]])

    def loss(t):
        return jnp.sqrt(jnp.sum((jnp.sqrt(a0**t) - a0) ** 2))

    def smooth(t):
        return jnp.sqrt(jnp.sum((a0 ** (t / 2) - a0) ** 2))

    assert np.isnan(jax.grad(loss)(4.0))
    out, rep = gsj.nansafe(jax.grad(loss), report=True)(4.0)
    np.testing.assert_allclose(out, jax.grad(smooth)(4.0), rtol=1e-6)
    np.testing.assert_allclose(out, 4.94376, rtol=1e-5)
    assert [f.kind for f in rep.findings] == ["resolved"]


# -- finite programs: bit-identical ------------------------------------------------------------


def mlp_loss(params, x, y):
    h = x
    for p in params[:-1]:
        h = jnp.tanh(h @ p["w"] + p["b"])
        h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
    o = h @ params[-1]["w"] + params[-1]["b"]
    return jnp.mean((o - y) ** 2) + 0.1 * jnp.sum(jnp.where(o > 0, jnp.sqrt(jnp.abs(o)), 0.0))


def make_params(sizes=(6, 16, 16, 3)):
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
    return [
        {"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)}
        for k, a, b in zip(keys, sizes[:-1], sizes[1:])
    ]


def test_finite_programs_are_bit_identical(maybe_jit):
    params = make_params((6, 3) if maybe_jit is not jax.jit else (6, 8, 8, 3))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 6))
    y = jnp.ones((5, 3))
    g = jax.value_and_grad(mlp_loss)
    got = bits(maybe_jit(gsj.nansafe(g))(params, x, y))
    if maybe_jit is jax.jit:
        assert got == bits(jax.jit(g)(params, x, y))
    else:
        # eagerly, the reference is the user's own eager call (issue 17: G0 against the plain
        # call, not against a re-evaluation of its traced program)
        assert got == bits(g(params, x, y))


def test_optax_train_step():
    params = make_params((6, 8, 3))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 6))
    y = jnp.ones((5, 3))
    opt = optax.adam(1e-2)
    state = opt.init(params)

    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    want = jax.jit(step)(params, state, x, y)
    assert bits(jax.jit(gsj.nansafe(step))(params, state, x, y)) == bits(want)
    got, rep = gsj.nansafe(jax.jit(step), report=True)(params, state, x, y)
    assert bits(got) == bits(want) and rep.findings == []

    # a dead branch that used to poison every parameter
    def bad_loss(params, x, y):
        o = x @ params[0]["w"]
        return jnp.sum(jnp.where(o > 100.0, jnp.sqrt(o - 100.0), 0.0)) + mlp_loss(params, x, y)

    def bad_step(params, state, x, y):
        loss, grads = jax.value_and_grad(bad_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    plain = jax.jit(bad_step)(params, state, x, y)
    assert not all(np.isfinite(np.asarray(v)).all() for v in jax.tree_util.tree_leaves(plain[0]))
    fixed = jax.jit(gsj.nansafe(bad_step))(params, state, x, y)
    assert bits(fixed) == bits(want)


# -- control flow ------------------------------------------------------------------------------


def test_scan_cond_remat(maybe_jit):
    def scanned(x):
        def body(c, xi):
            return c * (1.0 + jnp.where(xi > 0, jnp.sqrt(xi), 0.0)), 2.0 * xi

        c, ys = lax.scan(body, 1.0, x)
        return c + jnp.sum(ys)

    x = jnp.asarray([-1.0, 4.0, 1.0])
    out = maybe_jit(gsj.nansafe(jax.grad(scanned)))(x)
    np.testing.assert_allclose(out, [2.0, 2.5, 3.5], rtol=1e-6)

    def conded(x):
        return lax.cond(
            x[1] < 0, lambda z: jnp.sum(jnp.where(z > 0, jnp.sqrt(z), 0.0)), lambda z: jnp.sum(z), x
        )

    x = jnp.asarray([4.0, -1.0])
    np.testing.assert_allclose(maybe_jit(gsj.nansafe(jax.grad(conded)))(x), [0.25, 0.0])

    def rematted(x):
        return jnp.sum(jax.checkpoint(lambda z: jnp.where(z > 0, jnp.sqrt(z), 0.0))(x))

    np.testing.assert_allclose(maybe_jit(gsj.nansafe(jax.grad(rematted)))(x), [0.25, 0.0])

    def looped(x):
        return lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] * 1.5, c[1] + 1), (x, 0))[0]

    assert float(maybe_jit(gsj.nansafe(jax.jacfwd(looped)))(2.0)) == 3.375


def test_bad_usage():
    from gradsan import UsageError

    with pytest.raises(UsageError):
        gsj.nansafe(3)
    with pytest.raises(UsageError):
        gsj.nansafe(jax.grad(where_sqrt), mode="zero")
    with pytest.raises(UsageError, match="jax.jit"):
        jax.jit(gsj.nansafe(jax.grad(where_sqrt), report=True))(jnp.ones(2))
