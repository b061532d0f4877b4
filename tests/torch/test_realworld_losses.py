"""Real PyTorch losses nobody here wrote, each re-expressed from a public report (cited above
it), checked as a user would: ``explain`` names the op where the NaN/Inf was born, at the
user's ``file:line (function)``; a fix gradsan prints as verified is pasted into a copy of this
file and run, and must remove the NaN and keep the value; ``sanitize`` says nothing about the
smooth versions; ``nansafe`` repairs only structural zeros."""

import dataclasses
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradsan.torch as gst
from tests.conftest import line_of

HERE = Path(__file__).resolve()
pytestmark = pytest.mark.filterwarnings(r"ignore:std\(\).*degrees of freedom:UserWarning")

# ---- the programs -------------------------------------------------------------------------------


# https://github.com/tensorflow/tensorflow/issues/30199 (triplet loss whose positive equals its
# anchor: the hand-written Euclidean distance is sqrt(0))
def triplet_manual(anchor, positive, negative):
    d_ap = torch.sqrt(((anchor - positive) ** 2).sum(dim=1))  # L:triplet
    d_an = torch.sqrt(((anchor - negative) ** 2).sum(dim=1))
    return F.relu(d_ap - d_an + 1.0).mean()


# https://github.com/allenai/allennlp/issues/890 (masked_log_softmax: a row whose mask is all
# zeros; log(mask) is the -inf mask)
def masked_log_softmax(logits, mask):
    logp = F.log_softmax(logits + torch.log(mask), dim=-1)  # L:allennlp
    keep = mask.any(dim=-1)
    return -torch.where(keep[:, None], logp * mask, torch.zeros_like(logp)).sum()


# pytorch/examples reinforcement_learning/reinforce.py finish_episode on a one-step episode:
# returns.std() of one element is NaN (https://github.com/ray-project/ray/issues/846)
def reinforce_finish_episode(logits, actions, rewards):
    gamma, eps = 0.99, 1e-8
    big_r, returns = 0.0, []
    for r in reversed(rewards):
        big_r = r + gamma * big_r
        returns.insert(0, big_r)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)  # L:reinforce
    logp = torch.distributions.Categorical(logits=logits).log_prob(actions)
    return (-logp * returns).sum()


# https://github.com/snipsco/ntm-lasagne/issues/5 (a cross entropy written out; the sigmoid
# saturates to exactly 1.0 in float32, so log(1 - p) = -inf and (1 - target) * -inf = NaN)
def manual_bce(logits, target):
    p = torch.sigmoid(logits)
    return -(target * torch.log(p) + (1 - target) * torch.log(1 - p)).mean()  # L:bce


# log(softmax(x)) instead of log_softmax, the LM head of pytorch/examples word_language_model
# written the old way (https://github.com/pytorch/pytorch/issues/1620): a logit far above the
# others underflows the rest of the softmax to 0
def log_of_softmax(logits, targets):
    return F.nll_loss(torch.log(F.softmax(logits, dim=-1)), targets)  # L:logsoftmax


# pytorch/examples vae/main.py loss_function, KLD term, with an encoder whose logvar grew past
# float32's exp range (https://github.com/AntixK/PyTorch-VAE/issues/69 discusses this term)
def vae_kld(mu, logvar):
    return -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())  # L:vae


# https://github.com/pytorch/pytorch/issues/4320 / PR 45468 (std over a batch of size 1)
def batch_norm_by_hand(h):
    return ((h - h.mean(dim=0)) / torch.std(h, dim=0)).pow(2).sum()  # L:std1


