import torch

import gradsan.torch as gst
from tests.conftest import line_of


def test_kinks_are_flagged_with_their_lines():
    x = torch.tensor([0.0, 1.0, -2.0], requires_grad=True)
    y = torch.tensor([0.0, 1.0, 3.0], requires_grad=True)
    with gst.sanitize() as report:
        a = torch.abs(x).sum()  # abs
        b = torch.relu(x).sum()  # relu
        c = torch.maximum(x, y).sum()  # maximum
        e = torch.where(x > 0, x, -x).sum()  # where
        f = torch.clamp(x, 0, 1).sum()  # clamp
        g = torch.max(torch.stack([y[1], y[1], y[0]]), dim=0).values  # maxdim
        (a + b + c + e + f + g).backward()
    got = {(f.catalog_id, f.where.line) for f in report.findings}
    assert ("abs-at-zero", line_of("abs")) in got
    assert ("relu-at-zero", line_of("relu")) in got
    assert ("max-tie", line_of("maximum")) in got
    assert ("where-at-boundary", line_of("where")) in got
    assert ("clip-at-bound", line_of("clamp")) in got
    assert ("max-tie", line_of("maxdim")) in got
    assert all(f.kind == "kink" for f in report.findings)
    assert report.ok  # kinks are not errors


def test_atan2_at_origin_is_an_inadmissible_convention():
    p = torch.zeros(2, requires_grad=True)
    with gst.sanitize() as report:
        torch.atan2(p[0], p[1]).backward()  # atan2
    (f,) = report.findings
    assert f.kind == "convention" and f.catalog_id == "atan2-at-origin"
    assert f.where.line == line_of("atan2")
    assert f.detail["admissible"] is False


def test_jax_seed_abs_vs_norm_in_torch():
    x = torch.tensor(0.0, requires_grad=True)
    y = torch.tensor(0.0)
    with gst.sanitize() as report:
        torch.abs(x - y).backward()  # abs-seed
    assert [f.catalog_id for f in report.findings] == ["abs-at-zero"]
    assert report.findings[0].where.line == line_of("abs-seed")


def test_smooth_function_has_no_flags():
    x = torch.tensor([0.5, 1.0], requires_grad=True)
    report = gst.sanitize(lambda x: (torch.tanh(x) * torch.exp(x)).sum())(x)
    assert report.findings == []
