"""guard's replay starts from the step's own start: the numbers, strings and small containers
the step names are put back to what they held when the step began, so a step that advances a
counter (or pops a work list) before it computes replays the same batch; after the report they
hold what the step left."""

from __future__ import annotations

import pytest
import torch

import gradsan
import gradsan.torch as gst

BAD = 2
BATCHES = [torch.full((3,), 1.0 + i) for i in range(5)]
BATCHES[BAD] = torch.zeros(3)  # sqrt at 0: inf * 0


def _loss(w, x):
    return torch.sqrt((w * x).pow(2).sum())  # L:origin


with open(__file__) as _f:
    ORIGIN = next(i for i, s in enumerate(_f, 1) if "# L:origin" in s and "next(" not in s)
counter = 0  # a global the step advances


def _run(step, n=5):
    g = gst.guard(step)
    for i in range(n):
        try:
            g()
        except gradsan.NonFiniteError as e:
            return i, e
    return None, None


def _check(err):
    f = err.report.findings[0]
    assert f.where is not None and f.where.line == ORIGIN, err.report
    assert any("as they were when the step began" in n for n in err.report.notes)


def test_a_dict_counter_in_the_closure():
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] += 1
        opt.zero_grad()
        loss = _loss(w, BATCHES[i])
        loss.backward()
        opt.step()
        return loss

    failed, err = _run(step)
    assert failed == BAD
    _check(err)
    assert state == {"i": BAD + 1}  # what the step left


def test_a_nonlocal_int_and_a_work_list():
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    todo = list(range(5))
    i = 0

    def step():
        nonlocal i
        j = todo.pop(0)
        i += 1
        opt.zero_grad()
        loss = _loss(w, BATCHES[j])
        loss.backward()
        opt.step()
        return loss

    failed, err = _run(step)
    assert failed == BAD
    _check(err)
    assert todo == [3, 4] and i == BAD + 1


def test_a_global_counter():
    global counter
    counter = 0
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)

    def step():
        global counter
        counter += 1
        opt.zero_grad()
        loss = _loss(w, BATCHES[counter - 1])
        loss.backward()
        opt.step()
        return loss

    failed, err = _run(step)
    assert failed == BAD
    _check(err)
    assert counter == BAD + 1


class Trainer:
    def __init__(self):
        self.w = torch.ones(3, requires_grad=True)
        self.opt = torch.optim.SGD([self.w], lr=0.1)
        self.it = 0

    def train_step(self):
        x = BATCHES[self.it]
        self.it += 1
        self.opt.zero_grad()
        loss = _loss(self.w, x)
        loss.backward()
        self.opt.step()
        return loss


def test_a_trainer_attribute():
    t = Trainer()
    failed, err = _run(t.train_step)
    assert failed == BAD
    _check(err)
    assert t.it == BAD + 1


def test_a_large_log_is_not_copied_and_the_note_says_so():
    """A list of more than 256 items is not copied on every step: the replay sees it as the
    step left it, and the note names it."""
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    log = [0.0] * 300
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] += 1
        opt.zero_grad()
        loss = _loss(w, BATCHES[i])
        loss.backward()
        opt.step()
        log.append(loss.item())
        return loss

    failed, err = _run(step)
    assert failed == BAD
    _check(err)
    note = next(n for n in err.report.notes if "a second time" in n)
    assert "`log`: too large to copy on every step" in note
    assert len(log) == 300 + BAD  # the failing step stopped before its append


@pytest.mark.parametrize("kind", ["list", "set", "deque"])
def test_start_state_rewinds_each_container_in_place(kind):
    import collections

    from gradsan.torch import _replay

    make = {"list": list, "set": set, "deque": collections.deque}[kind]
    box = make([1, 2])
    n = 5

    def step():
        return box, n

    b = _replay.Bindings(step)
    start = _replay.StartState(b)
    ref = box
    box.clear() if kind != "list" else box.append(3)
    start.rewind()
    assert box is ref and sorted(box) == [1, 2]


@pytest.mark.parametrize("how", ["data", "no_grad"])
def test_a_step_that_updates_its_parameters_itself(how):
    """No optimizer (word_language_model's ``p.data.add_(p.grad, alpha=-lr)``, or an update
    under no_grad): the gradients are checked right after the backward, so a NaN stops the
    step before its update; the replay stops there too; the parameters are what the failing
    step's forward saw, and the origin is the user's line."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1)
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] += 1
        lin.zero_grad()
        loss = _loss(lin.weight[0], BATCHES[i]) + lin.bias.sum()
        loss.backward()
        for p in lin.parameters():
            if how == "data":
                p.data.add_(p.grad, alpha=-0.1)
            else:
                with torch.no_grad():
                    p -= 0.1 * p.grad
        return loss

    g = gst.guard(step)
    g()
    g()
    before = [p.detach().clone() for p in lin.parameters()]
    with pytest.raises(gradsan.NonFiniteError) as ei:
        g()
    _check(ei.value)
    after = [p.detach() for p in lin.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, before))  # no update, no NaN
    assert all(torch.isfinite(p).all() for p in after)
    assert state["i"] == BAD + 1
    g()  # training goes on with the next batch
    assert all(torch.isfinite(p).all() for p in lin.parameters())


def test_with_an_optimizer_the_backward_is_not_checked_twice(monkeypatch):
    """Once an optimizer has stepped in a call, its pre-hook checks and the backward is not
    wrapped: one check per step."""
    from gradsan.torch import _guard

    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = _loss(w, x)
        loss.backward()
        opt.step()
        return loss

    calls = []
    real = _guard.finite
    monkeypatch.setattr(_guard, "finite", lambda *a: calls.append(len(a[0])) or real(*a))
    g = gst.guard(step)
    orig = torch.autograd.backward
    for _ in range(3):
        g(torch.ones(3))
        assert torch.autograd.backward is orig
    assert calls.count(1) == 3  # the pre-hook's check of w's gradient, once a step


def test_a_nan_the_grad_held_before_the_step_is_named_and_left_in_place():
    """A step without zero_grad whose .grad already held NaN: the replay (from .grad = None)
    computes finite gradients, so the NaN was in the .grad before the step; the report names
    `lin.weight.grad`, and the gradients stay as the step left them."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    lin.weight.grad = torch.full((1, 2), float("nan"))
    before = [p.detach().clone() for p in lin.parameters()]
    x = torch.randn(3, 2)

    def step():
        lin(x).sum().backward()
        opt.step()

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)()
    (f,) = ei.value.report.findings
    assert f.catalog_id == "nonfinite-input" and "`lin.weight.grad`" in str(ei.value.report)
    assert "zero_grad" in f.explanation
    assert "did not reproduce" not in str(ei.value.report)
    assert torch.isnan(lin.weight.grad).all()  # as the step left it, not the replay's
    assert torch.isfinite(lin.bias.grad).all()
    assert all(torch.equal(p, b) for p, b in zip(lin.parameters(), before))  # no update
