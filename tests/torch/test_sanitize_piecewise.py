"""Issue 15: PReLU, RReLU, softshrink, hardshrink and threshold under sanitize.

Corners (prelu/rrelu at 0, softshrink at +-lambd, threshold with value == threshold) are
flagged as activation-corner with PyTorch's value and the interval between the one-sided
slopes; jumps (hardshrink at +-lambd, threshold with value != threshold) as activation-jump,
with the two limits; nothing away from them, nor where the slopes agree (prelu with weight 1,
shrinks with lambd 0)."""

import pytest
import torch
import torch.nn.functional as F

import gradsan.torch as gst
from tests.conftest import line_of

W = torch.tensor([1.0, 2.0, 3.0])


def _sanitize(act, x0):
    x = torch.tensor(x0, requires_grad=True)
    with gst.sanitize() as report:
        y = act(x)  # the activation
        (y * W).sum().backward()
    return report, x


def _rrelu_eval():
    m = torch.nn.RReLU(0.1, 0.3)
    m.eval()
    return m


# name, activation, input (its corner at element 0), PyTorch's value, (left, right) slopes
CORNERS = [
    ("prelu", lambda x: F.prelu(x, torch.tensor([0.25])), [0.0, 1.0, -1.0], 0.25, (0.25, 1.0)),
    ("nn.PReLU", torch.nn.PReLU(init=0.3), [0.0, 1.0, -1.0], 0.3, (0.3, 1.0)),
    ("rrelu eval", lambda x: F.rrelu(x, 0.1, 0.3), [0.0, 1.0, -1.0], 0.2, (0.2, 1.0)),
    ("nn.RReLU eval", _rrelu_eval(), [0.0, 1.0, -1.0], 0.2, (0.2, 1.0)),
    ("softshrink lambd", F.softshrink, [0.5, 1.0, -1.0], 0.0, (0.0, 1.0)),
    ("softshrink -lambd", lambda x: F.softshrink(x, 0.3), [-0.3, 1.0, -1.0], 0.0, (1.0, 0.0)),
    ("nn.Softshrink", torch.nn.Softshrink(0.25), [0.25, 1.0, -1.0], 0.0, (0.0, 1.0)),
    ("threshold value==threshold", lambda x: F.threshold(x, 0.5, 0.5), [0.5, 1.0, -1.0],
     0.0, (0.0, 1.0)),
]  # fmt: skip


@pytest.mark.parametrize("case", CORNERS, ids=[c[0] for c in CORNERS])
def test_corner_is_flagged_with_its_one_sided_slopes(case):
    _, act, x0, value, (left, right) = case
    report, x = _sanitize(act, x0)
    (f,) = report.findings
    assert f.catalog_id == "activation-corner" and f.kind == "kink"
    lam = getattr(act, "__name__", "") == "<lambda>"
    assert f.where.line == (act.__code__.co_firstlineno if lam else line_of("the activation"))
    assert f.index == (0,) and f.count == 1
    assert float(f.detail.value) == pytest.approx(value, abs=1e-6)
    assert float(f.detail.value) == pytest.approx(float(x.grad[0]) / float(W[0]), abs=1e-6)
    assert f.detail.admissible is True
    lo, hi = min(left, right), max(left, right)
    assert f.detail.subdifferential.startswith(f"[{lo:.6g}, {hi:.6g}] (the one-sided slopes")


def test_prelu_per_channel_slope_is_read_at_the_corner():
    """A 3-channel PReLU: the slope of the channel whose input is 0; the channel whose slope
    is 1 is smooth there (not a corner), and the weight's own gradient is 0 on both sides."""
    m = torch.nn.PReLU(3)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([1.0, 0.1, 0.2]))
    x = torch.tensor([[0.0, -1.0, 2.0], [1.0, 0.0, -1.0]], requires_grad=True)
    with gst.sanitize() as report:
        m(x).sum().backward()  # prelu
    (f,) = report.findings
    assert f.catalog_id == "activation-corner" and f.where.line == line_of("prelu")
    assert f.count == 1 and f.index == (1, 1)  # (0, 0) is at 0 but its channel's slope is 1
    assert float(f.detail.value) == pytest.approx(0.1)
    assert f.detail.subdifferential.startswith("[0.1, 1]")
    assert float(m.weight.grad[1]) == pytest.approx(-1.0)  # x below 0 only; 0 at the corner


