"""torch findings that were located but had no catalog entry (so no words and no fix): each now
names its entry, and where the entry has a code fix it is verified on the program."""

import torch

import gradsan.torch as gst

MASK = torch.tensor([False, True])


def reciprocal_masked(x):
    loss = torch.where(MASK, 1.0 / x, 0.0).sum()  # 1.0 / x is aten.reciprocal
    loss.backward()
    return loss


def _nonfinite(report):
    found = [f for f in report.findings if f.kind == "nonfinite"]
    assert found, str(report)
    return found


def test_reciprocal_is_a_division_by_zero_with_a_verified_fix():
    x = torch.tensor([0.0, 0.5], requires_grad=True)
    report = gst.explain(reciprocal_masked)(x)
    (f,) = _nonfinite(report)
    assert f.catalog_id == "div-by-zero", str(report)
    assert f.explanation
    verified = [p for p in f.fixes if p.status == "verified"]
    assert any("safe.div(1.0, x)" in p.replacement for p in verified), str(report)
    assert "gradsan catalog div-by-zero" in str(report)
