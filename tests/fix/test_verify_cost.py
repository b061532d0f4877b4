"""The fix verification's cost is bounded: certify / nansafe give the reference gradient only on
programs of at most REFERENCE_MAX_EQNS equations run (a scan counts its body per iteration);
above that the fix is checked on the compiled program alone and says so in one line, and a
report's checks stop at a CPU budget."""

import jax
import jax.numpy as jnp

import gradsan.jax as gsj
from gradsan._fix import _cost, _verify


def step(theta, a0):
    a = jnp.sqrt(a0**theta)
    return theta, jnp.sum((a - a0) ** 2)


def loss(theta, a0s):
    _, ys = jax.lax.scan(step, theta, a0s)
    return jnp.sum(ys)


def _args(n):
    a0s = jnp.ones((n, 2, 2)) * jnp.array([[1.0, 2.0], [2.0, 3.0]])
    return jnp.float32(2.5), a0s.at[n // 2].set(jnp.array([[1.0, 0.0], [0.0, 3.0]]))


def _fix_of(report):
    [f] = report.findings
    return next(p for p in f.fixes if p.code)


def test_scan_size_counts_iterations():
    closed = jax.make_jaxpr(jax.grad(loss))(*_args(10))
    assert _cost.equations(closed) > 10 * 2 * 5  # forward and backward bodies, 10 times each
    ten, hundred = (_cost.equations(jax.make_jaxpr(jax.grad(loss))(*_args(n))) for n in (10, 100))
    assert hundred - ten > 80 * (ten - 1) // 10


def test_small_program_checked_against_the_reference_computed_once(monkeypatch):
    calls = []
    real = _verify._Program._reference
    monkeypatch.setattr(_verify._Program, "_reference", lambda self: calls.append(1) or real(self))
    p = _fix_of(gsj.explain(jax.grad(loss))(*_args(8)))
    assert p.status == "verified", p.checked
    assert "= the certified limit" in p.checked and len(calls) == 1


def _large(monkeypatch):
    calls = []
    monkeypatch.setattr(_verify._Program, "_reference", lambda self: calls.append(1) or (None, ""))
    monkeypatch.setattr(_verify, "REFERENCE_MAX_EQNS", 50)
    return calls


def test_large_program_checked_by_differences(monkeypatch):
    calls = _large(monkeypatch)
    p = _fix_of(gsj.explain(jax.grad(loss))(*_args(8)))
    assert not calls  # neither certify nor nansafe ran
    assert p.status == "verified" and "matches central differences" in p.checked


def test_large_program_without_reference_says_so(monkeypatch):
    calls = _large(monkeypatch)
    monkeypatch.setattr(_verify._Program, "central_differences", lambda self, grad: None)
    report = gsj.explain(jax.grad(loss))(*_args(8))
    p = _fix_of(report)
    assert not calls
    size = _cost.equations(jax.make_jaxpr(jax.grad(loss))(*_args(8)))
    assert p.status == "unverified"
    assert p.checked.startswith(f"the program is too large to check quickly ({size:,} equations)")
    assert "is finite, same value" in p.checked and "\n" not in p.checked
    assert f"# not verified: {p.checked}" in str(report)


def test_budget_stops_the_checks(monkeypatch):
    monkeypatch.setattr(_cost, "BUDGET_S", -1.0)
    p = _fix_of(gsj.explain(jax.grad(loss))(*_args(8)))
    assert p.status == "unverified"
    assert p.checked.startswith("the program is too large to check quickly (")
    assert "gradsan stopped checking after" in p.checked
