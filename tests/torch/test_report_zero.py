"""What made the zero of 0 * inf exact, said truly (PyTorch): a number 0 the program wrote is
a constant, never an underflow; "underflowed" only where a product of nonzero finite values
(or an exp) rounded to 0. The same program under JAX says the same."""

import jax
import jax.numpy as jnp
import torch

import gradsan.jax as gsj
import gradsan.torch as gst
from gradsan._events import ZeroKind
from tests.conftest import line_of


def literal_zero(x):
    y = 1.0 / x  # O:literal_zero
    return (y * 0.0).sum()  # Z:literal_zero


def literal_zero_jax(x):
    y = 1.0 / x
    return (y * 0.0).sum()


def literal_zero_assigned(x):
    y = torch.log(x)
    w = torch.ones(2) * 0  # Z:literal_zero_assigned
    return (y * w).sum()


def real_underflow(x):
    y = torch.log(x)
    w = torch.tensor([1e-30, 1.0]) * torch.tensor([1e-30, 1.0])  # Z:real_underflow
    return (y * w).sum()


def over_inf(x):
    y = torch.log(x)
    w = torch.tensor([1.0, 2.0]) / torch.tensor([float("inf"), 1.0])  # Z:over_inf
    return (y * w).sum()


def _grad_finding(report):
    return next(f for f in report.findings if f.target and "gradient" in f.title)


def test_a_literal_zero_in_the_backward_is_a_constant_not_an_underflow():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    report = gst.explain(literal_zero)(x)
    text = str(report)
    assert "underflow" not in text, text
    fs = [f for f in report.findings if f.zero_from is not None]
    assert len(fs) == 2, text  # the forward value's NaN and the gradient's
    for f in fs:
        assert f.where.line == line_of("O:literal_zero")
        assert f.zero_from.line == line_of("Z:literal_zero")
        assert f.detail["zero_kind"] == ZeroKind.MASK.value
        assert f.detail["met_text"].startswith(
            "`y * 0.0` multiplies by a mask that is 0 here, so the gradient through it is 0"
        ), f.detail["met_text"]


def test_jax_says_the_same_of_the_same_program():
    t = gst.explain(literal_zero)(torch.tensor([0.0, 1.0], requires_grad=True))
    j = gsj.explain(jax.value_and_grad(literal_zero_jax))(jnp.array([0.0, 1.0]))
    assert len(t.findings) >= 2 and len(j.findings) == 2
    for ft, fj in zip(t.findings, j.findings):
        assert ft.detail["zero_kind"] == fj.detail["zero_kind"] == ZeroKind.MASK.value
        zt = ft.detail["met_text"].split(", and ")[0]
        zj = fj.detail["met_text"].split(", and ")[0]
        assert zt == zj, (zt, zj)


def test_a_literal_zero_in_the_forward_is_a_constant():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    report = gst.explain(literal_zero_assigned)(x)
    text = str(report)
    assert "underflowed to exactly 0" not in text and "a value that underflowed" not in text
    f = report.findings[0]
    assert f.zero_from.line == line_of("Z:literal_zero_assigned"), text
    assert f.detail["zero_kind"] == ZeroKind.MASK.value


def test_a_product_of_nonzero_values_that_rounded_to_zero_is_an_underflow():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    report = gst.explain(real_underflow)(x)
    f = report.findings[0]
    assert f.zero_from.line == line_of("Z:real_underflow")
    assert f.detail["zero_kind"] == ZeroKind.UNDERFLOW.value
    assert "underflowed to exactly 0" in f.detail["met_text"]


def test_a_quotient_by_inf_is_zero_by_its_value_not_an_underflow():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    report = gst.explain(over_inf)(x)
    f = report.findings[0]
    assert f.zero_from.line == line_of("Z:over_inf")
    assert f.detail["zero_kind"] == ZeroKind.VALUE.value, str(report)
    assert "underflowed to exactly 0" not in str(report)
