"""torch.compile: explain, sanitize and nansafe run the eager twin of a compiled module or
function and report the user's lines; `gradsan run` locates a NaN in a compiled model.

Slow: each test pays dynamo's import and a compilation (seconds on CPU)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import gradsan.torch as gst
from tests.conftest import line_of

pytestmark = pytest.mark.slow


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        h = self.enc(x)
        d = torch.sqrt(((h - h.detach()) ** 2).sum(-1))  # compiled-sqrt
        return self.head(h).mean() + d.mean()


def compiled_model():
    torch.manual_seed(0)
    model = Model()
    cmodel = torch.compile(model)
    try:
        cmodel(torch.randn(2, 4))  # compiled once, outside gradsan
    except Exception as e:  # pragma: no cover - depends on the toolchain
        pytest.skip(f"torch.compile is unusable here: {e}")
    return model, cmodel


def test_explain_around_a_compiled_module_locates_the_users_line():
    model, cmodel = compiled_model()
    model.zero_grad()
    with gst.explain() as report:
        loss = cmodel(torch.randn(3, 4))
        loss.backward()
    (f,) = report.findings
    assert f.catalog_id == "sqrt-at-zero" and f.phase == "gradient"
    assert f.where.file == __file__ and f.where.line == line_of("compiled-sqrt")
    assert f.where.function == "forward"
    assert {o.path for o in f.outputs} == {"cmodel.enc.weight", "cmodel.enc.bias"}
    assert torch.isnan(model.enc.weight.grad).all()
    # after the block, the module is compiled again (the eager stance ended with the block)
    assert torch.compiler.is_compiling() is False
    assert torch._dynamo.eval_frame._stance.stance == "default"


def test_sanitize_and_nansafe_around_a_compiled_module():
    model, cmodel = compiled_model()
    model.zero_grad()
    with gst.sanitize() as report:
        cmodel(torch.randn(3, 4)).backward()
    assert [f.catalog_id for f in report.findings if f.kind == "nonfinite"] == ["sqrt-at-zero"]
    assert report.findings[0].where.line == line_of("compiled-sqrt")
    model.zero_grad()
    with gst.nansafe() as report:
        cmodel(torch.randn(3, 4)).backward()
    (f,) = report.findings
    assert f.kind == "unresolved" and f.where.line == line_of("compiled-sqrt")


@torch.compile
def masked_root(x):
    return torch.where(x > 0, torch.sqrt(x), 0.0).sum()  # compiled-fn


def test_functional_forms_around_a_compiled_function():
    x = torch.tensor([-1.0, 4.0], requires_grad=True)
    report = gst.explain(masked_root)(x)
    (f,) = report.findings
    assert f.catalog_id == "sqrt-of-negative" and f.where.line == line_of("compiled-fn")
    assert torch.isnan(x.grad[0])
    x = torch.tensor([-1.0, 4.0], requires_grad=True)
    report = gst.nansafe(masked_root)(x)
    assert [f.kind for f in report.findings] == ["resolved"]
    assert x.grad.tolist() == [0.0, 0.25]


def test_compiled_module_first_called_inside_the_block():
    torch.manual_seed(0)
    model = Model()
    cmodel = torch.compile(model)  # never run compiled before the block
    with gst.explain() as report:
        cmodel(torch.randn(3, 4)).backward()
    assert report.findings[0].where.line == line_of("compiled-sqrt")


SCRIPT = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.enc(x)
        return torch.sqrt(((h - h.detach()) ** 2).sum())  # script-sqrt

torch.manual_seed(0)
model = Model()
cmodel = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    loss = cmodel(torch.randn(3, 4))
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("trace", [False, True])
def test_gradsan_run_locates_a_nan_in_a_compiled_model(tmp_path, trace):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    args = [sys.executable, "-m", "gradsan", "run", *(["--trace"] if trace else []), str(script)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 3, r.stderr
    line = line_of(script, "script-sqrt")
    assert "sqrt at " in r.stderr and f"train.py:{line} (forward)" in r.stderr
    assert "? at None" not in r.stderr
    assert "seeded" not in r.stderr
    assert "the 1st backward call" in r.stderr
