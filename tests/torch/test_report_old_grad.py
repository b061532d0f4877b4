"""A NaN a leaf's .grad already held before the call (backward adds into .grad) is named as
that .grad, never as an unnamed "tensor of shape (2,)" that reads as the finite input."""

import torch

import gradsan.torch as gst


def doubled(x):
    return (x * 2.0).sum()


def step(model, x):
    return model(x).sum()


def test_a_nan_in_an_arguments_grad_is_named_as_its_grad():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    x.grad = torch.tensor([float("nan"), 0.0])
    report = gst.explain(doubled)(x)
    (f,) = report.findings
    assert f.catalog_id == "nonfinite-input"
    assert f.detail["input"] == "x.grad", f.detail
    assert str(report).startswith(
        "NaN in the gradient for `x`: it was already in the input: `x.grad` (nan in 1 of 2 "
        "elements, first at [0])."
    ), str(report)


def test_a_nan_in_a_parameters_grad_in_a_function_and_a_block():
    lin = torch.nn.Linear(2, 1)
    x = torch.ones(1, 2)
    lin.weight.grad = torch.full((1, 2), float("nan"))
    (f,) = gst.explain(step)(lin, x).findings
    assert f.detail["input"] == "model.weight.grad" and f.outputs[0].path == "model.weight"
    lin.weight.grad = torch.full((1, 2), float("nan"))
    with gst.explain(module=lin) as report:
        lin(x).sum().backward()
    (f,) = report.findings
    assert f.detail["input"] == "lin.weight.grad", f.detail


def test_a_call_after_a_failing_one_names_the_grad_it_left():
    def inverse(x):
        y = 1.0 / x  # the first call leaves x.grad NaN
        return (y * 0.0).sum()

    x = torch.tensor([0.0, 1.0], requires_grad=True)
    gst.explain(inverse)(x)
    report = gst.explain(inverse)(x)
    old = [f for f in report.findings if f.catalog_id == "nonfinite-input"]
    assert [f.detail["input"] for f in old] == ["x.grad"], str(report)
