import torch

import gradsan.torch as gst
from tests.conftest import line_of


def test_kinks_are_flagged_with_their_lines():
    x = torch.tensor([0.0, 1.0, -2.0], requires_grad=True)
    y = torch.tensor([0.0, 1.0, 3.0], requires_grad=True)
    with gst.sanitize() as report:
        a = torch.abs(x).sum()  # abs
        b = torch.relu(x).sum()  # relu
        c = torch.maximum(x, y).sum()  # maximum
        e = torch.where(x > 0, x, -x).sum()  # where
        f = torch.clamp(x, 0, 1).sum()  # clamp
        # a tie of two different functions (y1 and y1**2 at y1 = 1); a tie of y1 with itself
        # is the same function (issue 15: counted, not reported)
        g = torch.max(torch.stack([y[1], y[1] ** 2, y[0]]), dim=0).values  # maxdim
        (a + b + c + e + f + g).backward()
    got = {(f.catalog_id, f.where.line) for f in report.findings}
    assert ("abs-at-zero", line_of("abs")) in got
    assert ("relu-at-zero", line_of("relu")) in got
    assert ("max-tie", line_of("maximum")) in got
    assert ("where-at-boundary", line_of("where")) in got
    assert ("clip-at-bound", line_of("clamp")) in got
    assert ("max-tie", line_of("maxdim")) in got
    assert all(f.kind == "kink" for f in report.findings)
    assert report.ok  # kinks are not errors


def test_atan2_at_origin_is_an_inadmissible_convention():
    p = torch.zeros(2, requires_grad=True)
    with gst.sanitize() as report:
        torch.atan2(p[0], p[1]).backward()  # atan2
    (f,) = report.findings
    assert f.kind == "convention" and f.catalog_id == "atan2-at-origin"
    assert f.where.line == line_of("atan2")
    assert f.detail["admissible"] is False


def test_jax_seed_abs_vs_norm_in_torch():
    x = torch.tensor(0.0, requires_grad=True)
    y = torch.tensor(0.0)
    with gst.sanitize() as report:
        torch.abs(x - y).backward()  # abs-seed
    assert [f.catalog_id for f in report.findings] == ["abs-at-zero"]
    assert report.findings[0].where.line == line_of("abs-seed")


def test_smooth_function_has_no_flags():
    x = torch.tensor([0.5, 1.0], requires_grad=True)
    report = gst.sanitize(lambda x: (torch.tanh(x) * torch.exp(x)).sum())(x)
    assert report.findings == []


# -- issue 15: PyTorch's silent conventions, read with the catalog's masks -------------------


def _conventions_program():
    import torch.nn.functional as F

    def r(v):
        return torch.tensor(v, requires_grad=True)

    x0, x2, c = r([0.0, 0.0]), r([[1.0, 2.0], [1.0, 2.0]]), r([1.0, 1.0])
    a = torch.linalg.norm(x0)  # c-norm
    b = torch.linalg.vector_norm(r([0.0, 0.0]))  # c-vnorm
    s = torch.std(c)  # c-std
    p = torch.pdist(x2).sum()  # c-pdist
    d = torch.cdist(r([[1.0, 2.0]]), r([[1.0, 2.0]])).sum()  # c-cdist
    i = torch.linalg.vector_norm(r([1.0, -1.0, 0.5]), ord=float("inf"))  # c-inf
    q = torch.quantile(r([1.0, 1.0, 3.0, 4.0]), 0.4)  # c-quantile
    m = torch.median(r([1.0, 1.0, 3.0]))  # c-median
    e = torch.linalg.eigvalsh(r(1.0) * torch.eye(3))[-1]  # c-eigvalsh
    n = (F.normalize(r([0.0, 1.0, 2.0]), p=1, dim=0) * torch.arange(3.0)).sum()  # c-normalize
    t = torch.linalg.det(r([[1.0, 2.0], [2.0, 4.0]]))  # c-det
    return a + b + s + p + d + i + q + m + e + n + t


def test_silent_conventions_are_flagged_at_their_lines():
    with gst.sanitize() as report:
        _conventions_program().backward()
    got = {(f.catalog_id, f.where.line) for f in report.findings}
    want = {
        ("norm-at-zero", line_of("c-norm")),
        ("norm-at-zero", line_of("c-vnorm")),
        ("std-of-constant", line_of("c-std")),
        ("norm-at-zero", line_of("c-pdist")),
        ("norm-at-zero", line_of("c-cdist")),
        ("max-tie", line_of("c-inf")),
        ("sort-tie", line_of("c-quantile")),
        ("sort-tie", line_of("c-median")),
        ("eigh-repeated-eigenvalues", line_of("c-eigvalsh")),
        ("abs-at-zero", line_of("c-normalize")),
        ("det-at-singular", line_of("c-det")),
    }
    assert want <= got, want - got
    by_line = {f.where.line: f for f in report.findings}
    # PyTorch's value there, against the entry's admissible set
    assert by_line[line_of("c-norm")].detail["admissible"] is True
    assert by_line[line_of("c-norm")].detail["value"] == "[0, 0]"
    assert by_line[line_of("c-inf")].detail["value"] == "[0.5, -0.5, 0]"
    assert by_line[line_of("c-median")].detail["admissible"] is True
    det = by_line[line_of("c-det")]
    assert det.kind == "convention" and det.detail["admissible"] is False
    assert by_line[line_of("c-normalize")].library == "torch.nn.functional.normalize"


