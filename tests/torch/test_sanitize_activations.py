"""Issue 15: PyTorch's fused piecewise activations at their corners, under sanitize.

Each is flagged at the user's line when the gradient goes through its corner, with PyTorch's
value there and the interval between the two one-sided slopes (its Clarke subdifferential);
away from the corner, or where both slopes agree (elu with alpha = 1, celu), nothing."""

import pytest
import torch
import torch.nn.functional as F

import gradsan.torch as gst
from tests.conftest import line_of

SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717
W = torch.tensor([1.0, 2.0, 3.0])

# name, activation, input with a corner at element 0, entry, PyTorch's value, (lo, hi)
CORNERS = [
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), [0.0, 1.0, -1.0], "activation-corner",
     0.1, (0.1, 1.0)),
    ("leaky_relu kw", lambda x: F.leaky_relu(x, negative_slope=0.2), [0.0, 1.0, -1.0],
     "activation-corner", 0.2, (0.2, 1.0)),
    ("nn.LeakyReLU", torch.nn.LeakyReLU(0.3), [0.0, 1.0, -1.0], "activation-corner",
     0.3, (0.3, 1.0)),
    ("elu 0.5", lambda x: F.elu(x, 0.5), [0.0, 1.0, -1.0], "activation-corner",
     0.5, (0.5, 1.0)),
    ("elu 2", lambda x: F.elu(x, alpha=2.0), [0.0, 1.0, -1.0], "activation-corner",
     2.0, (1.0, 2.0)),
    ("selu", F.selu, [0.0, 1.0, -1.0], "activation-corner",
     SELU_SCALE * SELU_ALPHA, (SELU_SCALE, SELU_SCALE * SELU_ALPHA)),
    ("hardswish -3", F.hardswish, [-3.0, 1.0, -1.0], "activation-corner", 0.0, (-0.5, 0.0)),
    ("hardswish 3", F.hardswish, [3.0, 1.0, -1.0], "activation-corner", 1.0, (1.0, 1.5)),
    ("hardsigmoid -3", F.hardsigmoid, [-3.0, 1.0, -1.0], "activation-corner",
     0.0, (0.0, 1 / 6)),
    ("hardsigmoid 3", F.hardsigmoid, [3.0, 1.0, -1.0], "activation-corner", 0.0, (0.0, 1 / 6)),
    ("relu6 0", F.relu6, [0.0, 1.0, 2.0], "clip-at-bound", 0.0, None),
    ("relu6 6", F.relu6, [6.0, 1.0, 2.0], "clip-at-bound", 0.0, None),
    ("nn.ReLU6", torch.nn.ReLU6(), [6.0, 1.0, 2.0], "clip-at-bound", 0.0, None),
    ("hardtanh", lambda x: F.hardtanh(x, -2.0, 2.0), [2.0, 1.0, 0.0], "clip-at-bound",
     0.0, None),
]  # fmt: skip


def _sanitize(act, x0):
    x = torch.tensor(x0, requires_grad=True)
    with gst.sanitize() as report:
        y = act(x)  # the activation
        (y * W).sum().backward()
    return report, x


@pytest.mark.parametrize("case", CORNERS, ids=[c[0] for c in CORNERS])
def test_activation_at_its_corner_is_flagged_with_its_set(case):
    _, act, x0, entry, value, interval = case
    report, x = _sanitize(act, x0)
    (f,) = report.findings
    assert f.catalog_id == entry and f.kind == "kink"
    # the user's line: the lambda that calls the activation, else the line that calls it
    lam = getattr(act, "__name__", "") == "<lambda>"
    assert f.where.line == (act.__code__.co_firstlineno if lam else line_of("the activation"))
    assert f.index == (0,) and f.count == 1
    assert float(f.detail.value) == pytest.approx(value, rel=1e-4)
    assert float(f.detail.value) == pytest.approx(float(x.grad[0]) / float(W[0]), rel=1e-4)
    assert f.detail.admissible is True
    if interval is not None:
        lo, hi = interval
        assert f.detail.subdifferential.startswith(f"[{lo:.6g}, {hi:.6g}]")
    else:
        assert f.detail.subdifferential.startswith("[0, 1]")


