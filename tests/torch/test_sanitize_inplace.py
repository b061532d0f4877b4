"""Issue 15: in-place kink calls under sanitize (``relu_``, ``clamp_``, ``nn.ReLU(inplace=True)``,
``F.relu(x, inplace=True)``, ``F.leaky_relu_``, ``F.hardtanh_``, ``F.threshold_``, ...).

The call overwrites its operand, so sanitize reads it before the call (the tracer's pre-call
hook: a copy and its tangents, only at a kink): such calls are flagged and cleared as their
out-of-place forms are, at the user's line, and not said unchecked."""

import pytest
import torch
import torch.nn.functional as F

import gradsan.torch as gst
from tests.conftest import line_of

W = torch.tensor([1.0, 2.0, 3.0])


def _run(call, x0):
    x = torch.tensor(x0, requires_grad=True)
    with gst.sanitize() as report:
        (call(x * 1.0) * W).sum().backward()
    return report, x


# name, call, input (its kink at element 0), entry, PyTorch's value there
FLAGGED = [
    ("relu_", lambda h: h.relu_(), [0.0, 0.5, -3.0], "relu-at-zero", 0.0),
    ("torch.relu_", lambda h: torch.relu_(h), [0.0, 0.5, -3.0], "relu-at-zero", 0.0),
    ("nn.ReLU(inplace)", lambda h: torch.nn.ReLU(inplace=True)(h), [0.0, 0.5, -3.0],
     "relu-at-zero", 0.0),
    ("F.relu(inplace)", lambda h: F.relu(h, inplace=True), [0.0, 0.5, -3.0], "relu-at-zero", 0.0),
    ("clamp_ at 1", lambda h: h.clamp_(0.0, 1.0), [1.0, 0.5, -3.0], "clip-at-bound", 1.0),
    ("clamp_min_", lambda h: h.clamp_min_(0.0), [0.0, 0.5, -3.0], "clip-at-bound", 1.0),
    ("F.leaky_relu_", lambda h: F.leaky_relu_(h, 0.2), [0.0, 0.5, -3.0], "activation-corner",
     0.2),
    ("F.hardtanh_", lambda h: F.hardtanh_(h), [1.0, 0.5, -3.0], "clip-at-bound", 0.0),
    ("F.elu_", lambda h: F.elu_(h, 0.5), [0.0, 0.5, -3.0], "activation-corner", 0.5),
    ("F.rrelu_ eval", lambda h: F.rrelu_(h, 0.1, 0.3), [0.0, 0.5, -3.0], "activation-corner",
     0.2),
    ("F.threshold_", lambda h: F.threshold_(h, 0.5, -1.0), [0.5, 0.6, -3.0], "activation-jump",
     0.0),
    ("nn.Threshold(inplace)", lambda h: torch.nn.Threshold(0.5, 2.0, inplace=True)(h),
     [0.5, 0.6, -3.0], "activation-jump", 0.0),
]  # fmt: skip


@pytest.mark.parametrize("case", FLAGGED, ids=[c[0] for c in FLAGGED])
def test_in_place_kink_is_flagged_at_the_users_line(case):
    _, call, x0, entry, value = case
    report, x = _run(call, x0)
    (f,) = report.findings
    assert f.catalog_id == entry
    assert f.where.line == call.__code__.co_firstlineno
    assert f.where.file.endswith("test_sanitize_inplace.py")
    assert f.index == (0,) and f.count == 1
    assert float(f.detail.value) == pytest.approx(value, abs=1e-6)
    assert float(f.detail.value) == pytest.approx(float(x.grad[0]) / float(W[0]), abs=1e-6)
    assert report.notes == []


CLEAN = [
    ("clamp_(0, 1) at 2", lambda h: h.clamp_(0.0, 1.0), [2.0, 0.5, -3.0]),  # was a false flag
    ("relu_ off 0", lambda h: h.relu_(), [0.1, 0.5, -3.0]),
    ("nn.ReLU6(inplace) below 0", lambda h: torch.nn.ReLU6(inplace=True)(h), [-3.0, 0.5, 7.0]),
    ("F.hardtanh_ outside", lambda h: F.hardtanh_(h), [2.0, 0.5, -3.0]),
    ("F.threshold_ off", lambda h: F.threshold_(h, 0.5, -1.0), [0.4, 0.6, -3.0]),
    ("F.elu_ alpha 1", lambda h: F.elu_(h), [0.0, 0.5, -3.0]),
]