def test_no_flag_where_no_gradient_flows():
    logits = torch.tensor([1.0, 2.0], requires_grad=True)
    labels = torch.tensor([1, 0])
    w = torch.zeros(3)
    with gst.sanitize() as report:
        sel = torch.where(labels == 1, logits, torch.zeros(2)).sum()  # integer labels
        off = (torch.relu(w) * torch.ones(3)).sum()  # no input requires grad
        nrm = torch.linalg.norm(torch.zeros(2))  # a constant
        (sel + off + nrm + logits.sum()).backward()
    assert report.findings == [], [f.catalog_id for f in report.findings]


def test_conventions_off_their_sets_are_not_flagged():
    x = torch.tensor([0.5, 1.0], requires_grad=True)
    with gst.sanitize() as report:
        v = torch.linalg.norm(x) + torch.std(x) + torch.median(torch.stack([x[0], x[1], 2 * x[1]]))
        v = v + torch.linalg.det(torch.diag(x)) + torch.pdist(torch.stack([x, 2 * x])).sum()
        v.backward()
    assert report.findings == [], [f.catalog_id for f in report.findings]


# -- issue 15: a kink is a finding only when the gradient depends on it ----------------------


def _r(v):
    return torch.tensor(v, requires_grad=True)


def _ids(report):
    return [(f.catalog_id, f.where.line) for f in report.findings]


def test_where_branches_meeting_c1_are_counted_not_flagged():
    d = 1.0
    r, x = _r([1.0, -1.0, 0.3]), _r([0.0, 1.0])
    with gst.sanitize() as report:
        huber = torch.where(r.abs() < d, 0.5 * r**2, d * (r.abs() - 0.5 * d)).sum()
        elu = torch.where(x > 0, x, torch.exp(x) - 1).sum()  # ELU, alpha = 1
        (huber + elu).backward()
    assert report.findings == [], _ids(report)
    assert any("2 kink(s) or tie(s) checked and left out" in n for n in report.notes)
    assert any("2 same function" in n for n in report.notes)
    assert torch.allclose(r.grad, torch.tensor([1.0, -1.0, 0.3]))


def test_where_with_a_kink_or_a_jump_is_flagged():
    x = _r([0.0, 1.0])
    with gst.sanitize() as report:
        leaky = torch.where(x > 0, x, 0.1 * x).sum()  # w-kink
        jump = torch.where(x > 0, x + 1, x).sum()  # w-jump
        (leaky + jump).backward()
    got = set(_ids(report))
    assert ("where-at-boundary", line_of("w-kink")) in got
    assert ("where-at-boundary", line_of("w-jump")) in got


def test_ties_of_the_same_function_or_symmetric_downstream_are_counted():
    x, y = _r([0.0, 1.0]), _r([2.0])
    with gst.sanitize() as report:
        same = torch.maximum(x, x).sum() + torch.maximum(x * y, y * x).sum()
        sym = torch.sort(_r([1.0, 1.0, 2.0])).values.sum()
        top = torch.topk(_r([2.0, 2.0, 1.0]), 2).values.sum()
        amax = torch.amax(torch.stack([y, y]), 0).sum()
        (same + sym + top + amax).backward()
    assert report.findings == [], _ids(report)
    (n,) = [n for n in report.notes if "checked and left out" in n]
    assert "5 kink(s)" in n and "3 same function" in n and "2 no effect on the loss" in n


def test_ties_the_gradient_depends_on_are_flagged():
    x = _r([1.0])
    with gst.sanitize() as report:
        a = torch.maximum(x, x**2).sum()  # t-max-diff
        b = (torch.sort(_r([1.0, 1.0, 2.0])).values * torch.arange(3.0)).sum()  # t-sort-w
        c = torch.topk(_r([2.0, 2.0, 1.0]), 1).values.sum()  # t-topk-1
        (a + b + c).backward()
    got = set(_ids(report))
    assert ("max-tie", line_of("t-max-diff")) in got
    assert ("sort-tie", line_of("t-sort-w")) in got
    assert ("sort-tie", line_of("t-topk-1")) in got


def test_sort_indices_kept_in_use_stay_flagged():
    x, w = _r([1.0, 1.0, 2.0]), _r([1.0, 2.0, 3.0])
    with gst.sanitize() as report:
        v, i = torch.sort(x)  # t-sort-idx
        (v * w[i]).sum().backward()
    assert ("sort-tie", line_of("t-sort-idx")) in set(_ids(report))


