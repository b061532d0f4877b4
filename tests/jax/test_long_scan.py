"""Long scans: only the iterations from the first non-finite one are interpreted, and the
report is the one a full iteration-by-iteration interpretation gives."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from gradsan.jax import _explain


def _line(fn, text: str) -> int:
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def rnn_loss(w, xs):
    def step(h, x):
        h = jnp.tanh(h * w + x)
        return h, jnp.sqrt(jnp.abs(h - 0.5))  # L:sqrt

    h, ys = jax.lax.scan(step, jnp.zeros(4), xs)
    return jnp.sum(ys) + jnp.sum(h)


def reverse_loss(w, xs):
    def step(c, x):
        c = c + jnp.log(x * w)  # L:log
        return c, c

    c, ys = jax.lax.scan(step, jnp.zeros(3), xs, reverse=True)
    return jnp.sum(ys)


def forward_nan(xs):
    def step(c, x):
        return c + x, jnp.log(x)  # L:fwdlog

    return jax.lax.scan(step, 0.0, xs)[1]


def _rnn_args(n):
    xs = (jnp.ones((n, 4)) * 0.01).at[n * 7 // 10].set(jnp.arctanh(0.5))
    return jnp.zeros(4), xs


def _reverse_args(n):
    return jnp.ones(3), jnp.ones((n, 3)).at[n // 3, 1].set(0.0)


def _forward_args(n):
    return (jnp.linspace(1.0, 2.0, n).at[n // 2].set(-1.0),)


CASES = {
    "rnn": (lambda: jax.jit(jax.grad(rnn_loss)), _rnn_args),
    "reverse": (lambda: jax.grad(reverse_loss), _reverse_args),
    "forward": (lambda: forward_nan, _forward_args),
}


def _facts(report):
    return [
        (f.primitive, f.where.line if f.where else None, f.phase, f.context, f.form, f.values)
        for f in report.findings
    ]


@pytest.mark.parametrize("name", sorted(CASES))
def test_lazy_scan_reports_what_the_full_interpretation_reports(name, monkeypatch):
    make, args_of = CASES[name]
    fun, args = make(), args_of(200)
    lazy = gsj.explain(fun)(*args)
    monkeypatch.setattr(_explain, "LAZY_SCAN", 10**9)
    full = gsj.explain(fun)(*args)
    assert lazy.findings and _facts(lazy) == _facts(full)
    for a, b in zip(
        jax.tree_util.tree_leaves(lazy.outputs), jax.tree_util.tree_leaves(full.outputs)
    ):
        assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


def test_two_thousand_steps():
    # Was 10,000 steps (45 s, nearly all of it the fix verification's reference gradient:
    # certify walks every iteration of the scan, so its cost grows with the length). 2,000
    # takes the same path: far longer than LAZY_SCAN, so the scan runs compiled and only the
    # iterations from the first non-finite one (1400, 70% in as before) are interpreted.
    assert 2_000 > 10 * _explain.LAZY_SCAN
    fun = jax.jit(jax.grad(rnn_loss))
    w, xs = _rnn_args(2_000)
    [f] = gsj.explain(fun)(w, xs).findings
    assert f.primitive == "sqrt" and f.where.line == _line(rnn_loss, "L:sqrt")
    assert "scan iteration 1400 (of 2000)" in f.context
    assert f.form == "0*inf" and f.met_where is not None
    assert np.isnan(np.asarray(fun(w, xs))).all()
