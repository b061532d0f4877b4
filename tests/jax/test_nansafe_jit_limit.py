"""nansafe's limit engine under jax.jit: the host decision through a pure_callback behind a
lax.cond, taken only when an output is non-finite."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from gradsan import UsageError
from gradsan.jax import _nansafe_limit

A0 = jnp.asarray([[1.0, 0.0], [0.0, 3.0]])  # the Zygote seed of test_certify.py


def zygote(theta):
    return jnp.sqrt(jnp.sum((jnp.sqrt(A0**theta) - A0) ** 2))


def zygote_data(theta, a0):  # the same loss with A0 as data: its zeros are not constants
    return jnp.sqrt(jnp.sum((jnp.sqrt(a0**theta) - a0) ** 2))


def sqrt_sqrt(x):
    return jnp.sqrt(x) * jnp.sqrt(x)


def x_sqrt_x(x):
    return x * jnp.sqrt(x)


def norm(x):
    return jnp.linalg.norm(x)


def sqrt_norm(x):
    return jnp.sqrt(jnp.linalg.norm(x))


ZYGOTE = 4.9438  # 4.5 log 3, to 4 decimals

# name: (loss, point, data, expected: a number, an array, or None for "stays non-finite")
CASES = {
    "zygote": (zygote, 4.0, (), ZYGOTE),
    "zygote_data": (zygote_data, 4.0, (A0,), ZYGOTE),
    "sqrt_sqrt": (sqrt_sqrt, 0.0, (), 1.0),
    "x_sqrt_x": (x_sqrt_x, 0.0, (), 0.0),
    "norm": (norm, np.zeros(3), (), np.zeros(3)),  # the min-norm Clarke subgradient
    "sqrt_norm": (sqrt_norm, np.zeros(3), (), None),  # SINGULAR: never a number
}


@pytest.fixture
def host_calls(monkeypatch):
    """Every host decision, eager or from the callback under jit."""
    calls = []
    real = _nansafe_limit.host_limit

    def counting(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(_nansafe_limit, "host_limit", counting)
    return calls


def _check(out, want, dtype):
    out = np.asarray(out)
    assert out.dtype == dtype
    if want is None:
        assert not np.isfinite(out).any()
    elif want is ZYGOTE:
        assert round(float(out), 4) == ZYGOTE
    else:
        np.testing.assert_array_equal(out, np.asarray(want, dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_and_jit_give_the_same_values(name, dtype):
    loss, x0, data, want = CASES[name]
    with jax.enable_x64(dtype == "float64"):
        x = jnp.asarray(x0, dtype)
        data = tuple(jnp.asarray(d, dtype) for d in data)
        g = gsj.nansafe(jax.grad(loss))
        eager = g(x, *data)
        jitted = jax.jit(g)(x, *data)
        _check(eager, want, dtype)
        _check(jitted, want, dtype)
        np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))


def test_plain_jit_of_the_seed_cases_is_non_finite():
    """What the repair is measured against: plain jax.grad gives NaN on every case."""
    for loss, x0, data, _ in CASES.values():
        assert not np.isfinite(np.asarray(jax.jit(jax.grad(loss))(jnp.asarray(x0), *data))).all()


def test_the_host_is_called_only_when_an_output_is_non_finite(host_calls):
    g = jax.jit(gsj.nansafe(jax.grad(sqrt_sqrt)))
    assert float(g(jnp.asarray(2.0))) == pytest.approx(1.0)
    assert host_calls == []  # a finite step never leaves the device
    assert float(g(jnp.asarray(0.0))) == 1.0
    assert len(host_calls) == 1
    assert float(g(jnp.asarray(3.0))) == pytest.approx(1.0)
    assert len(host_calls) == 1
    # a structural repair already gives a finite gradient: no host call either
    assert round(float(jax.jit(gsj.nansafe(jax.grad(zygote)))(4.0)), 4) == ZYGOTE
    assert len(host_calls) == 1


def test_a_jitted_function_called_twice_reuses_its_compilation(host_calls):
    g = jax.jit(gsj.nansafe(jax.grad(sqrt_sqrt)))
    assert float(g(jnp.asarray(0.0))) == 1.0
    assert float(g(jnp.asarray(0.0))) == 1.0
    assert float(g(jnp.asarray(4.0))) == pytest.approx(1.0)
    assert g._cache_size() == 1
    assert len(host_calls) == 2


def test_no_callback_outside_a_plain_gradient_in_structural_mode():
    def has_callback(f, *args):
        return "pure_callback" in str(jax.make_jaxpr(f)(*args))

    grad = jax.grad(sqrt_sqrt)
    assert has_callback(gsj.nansafe(grad), 0.0)
    assert not has_callback(gsj.nansafe(grad, mode="strong_zero"), 0.0)
    assert not has_callback(gsj.nansafe(lambda x: grad(x) * 2.0), 0.0)

    def step(p, x):
        return p - 0.1 * jax.grad(lambda p: jnp.sum(jnp.sqrt(p * x)))(p)

    assert not has_callback(gsj.nansafe(step), jnp.ones(3), jnp.ones(3))
    # strong_zero under jit: the labelled convention, as before (no limit engine)
    assert float(jax.jit(gsj.nansafe(grad, mode="strong_zero"))(0.0)) == 0.0


def test_report_under_jit_is_still_a_usage_error():
    with pytest.raises(UsageError, match="inside jax.jit"):
        jax.jit(gsj.nansafe(jax.grad(sqrt_sqrt), report=True))(0.0)


def test_vmap_gives_each_element_its_own_limit(host_calls):
    g = jax.jit(gsj.nansafe(jax.grad(sqrt_sqrt)))
    out = jax.vmap(g)(jnp.asarray([0.0, 2.0, 0.0]))
    np.testing.assert_allclose(np.asarray(out), [1.0, 1.0, 1.0], rtol=1e-6)
    assert len(host_calls) == 2  # only the non-finite elements reach the host
    del host_calls[:]
    jax.vmap(g)(jnp.asarray([1.0, 2.0]))
    jax.vmap(jax.vmap(g))(jnp.asarray([[1.0, 2.0], [3.0, 4.0]]))
    assert host_calls == []  # a finite batch never leaves the device, nested vmaps too

    # per-element limits that differ: d/dx of (sqrt(x y))^2 at x = 0 is y
    h = jax.jit(gsj.nansafe(jax.grad(lambda x, y: jnp.sqrt(x * y) * jnp.sqrt(x * y))))
    out = jax.vmap(h, in_axes=(None, 0))(jnp.asarray(0.0), jnp.asarray([0.0, 2.0, 5.0]))
    np.testing.assert_allclose(np.asarray(out), [0.0, 2.0, 5.0], rtol=1e-12)  # sqrt(2)^2

    n = jax.vmap(jax.jit(gsj.nansafe(jax.grad(norm))))(jnp.asarray([[0.0, 0.0], [3.0, 4.0]]))
    np.testing.assert_allclose(np.asarray(n), [[0.0, 0.0], [0.6, 0.8]], rtol=1e-6)
    s = jax.vmap(jax.jit(gsj.nansafe(jax.grad(sqrt_norm))))(jnp.zeros((2, 3)))
    assert not np.isfinite(np.asarray(s)).any()


def test_differentiating_through_it_does_not_reach_the_callback(host_calls):
    g = jax.jit(gsj.nansafe(jax.grad(sqrt_sqrt)))
    assert abs(float(jax.jacfwd(g)(jnp.asarray(2.0)))) < 1e-6
    assert abs(float(jax.grad(g)(jnp.asarray(2.0)))) < 1e-6
    assert host_calls == []


def test_limit_false_never_asks_the_limit_engine():
    """limit=False: a numerical 0 * inf stays non-finite eagerly and under jit, and the jitted
    program holds no callback at all."""
    g = jax.grad(lambda x: jnp.sqrt(x) * jnp.sqrt(x))
    x = jnp.asarray(0.0)
    assert not np.isfinite(float(gsj.nansafe(g, limit=False)(x)))
    assert not np.isfinite(float(jax.jit(gsj.nansafe(g, limit=False))(x)))
    assert float(jax.jit(gsj.nansafe(g))(x)) == 1.0
    text = jax.jit(gsj.nansafe(g, limit=False)).lower(x).as_text()
    assert "callback" not in text
    assert "callback" in jax.jit(gsj.nansafe(g)).lower(x).as_text()
    with pytest.raises(UsageError, match="limit"):
        gsj.nansafe(g, limit="yes")
