"""The torch fix verifier's re-runs of a train step leave the user's state as the user's one
call left it: the parameters and ``.grad`` of the modules the step reaches through its closure,
its optimizer's state, the random number generators; a step reading from an iterator is not
run again at all."""

import random

import numpy as np
import pytest
import torch
from torch import nn

import gradsan.torch as gst


def _train_step(momentum=0.9):
    torch.manual_seed(0)
    model = nn.Linear(3, 3).double()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)

    def step(x):
        opt.zero_grad()
        h = model(x + 1e-3 * torch.randn_like(x) * 0.0)
        n = torch.sqrt((h * h).sum(-1, keepdim=True))
        loss = (h / (n + 1e-6)).sum() + 1e-3 * float(np.random.rand()) * 0.0 + random.random() * 0
        loss.backward()
        opt.step()
        return loss

    return step, model, opt


def _state(model, opt):
    out = [t.detach().clone() for t in model.parameters()]
    out += [t.grad.clone() for t in model.parameters() if t.grad is not None]
    for st in opt.state.values():
        out += [v.clone() for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def _rngs():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def test_a_closure_train_step_updates_the_users_model_once():
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    step, model, opt = _train_step()
    random.seed(0)
    np.random.seed(0)
    report = gst.explain(step)(x)
    fixes = [p for f in report.findings for p in f.fixes if p.code]
    assert fixes and all(p.status != "verified" for p in fixes)  # nothing of the gradient compared
    assert all("not its gradient" in p.checked for p in fixes), [p.checked for p in fixes]
    got, rngs = _state(model, opt), _rngs()
    step2, model2, opt2 = _train_step()
    random.seed(0)
    np.random.seed(0)
    step2(x)  # the same step, with no fix checking
    want, rngs2 = _state(model2, opt2), _rngs()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (
            torch.equal(a, b)
            or (a.isnan() == b.isnan()).all()
            and torch.equal(a.nan_to_num(), b.nan_to_num())
        )
    assert torch.equal(rngs[0], rngs2[0])
    assert np.array_equal(rngs[1], rngs2[1]) and rngs[2] == rngs2[2]


def test_a_step_reading_an_iterator_is_not_run_again():
    model = nn.Linear(3, 1).double()
    batches = iter([torch.zeros(2, 3, dtype=torch.float64)] * 3)

    def step():
        h = model(next(batches))
        return torch.sqrt((h * h).sum() * 0.0)

    report = gst.explain(step)()
    fixes = [p for f in report.findings for p in f.fixes if p.code]
    if not fixes:
        pytest.skip("no code fix proposed for this program")
    assert all("batches" in p.checked and p.status != "verified" for p in fixes)
    assert len(list(batches)) == 2  # the user's call took one batch, and no other


LIN = nn.Linear(2, 2).double()
with torch.no_grad():
    LIN.weight.zero_()
    LIN.bias.zero_()


def abs_of_a_global_layer(x):
    return torch.abs(LIN(x)).sum()  # |0|: a kink the gradient of LIN's parameters sits on


def test_a_kink_fix_is_not_verified_by_an_empty_gradient():
    rep = gst.sanitize(abs_of_a_global_layer)(torch.tensor([1.0, 2.0], dtype=torch.float64))
    fixes = [p for f in rep.findings for p in f.fixes if p.code]
    assert fixes, str(rep)
    assert all(p.status != "verified" for p in fixes), [p.checked for p in fixes]
