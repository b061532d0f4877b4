"""guard's replay names the zero of a ``0 * inf`` or ``0 / 0`` as explain does, when the Node
that made the zero ran only under a Node hook (gradsan.torch._nodes) and not op by op: its
record reads the forward values the Node saved (``h / n``'s gradient for ``n`` reads ``h``),
so the walk to where the zero came from ends where the fully traced backward's ends (before,
such a zero was 'no gradient flows along this path (an integer value or stop_gradient)'). A
saved tensor's detach in a Node run again is not where its zero came from (before, the walk went
round it and both said '`torch.relu(n - 1.0)` is 0 here' for the derivative of relu)."""

import pytest
import torch
from torch import nn

import gradsan
import gradsan.torch as gst
from tests.conftest import line_of


def _lin(weight=0.0, bias=0.0):
    m = nn.Linear(3, 3)
    with torch.no_grad():
        m.weight.fill_(weight)
        m.bias.fill_(bias)
    return m


def normalise():
    m = _lin()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))

    def step():
        m.zero_grad(set_to_none=True)
        h = m(x)
        n = torch.sqrt((h * h).sum(-1, keepdim=True))
        loss = (h / (n + 1e-6)).sum()  # L:zero-normalise
        loss.backward()
        return loss

    return step, m, "L:zero-normalise", "the derivative of `h / (n + 1e-6)` is 0 here"


def square_of_root():
    m = _lin()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))

    def step():
        m.zero_grad(set_to_none=True)
        n = torch.sqrt(m(x) * m(x))
        loss = (n**2).sum()  # L:zero-square
        loss.backward()
        return loss

    return step, m, "L:zero-square", "the derivative of `n**2` is 0 here"


def relu_of_root():
    m = _lin()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))

    def step():
        m.zero_grad(set_to_none=True)
        n = torch.sqrt(m(x) * m(x))
        loss = torch.relu(n - 1.0).sum()  # L:zero-relu
        loss.backward()
        return loss

    return step, m, "L:zero-relu", "the derivative of `torch.relu(n - 1.0)` is 0 here"


def masked_root():
    m = _lin()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    keep = torch.zeros(4, 3)

    def step():
        m.zero_grad(set_to_none=True)
        n = torch.sqrt(m(x) * m(x))
        loss = (n * keep).sum()  # L:zero-mask
        loss.backward()
        return loss

    return step, m, "L:zero-mask", "multiplies by a mask that is 0 here"


CASES = [normalise, square_of_root, relu_of_root, masked_root]


def _met(report):
    """The 'met' block of the report's first finding: its line and the words on the zero."""
    lines = str(report).splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("met "))
    return lines[i], lines[i + 2].strip()


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_guard_names_the_zero_as_explain_does(case):
    step, m, marker, words = case()
    explained = gst.explain(step)()
    with pytest.raises(gradsan.NonFiniteError) as e:
        gst.guard(step)()
    guarded = e.value.report
    assert [f.catalog_id for f in guarded.findings] == [f.catalog_id for f in explained.findings]
    (where, said), (ewhere, esaid) = _met(guarded), _met(explained)
    assert f"test_nodes_zero.py:{line_of(marker)} (step)" in where
    assert (where, said) == (ewhere, esaid)
    assert "stop_gradient" not in said
    assert words in said