# a cosine similarity written out (https://github.com/HKUDS/LightRAG/pull/3421: zero vector)
def manual_cosine(a, b):
    return ((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).mean()  # L:cosine


# https://github.com/pytorch/pytorch/pull/131060 (softmax of a fully masked attention row; the
# additive mask is written out with -inf, the loss reads only the first query)
def masked_attention(scores, v):
    inf = float("-inf")
    mask = torch.tensor([[0.0, 0.0, inf], [inf, inf, inf]])
    w = torch.softmax(scores + mask, dim=-1)  # L:attn
    return (w @ v)[0].sum()


# https://github.com/pytorch/pytorch/pull/2775: .pow(2).sum().sqrt() of a zero residual (a
# regression that fits one sample exactly), the loss of the pytorch/examples regression script
def rmse_fit(w, x, y):
    return (x @ w - y).pow(2).sum().sqrt()  # L:rmse


# https://github.com/e3nn/e3nn/issues/112 (spherical angle of a relative position vector: atan2
# of two exact zeros, then acos of z / r with r = 0)
def edge_angles(pos):
    rel = pos[1] - pos[0]
    r = rel.norm()
    theta = torch.acos(rel[2] / r)  # L:e3nn
    return theta


# the smooth versions the reports settled on: sanitize must say nothing
def triplet_builtin(anchor, positive, negative):
    return F.triplet_margin_loss(anchor, positive, negative, margin=1.0)


def bce_with_logits(logits, target):
    return F.binary_cross_entropy_with_logits(logits, target)


def log_softmax_head(logits, targets):
    return F.nll_loss(F.log_softmax(logits, dim=-1), targets)


def kld_bounded(mu, logvar):
    logvar = logvar.clamp(max=20.0)
    return -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


def cosine_builtin(a, b):
    return F.cosine_similarity(a, b, dim=-1, eps=1e-8).mean()


def normalize_p1(a):  # https://github.com/pytorch/pytorch/issues/3264, fixed upstream
    return F.normalize(a, p=1, dim=1).sum()


def multidim_norm(a):  # https://github.com/pytorch/pytorch/issues/37323, fixed upstream
    return a.norm(dim=(1, 2)).sum()


def mlp_cross_entropy(x, y):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    return F.cross_entropy(net(x), y) + sum(p.pow(2).sum() for p in net.parameters()) * 1e-4


def attention_some_masked(scores, v):
    inf = float("-inf")
    mask = torch.tensor([[0.0, 0.0, inf], [0.0, inf, inf]])
    return (torch.softmax(scores + mask, dim=-1) @ v).sum()


def _t(*a, **k):
    return torch.tensor(*a, **k)


def _g(*a):
    return torch.tensor(*a, requires_grad=True)


@dataclasses.dataclass
class Case:
    fn: Callable
    args: Callable[[], tuple]
    entry: str | None  # the catalog entry of the first finding (None: named by the op only)
    marker: str
    reached: set[str]


CASES = {
    "triplet": Case(
        triplet_manual,
        lambda: (
            _g([[1.0, 2.0], [0.5, 0.5]]),
            _g([[1.0, 2.0], [0.0, 1.0]]),
            _g([[3.0, 0.0], [2.0, 2.0]]),
        ),
        "sqrt-at-zero",
        "L:triplet",
        {"anchor", "positive"},
    ),
    "allennlp": Case(
        masked_log_softmax,
        lambda: (_g([[0.3, 0.5, 0.2], [0.3, 0.3, 0.3]]), _t([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])),
        "log-at-zero",
        "L:allennlp",
        {"logits"},
    ),
    "reinforce": Case(
        reinforce_finish_episode,
        lambda: (_g([[0.1, 0.2]]), _t([1]), [1.0]),
        "var-of-constant",
        "L:reinforce",
        {"logits"},
    ),
    "bce": Case(
        manual_bce, lambda: (_g([0.5, 20.0]), _t([1.0, 1.0])), "log-at-zero", "L:bce", {"logits"}
    ),
    "logsoftmax": Case(
        log_of_softmax,
        lambda: (_g([[0.0, 120.0, 1.0]]), _t([0])),
        "log-at-zero",
        "L:logsoftmax",
        {"logits"},
    ),
    "vae": Case(
        vae_kld, lambda: (_g([0.1, -0.2]), _g([0.5, 100.0])), "exp-overflow", "L:vae", {"logvar"}
    ),
    "std1": Case(
        batch_norm_by_hand, lambda: (_g([[1.0, 2.0]]),), "var-of-constant", "L:std1", {"h"}
    ),
    "cosine": Case(
        manual_cosine,
        lambda: (_g([[1.0, 2.0], [0.0, 0.0]]), _g([[1.0, 1.0], [1.0, 3.0]])),
        "div-by-zero",
        "L:cosine",
        {"a", "b"},
    ),
    "attn": Case(
        masked_attention,
        lambda: (_g([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]), _g([[1.0], [2.0], [3.0]])),
        "softmax-all-neg-inf",
        "L:attn",
        {"v"},
    ),
    "rmse": Case(
        rmse_fit,
        lambda: (_g([1.0, 2.0]), _t([[1.0, 0.0], [0.0, 1.0]]), _t([1.0, 2.0])),
        "sqrt-at-zero",
        "L:rmse",
        {"w"},
    ),
    "e3nn": Case(
        edge_angles,
        lambda: (_g([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]),),
        "div-by-zero",
        "L:e3nn",
        {"pos"},
    ),
}

SMOOTH = {
    "triplet_builtin": (
        triplet_builtin,
        lambda: (_g([[1.0, 2.0]]), _g([[1.5, 2.0]]), _g([[3.0, 0.0]])),
    ),
    "bce_with_logits": (bce_with_logits, lambda: (_g([0.5, 20.0, -30.0]), _t([1.0, 1.0, 0.0]))),
    "log_softmax_head": (log_softmax_head, lambda: (_g([[0.0, 120.0, 1.0]]), _t([0]))),
    "kld_bounded": (kld_bounded, lambda: (_g([0.1, -0.2]), _g([0.5, 10.0]))),
    "cosine_builtin": (
        cosine_builtin,
        lambda: (_g([[1.0, 2.0], [0.3, 0.1]]), _g([[1.0, 1.0], [1.0, 3.0]])),
    ),
    "normalize_p1": (normalize_p1, lambda: (_g([[0.1, 0.3, 0.2, 0.4, 0.1996]]),)),
    "multidim_norm": (multidim_norm, lambda: (_g([[[1.0, 2.0], [3.0, 4.0]]]),)),
    "mlp_cross_entropy": (
        mlp_cross_entropy,
        lambda: (
            torch.randn(5, 4, generator=torch.Generator().manual_seed(2)),
            _t([0, 1, 2, 1, 0]),
        ),
    ),
    "attention_some_masked": (
        attention_some_masked,
        lambda: (_g([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]), _g([[1.0], [2.0], [3.0]])),
    ),
}


# ---- the checks ---------------------------------------------------------------------------------


def _plain(fn, args):
    """The loss and the gradients of a run without gradsan."""
    loss = fn(*args)
    loss.backward()
    return loss.detach(), [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _paste(fix) -> types.ModuleType:
    """This file with the printed fix pasted in (its replacement over its span, its import
    added), run as a new module: what a user who pastes the fix gets."""
    assert fix.file == str(HERE), fix.file
    lines = HERE.read_text().splitlines(keepends=True)
    first, last = lines[fix.start_line - 1], lines[fix.end_line - 1]
    new = first[: fix.start_col] + fix.replacement + last[fix.end_col :]
    assert fix.original in "".join(lines[fix.start_line - 1 : fix.end_line])
    lines[fix.start_line - 1 : fix.end_line] = [new]
    source = "".join(lines)
    if fix.needs_import:
        source = f"import {fix.needs_import}\n" + source
    mod = types.ModuleType("pasted_realworld_losses")
    mod.__file__ = str(HERE.with_name("pasted_realworld_losses.py"))
    sys.modules[mod.__name__] = mod
    try:
        exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    finally:
        del sys.modules[mod.__name__]
    return mod


_REPORTS: dict = {}


def _report(name):
    """explain's report of a case (one run per case and test session)."""
    if name not in _REPORTS:
        case = CASES[name]
        _REPORTS[name] = gst.explain(case.fn)(*case.args())
    return _REPORTS[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_names_the_origin_at_the_users_line(name):
    case = CASES[name]
    report = _report(name)
    assert not report.ok
    f = report.findings[0]
    assert f.catalog_id == case.entry
    assert (f.where.file, f.where.line, f.where.function) == (
        str(HERE),
        line_of(case.marker),
        case.fn.__name__,
    )
    assert case.reached <= {o.path for o in f.outputs}
    text = str(report)
    assert f"test_realworld_losses.py:{line_of(case.marker)} ({case.fn.__name__})" in text
    # the values it saw are in the words (softmax of a masked row: named by its row, no value)
    assert (" got " in text) != (case.entry == "softmax-all-neg-inf")


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_leaves_outputs_and_gradients_as_plain_autograd(name):
    case = CASES[name]
    want_loss, want_grads = _plain(case.fn, case.args())
    args = case.args()
    gst.explain(case.fn)(*args)
    got = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    for g, w in zip(got, want_grads):
        assert torch.equal(torch.nan_to_num(g, 7.0, 8.0, 9.0), torch.nan_to_num(w, 7.0, 8.0, 9.0))


def _verified(name):
    case = CASES[name]
    report = _report(name)
    return case, [p for f in report.findings for p in f.fixes if p.code and p.status == "verified"]


def test_every_printed_verified_fix_is_pasted_and_run():
    pasted = 0
    for name in sorted(CASES):
        case, fixes = _verified(name)
        text = str(_report(name))
        for fix in fixes:
            assert "verified:" in text and fix.replacement in text
            mod = _paste(fix)
            args = case.args()
            want, _ = _plain(case.fn, case.args())
            loss, grads = _plain(getattr(mod, case.fn.__name__), args)
            assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads), name
            assert torch.allclose(loss, want, rtol=1e-6, atol=1e-7), name
            pasted += 1
    assert pasted >= 2  # triplet and rmse: gradsan's safe sqrt


def test_a_fix_that_did_not_work_is_not_printed_as_code():
    # allennlp's row: safe log of the mask keeps -inf * 0 in the forward; gradsan ran it
    report = _report("allennlp")
    failed = [p for f in report.findings for p in f.fixes if p.status == "failed"]
    assert failed
    text = str(report)
    for p in failed:
        assert p.replacement not in text


@pytest.mark.parametrize("name", sorted(SMOOTH))
def test_sanitize_says_nothing_on_the_smooth_versions(name):
    fn, args = SMOOTH[name]
    report = gst.sanitize(fn)(*args())
    assert report.ok and not report.findings, str(report)


def test_sanitize_flags_atan2_at_the_origin_as_a_convention():
    # https://github.com/pytorch/pytorch/issues/98276: atan2(imag, real) at 0 + 0j gives a
    # finite [0, 0] (PyTorch's convention), not a derivative
    def phase(z):
        return torch.atan2(z[..., 1], z[..., 0]).sum()  # L:phase

    z = _g([[0.0, 0.0], [1.0, 1.0]])
    assert gst.explain(phase)(z).ok  # finite: explain has nothing to say
    report = gst.sanitize(phase)(_g([[0.0, 0.0], [1.0, 1.0]]))
    (f,) = report.findings
    assert f.kind == "convention" and f.where.line == line_of("L:phase")
    assert gst.sanitize(phase)(_g([[1.0, 0.5], [1.0, 1.0]])).ok


# https://github.com/pytorch/pytorch/issues/156212 (a where does not protect the other branch):
# the log-likelihood of padded sequences, the padding's probabilities zeroed by the length mask
def padded_log_likelihood(logits, lengths):
    mask = torch.arange(logits.shape[1])[None, :] < lengths[:, None]
    p = torch.sigmoid(logits) * mask
    return -torch.where(mask, torch.log(p), torch.zeros_like(p)).sum()  # L:padded


def test_nansafe_repairs_the_padding_to_the_true_gradient():
    def args():
        return _g([[0.5, -1.0, 2.0], [0.3, 0.1, -0.2]]), _t([3, 1])

    plain = args()
    _plain(padded_log_likelihood, plain)
    assert not torch.isfinite(plain[0].grad).all()  # the trap, in plain autograd
    report = gst.explain(padded_log_likelihood)(*args())
    assert report.findings[0].where.line == line_of("L:padded")
    fixed = args()
    report = gst.nansafe(padded_log_likelihood)(*fixed)
    assert any(f.kind == "resolved" for f in report.findings)
    # the true gradient: only the valid positions, log(sigmoid) differentiated by hand
    logits, true = fixed[0], torch.zeros(2, 3)
    s = torch.sigmoid(logits.detach())
    true[0] = -(1 - s[0])
    true[1, 0] = -(1 - s[1, 0])
    assert torch.allclose(logits.grad, true)


def test_nansafe_does_not_claim_the_fully_masked_attention_row():
    # the row has no value (softmax of all -inf): nansafe does not invent a gradient for it
    args = CASES["attn"].args()
    gst.nansafe(masked_attention)(*args)
    assert not torch.isfinite(args[0].grad[1]).any()


def test_nansafe_leaves_a_numerical_zero_unresolved():
    # the triplet's zero is a relu that is off (a numerical zero of the data): no repair
    args = CASES["triplet"].args()
    report = gst.nansafe(triplet_manual)(*args)
    assert not torch.isfinite(args[0].grad).all()
    assert any(f.kind == "unresolved" for f in report.findings) or not report.ok


_EQUATION = __import__("re").compile(r"(-?\d+\.\d+|-?inf|nan) ([*/]) (-?\d+\.\d+|-?inf|nan) = nan")


def _equations_hold(text):
    """Every ``a * b = nan`` (``a / b = nan``) the report prints is true of the numbers it
    prints."""
    for a, op, b in _EQUATION.findall(text):
        x, y = float(a), float(b)
        with torch.no_grad():
            got = (
                x * y
                if op == "*"
                else (math.nan if y == 0 and x == 0 else x / y if y else x * math.inf)
            )
        assert math.isnan(got), f"{a} {op} {b} = nan is false: {text}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_printed_arithmetic_is_true(name):
    _equations_hold(str(_report(name)))


# https://github.com/pytorch/pytorch/issues/41508 and PR 196170: nn.MultiheadAttention with
# need_weights=True, a key padding mask and a banded attn_mask leave a query with every key
# masked; the loss reads only the first batch element, and every in_proj gradient is NaN
def mha_fully_masked(x):
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(embed_dim=4, num_heads=1)
    inf = float("-inf")
    kpm = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, inf, inf]])
    am = torch.tensor(
        [[0.0, inf, inf, inf], [0.0, 0.0, inf, inf], [inf, 0.0, 0.0, inf], [inf, inf, 0.0, 0.0]]
    )
    out, _ = attn(x, x, x, key_padding_mask=kpm, attn_mask=am)  # L:mha
    return out[:, 0].sum()  # L:mha-slice


def test_multihead_attention_fully_masked_query():
    x = torch.rand(4, 2, 4, generator=torch.Generator().manual_seed(1))
    report = gst.explain(mha_fully_masked)(x)
    text = str(report)
    _equations_hold(text)  # before: "1.0 * 0.0 = nan in aten.bmm"
    assert not report.ok
    paths = {o.path for f in report.findings for o in f.outputs}
    assert {"attn.in_proj_weight", "attn.in_proj_bias"} <= paths
    assert all(f.where.line == line_of("L:mha") for f in report.findings)
    assert f"test_realworld_losses.py:{line_of('L:mha-slice')} (mha_fully_masked)" in text


def test_nansafe_says_when_it_made_no_repair():
    report = gst.nansafe(masked_attention)(*CASES["attn"].args())
    assert not report.ok
    assert any(n.startswith("nansafe made no repair") for n in report.notes)
    assert "nansafe made no repair" in str(report)
    # and says nothing of the kind when it did repair
    args = _g([[0.5, -1.0, 2.0], [0.3, 0.1, -0.2]]), _t([3, 1])
    report = gst.nansafe(padded_log_likelihood)(*args)
    assert not any(n.startswith("nansafe made no repair") for n in report.notes)
