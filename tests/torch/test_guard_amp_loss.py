"""guard with a GradScaler: a step the scaler skips because its gradients overflowed is a note;
a step whose loss was already NaN/Inf before ``scaler.scale`` (the forward made it) is reported
at once: skipping it and lowering the scale cannot fix it."""

from __future__ import annotations

import pytest
import torch

import gradsan
import gradsan.torch as gst
from tests.conftest import line_of


def _setup(bad: int, *, overflow: bool = False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] += 1
        x = torch.randn(8, 4)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(x).float()
            if i >= bad and not overflow:
                pred = torch.log(pred - 100.0)  # L:amp-log
            loss = pred.pow(2).mean()
            if i == bad and overflow:
                loss = loss * 1e37  # finite; scaled by 256 it overflows float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step, model, scaler


def test_a_nan_loss_before_scaling_is_reported_at_its_step():
    step, model, scaler = _setup(bad=2)
    g = gst.guard(step)
    g()
    g()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(gradsan.NonFiniteError) as ei:
        g()
    f = ei.value.report.findings[0]
    assert f.catalog_id == "log-of-negative" or f.primitive == "log", ei.value.report
    assert f.where is not None and f.where.line == line_of("L:amp-log")
    assert any(
        "already non-finite when the step gave it to GradScaler.scale" in n
        for n in ei.value.report.notes
    )
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert scaler.get_scale() == 2.0**7  # as the failing step left it (its own backoff)


def test_an_overflow_of_the_scaled_gradients_is_still_a_note():
    step, model, scaler = _setup(bad=2, overflow=True)
    g = gst.guard(step)
    for _ in range(4):
        g()  # no error: the scaler skips step 3 by design
    assert scaler.get_scale() < 2.0**8
    assert any("skipped" in n for n in g.notes)
