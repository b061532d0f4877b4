"""`gradsan run` on examples/jax_shardmap_dp.py (data parallel over 8 simulated devices, a padded
batch that NaNs on the last device): the exit code, the located report with the device, the JSON
report and the reproducer, from one run in a child process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import line_of

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "jax_shardmap_dp.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("dp")
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", "--json", "out.json", str(SCRIPT)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return r, cwd


def test_exit_code_and_the_step_it_stopped_at(run):
    r, _ = run
    assert r.returncode == 3, r.stderr[-3000:]
    assert "the 4th call of `train_step` (jax.jit) returned NaN/Inf" in r.stderr
    if "is read at the end of the script" not in r.stderr:
        assert r.stdout.splitlines()[-1] == "step 3"  # stopped at the padded batch


def test_report_names_the_line_and_the_device(run):
    r, _ = run
    assert f"{SCRIPT}:{line_of(SCRIPT, 'per-device RMSE')} (rmse)" in r.stderr
    assert "in device 7 of 8 (data=7)" in r.stderr
    assert "sqrt-at-zero" in r.stderr
    # the safe sqrt is offered, and said to be unverified (no reference gradient)
    assert "gradsan.jax.safe.sqrt" in r.stderr and "# not verified" in r.stderr
    assert "no fix.patch" in r.stderr


def test_json_report_and_reproducer(run):
    r, cwd = run
    data = json.loads((cwd / "out.json").read_text())
    assert data["exit_code"] == 3
    [report] = data["reports"]
    assert [f["catalog_id"] for f in report["findings"]] == ["sqrt-at-zero"]
    (repro,) = [p for p in cwd.iterdir() if p.name.startswith("gradsan-repro-")]
    assert (repro / "repro.py").exists()
