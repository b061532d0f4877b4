"""torch.utils.checkpoint (reentrant and not): the NaN is located at the user's line inside the
checkpointed function, and checkpoint's internal copies of its inputs are not reported."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import gradsan
import gradsan.torch as gst
from tests.conftest import line_of


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return torch.sqrt(((h - h.detach()) ** 2).sum(-1))  # ckpt-sqrt


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_locates_the_users_line(reentrant):
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(3, 4, requires_grad=True)
    with gst.explain() as report:
        loss = checkpoint(block, x, use_reentrant=reentrant).sum()
        loss.backward()
    assert torch.isnan(x.grad).all()
    (f,) = report.findings
    assert f.catalog_id == "sqrt-at-zero" and f.primitive == "sqrt"
    assert f.where.file == __file__ and f.where.line == line_of("ckpt-sqrt")
    assert f.where.function == "forward"
    assert {o.path for o in f.outputs} == {"x", "block.lin.weight", "block.lin.bias"}


@pytest.mark.parametrize("reentrant", [True, False])
def test_guard_replays_a_checkpointed_step(reentrant):
    torch.manual_seed(0)
    block = Block()
    opt = torch.optim.SGD(block.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = checkpoint(block, x, use_reentrant=reentrant).sum()
        loss.backward()
        opt.step()

    with pytest.raises(gradsan.NonFiniteError) as ei:
        # reentrant checkpoint needs an input that requires grad to reach the parameters
        gst.guard(step)(torch.randn(3, 4, requires_grad=True))
    f = ei.value.report.findings[0]
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of("ckpt-sqrt")