def test_rrelu_in_training_is_flagged_without_reading_the_drawn_slope():
    """Training mode draws a slope per element: the corner is flagged, its set is [r, 1] for
    the drawn r, and sanitize does not call rrelu again (that would draw from the user's
    generator)."""
    torch.manual_seed(0)
    x = torch.tensor([0.0, 1.0, -1.0], requires_grad=True)
    with gst.sanitize() as report:
        (F.rrelu(x, 0.1, 0.3, training=True) * W).sum().backward()  # rrelu
    after = torch.rand(1)
    torch.manual_seed(0)
    F.rrelu(torch.tensor([0.0, 1.0, -1.0]), 0.1, 0.3, training=True)
    assert torch.equal(after, torch.rand(1))  # exactly one draw, the user's
    (f,) = report.findings
    assert f.catalog_id == "activation-corner" and f.where.line == line_of("rrelu")
    assert "the slope rrelu drew in training, in [0.1, 0.3]" in f.detail.subdifferential
    assert f.detail.get("value") is None


# name, activation, input (its jump at element 0), the two limits
JUMPS = [
    ("hardshrink lambd", F.hardshrink, [0.5, 1.0, -1.0], (0.0, 0.5)),
    ("hardshrink -lambd", lambda x: F.hardshrink(x, 0.3), [-0.3, 1.0, -1.0], (-0.3, 0.0)),
    ("nn.Hardshrink", torch.nn.Hardshrink(0.25), [0.25, 1.0, -1.0], (0.0, 0.25)),
    ("x.hardshrink", lambda x: x.hardshrink(0.5), [-0.5, 1.0, -1.0], (-0.5, 0.0)),
    ("threshold", lambda x: F.threshold(x, 0.5, -1.0), [0.5, 1.0, -1.0], (-1.0, 0.5)),
    ("nn.Threshold", torch.nn.Threshold(0.1, 20.0), [0.1, 1.0, -1.0], (20.0, 0.1)),
    ("torch.threshold", lambda x: torch.threshold(x, 0.0, 6.0), [0.0, 1.0, -1.0], (6.0, 0.0)),
]


@pytest.mark.parametrize("case", JUMPS, ids=[c[0] for c in JUMPS])
def test_jump_is_flagged_with_its_limits(case):
    _, act, x0, (left, right) = case
    report, x = _sanitize(act, x0)
    (f,) = report.findings
    assert f.catalog_id == "activation-jump" and f.kind == "kink"
    lam = getattr(act, "__name__", "") == "<lambda>"
    assert f.where.line == (act.__code__.co_firstlineno if lam else line_of("the activation"))
    assert f.index == (0,) and f.count == 1
    assert float(f.detail.value) == 0.0 == float(x.grad[0])
    assert f.detail.admissible is False  # no value is a derivative at a jump
    assert f.detail.subdifferential.startswith(f"none: {f.detail.subdifferential.split()[1]}")
    assert f"jumps from {left:g} to {right:g} at {x0[0]:g}" in f.detail.subdifferential


CLEAN = [
    ("prelu weight 1", lambda x: F.prelu(x, torch.tensor([1.0])), [0.0, 1.0, -1.0]),
    ("prelu off 0", torch.nn.PReLU(), [0.1, 1.0, -1.0]),
    ("rrelu off 0", lambda x: F.rrelu(x, 0.1, 0.3), [0.1, 1.0, -1.0]),
    ("rrelu slopes 1", lambda x: F.rrelu(x, 1.0, 1.0), [0.0, 1.0, -1.0]),
    ("softshrink off", F.softshrink, [0.4, 0.6, -0.6]),
    ("softshrink lambd 0", lambda x: F.softshrink(x, 0.0), [0.0, 1.0, -1.0]),
    ("hardshrink off", F.hardshrink, [0.4, 0.6, -0.6]),
    ("hardshrink lambd 0", lambda x: F.hardshrink(x, 0.0), [0.0, 1.0, -1.0]),
    ("threshold off", lambda x: F.threshold(x, 0.5, -1.0), [0.4, 0.6, -1.0]),
    ("celu 2", lambda x: F.celu(x, 2.0), [0.0, 1.0, -1.0]),
]


