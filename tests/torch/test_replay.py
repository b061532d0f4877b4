"""guard's replay: no batch is pulled again, no optimizer update or scheduler step is applied,
parameters, buffers and the RNG stream are what a run without gradsan left; the step's Python
runs a second time and the report says so (the lists and numbers it names are put back);
where the step cannot be replayed safely, the report says so."""

import copy
import types

import pytest
import torch

import gradsan
import gradsan.torch as gst
from tests.conftest import line_of


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x, bad):
        h = self.bn(self.lin(x))
        if bad:
            return torch.sqrt(((h - h.detach()) ** 2).sum())  # replay-sqrt
        return h.pow(2).mean()


def batches():
    torch.manual_seed(1)
    for i in range(10):
        yield torch.randn(8, 4), i == 2  # the third batch is the bad one


def test_iterator_loses_no_batch_and_no_update_is_applied():
    torch.manual_seed(0)
    model = Net()
    plain = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    it = batches()

    def step():
        x, bad = next(it)
        opt.zero_grad()
        loss = model(x, bad)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    guarded = gst.guard(step)
    guarded()
    guarded()
    with pytest.raises(gradsan.NonFiniteError) as ei:
        guarded()
    f = ei.value.report.findings[0]
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of("replay-sqrt")
    # the next batch is the 4th: the replay took none from the iterator
    x, bad = next(it)
    assert not bad and x.shape == (8, 4)
    ref = batches()
    for _ in range(3):
        next(ref)
    assert torch.equal(next(ref)[0], x)
    # the same updates and scheduler steps as a run without gradsan, stopped before the 3rd
    # update (guard stops the non-finite one)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    sched_p = torch.optim.lr_scheduler.StepLR(opt_p, step_size=1, gamma=0.5)
    for xb, badb in list(batches())[:3]:
        opt_p.zero_grad()
        plain(xb, badb).backward()
        if not badb:
            opt_p.step()
            sched_p.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    for a, b in zip(model.buffers(), plain.buffers()):  # BatchNorm ran 3 times, not 4
        assert torch.equal(a, b)
    assert sched.last_epoch == sched_p.last_epoch == 2
    assert opt.param_groups[0]["lr"] == opt_p.param_groups[0]["lr"]


def test_rng_stream_continues_as_without_gradsan():
    lin = torch.nn.Linear(4, 4)

    def step(x):
        h = torch.nn.functional.dropout(lin(x), 0.5)
        loss = torch.sqrt((h - h.detach()).pow(2).sum())
        loss.backward()
        return loss

    x = torch.randn(2, 4)
    torch.manual_seed(5)
    step(x)
    after_plain = torch.get_rng_state()
    torch.manual_seed(5)
    with pytest.raises(gradsan.NonFiniteError):
        gst.guard(step)(x)
    assert torch.equal(torch.get_rng_state(), after_plain)


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 1)


def two_optimizer_run(guarded: bool, steps: int = 3):
    torch.manual_seed(0)
    m = Two()
    opt_a = torch.optim.Adam(m.a.parameters(), lr=0.1)
    opt_b = torch.optim.Adam(m.b.parameters(), lr=0.1)

    def step(x, bad):
        opt_a.zero_grad()
        m.a(x).pow(2).mean().backward()
        opt_a.step()  # its update is applied once
        opt_b.zero_grad()
        h = m.b(m.a(x).detach())
        loss = torch.sqrt((h - h.detach()).pow(2).sum()) if bad else h.mean()  # two-sqrt
        loss.backward()
        opt_b.step()

    run = gst.guard(step) if guarded else step
    torch.manual_seed(3)
    data = [(torch.randn(5, 4), i == steps - 1) for i in range(steps)]
    err = None
    for x, bad in data:
        if not guarded and bad:  # a run without gradsan, stopped before the bad update
            opt_a.zero_grad()
            m.a(x).pow(2).mean().backward()
            opt_a.step()
            break
        try:
            run(x, bad)
        except gradsan.NonFiniteError as e:
            err = e
    return m, err


def test_two_optimizers_first_update_applied_once():
    ref, _ = two_optimizer_run(guarded=False)
    m, err = two_optimizer_run(guarded=True)
    assert err is not None
    f = err.report.findings[0]
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of("two-sqrt")
    assert {o.path for o in f.outputs} >= {"m.b.weight"}
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_two_optimizers_failing_on_the_first_call_says_it_was_not_replayed():
    torch.manual_seed(0)
    m = Two()
    opts = {"a": torch.optim.SGD(m.a.parameters(), lr=0.1)}  # the step cannot see two
    opt_b = torch.optim.SGD(m.b.parameters(), lr=0.1)

    def step(x):
        opts["a"].zero_grad()
        m.a(x).sum().backward()
        opts["a"].step()
        opt_b.zero_grad()
        h = m.b(m.a(x).detach())
        torch.sqrt((h - h.detach()).pow(2).sum()).backward()
        opt_b.step()

    after_a = None
    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)(torch.randn(3, 4))
    after_a = [p.detach().clone() for p in m.a.parameters()]
    text = str(ei.value)
    assert "not replayed" in text and "SGD" in text
    assert {o.path for o in ei.value.report.findings[0].outputs} == {"m.b.weight", "m.b.bias"}
    assert all(torch.equal(p, q) for p, q in zip(after_a, m.a.parameters()))


