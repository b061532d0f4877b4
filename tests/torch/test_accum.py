"""Gradient accumulation: a NaN in micro-batch 3 of 4 names the micro-batch (guard and
`gradsan run`)."""

import subprocess
import sys
import textwrap

import pytest
import torch

import gradsan
import gradsan.torch as gst
from gradsan.torch._accum import micro_batch_note
from tests.conftest import line_of


def test_guard_names_micro_batch_3_of_4():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(xs):
        opt.zero_grad()
        for x in xs:
            loss = model(torch.log(x)).pow(2).mean() / len(xs)  # L:log
            loss.backward()
        opt.step()

    guarded = gst.guard(step)
    xs = [torch.rand(2, 4) + 0.1 for _ in range(4)]
    guarded(xs)
    xs[2][0, 0] = -1.0
    w0 = model[0].weight.detach().clone()
    with pytest.raises(gradsan.NonFiniteError) as e:
        guarded(xs)
    f = e.value.report.findings[0]
    assert f.primitive == "log" and f.where.line == line_of("L:log")
    (note,) = [n for n in e.value.report.notes if "accumulation" in n]
    assert "micro-batch 3 of 4" in note and "micro-batches 1-2 were finite" in note
    assert torch.equal(model[0].weight, w0)


def test_one_backward_per_step_says_nothing():
    assert micro_batch_note(1, 1) is None and micro_batch_note(1, None) is None
    assert "micro-batch 2 of 2" in micro_batch_note(2, 2)
    assert "micro-batch 1 of 4" in micro_batch_note(1, 4)
    assert "with micro-batch 3 of the optimizer step" in micro_batch_note(3, None)


SCRIPT = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    opt.zero_grad()
    for mb in range(4):
        x = torch.rand(2, 4) + 0.1
        if step == 1 and mb == 2:
            x[0, 0] = -1.0
        loss = model(torch.log(x)).pow(2).mean() / 4  # L:log
        loss.backward()
    opt.step()
print("done")
"""


@pytest.mark.slow
def test_gradsan_run_names_micro_batch_3_of_4(tmp_path):
    script = tmp_path / "accum.py"
    script.write_text(textwrap.dedent(SCRIPT))
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3, r.stderr
    assert "the 7th backward call" in r.stderr
    assert f"log at {script.name}:{line_of(script, 'L:log')} (<module>)" in r.stderr
    assert "micro-batch 3 of 4 of the optimizer step" in r.stderr