def test_clean_torch_controls_have_no_findings():
    import torch.nn.functional as F

    ln = torch.nn.LayerNorm(3)
    q = _r([[[1.0, 2.0], [3.0, 4.0]]])
    full_row = torch.tensor([[[False, False], [True, True]]])
    with gst.sanitize() as report:
        v = F.elu(_r([0.0, 1.0]), alpha=1.0).sum() + F.softplus(_r([0.0, 1.0])).sum()
        v = v + torch.logsumexp(_r([[1.0, 1.0], [0.0, 0.0]]), 1).sum()
        v = v + (ln(torch.stack([torch.zeros(3), _r([1.0, 2.0, 3.0])])) ** 2).sum()
        s = (q @ q.transpose(-1, -2)).masked_fill(full_row, torch.finfo(torch.float32).min)
        v = v + (torch.softmax(s, -1) @ q).sum()
        v = v + F.scaled_dot_product_attention(q, q, q, attn_mask=~full_row).nan_to_num().sum()
        v = v + F.smooth_l1_loss(_r([1.0, -1.0]), torch.zeros(2), beta=1.0)
        v = v + F.huber_loss(_r([1.0, -1.0]), torch.zeros(2), delta=1.0)
        v.backward()
    assert [f for f in report.findings if f.kind in ("kink", "convention")] == []


def test_real_kinks_feeding_a_loss_are_flagged_with_their_set():
    import torch.nn.functional as F

    with gst.sanitize() as report:
        a = F.mse_loss(torch.relu(_r([0.0, 1.0]) * 2.0), torch.ones(2))  # t-relu-loss
        b = torch.abs(_r([0.0, 1.0]) - torch.ones(2)).mean()  # t-abs-mean
        (a + b).backward()
    by = {(f.catalog_id, f.where.line): f for f in report.findings}
    relu = by[("relu-at-zero", line_of("t-relu-loss"))]
    assert relu.detail["subdifferential"] == "[0, 1]"
    # PyTorch's derivative there, against the entry's admissible set
    assert relu.detail["value"] == "0" and relu.detail["admissible"] is True
    assert ("abs-at-zero", line_of("t-abs-mean")) in by  # |x - 1| at x = 1
    assert by[("abs-at-zero", line_of("t-abs-mean"))].detail["admissible"] is True


def test_tie_values_are_read_against_the_simplex():
    x = _r([1.0, 0.0])
    with gst.sanitize() as report:
        a = torch.max(torch.stack([x[0], x[0] ** 2, x[1]]), dim=0).values  # v-maxdim
        b = torch.maximum(x[0], x[0] ** 2)  # v-maximum
        (a + b).backward()
    by = {f.where.line: f for f in report.findings}
    assert by[line_of("v-maxdim")].detail["value"] == "[1, 0, 0]"
    assert by[line_of("v-maximum")].detail["value"] == "[0.5, 0.5]"
    assert all(f.detail["admissible"] is True for f in report.findings)


def test_no_gradient_through_the_kink_no_flag():
    x = _r([0.0, 1.0])
    with gst.sanitize() as report:
        with torch.no_grad():
            m = torch.relu(x)
        frozen = torch.where(torch.zeros(2) > 0, torch.zeros(2), 1.0)
        detached = torch.abs(x.detach())
        (x * m + x * frozen + x * detached).sum().backward()
    assert report.findings == [], _ids(report)


def test_a_gradient_penalty_is_said_not_checked():
    # (an abs inside a create_graph backward crashes the tracer itself: not used here)
    x = _r([0.0, 1.0])
    with gst.sanitize() as report:
        # C^1 at 0 (counted when no gradient is differentiated), listed here unchecked
        f = torch.where(x > 0, x**2 + x, x).sum()  # p-where
        (g,) = torch.autograd.grad(f, x, create_graph=True)
        (f + (g**2).sum()).backward()
    assert ("where-at-boundary", line_of("p-where")) in set(_ids(report))
    assert any("create_graph=True" in n and "without checking" in n for n in report.notes)


def test_probes_do_not_go_through_a_wrapped_autograd_grad(monkeypatch):
    # gradsan run wraps torch.autograd.grad to check the user's calls: the dependence check's
    # own gradients must not be counted (or checked) as the user's
    import functools

    calls = []
    orig = torch.autograd.grad

    @functools.wraps(orig)
    def counted(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    monkeypatch.setattr(torch.autograd, "grad", counted)
    x = _r([0.0, 1.0])
    with gst.sanitize() as report:
        (torch.relu(x).sum() + torch.linalg.norm(_r([0.0, 0.0]))).backward()
    assert {f.catalog_id for f in report.findings} == {"relu-at-zero", "norm-at-zero"}
    assert calls == []
