"""guard's replay traces the backward up to where a NaN is born and not the Nodes after it
(gradsan.torch._untilborn): the same origin and the same reached gradients as a full trace,
other branches still traced, and a note that says what was not traced."""

import pytest
import torch

import gradsan
import gradsan.torch as gst
from gradsan.torch import _untilborn
from tests.conftest import line_of


class Chain(torch.nn.Module):
    def __init__(self, depth=12, bad=8):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(depth)])
        self.bad = bad

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if i == self.bad:
                x = torch.sqrt(x * 0.0) + x  # chain-sqrt
        return x.pow(2).mean()


def _report(step):
    with pytest.raises(gradsan.NonFiniteError) as e:
        gst.guard(step)()
    return e.value.report


def test_same_origin_and_reached_gradients_as_a_full_trace(monkeypatch):
    torch.manual_seed(0)
    model, x = Chain(), torch.randn(4, 8)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(x)
        loss.backward()
        return loss

    fast = _report(step)
    (f,) = fast.findings
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of("chain-sqrt")
    # every parameter before the bad layer (layers 0-8) gets the NaN; layers 9-11 stay finite
    want = [f"model.layers.{i}.{w}" for i in range(9) for w in ("weight", "bias")]
    assert sorted(o.path for o in f.outputs) == sorted(want)
    (note,) = [n for n in fast.notes if "up to where the NaN was born" in n]
    assert "not the " in note and " autograd Nodes after it" in note

    # the full trace (every Node hooked) finds the same origin and the same gradients
    from gradsan.torch._nodes import NodeHooks

    monkeypatch.setattr(_untilborn, "UntilBorn", NodeHooks)
    full = _report(step)
    (g,) = full.findings
    assert (g.catalog_id, g.where, sorted(o.path for o in g.outputs)) == (
        f.catalog_id,
        f.where,
        sorted(o.path for o in f.outputs),
    )
    assert not any("up to where the NaN was born" in n for n in full.notes)


def test_an_origin_in_another_branch_is_still_traced():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 4)
    b = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)

    def step():
        a.zero_grad(set_to_none=True)
        b.zero_grad(set_to_none=True)
        ya = torch.sqrt(a(x) * 0.0)  # branch-a
        yb = torch.log(b(x) * 0.0 + 1.0) * 0.0 + torch.sqrt(b(x) * 0.0)  # branch-b
        loss = ya.sum() + yb.sum()
        loss.backward()
        return loss

    report = _report(step)
    lines = sorted(f.where.line for f in report.findings)
    assert lines == sorted([line_of("branch-a"), line_of("branch-b")])
    by_line = {f.where.line: sorted(o.path for o in f.outputs) for f in report.findings}
    assert by_line[line_of("branch-a")] == ["a.bias", "a.weight"]
    assert by_line[line_of("branch-b")] == ["b.bias", "b.weight"]
