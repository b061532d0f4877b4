"""Mixed precision: a GradScaler's skipped steps are a note; a NaN it does not skip, or a scale
that collapses, is reported with the op and the user's line; autocast findings say the dtype."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gradsan
import gradsan.torch as gst
from gradsan.torch import _amp
from tests.conftest import line_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_amp_gradscaler.py"


def _setup(init_scale=2.0**16):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return model, opt, scaler


def _batch():
    return torch.randn(32, 8) * 4, torch.randn(32, 1)


def test_guard_lets_skipped_scaler_steps_through_and_counts_them():
    model, opt, scaler = _setup()

    def step(x, y):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = (model(x).float() - y).pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    guarded = gst.guard(step)
    w0 = model[0].weight.detach().clone()
    for _ in range(12):
        guarded(*_batch())  # no NonFiniteError: the overflows are the scaler's
    st = _amp.stats_of(scaler)
    assert st.steps == 12 and 0 < st.skipped < 12  # some steps overflowed, later ones did not
    assert st.first_scale == 2.0**16
    (note,) = guarded.notes
    assert f"GradScaler skipped {st.skipped} of " in note and "not an error" in note
    assert not torch.equal(model[0].weight, w0)  # the unskipped steps trained
    # the GradScaler class is as it was
    assert torch.amp.GradScaler.step.__qualname__ == "GradScaler.step"
    assert not hasattr(torch.amp.GradScaler.step, "__wrapped__")


def test_guard_reports_a_collapsing_scale_with_the_line_of_the_nan():
    model, opt, scaler = _setup(init_scale=2.0**4)

    def step(x, y):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            pred = model(x).float()
            # a finite loss whose gradient is inf at every scale (a NaN loss from the forward
            # is reported at once instead: test_guard_amp_loss.py)
            pred = torch.sqrt(pred - pred.detach())  # L:log
            loss = (pred - y).pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    guarded = gst.guard(step)
    w0 = model[0].weight.detach().clone()
    with pytest.raises(gradsan.NonFiniteError) as e:
        for _ in range(10):
            guarded(*_batch())
    st = _amp.stats_of(scaler)
    assert st.consecutive == 5 and st.last_scale == 0.5  # 16 -> 8 -> 4 -> 2 -> 1 -> 0.5
    f = e.value.report.findings[0]
    assert f.primitive == "sqrt" and f.where.line == line_of(__file__, "L:log")
    assert any("scale collapsed (2**4 -> 0.5)" in n for n in e.value.report.notes)
    assert torch.equal(model[0].weight, w0)  # every step was skipped, the replay applied none
    assert scaler.get_scale() == 0.5  # the replay left the scaler as the step left it


def test_guard_reports_a_nan_the_scaler_does_not_skip():
    model, opt, scaler = _setup(init_scale=1.0)

    def step(x, y):
        opt.zero_grad()
        pred = torch.sqrt(model(x))  # L:sqrt
        loss = (pred - y).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        opt.step()  # bypasses the scaler's skip
        scaler.update()
        return loss

    w0 = model[0].weight.detach().clone()
    with pytest.raises(gradsan.NonFiniteError) as e:
        gst.guard(step)(*_batch())
    f = e.value.report.findings[0]
    assert f.primitive == "sqrt" and f.where.line == line_of(__file__, "L:sqrt")
    assert any("did not skip" in n for n in e.value.report.notes)
    assert torch.equal(model[0].weight, w0)


def test_scaled_loss_is_recognised_through_detach():
    _, _, scaler = _setup()
    loss = torch.tensor(2.0, requires_grad=True) * 1.0
    with _amp.Watch() as w:
        scaled = scaler.scale(loss)
    assert w.scaler_of(scaled.detach()) is scaler
    assert w.scaler_of(loss.detach()) is None


@pytest.mark.slow
def test_gradsan_run_gradscaler_example_runs_to_the_end(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(EXAMPLE)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "done"
    assert "gradsan: GradScaler skipped 9 of 30 step(s)" in r.stderr
    assert not list(tmp_path.iterdir())  # no reproducer


@pytest.mark.slow
def test_gradsan_run_stops_at_a_loss_already_nan_before_scaling(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(EXAMPLE), "--nan-from", "12"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 3, r.stderr
    log_line = line_of(EXAMPLE, "the bug: log of a negative number")
    assert f"log at {EXAMPLE}:{log_line} (main)" in r.stderr
    assert "loss scaled by a GradScaler" in r.stderr
    assert "already non-finite when the step gave it to GradScaler.scale" in r.stderr
    assert "step 12 " not in r.stdout  # stopped in step 12, before its print
    assert "not an error" not in r.stderr


@pytest.mark.slow
def test_gradsan_run_stops_when_the_scale_collapses(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(EXAMPLE), "--inf-grad-from", "12"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 3, r.stderr
    line = line_of(EXAMPLE, "the bug: sqrt at 0, inf slope")
    assert f"sqrt at {EXAMPLE}:{line} (main)" in r.stderr
    assert "the scaler had skipped the 7 step(s) before it" in r.stderr  # steps 12-18
    assert "not an overflow the scaling causes" in r.stderr
    assert "step 18 " in r.stdout and "step 19 " not in r.stdout
    assert "not an error" not in r.stderr


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def test_autocast_bf16_inf_is_blamed_on_its_op_not_the_input():
    model = _mlp()
    x = torch.randn(4, 8)
    with gst.explain(module=model) as report:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = model(x * 3e38)  # L:overflow
            loss = h.float().sum()
        loss.backward()
    assert not report.ok
    assert all(f.catalog_id != "nonfinite-input" for f in report.findings)
    (f,) = report.findings
    assert f.primitive == "mul" and f.where.line == line_of("L:overflow")
    assert "model.0.weight" in [o.path for o in f.outputs]


def test_autocast_fp16_cast_overflow_is_named_with_the_dtype():
    model = _mlp()
    x = torch.randn(4, 8)
    with gst.explain(module=model) as report:
        with torch.autocast("cpu", dtype=torch.float16):
            h = model(x * 1e5)  # L:cast
            loss = h.float().sum()
        loss.backward()
    assert all(f.catalog_id != "nonfinite-input" for f in report.findings)
    (cast,) = [f for f in report.findings if f.primitive == "autocast cast to float16"]
    assert cast.where.line == line_of("L:cast")
    assert [o.path for o in cast.outputs] == ["model.0.weight"]