@pytest.mark.parametrize("case", CLEAN, ids=[c[0] for c in CLEAN])
def test_in_place_off_a_kink_has_no_finding_and_no_note(case):
    _, call, x0 = case
    report, _ = _run(call, x0)
    assert report.findings == [] and report.notes == []


class Block(torch.nn.Module):
    """A torchvision-style block: conv-free Linear, ReLU(inplace=True), Linear."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(3, 4)
        self.act = torch.nn.ReLU(inplace=True)
        self.fc2 = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))  # the block


def _block():
    torch.manual_seed(0)
    m = Block()
    with torch.no_grad():
        m.fc1.bias.zero_()
    return m


def test_in_place_relu_inside_a_module():
    m = _block()
    with gst.sanitize() as report:
        m(torch.zeros(2, 3)).sum().backward()
    (f,) = report.findings
    assert f.catalog_id == "relu-at-zero" and f.where.line == line_of("the block")
    assert f.count == 8 and f.scope == "m.act"
    with gst.sanitize() as report:
        m(torch.ones(2, 3)).sum().backward()
    assert report.findings == [] and report.notes == []


def test_in_place_kink_no_gradient_is_counted():
    """At the kink but the loss does not read it: counted, as the out-of-place form is."""
    x = torch.tensor([0.0, 0.5, -3.0], requires_grad=True)
    with gst.sanitize() as report:
        h = (x * 0.0).relu_()  # the operand does not move
        (h.sum() + x.sum()).backward()
    assert report.findings == []
    (note,) = report.notes
    assert "1 same function" in note


def test_weight_clipping_under_no_grad_is_not_a_kink():
    """WGAN-style clipping of a parameter in no_grad: no gradient flows through it."""
    w = torch.nn.Parameter(torch.tensor([0.01, 0.5, -0.01]))
    with gst.sanitize() as report:
        with torch.no_grad():
            w.clamp_(-0.01, 0.01)
        (w * W).sum().backward()
    assert report.findings == [] and report.notes == []


@pytest.mark.slow
def test_in_place_relu_in_a_compiled_module():
    """sanitize runs the eager twin of a compiled module: the in-place ReLU is read too."""
    m = _block()
    cm = torch.compile(m)
    with gst.sanitize() as report:
        cm(torch.zeros(2, 3)).sum().backward()
    (f,) = report.findings
    assert f.catalog_id == "relu-at-zero" and f.where.line == line_of("the block")
    assert f.count == 8


@pytest.mark.parametrize(
    "call",
    [lambda h: h.clamp(0.1, 1.0), lambda h: h.clamp_(0.1, 1.0)],
    ids=["clamp", "clamp_"],
)
def test_clamp_at_a_float32_bound_is_flagged(call):
    """0.1 is not a float32: PyTorch compares x with the bound in x's dtype (0.1f), so
    sanitize does too (it compared in float64 and missed the kink)."""
    report, _ = _run(call, [0.1, 0.5, 2.0])
    (f,) = report.findings
    assert f.catalog_id == "clip-at-bound" and f.where.line == call.__code__.co_firstlineno
    assert f.index == (0,) and f.count == 1


@pytest.mark.parametrize("inplace", [False, True], ids=["ReLU", "ReLU(inplace)"])
def test_kink_inside_a_non_reentrant_checkpoint(inplace):
    """sanitize's probes inside a checkpointed region are not the region's saved tensors (a
    CheckpointError 'a different number of tensors was saved' before); the kink is flagged."""
    import torch.utils.checkpoint as cp

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4)
    with torch.no_grad():
        lin.bias.zero_()
    act = torch.nn.ReLU(inplace=inplace)

    def blk(x):
        return act(lin(x))  # checkpointed

    with gst.sanitize() as report:
        x = torch.zeros(2, 3, requires_grad=True)
        cp.checkpoint(blk, x, use_reentrant=False).sum().backward()
    (f,) = report.findings
    assert f.catalog_id == "relu-at-zero" and f.where.line == line_of("checkpointed")
    assert f.count == 8
