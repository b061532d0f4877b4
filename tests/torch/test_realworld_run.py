"""`gradsan run` on examples/torch_mnist_log_of_softmax.py (pytorch/examples mnist with the
log(softmax) of the threads and one broken batch), as a user runs it: exit 3 at step 3, the
origin at the script's line, and the printed fix, pasted into the script, trains to the end
with the same losses on the clean steps. One subprocess (module-scoped)."""

import contextlib
import io
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import line_of

pytestmark = pytest.mark.slow  # one `gradsan run` subprocess (its re-run traces the step)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "torch_mnist_log_of_softmax.py"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("mnist")
    return subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(SCRIPT)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run_main(source: str) -> str:
    mod = types.ModuleType("pasted_mnist")
    mod.__file__ = str(SCRIPT.with_name("pasted_mnist.py"))
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        mod.main()
    return out.getvalue()


def test_gradsan_run_stops_at_the_bad_batch_with_its_origin(ran):
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout.splitlines()[-1] == "step 2 loss 2.7610"
    line = line_of(SCRIPT, "the log of a softmax")
    assert f"log at {SCRIPT}:{line} (forward) got 0.0" in ran.stderr
    assert "the 4th backward call" in ran.stderr and "log-at-zero" in ran.stderr


def test_the_printed_fix_pasted_into_the_script_trains_to_the_end(ran):
    # the first fix gradsan printed, as code under "Fix:"
    m = re.search(r"Fix:\n  1\. .*\n     (.+)\n", ran.stderr)
    assert m, ran.stderr
    fix = m.group(1).strip()
    assert fix == "return F.log_softmax(self.fc1(x), dim=1)"
    lines = SCRIPT.read_text().splitlines(keepends=True)
    i = line_of(SCRIPT, "the log of a softmax") - 1
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = indent + fix + "\n"
    out = _run_main("".join(lines))
    assert out.endswith("done\n")
    losses = [float(x.split()[-1]) for x in out.splitlines() if x.startswith("step ")]
    assert len(losses) == 6 and all(v == v and abs(v) != float("inf") for v in losses)
    # the clean steps keep their values (the fix is the same function where it is finite)
    assert [f"step {i} loss {v:.4f}" for i, v in enumerate(losses[:3])] == ran.stdout.splitlines()[
        :3
    ]
