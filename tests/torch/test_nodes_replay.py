"""guard's replay runs a Node again where a NaN is born in it (gradsan.torch._nodes), and what
the backward computes stays autograd's, bit for bit: a Node called from Python returns its raw
outputs (a Linear's bias gradient [batch, out], an add's [rows, cols] for a [rows, 1] operand),
the engine then sums a broadcast gradient to its input's shape and casts it to its dtype. The
re-run does the same under the dispatch mode (a NaN can be born in that sum: inf + -inf), and
its outputs stand in for autograd's only when they hold the same bits."""

import pytest
import torch
from torch import nn

import gradsan
import gradsan.torch as gst
from gradsan.torch import _nodes
from tests.conftest import line_of

SIGN = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])  # +inf and -inf meet in a batch's sum


def linear():
    lin = nn.Linear(3, 1)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.zero_()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))

    def step():
        lin.zero_grad(set_to_none=True)
        loss = (torch.sqrt(lin(x)) * SIGN).sum()  # L:linear
        loss.backward()
        return loss

    return step, list(lin.parameters()), "L:linear", "AddmmBackward0"


def addmm():
    b = torch.zeros(2, requires_grad=True)
    w = torch.zeros(3, 2, requires_grad=True)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))

    def step():
        b.grad = w.grad = None
        loss = (torch.sqrt(torch.addmm(b, x, w)) * SIGN).sum()  # L:addmm
        loss.backward()
        return loss

    return step, [b, w], "L:addmm", "AddmmBackward0"


def conv():
    c = nn.Conv2d(1, 2, 2)
    with torch.no_grad():
        c.weight.zero_()
        c.bias.zero_()
    x = torch.randn(2, 1, 3, 3, generator=torch.Generator().manual_seed(2))
    sign = torch.tensor([1.0, -1.0]).view(2, 1, 1, 1)

    def step():
        c.zero_grad(set_to_none=True)
        loss = (torch.sqrt(c(x)) * sign).sum()  # L:conv
        loss.backward()
        return loss

    return step, list(c.parameters()), "L:conv", "ConvolutionBackward0"


def broadcast_add():
    a = torch.zeros(4, 1, requires_grad=True)
    b = torch.zeros(1, 3, requires_grad=True)

    def step():
        a.grad = b.grad = None
        loss = (torch.sqrt(a + b) * SIGN).sum()  # L:add
        loss.backward()
        return loss

    return step, [a, b], "L:add", "AddBackward0"


def broadcast_mul():
    a = torch.full((4, 1), 2.0, requires_grad=True)
    b = torch.zeros(1, 3, requires_grad=True)

    def step():
        a.grad = b.grad = None
        loss = (torch.sqrt(a * b) * SIGN).sum()  # L:mul
        loss.backward()
        return loss

    return step, [a, b], "L:mul", "MulBackward0"


def expand():
    e = torch.zeros(1, 3, requires_grad=True)

    def step():
        e.grad = None
        loss = (torch.sqrt(e.expand(4, 3)) * SIGN).sum()  # L:expand
        loss.backward()
        return loss

    return step, [e], "L:expand", "ExpandBackward0"


def mixed_dtype():
    p = torch.zeros(1, requires_grad=True)  # float32, added to float64: the engine casts back
    x = torch.zeros(4, 1, dtype=torch.float64)

    def step():
        p.grad = None
        loss = (torch.sqrt(x + p) * SIGN.double()).sum()  # L:dtype
        loss.backward()
        return loss

    return step, [p], "L:dtype", "AddBackward0"


CASES = [linear, addmm, conv, broadcast_add, broadcast_mul, expand, mixed_dtype]


def _bits(t):
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(ints)


def _plain(step, params):
    step()
    return [p.grad.clone() for p in params]


@pytest.fixture
def reruns(monkeypatch):
    """(Node name, whether its re-run stood in for autograd's outputs) of each re-run."""
    seen = []
    again = _nodes.NodeHooks._again

    def spy(self, node, grad_inputs, grad_outputs):
        out = again(self, node, grad_inputs, grad_outputs)
        seen.append((node.name(), out is not None))
        return out

    monkeypatch.setattr(_nodes.NodeHooks, "_again", spy)
    return seen


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_the_replayed_gradients_are_autograds_and_the_origin_is_named(case, reruns):
    step, params, marker, node = case()
    want = _plain(step, params)
    assert any(not torch.isfinite(g).all() for g in want)  # the case makes a NaN/Inf
    with pytest.raises(gradsan.NonFiniteError) as e:
        gst.guard(step, params=params)()
    # the Node was run again (and its outputs, the engine's to the bit, used): no crash
    assert (node, True) in reruns
    # guard's replay leaves .grad as it computed it: the same bits as plain autograd's
    for p, g in zip(params, want):
        assert p.grad is not None and p.grad.dtype == g.dtype and p.grad.shape == g.shape
        assert torch.equal(_bits(p.grad), _bits(g))
    f = e.value.report.findings[0]
    assert f.catalog_id == "sqrt-at-zero"
    assert (f.where.file, f.where.line) == (__file__, line_of(marker))
    assert f"test_nodes_replay.py:{line_of(marker)} (step)" in str(e.value.report)
    # explain (a fully traced backward) names the same origin
    (g,) = gst.explain(step)().findings
    assert (g.catalog_id, g.where.line) == (f.catalog_id, f.where.line)


def test_a_re_run_that_differs_from_autograd_is_not_used(monkeypatch, reruns):
    # a re-run that does not give autograd's bits (nondeterminism) only observes: what the
    # backward hands on stays autograd's, and the report still names the origin
    as_engine = _nodes._as_engine

    def off(a, o):
        a = as_engine(a, o)
        if isinstance(a, torch.Tensor) and a.numel():
            a = a.clone()
            a.view(-1)[0] = 123.0
        return a

    monkeypatch.setattr(_nodes, "_as_engine", off)
    step, params, marker, _ = broadcast_add()
    want = _plain(step, params)
    with pytest.raises(gradsan.NonFiniteError) as e:
        gst.guard(step, params=params)()
    assert ("AddBackward0", False) in reruns
    for p, g in zip(params, want):
        assert torch.equal(_bits(p.grad), _bits(g))
    f = e.value.report.findings[0]
    assert (f.catalog_id, f.where.line) == ("sqrt-at-zero", line_of(marker))


def test_same_bits_tells_a_nan_payload_and_a_signed_zero_apart():
    nan = torch.tensor([float("nan")])
    other = (_bits(nan) ^ 1).view(torch.float32)  # another NaN
    assert _nodes._same_bits(nan, nan.clone())
    assert not _nodes._same_bits(nan, other)
    assert not _nodes._same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not _nodes._same_bits(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not _nodes._same_bits(torch.zeros(2), torch.zeros(1, 2))
    assert not _nodes._same_bits(torch.zeros(2), None)
    assert _nodes._same_bits(None, None)
