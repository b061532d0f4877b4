"""sanitize's compiled screen: a healthy program is answered by one compiled run, and the screen
never says "nothing" where the full kink evaluation (KinkEval) records something."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from gradsan.jax import _sanitize, _screen
from tests.jax.test_kink_coverage import CASES, _mlp, _mlp_loss

C = 0.5


def screen(fun, *args, **kwargs):
    """(outputs, kinks, nonfinite) from the screen itself, with no fallback."""
    return _screen.Screener(fun)(args, kwargs)


def full_kinks(fun, *args):
    _, _, ev = _sanitize.scan_kinks(fun, args, {})
    return [k for k in ev.kinks if not k.summarized]


@pytest.mark.parametrize("name,f,kink,entry", [pytest.param(*c, id=c[0]) for c in CASES])
@pytest.mark.parametrize("where", ["at", "away"])
def test_screen_agrees_with_the_full_evaluation(name, f, kink, entry, where):
    g = jax.grad(lambda y: f(y, jnp.float32(C)))
    x = jnp.float32(kink if where == "at" else kink + 0.3)
    outs, n, bad = screen(g, x)
    want = np.asarray(g(x))
    assert bad == (not np.isfinite(want))  # atan2 at the origin: JAX's gradient is NaN
    np.testing.assert_array_equal(np.asarray(outs), want)
    if full_kinks(g, x):
        assert n > 0, name
    if where == "at":
        assert n > 0, name
    else:
        assert n == 0, name


def _loops(x):
    def body(c, xi):
        return c + jnp.abs(xi - 1.0), jnp.maximum(xi, 2.0)

    c, ys = jax.lax.scan(body, 0.0, x)
    w = jax.lax.while_loop(
        lambda s: s[1] < 3, lambda s: (jax.nn.relu(s[0] - 0.5), s[1] + 1), (c, 0)
    )[0]
    k = jax.lax.cond(x[0] > 0, lambda v: jnp.minimum(v, 4.0), lambda v: v, x[1])
    return c + ys.sum() + w + k


@pytest.mark.parametrize(
    "x, hits",
    [
        ([0.5, 3.0, 5.0], False),  # no element at any kink
        ([0.5, 1.0, 5.0], True),  # abs at 0 in scan iteration 1
        ([2.0, 3.0, 5.0], True),  # max tie in scan iteration 0
        ([0.5, 4.0, 5.0], True),  # the cond branch's min ties
    ],
)
def test_loops_and_branches(x, hits):
    x = jnp.asarray(x, jnp.float32)
    g = _loops  # the value (reverse mode does not go through while_loop)
    _, n, _ = screen(g, x)
    assert (n > 0) == hits
    assert bool(full_kinks(g, x)) == hits
    r = gsj.sanitize(g, directions=0)(x)
    assert bool([f for f in r.findings if f.kind in ("kink", "convention")]) == hits


def test_while_relu_tie_inside_the_loop():
    # relu(c - 0.5) at exactly 0 on the loop's first iteration (c = 0.5)
    def f(c):
        return jax.lax.while_loop(
            lambda s: s[1] < 2, lambda s: (jax.nn.relu(s[0] - 0.5), s[1] + 1), (c, 0)
        )[0]

    _, n, _ = screen(f, jnp.float32(0.5))
    assert n > 0
    _, n, _ = screen(f, jnp.float32(0.7))
    assert n == 0


@pytest.mark.parametrize(
    "name, f",
    [
        ("jit", lambda x: jnp.where(jax.jit(lambda y: y > 0)(x), x, 2 * x).sum()),
        (
            "cond",
            lambda x: jax.lax.cond(
                x[1] > 0, lambda m, y: jnp.where(m, y, 2 * y), lambda m, y: y, x > 0, x
            ).sum(),
        ),
    ],
)
def test_comparison_keeps_its_equality_mask_across_a_call_or_branch(name, f):
    # the comparison is computed on one side of a call or branch, the select on the other
    x = jnp.array([0.0, 1.0, -1.0])
    assert full_kinks(f, x)
    _, n, _ = screen(f, x)
    assert n > 0, name
    _, n, _ = screen(f, x + 0.25)
    assert n == 0, name


def test_clean_mlp_is_answered_by_the_screen_and_cached():
    params = _mlp(jax.random.PRNGKey(0), [8, 16, 16, 4])
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 8))
    y = jax.nn.one_hot(jnp.arange(5) % 4, 4)
    g = jax.grad(_mlp_loss)
    sc = _screen.Screener(g)
    outs, n, bad = sc((params, x, y), {})
    assert (n, bad) == (0, False)
    want = g(params, x, y)
    for a, b in zip(jax.tree_util.tree_leaves(outs), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    sc((params, x, y), {})
    assert len(sc.cache) == 1  # the second call reuses the compiled screen


def test_nonfinite_goes_to_explain():
    r = gsj.sanitize(jax.grad(lambda x: jnp.sqrt(x) * 0.0 + jnp.abs(x)))(jnp.float32(0.0))
    ids = {f.catalog_id for f in r.findings}
    assert "sqrt-at-zero" in ids and "abs-at-zero" in ids


def test_jitted_with_static_argument():
    f = jax.jit(lambda x, k: jnp.abs(x) * k, static_argnums=1)
    sc = _screen.Screener(f)
    assert sc((jnp.float32(0.0), 2), {})[1] > 0
    assert sc((jnp.float32(1.0), 2), {})[1] == 0
    assert sc((jnp.float32(1.0), 5), {})[0] == 5.0
    assert len(sc.cache) == 2  # one screen per static value
    r = gsj.sanitize(f)(jnp.float32(0.0), 3)
    assert [g.catalog_id for g in r.findings] == ["abs-at-zero"]


def test_isnan_is_not_a_boundary():
    # jnp.isnan(x) is x != x: a value compared with itself is constant near every finite x
    def f(x):
        return jnp.where(jnp.isnan(x), 0.0, x).sum()

    x = jnp.array([1.0, jnp.nan])
    for fun in (f, jax.grad(f)):
        assert gsj.sanitize(fun)(x).findings == []
        assert screen(fun, x)[1] == 0
        assert full_kinks(fun, x) == []


def test_nonfinite_without_kinks_is_explained():
    r = gsj.sanitize(jax.grad(lambda x: jnp.sqrt(x) * 2.0))(jnp.float32(0.0))
    assert [f.catalog_id for f in r.findings] == ["sqrt-at-zero"]


def test_count_screen_keeps_only_what_the_count_reads():
    """sanitize's screen returns the count alone (the outputs are the user's own call, G0):
    the compiled program has no backward pass (fewer matrix products than the step) and
    agrees with the full screen's count, clean and at a kink; arrays-only calls share one
    cached program."""
    params = _mlp(jax.random.PRNGKey(0), [8, 16, 16, 4])
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 8))
    y = jax.nn.one_hot(jnp.arange(5) % 4, 4)
    g = jax.jit(jax.grad(_mlp_loss))
    sc = _screen.Screener(g)
    assert sc.count((params, x, y), {}) == sc((params, x, y), {})[1] == 0
    x0 = x.at[0].set(0.0)
    params0 = [(w, jnp.zeros_like(b)) for w, b in params]
    assert sc.count((params0, x0, y), {}) == sc((params0, x0, y), {})[1] > 0
    plain = [v for k, v in sc.cache.items() if k[0] == "plain"]
    assert len(plain) == 1  # one program for both calls (same tree, shapes and dtypes)
    flat = jax.tree_util.tree_leaves((params, x, y))
    screen_hlo = plain[0][0].lower(*flat).compile().as_text()
    step_hlo = g.lower(params, x, y).compile().as_text()
    assert 0 < screen_hlo.count(" dot(") < step_hlo.count(" dot(")
