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
        g = torch.max(torch.stack([y[1], y[1], y[0]]), dim=0).values  # maxdim
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
