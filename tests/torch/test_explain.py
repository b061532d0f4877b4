import pytest
import torch

import gradsan
import gradsan.torch as gst
from tests.conftest import col_of, line_of


def test_zygote_seed_blames_inner_sqrt():
    A0 = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    theta = torch.tensor(4.0, requires_grad=True)
    with gst.explain() as report:
        loss = torch.sqrt(torch.sum((torch.sqrt(A0**theta) - A0) ** 2))  # seed
        loss.backward()
    assert torch.isnan(theta.grad)
    assert not report.ok
    (f,) = report.findings
    assert f.kind == "nonfinite" and f.phase == "gradient"
    assert f.catalog_id == "sqrt-at-zero"
    assert f.primitive == "sqrt"
    assert f.where.file == __file__
    assert f.where.line == line_of("seed")
    assert (f.where.column, f.where.end_column) == col_of("seed", "torch.sqrt(A0**theta)")
    assert f.where.function == "test_zygote_seed_blames_inner_sqrt"
    assert f.backend_op == "aten.div in SqrtBackward0"
    assert f.result == "nan"
    assert (f.count, f.size, f.index) == (2, 4, (0, 1))
    assert f.values == "sqrt got 0.0 in 2 of 4 elements, first at [0, 1]"
    assert f.form == "0/0"
    assert f.zero_from is not None and f.zero_from.line == line_of("seed")
    assert [o.path for o in f.outputs] == ["theta"]
    text = str(report)
    assert "test_explain.py" in text and "Fix:" in text and "torch.sqrt" in text


def test_zygote_seed_multiline():
    A0 = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    theta = torch.tensor(4.0, requires_grad=True)

    def loss_fn(theta):
        A = A0**theta
        A = torch.sqrt(A)  # inner
        return torch.sqrt(torch.sum((A - A0) ** 2))  # outer

    report = gst.explain(loss_fn)(theta)
    (f,) = report.findings
    assert f.where.line == line_of("inner") and f.where.function == "loss_fn"
    assert f.zero_from.line == line_of("outer")
    assert (f.zero_from.column, f.zero_from.end_column) == col_of("outer", "(A - A0) ** 2")
    assert f.outputs[0].path == "theta"
    assert torch.isnan(theta.grad)
    assert isinstance(report.outputs, torch.Tensor)


def test_library_formulas_that_mask_a_nan_are_not_blamed():
    # torch's own norm, std and pow-w.r.t.-exponent formulas create a NaN and mask it
    x = torch.zeros(3, requires_grad=True)
    y = torch.zeros(3)
    theta = torch.tensor(4.0, requires_grad=True)
    A0 = torch.tensor([1.0, 0.0, 3.0])
    with gst.explain() as report:
        torch.linalg.norm(x - y).backward()
        ((x - x.mean()) / (x.std() + 1e-5)).sin().sum().backward()
        (A0**theta).sum().backward()
    assert report.ok and report.findings == []
    assert torch.isfinite(x.grad).all() and torch.isfinite(theta.grad)


def test_flux_seed_normalise_constant_input_is_finite_in_torch():
    x = torch.ones(3, 3, requires_grad=True)
    with gst.explain() as report:
        mu = x.mean(dim=0, keepdim=True)
        sd = x.std(dim=0, keepdim=True)
        torch.sin((x - mu) / (sd + 1e-5)).sum().backward()
    assert report.ok
    # the same normalisation with an explicit sqrt of the variance does give NaN: blamed
    x.grad = None
    with gst.explain() as report:
        mu = x.mean(dim=0, keepdim=True)
        sd = torch.sqrt(((x - mu) ** 2).mean(dim=0, keepdim=True))  # sd
        torch.sin((x - mu) / (sd + 1e-5)).sum().backward()
    (f,) = report.findings
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of("sd")
    assert f.outputs[0].path == "x"


def test_inf_only_gradient_is_caught():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    with gst.explain() as report:
        torch.sqrt(x).sum().backward()  # inf
    assert torch.isinf(x.grad[0]) and not torch.isnan(x.grad).any()
    (f,) = report.findings
    assert f.result == "inf" and f.catalog_id == "sqrt-at-zero"
    assert f.where.line == line_of("inf")
    assert f.form is None


def test_value_phase_log_at_zero():
    p = torch.tensor([0.5, 0.0], requires_grad=True)
    with gst.explain() as report:
        loss = -torch.log(p).sum()  # logp
        loss.backward()
    assert torch.isinf(loss)
    f = report.findings[0]
    assert f.phase == "value" and f.catalog_id == "log-at-zero"
    assert f.where.line == line_of("logp")
    assert f.result == "inf"
    paths = [o.path for o in f.outputs]
    assert paths[0] == "loss" and "p" in paths


class Block(torch.nn.Module):
    def __init__(self, bad: bool):
        super().__init__()
        self.q_proj = torch.nn.Linear(4, 4)
        self.bad = bad

    def forward(self, x):
        h = self.q_proj(x)
        if self.bad:
            h = torch.sqrt(h * 0.0)  # bad-layer
        return h


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(i == 2) for i in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.pow(2).mean()


def test_module_paths_discovered_and_named():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(3, 4)
    with gst.explain() as report:
        model(x).backward()
    (f,) = report.findings
    assert f.catalog_id == "sqrt-at-zero"
    assert f.where.line == line_of("bad-layer") and f.where.function == "forward"
    assert f.scope == "model.layers.2"
    paths = {o.path for o in f.outputs}
    assert "model.layers.2.q_proj.weight" in paths
    assert "model.layers.0.q_proj.bias" in paths
    assert not any("layers.3" in p for p in paths)


def test_module_argument_names_the_root():
    torch.manual_seed(0)
    net = Net()
    with gst.explain(module={"encoder": net}) as report:
        net(torch.randn(2, 4)).backward()
    paths = {o.path for o in report.findings[0].outputs}
    assert "encoder.layers.2.q_proj.weight" in paths


def test_nonfinite_input_is_not_blamed_on_an_op():
    w = torch.ones(3, requires_grad=True)

    def step(x, w):
        return (x * w).sum()

    x = torch.tensor([1.0, float("nan"), 2.0])
    report = gst.explain(step)(x, w)
    f = report.findings[0]
    assert f.catalog_id == "nonfinite-input"
    assert f.detail["input"] == "x"
    assert "`x`" in f.values


def test_finite_step_is_unchanged():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    x = torch.randn(5, 8)
    loss0 = model(x).pow(2).mean()
    loss0.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with gst.explain() as report:
        loss1 = model(x).pow(2).mean()
        loss1.backward()
    assert report.ok and not report.findings
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(a, p.grad) for a, p in zip(ref, model.parameters()))


def test_functional_backwards_a_returned_loss():
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    report = gst.explain(lambda x: torch.sqrt(x).sum())(x)
    assert report.findings[0].result == "inf"
    assert x.grad[1] == 0.25


def test_bad_input_gets_a_usage_error():
    with pytest.raises(gradsan.UsageError, match="takes a function"):
        gst.explain(3)
    with pytest.raises(gradsan.UsageError, match="module="):
        gst.explain(module=3)
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(gradsan.UsageError, match="scalar"):
        gst.explain(lambda x: x * 2)(x)
    with pytest.raises(gradsan.UsageError, match="context manager"):
        gst.explain()(x)
    with pytest.raises(gradsan.UsageError):
        gst.guard(torch.ones(2))


def test_json_round_trip():
    x = torch.tensor([0.0], requires_grad=True)
    report = gst.explain(lambda x: torch.sqrt(x).sum())(x)
    assert '"sqrt-at-zero"' in report.to_json()
