"""The zero's side of a NaN gradient (PyTorch): for each kind of zero, the exact line of the
operation that made the zero factor of 0 * inf (or 0 / 0) exact, and its kind; the same
programs as tests/jax/test_zero_sources.py."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gradsan.torch as gst
from gradsan._events import ZeroKind
from tests.conftest import line_of

MASK3 = torch.tensor([False, True, True])
PAIR_MASK = torch.tensor([0.0, 1.0, 1.0])


def where_log(p):
    y = torch.log(p)  # O:where_log
    return torch.sum(torch.where(MASK3, y, 0.0))  # Z:where_log


def where_div(x):
    q = 1.0 / x  # O:where_div
    return torch.sum(torch.where(x != 0, q, 0.0))  # Z:where_div


def padding_log1p(x):
    y = torch.log1p(-x)  # O:padding_log1p
    pad = x < 1.0
    return torch.sum(torch.where(pad, y, 0.0))  # Z:padding_log1p


def mask_product(x):
    d = torch.sqrt(x)  # O:mask_product
    return torch.sum(d * PAIR_MASK)  # Z:mask_product


def slice_rows(x):
    out = torch.sqrt(x)  # O:slice_rows
    return torch.sum(out[:2])  # Z:slice_rows


def slice_logits(x):
    logits = torch.log(x)  # O:slice_logits
    return torch.sum(logits[:, :-1])  # Z:slice_logits


def one_hot_labels(p):
    labels = F.one_hot(torch.tensor([1, 2]), 3).float()  # Z:one_hot_labels
    return -torch.sum(labels * torch.log(p))  # O:one_hot_labels


def vanishing_square(x):
    return torch.sum(torch.sqrt(x**2))  # O:vanishing_square


def underflow_exp(x):
    w = torch.exp(-x)  # Z:underflow_exp
    return torch.sum(w * torch.sqrt(x - 200.0))  # O:underflow_exp


def nan_to_num_log(x):
    y = torch.log(x)  # O:nan_to_num_log
    return torch.sum(torch.nan_to_num(y))  # Z:nan_to_num_log


CASES = {
    "where_log": (where_log, [0.0, 0.5, 0.25], ZeroKind.WHERE),
    "where_div": (where_div, [0.0, 2.0], ZeroKind.WHERE),
    # (atan2 at the origin: torch's derivative formula gives a finite gradient, no NaN)
    "padding_log1p": (padding_log1p, [1.0, 0.5], ZeroKind.WHERE),
    "mask_product": (mask_product, [0.0, 1.0, 4.0], ZeroKind.MASK),
    "slice_rows": (slice_rows, [1.0, 4.0, 0.0], ZeroKind.SLICE),
    "slice_logits": (slice_logits, [[1.0, 0.0], [2.0, 0.0]], ZeroKind.SLICE),
    "one_hot_labels": (one_hot_labels, [[0.0, 0.5, 0.5], [0.2, 0.0, 0.8]], ZeroKind.CONSTANT),
    "vanishing_square": (vanishing_square, [0.0, 1.0], ZeroKind.DERIVATIVE),
    "underflow_exp": (underflow_exp, [200.0, 300.0], ZeroKind.UNDERFLOW),
    "nan_to_num_log": (nan_to_num_log, [0.0, 1.0], ZeroKind.NAN_TO_NUM),
}


def _report(name):
    fun, data, _ = CASES[name]
    x = torch.tensor(data, requires_grad=True)
    with gst.explain() as report:
        fun(x).backward()
    return report


@pytest.mark.parametrize("name", sorted(CASES))
def test_zero_source_line_and_kind(name):
    kind = CASES[name][2]
    report = _report(name)
    assert not report.ok, name
    f = report.findings[0]
    assert f.where is not None and f.where.line == line_of(f"O:{name}"), str(report)
    try:
        zline = line_of(f"Z:{name}")
    except LookupError:  # the zero is made on the origin's own line
        zline = line_of(f"O:{name}")
    assert f.zero_from is not None and f.zero_from.line == zline, str(report)
    assert f.detail.get("zero_kind") == kind.value, str(report)


@pytest.mark.parametrize("name", ["where_log", "where_div", "padding_log1p"])
def test_where_trap_in_torch_names(name):
    report = _report(name)
    f = report.findings[0]
    text = str(report)
    assert f.detail.get("zero_entry") == "where-trap"
    assert f.suggestions[0].startswith("Double where") and "torch.where(" in f.suggestions[0]
    assert "jnp." not in text and "JAX" not in text


class MySqrt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.sqrt()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g / (2 * y)


def test_custom_autograd_function_is_named():
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    with gst.explain() as report:
        (MySqrt.apply(x) * torch.tensor([0.0, 1.0])).sum().backward()  # L:custom
    f = report.findings[0]
    assert f.primitive == "MySqrt (custom autograd.Function)" and f.library is None
    assert f.where.line == line_of("L:custom")
    assert "inside Tensor.mul" not in str(report)


def test_nan_inside_multihead_attention_is_named_by_the_module():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(2, 1)
    q = torch.ones(2, 1, 2, requires_grad=True)
    mask = torch.tensor([[False, False], [True, True]])
    with gst.explain() as report:
        out, _ = mha(q, q, q, attn_mask=mask)  # L:mha
        out[:1].sum().backward()
    assert report.findings
    for f in report.findings:
        assert f.catalog_id != "nonfinite-input", str(report)
        assert f.library == "nn.MultiheadAttention" and f.where.line == line_of("L:mha")


NP_MASK = torch.tensor(np.array([[0.0, -np.inf], [-np.inf, -np.inf]], dtype=np.float32))


def test_a_minus_inf_mask_from_numpy_is_not_the_origin():
    q = torch.ones(2, 2, requires_grad=True)
    with gst.explain() as report:
        scores = q @ q.T + NP_MASK
        attn = torch.softmax(scores, dim=-1)  # L:np-softmax
        torch.sum(attn[:1]).backward()  # L:np-slice
    f = report.findings[0]
    assert f.where.line == line_of("L:np-softmax"), str(report)
    assert f.zero_from.line == line_of("L:np-slice") and f.detail["zero_kind"] == "slice"


def test_torch_reports_use_torch_names():
    for name in CASES:
        text = str(_report(name))
        assert "jnp." not in text and "JAX's" not in text and "jax." not in text, text


def test_sqrt_of_a_negative_is_headlined_as_a_domain_error():
    x = torch.tensor([-4.0, 1.0], requires_grad=True)
    with gst.explain() as report:
        torch.sqrt(x).sum().backward()
    f = report.findings[0]
    assert f.catalog_id == "sqrt-of-negative"
    assert "derivative is inf" not in str(report)
    assert f.explanation.startswith("Here sqrt got -4.0: a real negative value")


class MyLog(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.log()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / x


def test_custom_function_is_blamed_at_its_apply_line():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    with gst.explain() as report:
        y = MyLog.apply(x)  # L:apply
        z = torch.where(x > 0, y, torch.zeros_like(y))  # L:apply-use
        z.mean().backward()
    (f,) = report.findings
    assert f.primitive == "MyLog (custom autograd.Function)"
    assert f.where.line == line_of("L:apply"), str(report)
    assert f.zero_from.line == line_of("L:apply-use") and f.detail["zero_kind"] == "where"
    assert "inside Tensor" not in str(report)


def test_float16_overflow_under_autocast_is_explained_by_the_catalog():
    lin = torch.nn.Linear(4, 4)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.zero_()
    x = torch.full((2, 4), 2e4)
    with gst.explain(module=lin) as report:
        with torch.autocast("cpu", dtype=torch.float16):
            h = lin(x)  # L:fp16
        h.float().sum().backward()
    (f,) = report.findings
    assert f.catalog_id == "float16-overflow" and f.where.line == line_of("L:fp16")
    assert f.explanation.startswith("float16 holds magnitudes up to 65504 only.")


def test_torch_std_reports_use_torch_names():
    x = torch.tensor([3.0], requires_grad=True)
    with pytest.warns(UserWarning, match="degrees of freedom"):
        with gst.explain() as report:
            torch.std(x).backward()
    text = str(report)
    assert "torch.std" in text and "jnp." not in text and "JAX" not in text, text


def test_a_mask_passed_as_a_differentiated_argument_is_a_mask_not_a_derivative():
    def masked(x, m):
        y = torch.log(x)  # L:arg-mask-origin
        return (y * m).sum()  # L:arg-mask

    x = torch.tensor([0.0, 1.0], requires_grad=True)
    m = torch.tensor([0.0, 1.0], requires_grad=True)
    (f,) = gst.explain(masked)(x, m).findings
    assert f.where.line == line_of("L:arg-mask-origin")
    assert f.zero_from.line == line_of("L:arg-mask")
    assert f.detail["zero_kind"] == ZeroKind.INPUT_MASK.value
    assert f.detail["met_text"].startswith(
        "`y * m` multiplies by the input `m`, which is 0 here: a mask passed as an argument"
    )


def test_a_parameter_mask_in_the_backward_and_a_vanishing_derivative():
    w = torch.nn.Parameter(torch.tensor([0.0, 1.0]))

    def g(x):
        y = torch.sqrt(x)
        return (y * w).sum()  # L:param-mask

    (f,) = gst.explain(g)(torch.tensor([0.0, 1.0], requires_grad=True)).findings
    assert f.detail["zero_kind"] == ZeroKind.INPUT_MASK.value
    assert f.zero_from.line == line_of("L:param-mask")
    (f,) = gst.explain(lambda x: torch.sqrt(x * x).sum())(
        torch.tensor([0.0, 1.0], requires_grad=True)
    ).findings
    assert f.detail["zero_kind"] == ZeroKind.DERIVATIVE.value
