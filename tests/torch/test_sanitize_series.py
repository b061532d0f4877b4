"""Kinks in series, PyTorch (session 15): an earlier kink is flagged when it changes the
gradient with the later kinks at their one-sided choice, and counted when its output reaches
the loss only through a zero-slope side of the later ones. Each case's one-sided derivatives
are derived by hand in its comment and checked against difference quotients of the function
itself; the expected findings follow from them."""

import pytest
import torch
import torch.nn.functional as F

import gradsan.torch as gst
from tests.conftest import line_of


def relu_relu(x):
    y = torch.relu(x)  # rr-inner
    return torch.relu(y).sum()  # rr-outer


def abs_relu(x):
    y = torch.relu(x)  # ar-relu
    return torch.abs(y).sum()  # ar-abs


def where_where(x):
    y = torch.where(x > 0, x, 0.0)  # ww-inner
    return torch.where(y > 0, 2 * y, 0.0).sum()  # ww-outer


def clamp_relu(x):
    y = torch.relu(x)  # cr-relu
    return torch.clamp(y - 1.0, 0.0, 1.0).sum()  # cr-clamp


def relu_max(x):
    y = torch.relu(x)  # rm-relu
    return torch.maximum(y, torch.zeros(2)).sum()  # rm-max


def min_relu(x):
    y = torch.relu(x)  # mr-relu
    return torch.minimum(y, torch.zeros(2)).sum()  # mr-min


def inplace_chain(x):
    y = F.relu(x * 1.0, inplace=True)  # ip-first
    return F.relu(2 * y, inplace=True).sum()  # ip-second


def deep_blank(x):
    for _ in range(4):
        x = torch.relu(x @ (torch.eye(3) * 0.9 + 0.05))  # db-relu
    return x.sum()


# name: (function, point, {marker: flagged?}, one-sided derivatives along -e_0, +e_0, PyTorch's
# derivative along e_0)
CASES = {
    # relu(relu(x)) = relu(x): slopes 0 | 1, PyTorch's 0 * 0 = 0; with the outer relu on the
    # side the inner moves to (slope 1) the inner's choice is the gradient; the inner's
    # one-sided tangent 1 meets the outer's corner
    "relu-relu": (relu_relu, torch.zeros(2), {"rr-inner": True, "rr-outer": True}, (0.0, 1.0), 0),
    # |relu(x)| = relu(x): PyTorch's abs'(0) = sign(0) = 0 is not the slope 1 of the side relu
    # moves to: both choices change the gradient (on main: neither flagged)
    "abs-relu": (abs_relu, torch.zeros(2), {"ar-relu": True, "ar-abs": True}, (0.0, 1.0), 0.0),
    # 2 relu(x) written as two torch.where: slopes 0 | 2, PyTorch's 0
    "where-where": (
        where_where,
        torch.zeros(2),
        {"ww-inner": True, "ww-outer": True},
        (0.0, 2.0),
        0.0,
    ),
    # x = [0, 1]: relu at 0 in element 0 feeds clamp(-1) (below the bound: slope 0 for every
    # choice); clamp at its bound in element 1
    "clamp-relu": (
        clamp_relu,
        torch.tensor([0.0, 1.0]),
        {"cr-relu": False, "cr-clamp": True},
        (0.0, 0.0),
        0.0,
    ),
    # max(relu(x), 0) = relu(x): slopes 0 | 1; PyTorch's maximum splits the tie (0.5)
    "relu-max": (relu_max, torch.zeros(2), {"rm-relu": True, "rm-max": True}, (0.0, 1.0), 0.0),
    # 2 relu(x) through two in-place relus (ReLU(inplace=True) as torchvision writes it): both
    # read before their call, both flagged (on main: neither)
    "inplace-chain": (
        inplace_chain,
        torch.zeros(2),
        {"ip-first": True, "ip-second": True},
        (0.0, 2.0),
        0.0,
    ),
    # min(relu(x), 0) = 0 everywhere: the kinks undo each other (0 | 0, PyTorch's 0); on main
    # relu was flagged
    "min-relu": (min_relu, torch.zeros(2), {"mr-relu": False, "mr-min": False}, (0.0, 0.0), 0.0),
}


def _one_sided(f, x, i, h=1e-3):
    e = torch.zeros_like(x)
    e[i] = 1.0
    with torch.no_grad():
        f0 = float(f(x))
        return ((f0 - float(f(x - h * e))) / h, (float(f(x + h * e)) - f0) / h)


def _run(fun, x):
    x = x.clone().requires_grad_(True)
    with gst.sanitize() as r:
        fun(x).backward()
    return r, x.grad


@pytest.mark.parametrize("name", sorted(CASES))
def test_kinks_in_series(name):
    fun, x, want, sides, ad = CASES[name]
    left, right = _one_sided(fun, x, 0)
    assert (left, right) == pytest.approx(sides, abs=2e-3)
    r, grad = _run(fun, x)
    assert float(grad[0]) == pytest.approx(ad)
    got = {f.where.line for f in r.findings if f.kind in ("kink", "convention") and f.where}
    for marker, flagged in want.items():
        assert (line_of(marker) in got) == flagged, (marker, r.findings, r.notes)
    assert got <= {line_of(m) for m in want}
    xx = x.clone().requires_grad_(True)
    fun(xx).backward()
    assert torch.equal(grad, xx.grad)  # the user's gradient is untouched


def test_blank_input_through_stacked_relus_is_flagged():
    # every layer's relu at 0: the one-sided derivative along +d is positive, PyTorch's 0
    x = torch.zeros(2, 3)
    d = torch.ones(2, 3)
    with torch.no_grad():
        assert float(deep_blank(x + 1e-3 * d)) > 0
    r, grad = _run(deep_blank, x)
    assert torch.count_nonzero(grad) == 0
    assert [f.where.line for f in r.findings if f.kind == "kink"] == [line_of("db-relu")]


def test_undone_kinks_say_so():
    r, _ = _run(min_relu, torch.zeros(2))
    assert any("one-sided derivatives equal to AD's" in n for n in r.notes), r.notes


def test_relu_before_maxpool_tie():
    # torchvision-style relu -> max_pool2d on a blank map: the pool is no kink op PyTorch
    # sanitize maps; relu's choice reaches the loss through the pool's chosen element
    def f(x):
        y = F.relu(x)  # mp-relu
        return F.max_pool2d(y, 2).sum()

    r, _ = _run(f, torch.zeros(1, 1, 2, 2))
    assert [f.where.line for f in r.findings if f.kind == "kink"] == [line_of("mp-relu")]


def test_more_kinks_in_series_than_checked_say_so():
    def tower(x):
        for _ in range(10):
            x = torch.relu(x)  # tw-relu
        return x.sum()

    r, _ = _run(tower, torch.zeros(1))
    assert [f.where.line for f in r.findings if f.kind == "kink"] == [line_of("tw-relu")]
    assert any("after the first 8 in series" in n for n in r.notes), r.notes
