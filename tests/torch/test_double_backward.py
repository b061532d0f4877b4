"""A gradient penalty (double backward) through abs: PyTorch's second derivative of abs is a
storage-less ZeroTensor, which gradsan's backward tracer must not read (it crashed torch)."""

from __future__ import annotations

import torch

import gradsan.torch as gst
from tests.conftest import line_of


def _penalty(x):
    f = x.abs().sum()
    (g,) = torch.autograd.grad(f, x, create_graph=True)
    return (g**2).sum() + (x * g).sum()


def test_explain_through_abs_double_backward_gives_the_plain_gradient():
    x0 = torch.tensor([0.0, 1.5, -2.0])
    plain = x0.clone().requires_grad_(True)
    _penalty(plain).backward()
    x = x0.clone().requires_grad_(True)
    with gst.explain() as report:
        _penalty(x).backward()
    assert torch.equal(x.grad, plain.grad)
    assert torch.equal(x.grad, torch.tensor([0.0, 1.0, -1.0]))
    assert not report.findings


def test_explain_locates_a_nan_behind_a_double_backward():
    x = torch.tensor([0.0, 1.5, -2.0], requires_grad=True)
    with gst.explain() as report:
        (_penalty(x) + torch.sqrt(x * 0).sum()).backward()  # sqrt
    assert torch.isnan(x.grad).any()
    (f,) = report.findings
    assert f.catalog_id == "sqrt-at-zero" and f.primitive == "sqrt"
    assert f.where.file == __file__ and f.where.line == line_of("sqrt")
