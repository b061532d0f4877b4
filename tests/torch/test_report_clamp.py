"""clamp's bounds read wherever they are given: positionally or by keyword, in the function,
the Tensor method and the in-place forms (clamp_max(x, max=v) read its bound as None)."""

import pytest
import torch

import gradsan.torch as gst
from gradsan.torch import _rules

FORMS = {
    "clamp_max(x, max=)": lambda x: torch.clamp_max(x, max=1.0),
    "clamp_max(x, v)": lambda x: torch.clamp_max(x, 1.0),
    "x.clamp_max(max=)": lambda x: x.clamp_max(max=1.0),
    "clamp_max_(x, max=)": lambda x: torch.clamp_max_(x * 1.0, max=1.0),
    "x.clamp_max_(max=)": lambda x: (x * 1.0).clamp_max_(max=1.0),
    "clamp_min(x, min=)": lambda x: torch.clamp_min(x, min=1.0),
    "x.clamp_min_(min=)": lambda x: (x * 1.0).clamp_min_(min=1.0),
    "clamp(x, max=)": lambda x: torch.clamp(x, max=1.0),
    "clamp(x, min=, max=)": lambda x: torch.clamp(x, min=-3.0, max=1.0),
    "clamp(input=x, min=)": lambda x: torch.clamp(input=x, min=1.0),
    "x.clamp_(max=)": lambda x: (x * 1.0).clamp_(max=1.0),
    "clip(x, max=)": lambda x: torch.clip(x, max=1.0),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_bound_by_keyword_is_flagged_at_the_bound(form):
    x = torch.tensor([1.0, 0.5], requires_grad=True)
    with gst.sanitize() as report:
        FORMS[form](x).sum().backward()
    (f,) = report.findings
    assert f.catalog_id == "clip-at-bound", str(report)
    assert f.where.line == FORMS[form].__code__.co_firstlineno  # the clamp call's own line
    assert f.detail["got"] == "1.0" and f.index == (0,)
    # PyTorch's clamp passes the gradient at a bound (1), inside the subdifferential [0, 1]
    assert f.detail["value"] == "1" and f.detail["admissible"] is True


@pytest.mark.parametrize("form", sorted(FORMS))
def test_off_the_bound_nothing_is_flagged(form):
    x = torch.tensor([0.25, 0.5], requires_grad=True)
    if "min" in form:
        x = torch.tensor([1.25, 1.5], requires_grad=True)
    with gst.sanitize() as report:
        FORMS[form](x).sum().backward()
    assert not report.findings and not report.notes, str(report)


def test_a_bound_the_gradient_does_not_depend_on_is_checked_and_left_out():
    x = torch.tensor([1.0, 0.5], requires_grad=True)
    with gst.sanitize() as report:
        (torch.clamp_max(x, max=1.0) * 0.0).sum().backward()
    assert not report.findings
    assert report.notes == [
        "1 kink(s) or tie(s) checked and left out: the gradient does not depend on the choice "
        "there (1 no effect on the loss)"
    ]


def test_the_operands_the_catalog_reads():
    x = torch.tensor([1.0])
    lo, xx, hi = _rules.operands_for("clamp_max", (x,), {"max": 2.0})[0]
    assert lo is None and xx is x and float(hi) == 2.0
    lo, xx, hi = _rules.operands_for("clamp_max_", (x, 2.0), {})[0]
    assert lo is None and float(hi) == 2.0
    lo, xx, hi = _rules.operands_for("clamp_min", (x,), {"min": -2.0})[0]
    assert float(lo) == -2.0 and hi is None
    lo, xx, hi = _rules.operands_for("clamp", (), {"input": x, "max": 3.0})[0]
    assert lo is None and xx is x and float(hi) == 3.0
    assert _rules.clamp_bounds("hardtanh", (x,), {"max_val": 0.5}) == (x, -1.0, 0.5)