@pytest.mark.parametrize("case", CLEAN, ids=[c[0] for c in CLEAN])
def test_no_finding_off_the_cut_or_where_smooth(case):
    _, act, x0 = case
    report, _ = _sanitize(act, x0)
    assert report.findings == [] and report.notes == []


def test_corner_and_jump_without_dependence_are_counted():
    x = torch.tensor([0.5, 1.0, 0.0], requires_grad=True)
    with gst.sanitize() as report:
        a = F.softshrink(x * 0.0 + 0.5).sum()  # the corner's operand does not move
        b = F.hardshrink(x).detach().sum()  # no gradient through it
        (a + b + x.sum()).backward()
    assert report.findings == []
    (note,) = report.notes
    assert "1 same function" in note


# fn, params, the PyTorch function of them
SLOPES = [
    ("leaky_relu", {"negative_slope": 0.1}, lambda t: F.leaky_relu(t, 0.1)),
    ("prelu", {"negative_slope": 0.25}, lambda t: F.prelu(t, torch.tensor([0.25], dtype=t.dtype))),
    ("rrelu", {"lower": 0.1, "upper": 0.3}, lambda t: F.rrelu(t, 0.1, 0.3, training=False)),
    ("elu", {"alpha": 0.5}, lambda t: F.elu(t, 0.5)),
    ("selu", {}, F.selu),
    ("hardswish", {}, F.hardswish),
    ("hardsigmoid", {}, F.hardsigmoid),
    ("softshrink", {"lambd": 0.5}, lambda t: F.softshrink(t, 0.5)),
    ("threshold", {"threshold": 0.5, "value": 0.5}, lambda t: F.threshold(t, 0.5, 0.5)),
]  # fmt: skip


@pytest.mark.parametrize("case", SLOPES, ids=[c[0] for c in SLOPES])
def test_catalog_one_sided_slopes_are_pytorchs(case):
    """The catalog's one-sided slopes at each corner against PyTorch's own function: the
    one-sided difference quotients in float64 (not the catalog's numbers copied)."""
    from gradsan._catalog.entries.kinks import activation_corners

    fn, params, f = case
    corners = activation_corners(fn, {"fn": fn, **params})
    assert corners
    h = 1e-7
    for c, left, right in corners:
        x = torch.tensor([c - h, c, c + h], dtype=torch.float64)
        y = f(x)
        assert float((y[1] - y[0]) / h) == pytest.approx(left, abs=1e-5)
        assert float((y[2] - y[1]) / h) == pytest.approx(right, abs=1e-5)


@pytest.mark.parametrize(
    "fn, params, f",
    [
        ("hardshrink", {"lambd": 0.5}, lambda t: F.hardshrink(t, 0.5)),
        ("threshold", {"threshold": 0.5, "value": -1.0}, lambda t: F.threshold(t, 0.5, -1.0)),
    ],
    ids=["hardshrink", "threshold"],
)
def test_catalog_jump_limits_are_pytorchs(fn, params, f):
    from gradsan._catalog.entries.kinks import activation_corners, activation_jumps

    jumps = activation_jumps(fn, {"fn": fn, **params})
    assert jumps and not activation_corners(fn, {"fn": fn, **params})
    for c, left, right in jumps:
        y = f(torch.tensor([c - 1e-9, c + 1e-9], dtype=torch.float64))
        assert float(y[0]) == pytest.approx(left, abs=1e-8)
        assert float(y[1]) == pytest.approx(right, abs=1e-8)
