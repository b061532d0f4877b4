import torch

import gradsan.torch as gst
from tests.conftest import line_of


def test_where_trap_unselected_branch_is_repaired():
    x = torch.tensor([-1.0, 4.0], requires_grad=True)
    with gst.nansafe() as report:
        y = torch.where(x > 0, torch.sqrt(x), 0.0)  # trap
        y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 0.25]))
    (f,) = report.findings
    assert f.kind == "resolved" and f.catalog_id.startswith("sqrt")  # x = -1: sqrt-of-negative
    assert f.where.line == line_of("trap")
    assert report.ok


def test_boundary_of_where_is_not_structural():
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    with gst.nansafe() as report:
        torch.where(x > 0, torch.log(x) * 2 + 1, 0.0).sum().backward()  # boundary
    assert torch.isnan(x.grad[0])
    assert [f.kind for f in report.findings] == ["unresolved"]
    assert report.findings[0].where.line == line_of("boundary")
    assert not report.ok


def test_constant_zero_factor_is_structural():
    c = torch.tensor([0.0, 1.0, 1.0])
    x = torch.tensor([0.0, 0.0, 4.0], requires_grad=True)
    with gst.nansafe() as report:
        (c * torch.sqrt(x)).sum().backward()
    assert x.grad[0] == 0.0
    assert torch.isinf(x.grad[1])  # a genuine infinite slope stays
    assert x.grad[2] == 0.25
    assert sorted(f.kind for f in report.findings) == ["resolved", "unresolved"]


def test_detached_zero_factor_is_structural():
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    with gst.nansafe():
        z = (x * 0.0).detach()
        (z * torch.sqrt(x)).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 0.0]))


def test_numerical_zero_is_never_repaired():
    # sqrt(x) * sqrt(x) = x has derivative 1; 0 * inf := 0 would give a wrong 0
    x = torch.tensor([0.0], requires_grad=True)
    with gst.nansafe() as report:
        (torch.sqrt(x) * torch.sqrt(x)).sum().backward()
    assert torch.isnan(x.grad).all()
    assert report.findings and all(f.kind == "unresolved" for f in report.findings)


def test_finite_gradients_are_unchanged():
    torch.manual_seed(0)
    x = torch.rand(5, requires_grad=True)
    (torch.where(x > 0.5, torch.sqrt(x), x**2)).sum().backward()
    ref = x.grad.clone()
    x.grad = None
    with gst.nansafe() as report:
        (torch.where(x > 0.5, torch.sqrt(x), x**2)).sum().backward()
    assert torch.equal(ref, x.grad) and report.findings == []
