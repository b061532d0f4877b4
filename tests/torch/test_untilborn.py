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


# -- the counts the replay and the report share (gradsan.torch._counts) -------------------------

_INF, _NAN = float("inf"), float("nan")
_VALUES = [
    [1.0, 2.0],
    [1.0, _NAN],
    [_NAN, _NAN],
    [_INF, 1.0],
    [-_INF, 1.0],
    [_INF, -_INF],  # a NaN sum with no NaN
    [_NAN, _INF],
    [3e38, 3e38],  # float32: the sum overflows, every element finite
    [0.0, -0.0],
]


def _tensors():
    ts = [torch.tensor(v, dtype=torch.float32) for v in _VALUES]
    ts += [torch.tensor(v, dtype=torch.float64) for v in _VALUES[:7]]
    ts += [torch.tensor(v, dtype=torch.float16) for v in [[60000.0, 60000.0], [1.0, _NAN]]]
    ts += [torch.full((4, 3), _NAN).t(), torch.zeros(()), torch.tensor(_NAN)]
    return ts


def test_counts_and_verdicts_equal_one_tensor_at_a_time():
    from gradsan.torch import _counts
    from gradsan.torch._explain import output_hit
    from gradsan.torch._mode import nonfinite

    ts = _tensors()
    want = []
    for t in ts:
        h = output_hit("", t)
        want.append((h.nan, h.inf) if h.count else None)
    for screen in (True, False):
        memo: dict = {}
        assert _counts.counts(ts, memo, screen=screen) == want
        assert _counts.counts(ts, memo) == want  # from the memo
        assert _counts.verdicts(ts, None, screen=screen) == [nonfinite(t) for t in ts]
    # complex, empty, ints: not counted together, asked one at a time
    odd = [torch.tensor([1 + 1j, _NAN]), torch.empty(0), torch.tensor([1, 2])]
    assert _counts.verdicts(odd) == [nonfinite(t) for t in odd]


def test_the_memo_forgets_a_tensor_changed_in_place():
    from gradsan.torch import _counts

    t = torch.ones(5)
    memo: dict = {}
    assert _counts.counts([t], memo) == [None]
    t[2] = _NAN
    assert _counts.counts([t], memo) == [(1, 0)]
    u = t.clone()
    _counts.copy(memo, t, u)
    assert _counts.recall(memo, u) == (True, (1, 0))


def test_screen_equals_has_zero_and_nonfinite():
    from gradsan.torch._mode import is_float, nonfinite
    from gradsan.torch._zero import has_zero, screen

    ts = _tensors() + [torch.tensor([1 + 0j, 2j]), torch.tensor([0, 1]), torch.empty(0)]
    ts += [torch.tensor([True, False]), torch.zeros(3, device="meta")]
    for t in ts:
        want = (is_float(t) and has_zero(t), nonfinite(t) if is_float(t) else None)
        assert screen(t) == want, t


def test_accumulated_and_hooked_gradients_are_counted_as_they_are():
    """A .grad that already held a gradient (two backward calls) or that a post-accumulate
    hook changed is not taken for a copy of what came in: its own counts are reported."""
    torch.manual_seed(0)
    model, x = Chain(depth=4, bad=2), torch.randn(4, 8)
    w = model.layers[0].weight

    def twice():
        model.zero_grad(set_to_none=True)
        model(x).backward()
        model(x).backward()

    (f,) = _report(twice).findings
    hit = {o.path: o for o in f.outputs}["model.layers.0.weight"]
    assert (hit.count, hit.size) == (w.numel(), w.numel())

    def halve(p):
        with torch.no_grad():
            p.grad[0] = 1.0  # one row finite again

    h = w.register_post_accumulate_grad_hook(halve)
    try:

        def once():
            model.zero_grad(set_to_none=True)
            model(x).backward()

        (f,) = _report(once).findings
    finally:
        h.remove()
    hit = {o.path: o for o in f.outputs}["model.layers.0.weight"]
    assert (hit.count, hit.nan) == (w.numel() - w.shape[1], w.numel() - w.shape[1])