def test_replay_asks_for_more_than_the_step_took():
    lin = torch.nn.Linear(2, 1)
    pulled = []
    runs = []
    box = types.SimpleNamespace(calls=0)  # (an object's attribute: not rewound)

    def data():
        while True:
            pulled.append(1)
            yield torch.zeros(1, 2)

    it = data()

    def step():
        runs.append(1)
        box.calls += 1
        x = next(it)
        if box.calls == 2:  # the replay takes a second batch
            next(it)
        h = lin(x)
        loss = torch.sqrt((h - h.detach()).pow(2).sum())
        loss.backward()
        return loss

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)()
    assert len(pulled) == 1  # nothing more came from the user's iterator
    # the replay ran from the step's start (`runs` empty again) and left `runs` as the step did
    assert box.calls == 2 and len(runs) == 1
    assert "as they were when the step began" in str(ei.value)
    assert "could not be replayed without side effects" in str(ei.value)
    assert "`it`" in str(ei.value)


A0 = torch.tensor([[1.0, 0.0], [0.0, 3.0]])


def prog_seed():
    theta = torch.tensor(4.0, requires_grad=True)
    torch.sqrt(torch.sum((torch.sqrt(A0**theta) - A0) ** 2)).backward()
    return [theta]


def prog_branches():
    x = torch.tensor([0.0, 1.0, -1.0], requires_grad=True)
    (torch.log(x) * 0.0 + torch.where(x > 0, torch.sqrt(x), 0.0)).sum().backward()
    return [x]


def prog_shared():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    h = m(torch.randn(5, 4))
    d = torch.sqrt(((h - h.detach()) ** 2).sum(-1))
    (m(h.detach().repeat(1, 4)[:, :4]).mean() + d.mean() + h.mean()).backward()
    return list(m.parameters())


def prog_masked_softmax():
    q = torch.randn(2, 3, 4, requires_grad=True)
    mask = torch.ones(2, 3, 3, dtype=torch.bool)
    mask[0, 1] = False
    s = (q @ q.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
    torch.softmax(s, -1).sum().backward()
    return [q]


def _summary(report):
    return [
        (
            f.kind,
            f.catalog_id,
            f.primitive,
            f.backend_op,
            f.where and f.where.line,
            f.form,
            f.met_op,
            f.zero_from and (f.zero_from.line, f.zero_from.column),
            f.values,
            f.count,
            f.index,
            sorted(o.path for o in f.outputs),
        )
        for f in report.findings
    ]


@pytest.mark.parametrize("prog", [prog_seed, prog_branches, prog_shared, prog_masked_softmax])
def test_node_level_backward_reports_what_the_full_trace_reports(prog):
    # guard's replay hooks the autograd Nodes and runs the dispatch mode only on the Nodes
    # where a NaN/Inf is born; its report must be the fully traced one
    from gradsan.torch._explain import _Session

    reports = []
    for node_level in (False, True):
        session = _Session(None)
        report = session.__enter__()
        session.tracer.node_level = node_level
        torch.manual_seed(0)
        leaves = prog()
        session.extra_leaves = leaves
        session.finish(session.close())
        assert not report.ok
        reports.append(_summary(report))
    assert reports[0] == reports[1]


def test_files_the_step_writes_to_are_left_alone(tmp_path):
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 - a handle the step keeps using
    lin = torch.nn.Linear(2, 1)
    box = types.SimpleNamespace(seen=[])  # (a list the replay does not put back)

    def step(x):
        box.seen.append(type(log).__name__)  # what the step sees in its closure
        with open(tmp_path / "other.txt", "a"):
            pass
        h = lin(x)
        loss = torch.sqrt((h - h.detach()).pow(2).sum())
        loss.backward()
        print("step", file=log)
        return loss

    with pytest.raises(gradsan.NonFiniteError):
        gst.guard(step)(torch.zeros(1, 2))
    assert box.seen == ["TextIOWrapper", "TextIOWrapper"]  # never replaced by a stand-in
    log.close()


CALLS = 0


def test_the_note_says_the_steps_python_ran_twice_and_what_it_put_back():
    torch.manual_seed(0)
    model = Net()
    log: list = []
    seen: dict = {}

    def step(x, bad):
        global CALLS
        CALLS += 1
        loss = model(x, bad)
        log.append(loss)  # the step's own Python side effects
        seen[len(seen)] = bad
        loss.backward()
        return loss

    guarded = gst.guard(step)
    guarded(torch.randn(8, 4), False)
    with pytest.raises(gradsan.NonFiniteError) as ei:
        guarded(torch.randn(8, 4), True)
    # the replay started from the step's start (log: 1 item, seen: 1 key, CALLS == 1) and
    # did what the step did: each append, insertion and increment once a call
    assert len(log) == 2 and CALLS == 2 and seen == {0: False, 1: True}
    note = next(n for n in ei.value.report.notes if "a second time" in n)
    assert note.startswith("the replay ran the step's Python a second time")
    assert "as they were when the step began" in note
    # the loss it appended is the replay's own tensor: named, and the step's put back
    assert "`log` (a list: its items changed)" in note and "put back" in note
    assert "`seen`" not in note and "`CALLS`" not in note  # these ended as the step left them
    assert "a print, logging, a file write" in note and "happened twice" in note


def test_the_note_says_so_when_nothing_it_names_changed():
    torch.manual_seed(0)
    model = Net()

    def step(x):
        loss = model(x, True)
        loss.backward()
        return loss

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)(torch.randn(8, 4))
    (note,) = [n for n in ei.value.report.notes if "a second time" in n]
    assert "were unchanged by it" in note
