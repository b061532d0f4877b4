"""The headline and the body say the same thing about NaN and Inf, from the values seen (#14).

One program per way a NaN is made, in both backends: a forward 0 / 0 (no infinity is born), an
inf born and then met by a zero, a zero cotangent divided by a zero (0 / 0 in a derivative
rule), an inf met by an opposite inf, a NaN met by a zero (0 * nan), a NaN already in the input.
Each asserts the exact fragments of the headline, the met row and the "why".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

from gradsan._report._text import headline
from gradsan.jax._explain import diagnose
from gradsan.torch._explain import explain as torch_explain
from gradsan.torch._explain import run_functional

# The reports' words without the verification of their fixes (which re-runs each program and
# is tested in tests/fix): explain(f)(*args) is diagnose / run_functional, then verified.


def _one(report):
    assert len(report.findings) >= 1, str(report)
    return report.findings


def _jax(fun, *args):
    return _one(diagnose(jax.grad(fun, argnums=tuple(range(len(args)))), args, {}))


def _torch(fun, *args):
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    return _one(run_functional(torch_explain(None), fun, tuple(ts), {}))


def _met(f) -> str:
    return f.detail.get("met_text") or ""


# ---- 0 / 0 in the forward value: no inf was born ------------------------------------------------


def test_jax_forward_zero_over_zero_says_so():
    (f,) = _jax(lambda x: jnp.sum(x / x.sum()), jnp.zeros(3))
    h = headline(f)
    assert "div at" in h and "(0.0 / 0.0 = nan already in the forward pass)" in h
    assert "and in its derivative inf * 0.0 = nan at" in h
    assert "that inf met a zero" not in h
    assert _met(f).startswith("`x / x.sum()` is 0.0 / 0.0 here, and inf * 0.0 = nan")
    assert f.explanation.startswith("Here div got 0.0 / 0.0: both operands are exactly 0")


def test_jax_forward_zero_over_zero_in_the_value():
    r = diagnose(jax.value_and_grad(lambda x: jnp.sum(x / x.sum())), (jnp.zeros(3),), {})
    value = next(f for f in r.findings if f.phase == "value")
    assert headline(value).endswith("got 0.0 (0.0 / 0.0 = nan).")
    assert "it returned nan" not in headline(value)


def test_torch_forward_zero_over_zero_says_so():
    (f,) = _torch(lambda x: (x / x.sum()).sum(), [0.0, 0.0, 0.0])
    h = headline(f)
    assert "div at" in h and "got 0.0 (0.0 / 0.0 = nan)." in h
    assert "inf" not in h
    assert f.explanation.startswith("Here div got 0.0 / 0.0: both operands are exactly 0")


# ---- an inf born, then met by a zero ------------------------------------------------------------


def test_jax_inf_met_a_zero():
    m = jnp.array([0.0, 1.0])
    (f,) = _jax(lambda x: jnp.sum(jnp.exp(x) * m), jnp.array([1000.0, 1.0]))
    h = headline(f)
    assert "exp at" in h and "(it returned inf), and that inf met a zero at" in h
    assert _met(f).endswith("0.0 * inf = nan in the backward `mul`")


def test_torch_inf_met_a_zero_with_the_values():
    m = torch.tensor([0.0, 1.0])
    (f,) = _torch(lambda x: (torch.exp(x) * m).sum(), [1000.0, 1.0])
    assert "exp at" in headline(f) and ", and that inf met a zero at" in headline(f)
    assert _met(f).endswith("inf * 0.0 = nan in mul")


def test_torch_minus_inf_is_named_minus_inf():
    (f,) = _torch(lambda x: (torch.log(x) * 0.0).sum(), [0.0, 1.0])
    assert ", and that -inf met a zero at" in headline(f)
    assert _met(f).endswith("-inf * 0.0 = nan in mul")


def test_jax_sqrt_under_where_inf_met_the_where():
    (f,) = _jax(lambda x: jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0)), jnp.array([0.0, 1.0]))
    h = headline(f)
    assert "(its derivative is inf there), and that inf met a zero at" in h
    assert _met(f).endswith("0.0 * inf = nan in the backward `mul`")


# ---- a zero cotangent divided by a zero: 0 / 0 in a derivative rule ---------------------------


def test_jax_zero_over_zero_in_the_derivative_rule():
    (f,) = _jax(lambda x: jnp.sum(jnp.log(x) * 0.0), jnp.array([0.0, 1.0]))
    h = headline(f)
    assert "(its derivative rule gave nan there), and a zero from" in h
    assert h.endswith("met a zero divisor: 0.0 / 0.0 = nan.")
    assert "that inf" not in h
    assert _met(f).endswith("0.0 / 0.0 = nan in the backward `div`")
    assert f.detail["met_value"] == "0.0"


def test_torch_sqrt_backward_zero_over_zero():
    (f,) = _torch(lambda x: torch.where(x > 0, torch.sqrt(x), 0.0).sum(), [0.0, 1.0])
    h = headline(f)
    assert "a zero from" in h and h.endswith("met a zero divisor: 0.0 / 0.0 = nan.")
    assert "that inf" not in h
    assert _met(f).endswith("0.0 / 0.0 = nan in aten.div in SqrtBackward0")


# ---- inf - inf ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_opposite_infinities(backend):
    if backend == "jax":
        fs = _jax(lambda x: jnp.sum(jnp.exp(x) - jnp.exp(2 * x)), jnp.array([1000.0, 1.0]))
    else:
        fs = _torch(lambda x: (torch.exp(x) - torch.exp(2 * x)).sum(), [1000.0, 1.0])
    for f in fs:
        assert "and that inf met an infinity of the opposite sign at" in headline(f)
        assert "inf + (-inf) = nan" in _met(f)
        assert "met a zero" not in headline(f)


# ---- a NaN met by a zero: 0 * nan -----------------------------------------------------------------


def test_jax_nan_met_a_zero():
    (f,) = _jax(lambda x: jnp.sum(jnp.where(x >= 0, jnp.sqrt(x), 0.0)), jnp.array([-1.0, 1.0]))
    h = headline(f)
    assert "got -1.0 in the forward pass (it returned nan), and that nan met a zero at" in h
    assert _met(f).endswith("0.0 * nan = nan in the backward `mul`")


def test_torch_nan_met_a_zero():
    (f,) = _torch(lambda x: torch.where(x >= 0, torch.sqrt(x), 0.0).sum(), [-1.0, 1.0])
    assert "got -1.0, and that nan met a zero at" in headline(f)
    assert "did not select this branch" in _met(f)
    assert _met(f).endswith("0.0 / nan = nan in aten.div in SqrtBackward0")


# ---- a NaN in the input ----------------------------------------------------------------------------


def test_jax_nan_in_the_input():
    (f,) = _jax(lambda x: jnp.sum(x * x), jnp.array([jnp.nan, 1.0]))
    assert headline(f) == (
        "NaN in the gradient for `x`: it was already in the input: `x` holds nan in 1 of 2 "
        "elements, first at [0]."
    )


def test_torch_nan_in_the_input_is_one_finding():
    fs = _torch(lambda x: (x * x).sum(), [float("nan"), 1.0])
    assert len(fs) == 1  # one input, however many records of it the tracer made
    assert headline(fs[0]) == (
        "NaN in outputs `loss`, `x`: it was already in the input: `x` (nan in 1 of 2 "
        "elements, first at [0])."
    )
