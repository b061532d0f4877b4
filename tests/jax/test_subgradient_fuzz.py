"""Fuzzing gradsan.jax.subgradient: random programs evaluated exactly on their kinks, against
mpmath difference quotients at 60 digits, like the certify fuzz. No silent wrong answer: the
gradient returned must be the gradient of the piece active along subgradient's direction v,
lim_{t -> 0+} grad f(x0 + t v), read off central quotients at x0 + eps v (eps -> 0+), and
g . v must be the one-sided quotient along v at x0. A report with an ``unresolved`` finding
says it could not decide; that is allowed (not silent)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gradsan.jax as gsj

UNARY = ["sin", "exp", "abs", "relu", "neg", "i0", "i0s", "clip", "signmul", "floormul"]
BINARY = ["add", "mul", "maximum", "minimum", "where"]


def _jax_op(op, a, b):
    return {
        "sin": lambda: jnp.sin(a),
        "exp": lambda: jnp.exp(0.3 * a),
        "abs": lambda: jnp.abs(a),
        "relu": lambda: jax.nn.relu(a),
        "neg": lambda: -a,
        "i0": lambda: jax.scipy.special.i0(a),
        "i0s": lambda: jax.scipy.special.i0(2 * a - 1),
        "clip": lambda: jnp.clip(a, -0.5, 0.5),
        "signmul": lambda: jnp.sign(a) * a,
        "floormul": lambda: jnp.floor(a) * a,
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "maximum": lambda: jnp.maximum(a, b),
        "minimum": lambda: jnp.minimum(a, b),
        "where": lambda: jnp.where(a > b, a * b, a + b),
    }[op]()


def _mp_op(op, a, b):
    return {
        "sin": lambda: mpmath.sin(a),
        "exp": lambda: mpmath.exp(0.3 * a),
        "abs": lambda: abs(a),
        "relu": lambda: max(a, 0),
        "neg": lambda: -a,
        "i0": lambda: mpmath.besseli(0, a),
        "i0s": lambda: mpmath.besseli(0, 2 * a - 1),
        "clip": lambda: min(max(a, mpmath.mpf("-0.5")), mpmath.mpf("0.5")),
        "signmul": lambda: mpmath.sign(a) * a,
        "floormul": lambda: mpmath.floor(a) * a,
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "maximum": lambda: max(a, b),
        "minimum": lambda: min(a, b),
        "where": lambda: a * b if a > b else a + b,
    }[op]()


def _program(ops):
    def jf(x):
        vals = [x[0], x[1], x[2]]
        for op, i, j in ops:
            vals.append(_jax_op(op, vals[i % len(vals)], vals[j % len(vals)]))
        return vals[-1]

    def mf(x):
        vals = list(x)
        for op, i, j in ops:
            vals.append(_mp_op(op, vals[i % len(vals)], vals[j % len(vals)]))
        return vals[-1]

    return jf, mf


def _direction(key):
    """subgradient's direction v for one argument of shape (3,), drawn as it draws it."""
    _, sub = jax.random.split(key)
    with jax.enable_x64(True):
        v = jax.random.normal(sub, (3,), jnp.float32).astype(jnp.float64)
    return np.asarray(v, np.float64)


def test_i0_at_its_kink_is_zero():
    """i0(2t - 1) at t = 0.5: I0 is smooth with I0'(0) = 0; abs and i0e are locked together."""
    for k in range(3):
        g, report = gsj.subgradient(
            lambda t: jax.scipy.special.i0(2 * t - 1), key=jax.random.PRNGKey(k)
        )(0.5)
        assert abs(float(g)) < 1e-6, (k, float(g))


ops_strategy = st.lists(
    st.tuples(st.sampled_from(UNARY + BINARY), st.integers(0, 10), st.integers(0, 10)),
    min_size=1,
    max_size=5,
)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@example(ops=[("i0s", 0, 0)], x=[0.5, 0.0, 0.0])
@example(ops=[("i0", 0, 0), ("abs", 1, 1), ("mul", 3, 4)], x=[0.0, 0.0, 1.0])
@given(
    ops=ops_strategy,
    x=st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]), min_size=3, max_size=3),
)
def test_subgradient_is_a_one_sided_limit(ops, x):
    jf, mf = _program(ops)
    key = jax.random.PRNGKey(0)
    with jax.enable_x64(True):
        g, report = gsj.subgradient(jf, key=key)(jnp.asarray(x, jnp.float64))
        g = np.asarray(g, np.float64)
    if any(f.kind == "unresolved" for f in report.findings):
        return  # said, not silent
    v = _direction(key)
    mpmath.mp.dps = 60
    x0 = [mpmath.mpf(a) for a in x]
    vm = [mpmath.mpf(float(a)) for a in v]
    f0 = mf(x0)
    h = mpmath.mpf("1e-40")
    one_sided = (mf([a + h * b for a, b in zip(x0, vm)]) - f0) / h
    assert abs(float(one_sided) - float(np.dot(g, v))) <= 1e-6 * max(1.0, abs(float(one_sided))), (
        ops,
        x,
        float(one_sided),
        g,
    )
    eps = mpmath.mpf("1e-20")
    y = [a + eps * b for a, b in zip(x0, vm)]
    for i in range(3):
        yp, ym = list(y), list(y)
        yp[i] += h
        ym[i] -= h
        q = float((mf(yp) - mf(ym)) / (2 * h))
        assert abs(q - g[i]) <= 1e-6 * max(1.0, abs(q)), (ops, x, i, q, g)
