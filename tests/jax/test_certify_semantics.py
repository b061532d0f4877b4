"""gradsan.jax.certify: the rules that decide what used to be UNDECIDED (repeated subexpressions,
the domain and the infinities met by comparisons, saturation at a log pole, atan at a pole), and
the cheap paths (the first pass with two terms, the rays in one batched sweep, the reused trace).
Every expected number here is worked out by hand or checked against jax.grad."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import gradsan.jax as gsj  # noqa: E402
from gradsan.jax.certify import _rays as C  # noqa: E402

PM = [1.0, -1.0]


def run(f, x0, directions=PM, **kw):
    r = gsj.certify(f, directions=directions, **kw)(x0)
    d = r.findings[0].detail
    return r, d, [v["verdict"] for v in d["verdicts"]]


def grads(d):
    return [
        None if v["gradient"] is None else float(np.asarray(v["gradient"][0]))
        for v in d["verdicts"]
    ]


def test_a_repeated_subexpression_ties_exactly():
    # log1p(cos x) twice: equal to every order, not only up to the horizon
    _, d, vs = run(lambda x: jnp.minimum(jnp.log1p(jnp.cos(x)), jnp.log1p(jnp.cos(x))), 0.0)
    assert vs == ["DEFINED", "DEFINED"] and grads(d) == [0.0, 0.0]
    # x + 0.0 is x itself: max(x, x + 0) is a tie, whose weights 1/2 + 1/2 give the gradient 1
    r, d, vs = run(lambda x: jnp.maximum(x, x + 0.0), 0.0)
    assert vs == ["DEFINED", "DEFINED"] and d["label"] == "gradient" and float(r.outputs) == 1.0
    # relu(x^3) / x^3 is exactly 1 for x > 0
    _, d, vs = run(lambda x: jax.nn.relu(x**3) / x**3 * x, 0.5)
    assert vs == ["DEFINED", "DEFINED"] and grads(d) == pytest.approx([1.0, 1.0], abs=1e-12)


def test_the_domain_reaches_through_a_comparison():
    # sqrt(x) at x < 0 is undefined, and so is the branch it decides
    _, d, vs = run(lambda x: jnp.where(jnp.sqrt(x) > 1, x, 2 * x), -1.0)
    assert vs == ["DOMAIN", "DOMAIN"] and d["label"] == "singular"


def test_infinities_decide_comparisons():
    # cbrt(log x) -> -inf along t > 0 (slower than any power): the comparison is False
    _, d, vs = run(lambda x: jnp.where(jnp.cbrt(jnp.log(x)) > 0, x, 2 * x), 0.0, [1.0])
    assert vs == ["DEFINED"] and grads(d) == [2.0]
    # log(0 * x) = -inf for every x: max picks x
    r, d, vs = run(lambda x: jnp.maximum(jnp.log(0.0 * x), x), 1.0)
    assert vs == ["DEFINED", "DEFINED"] and float(r.outputs) == 1.0
    # sin(x / 0) is NaN for every x whatever the sign of the zero: NaN > 0 is False
    _, d, vs = run(lambda x: jnp.where(jnp.sin(x / 0.0) > 0, x, 2 * x), 1.0)
    assert vs == ["DEFINED", "DEFINED"] and grads(d) == [2.0, 2.0]


def test_a_value_infinite_along_the_ray_is_singular():
    _, d, vs = run(lambda x: x / (x - x), 1.0)  # +-inf for every t: the sign is the zero's
    assert vs == ["SINGULAR", "SINGULAR"]
    assert "|f(x0 + t v)| is inf" in d["verdicts"][0]["certificate"]
    _, d, vs = run(lambda x: jnp.exp(1 / x), 0.0, [1.0])  # exp(+pole) -> +inf
    assert vs == ["SINGULAR"] and "-> +inf" in d["verdicts"][0]["certificate"]
    assert d["verdicts"][0]["fprime"] == math.inf


def test_an_undecided_choice_needs_a_nonzero_cotangent():
    # the inner where compares x / (x - x) (its sign is the zero's: undecided), but the outer
    # where never takes that branch, so no cotangent reaches it
    f = lambda x: jnp.where(jnp.cos(0.0 * x) < 0, jnp.where(x / (x - x) > 0, x, -x), 3 * x)  # noqa: E731
    _, d, vs = run(f, 1.0)
    assert vs == ["DEFINED", "DEFINED"] and grads(d) == [3.0, 3.0]


def test_an_undecided_comparison_of_an_infinity_says_so():
    _, d, vs = run(lambda x: jnp.minimum(x / (x - x), x), 1.0)
    assert vs == ["UNDECIDED", "UNDECIDED"]
    assert "infinite or undefined all along the ray" in d["verdicts"][0]["notes"][0]


def test_saturation_at_a_log_pole_is_algebraic():
    # logistic(log t) = t / (1 + t): slope 1, not a limit "beyond all orders" (slope 0)
    _, d, vs = run(lambda x: jax.nn.sigmoid(jnp.log(x)), 0.0)
    assert vs == ["DEFINED", "DOMAIN"] and grads(d)[0] == pytest.approx(1.0, abs=1e-12)
    # tanh(log(t) / 2) = (t - 1) / (t + 1): slope 2
    _, d, vs = run(lambda x: jnp.tanh(0.5 * jnp.log(x)), 0.0, [1.0])
    assert vs == ["DEFINED"] and grads(d)[0] == pytest.approx(2.0, abs=1e-12)
    # erf does saturate beyond all orders at a log pole: erf(log t) + 1 ~ exp(-(log t)^2)
    _, d, vs = run(lambda x: jax.lax.erf(jnp.log(x)), 0.0, [1.0])
    assert vs == ["DEFINED"] and grads(d)[0] == 0.0


def test_atan_at_a_pole():
    # atan(1/x) = pi/2 - atan(x) for x > 0: slope -1; from the left the limit is -pi/2 while
    # f(0) = atan(inf) = pi/2
    _, d, vs = run(lambda x: jnp.arctan(1 / x), 0.0)
    assert vs == ["DEFINED", "DISCONTINUOUS"]
    assert grads(d)[0] == pytest.approx(-1.0, abs=1e-12)


def test_a_huge_periodic_argument_is_not_trusted():
    # exp(exp(3)) = 5.3e8: the rounding of that limit moves sin by more than its own precision
    _, d, vs = run(lambda x: jnp.sin(jnp.exp(jnp.exp(x))), 3.0)
    assert vs == ["UNDECIDED", "UNDECIDED"]


def _mlp():
    rng = np.random.default_rng(3)
    params = {
        "w": [rng.standard_normal((5, 5)) / 3 for _ in range(4)],
        "b": [0.1 * rng.standard_normal(5) for _ in range(4)],
        "u": np.zeros(3),
    }
    x = rng.standard_normal((2, 5))
    y = rng.standard_normal((2, 5))

    def loss(p, x, y):
        h = x
        for i, (w, b) in enumerate(zip(p["w"], p["b"])):
            h = jnp.tanh(h @ w + b)
            if i == 1:
                h = h * (1.0 + jnp.linalg.norm(p["u"]))
        return jnp.mean((h - y) ** 2)

    return loss, params, x, y


def test_the_first_pass_and_the_batched_rays_match_one_ray_at_a_time(monkeypatch):
    loss, params, x, y = _mlp()
    r = gsj.certify(loss)(params, x, y)
    d = r.findings[0].detail
    assert [v["verdict"] for v in d["verdicts"]] == ["DEFINED", "DEFINED"]
    assert [v["horizon_cap"] for v in d["verdicts"]] == [1.5, 1.5]  # two terms were enough
    # away from u = 0 the loss is smooth: the limits are jax.grad's
    with jax.enable_x64(True):
        ref = jax.grad(loss)(jax.tree_util.tree_map(jnp.asarray, params), x, y)
    for k in ("w", "b"):
        for a, b in zip(r.outputs[k], ref[k]):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    # the same rays one at a time, with the plain schedule
    monkeypatch.setattr(C, "_batched", lambda *a: None)
    monkeypatch.setattr(C, "_caps", lambda terms, events: [(3.0, {}, None)])
    d1 = gsj.certify(loss)(params, x, y).findings[0].detail
    for v, v1 in zip(d["verdicts"], d1["verdicts"]):
        assert v["verdict"] == v1["verdict"]
        assert v["fprime"] == pytest.approx(v1["fprime"], rel=1e-10, abs=1e-12)
        for g, g1 in zip(v["gradient"], v1["gradient"]):
            np.testing.assert_allclose(g, g1, rtol=1e-10, atol=1e-12)


def test_a_second_call_reuses_the_trace_but_not_the_data():
    loss, params, x, y = _mlp()
    calls = []

    def counted(p, x, y):
        calls.append(1)
        return loss(p, x, y)

    cert = gsj.certify(counted)
    r1 = cert(params, x, y)
    n = len(calls)
    r2 = cert(params, x, 2 * y)  # same shapes: jit's trace is reused, the new data is used
    assert len(calls) == n
    with jax.enable_x64(True):
        ref = jax.grad(loss)(jax.tree_util.tree_map(jnp.asarray, params), x, 2 * y)
    np.testing.assert_allclose(r2.outputs["w"][0], ref["w"][0], rtol=1e-9, atol=1e-12)
    assert not np.allclose(r1.outputs["w"][0], r2.outputs["w"][0])


def test_a_python_flag_argument_is_closed_over():
    def loss(p, scale, flip):
        return scale * jnp.sum(jnp.sin(p) if flip else jnp.cos(p))

    r = gsj.certify(loss)(np.array([0.3, 0.7]), 2.0, True)
    np.testing.assert_allclose(r.outputs, 2 * np.cos([0.3, 0.7]), rtol=1e-12)


def test_the_max_of_nothing_is_minus_infinity():
    # jnp.max(x[:0], initial=-1) is max(reduce_max(empty) = -inf, -1) = -1
    r, d, vs = run(
        lambda x: jnp.sum(x**2) + jnp.max(x[:0], initial=-1.0), np.array([1.0, 2.0]), None
    )
    assert d["label"] == "gradient" and vs == ["DEFINED", "DEFINED"]
    np.testing.assert_allclose(r.outputs, [2.0, 4.0])


def test_a_constant_plus_zero_gives_its_infinity_a_sign():
    # (x - 1) / 0.0 = -inf near x = 0 (the literal is +0.0); an identically zero x - x is not
    # a constant, and the sign of its zero is not tracked
    _, d, vs = run(lambda x: jnp.where((x - 1) / 0.0 > 0, x, 2 * x), 0.0)
    assert vs == ["DEFINED", "DEFINED"] and grads(d) == [2.0, 2.0]
    _, d, vs = run(lambda x: x / 0.0, -1.0)
    assert vs == ["SINGULAR", "SINGULAR"] and "is -inf" in d["verdicts"][0]["certificate"]


def test_abs_of_a_value_zero_up_to_the_horizon():
    # x^27 is beyond every horizon tried, so its sign is unknown; |x^27| is still O(t^27), and
    # the product with an exact zero needs no partial of abs
    _, d, vs = run(lambda x: jnp.minimum(jnp.cos(x), 0.0) * jnp.abs(x**27) + x, 0.0)
    assert vs == ["DEFINED", "DEFINED"] and grads(d) == [1.0, 1.0]