OFF_CORNER = [
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), [0.5, 1.0, -1.0]),
    ("elu 0.5", lambda x: F.elu(x, 0.5), [0.5, 1.0, -1.0]),
    ("selu", F.selu, [0.5, 1.0, -1.0]),
    ("hardswish", F.hardswish, [-2.9, 2.9, 0.0]),
    ("hardsigmoid", F.hardsigmoid, [-3.1, 3.1, 0.0]),
    ("relu6", F.relu6, [5.9, 0.1, -1.0]),
    # both one-sided slopes agree at 0: C^1, no kink
    ("elu alpha=1", F.elu, [0.0, 1.0, -1.0]),
    ("nn.ELU()", torch.nn.ELU(), [0.0, 1.0, -1.0]),
    ("celu 0.5", lambda x: F.celu(x, 0.5), [0.0, 1.0, -1.0]),
]


@pytest.mark.parametrize("case", OFF_CORNER, ids=[c[0] for c in OFF_CORNER])
def test_no_finding_away_from_a_corner_or_where_slopes_agree(case):
    _, act, x0 = case
    report, _ = _sanitize(act, x0)
    assert report.findings == []
    assert report.notes == []  # nothing was a kink at all


def test_corner_without_dependence_is_counted_not_flagged():
    x = torch.tensor([0.0, 1.0, -3.0], requires_grad=True)
    with gst.sanitize() as report:
        a = F.leaky_relu(x * 0.0, 0.1).sum()  # the corner's operand does not move
        b = F.hardswish(x).detach().sum()  # no gradient through it
        (a + b + x.sum()).backward()
    assert report.findings == []
    (note,) = report.notes
    assert "1 same function" in note


def test_corner_feeding_the_loss_among_others():
    """An MLP with a LeakyReLU whose pre-activation is exactly 0 (a zero input, zero bias)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4)
    with torch.no_grad():
        lin.bias.zero_()
    net = torch.nn.Sequential(lin, torch.nn.LeakyReLU(0.05), torch.nn.Linear(4, 1))
    x = torch.zeros(2, 3)
    with gst.sanitize() as report:
        net(x).sum().backward()  # the model
    (f,) = report.findings
    assert f.catalog_id == "activation-corner" and f.where.line == line_of("the model")
    assert f.count == 8 and float(f.detail.value) == pytest.approx(0.05)


@pytest.mark.parametrize(
    "module, entry, index",
    [
        (torch.nn.ReLU6(inplace=True), "clip-at-bound", (1,)),
        (torch.nn.Hardswish(inplace=True), "activation-corner", (0,)),
        (torch.nn.LeakyReLU(0.1, True), "activation-corner", (1,)),
    ],
    ids=["ReLU6", "Hardswish", "LeakyReLU"],
)
def test_in_place_activation_is_read_before_the_call(module, entry, index):
    """The call overwrites its input (values below 0 become 0 in relu6, -3 becomes 0 in
    hardswish): sanitize reads the operand before the call, so the corner that was there is
    flagged at the user's line, and only it."""
    x = torch.tensor([-3.0, 0.0, 7.0], requires_grad=True)
    with gst.sanitize() as report:
        module(x * 1.0).sum().backward()  # in place
    (f,) = report.findings
    assert f.catalog_id == entry and f.where.line == line_of("in place")
    assert f.index == index and f.count == 1
    assert report.notes == []


@pytest.mark.parametrize(
    "call",
    [
        lambda h: torch.nn.ReLU(inplace=True)(h),
        lambda h: F.relu(h, inplace=True),
        lambda h: h.relu_(),
        lambda h: h.clamp_(-1.0, 1.0),
    ],
    ids=["nn.ReLU(inplace)", "F.relu(inplace)", "relu_", "clamp_"],
)
def test_in_place_relu_and_clamp_off_their_kinks_have_no_finding(call):
    """relu_/clamp_ overwrite their input: -3 clipped to -1 (or 0) would read as a value at
    the bound after the call; read before it, nothing is at a kink: no finding, no note."""
    x = torch.tensor([-3.0, 0.5, 2.0], requires_grad=True)
    with gst.sanitize() as report:
        (call(x * 1.0) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert report.findings == []
    assert report.notes == []


def test_out_of_place_clamp_at_its_bound_is_still_flagged():
    x = torch.tensor([-3.0, 0.5, 1.0], requires_grad=True)
    with gst.sanitize() as report:
        (x.clamp(-1.0, 1.0) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()  # clamp
    (f,) = report.findings
    assert f.catalog_id == "clip-at-bound" and f.where.line == line_of("clamp")
    assert f.count == 1
