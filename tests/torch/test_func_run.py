"""`gradsan run` checks the gradients torch.func returns to the script (grad, grad_and_value,
vjp, jacrev, vmap of grad): a NaN stops the run with a located report, a clean script runs
unchanged. In-process through the run's own hooks; one `gradsan run` subprocess (slow)."""

import subprocess
import sys
from pathlib import Path

import pytest

from gradsan._run._failure import Failure, Stop
from gradsan._run._hooks import Hooks, run_script
from tests.conftest import line_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_func_grad.py"


def _run(script, argv=(), trace=False):
    def on_failure(f: Failure) -> None:
        raise Stop(f)

    hooks = Hooks(on_failure, trace_from=1 if trace else None)
    code, failure = run_script(str(script), list(argv), hooks)
    return code, failure, hooks


def test_clean_torch_func_script_runs_unchanged(capsys):
    code, failure, hooks = _run(EXAMPLE, ["--clean"])
    assert code == 0 and failure is None
    assert capsys.readouterr().out.startswith("done: |w| = ")
    assert hooks.torch_calls == 22  # 20 grads, one vmap(grad), one jacrev: each checked


def test_nan_under_torch_func_grad_stops_untraced_naming_the_argument():
    code, failure, _ = _run(EXAMPLE)
    assert code == 3 and failure is not None
    assert failure.call == 13 and not failure.traced
    assert f"torch_func_grad.py:{line_of(EXAMPLE, 'the grad call')} (main)" in failure.label
    assert "torch.func.grad" in failure.label
    (f,) = failure.report.findings
    assert [o.path for o in f.outputs] == ["w"]


def test_nan_under_torch_func_grad_is_located_when_traced():
    code, failure, _ = _run(EXAMPLE, trace=True)
    assert code == 3 and failure.traced
    f = failure.report.findings[0]
    assert f.catalog_id == "sqrt-at-zero" and f.phase == "gradient"
    assert f.where.file == str(EXAMPLE) and f.where.function == "distance"
    assert f.where.line == line_of(EXAMPLE, "the bug: sqrt")
    assert [o.path for o in f.outputs] == ["w"]
    assert not any("accumulation" in n for n in failure.report.notes)  # nothing accumulates


SCRIPT = """
import torch
from torch.func import grad, jacrev, vjp, vmap

def f(w):
    return torch.sqrt((w - w.detach()).pow(2).sum())

w = torch.randn(3)
api = {api!r}
if api == "vjp":
    _, fn = vjp(f, w)
    fn(torch.tensor(1.0))
elif api == "jacrev":
    jacrev(f)(w)
else:
    vmap(grad(f))(torch.randn(2, 3))
print("not reached")
"""


@pytest.mark.parametrize("api", ["vjp", "jacrev", "vmap"])
def test_nan_from_vjp_jacrev_and_vmap_of_grad_stops(tmp_path, api, capsys):
    script = tmp_path / f"{api}.py"
    script.write_text(SCRIPT.format(api=api))
    code, failure, _ = _run(script)
    assert code == 3 and failure.call == 1
    assert f"torch.func.{api}" in failure.label
    assert "not reached" not in capsys.readouterr().out
    (f,) = failure.report.findings
    assert f.outputs and f.outputs[0].nan == f.outputs[0].size


@pytest.mark.slow
def test_gradsan_run_cli_locates_the_nan_under_torch_func_grad(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(EXAMPLE)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 3, r.stderr
    assert "in torch.func.grad, gave NaN/Inf gradients" in r.stderr
    assert f"sqrt at {EXAMPLE}:{line_of(EXAMPLE, 'the bug: sqrt')} (distance)" in r.stderr
    assert "reached  w (8 of 8 elements)" in r.stderr
    assert "accumulation" not in r.stderr
