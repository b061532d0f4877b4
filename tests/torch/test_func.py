"""torch.func transforms and torch.autograd.grad: the gradients they return are checked and
blamed like ``.grad``; an explain block without backward reports its non-finite forward values."""

import pytest
import torch
from torch.func import grad, grad_and_value, jacrev, vjp, vmap

import gradsan
import gradsan.torch as gst
from tests.conftest import line_of


def dist(w, x):
    h = w * x
    return torch.sqrt((h - h.detach()).pow(2).sum())  # func-sqrt


def check(report, *paths):
    assert not report.ok
    f = report.findings[0]
    assert f.catalog_id == "sqrt-at-zero" and f.phase == "gradient"
    assert f.where.file == __file__ and f.where.line == line_of("func-sqrt")
    assert f.where.function == "dist"
    assert [o.path for o in f.outputs] == list(paths)
    return f


def test_func_grad_is_found_and_located():
    w, x = torch.randn(4), torch.randn(4)
    with gst.explain() as report:
        g = grad(dist)(w, x)
    assert torch.isnan(g).all()  # the user's result is functorch's own
    check(report, "w")


def test_func_grad_and_value_and_argnums():
    w, x = torch.randn(4), torch.randn(4)
    with gst.explain() as report:
        gx, value = grad_and_value(dist, argnums=1)(w, x)
    assert value.item() == 0.0 and torch.isnan(gx).all()
    check(report, "x")


def test_func_grad_functional_form():
    w, x = torch.randn(4), torch.randn(4)
    report = gst.explain(lambda w, x: grad(dist)(w, x))(w, x)
    check(report, "w")


def test_func_vjp_and_jacrev():
    w, x = torch.randn(4), torch.randn(4)
    with gst.explain() as report:
        _, vjp_fn = vjp(lambda w: dist(w, x), w)
        (gw,) = vjp_fn(torch.tensor(1.0))
    assert torch.isnan(gw).all()
    check(report, "w")
    with gst.explain() as report:
        jac = jacrev(dist)(w, x)
    assert torch.isnan(jac).all()
    check(report, "w")
    assert any("re-ran batch element 0" in n for n in report.notes)


def test_func_vmap_does_not_crash_and_explains_one_element():
    w = torch.randn(4)
    xs = torch.randn(3, 4)
    xs[0] = 1.0  # all rows give sqrt(0): the first element is replayed
    with gst.explain() as report:
        gs = vmap(grad(dist, argnums=1), in_dims=(None, 0))(w, xs)
    assert gs.shape == (3, 4) and torch.isnan(gs).all()
    check(report, "xs[0]")
    (note,) = report.notes
    assert "vmap" in note and "batch element 0 of 3" in note


def test_func_vmap_of_a_forward_nan():
    xs = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    with gst.explain() as report:
        ys = vmap(torch.log)(xs)  # vmap-log
    assert torch.isinf(ys[1, 0])
    f = report.findings[0]
    assert f.catalog_id == "log-at-zero" and f.phase == "value"
    assert f.where.line == line_of("vmap-log")
    assert [o.path for o in f.outputs] == ["ys[1]"]


def test_finite_func_grad_reports_nothing():
    w, x = torch.randn(4), torch.randn(4) + 5.0
    with gst.explain() as report:
        g = grad(lambda w, x: (w * x).pow(2).sum())(w, x)
    assert report.ok and not report.findings
    assert torch.isfinite(g).all()


def test_autograd_grad_is_blamed():
    w = torch.randn(4, requires_grad=True)
    x = torch.randn(4)
    with gst.explain() as report:
        (g,) = torch.autograd.grad(dist(w, x), w)
    assert torch.isnan(g).all() and w.grad is None
    check(report, "w")


def test_explain_without_backward_reports_forward_values():
    with gst.explain() as report:
        y = torch.log(torch.tensor([0.0, 1.0]))  # fwd-log
        z = torch.tensor([4.0, -1.0]).sqrt()  # fwd-sqrt
    assert torch.isinf(y[0]) and torch.isnan(z[1])
    assert not report.ok
    got = {(f.phase, f.catalog_id, f.where.line, f.outputs[0].path) for f in report.findings}
    assert got == {
        ("value", "log-at-zero", line_of("fwd-log"), "y"),
        ("value", "sqrt-of-negative", line_of("fwd-sqrt"), "z"),
    }
    assert "every output is finite" not in str(report)


def test_explain_without_backward_says_what_it_checked():
    with gst.explain() as report:
        y = torch.log(torch.tensor([2.0, 1.0]))
    assert report.ok and torch.isfinite(y).all()
    text = str(report)
    assert "every output is finite" not in text
    assert "no backward ran" in text and "no gradient" in text


def loss_of(w, x):
    return grad(dist)(w, x).sum()


def test_guard_stops_a_nan_returned_by_func_grad():
    w, x = torch.randn(4), torch.randn(4)
    updates = []

    def step(w, x):
        g = grad(dist)(w, x)
        updates.append(1)  # never reached: the gradient is checked when grad returns
        return w - 0.1 * g

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)(w, x)
    assert updates == []  # neither the step nor its replay ran past the failing transform
    check(ei.value.report, "w")


def test_guard_stops_a_nan_returned_by_autograd_grad():
    w = torch.randn(4, requires_grad=True)
    x = torch.randn(4)

    def step(w, x):
        (g,) = torch.autograd.grad(dist(w, x), w)
        return g

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)(w, x)
    check(ei.value.report, "w")
