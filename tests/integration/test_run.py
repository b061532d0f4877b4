"""`gradsan run script.py`: the examples stop at their NaN step with the right lines, exit 3,
and leave a reproducer that re-creates the NaN."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import line_of

# slow: each test runs `gradsan run` (or a reproducer) in a subprocess
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def gradsan(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "gradsan", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def last_step(stdout: str) -> str:
    return [x for x in stdout.splitlines() if x.startswith("step ")][-1]


def only_repro(tmp_path: Path) -> Path:
    (d,) = [p for p in tmp_path.iterdir() if p.name.startswith("gradsan-repro-")]
    return d


def write(tmp_path: Path, name: str, code: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(code))
    return p


@pytest.mark.slow
def test_jax_example_stops_at_step_7_and_reproduces(tmp_path):
    script = EXAMPLES / "jax_pairwise_distance.py"
    r = gradsan("run", "--json", "out.json", script, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    if "is read one call late" in r.stderr:  # the step was still running after dispatch:
        # the script's own code after step 7 ran (it printed step 7's loss and the next
        # header), then the 9th call did not return
        assert last_step(r.stdout) == "step 8" and r.stdout.endswith("step 8\n")
        assert "\nstep 7\n  loss " in r.stdout
    else:  # the step was done when its dispatch returned: its flag was read at once
        assert last_step(r.stdout) == "step 7" and r.stdout.endswith("step 7\n")
    assert "the 8th call of `train_step` (jax.jit) returned NaN/Inf" in r.stderr
    assert "replaying it through the interpreter" in r.stderr and "replay done in" in r.stderr
    sqrt_line = line_of(script, "embedding distance")
    assert f"sqrt at {script}:{sqrt_line} (pairwise_distance)" in r.stderr.replace(
        os.path.relpath(script, tmp_path), str(script))
    assert "sqrt-at-zero" in r.stderr
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["exit_code"] == 3
    (rep,) = data["reports"]
    assert rep["call"] == 8 and rep["findings"][0]["catalog_id"] == "sqrt-at-zero"
    assert rep["findings"][0]["where"]["line"] == sqrt_line
    d = only_repro(tmp_path)
    assert {"inputs.npz", "repro.py", "meta.json", "structure.pkl", "jaxpr.txt"} <= {
        p.name for p in d.iterdir()}
    rr = subprocess.run([sys.executable, str(d / "repro.py")], capture_output=True, text=True,
                        timeout=300, cwd=tmp_path)
    assert rr.returncode == 3, rr.stderr
    assert "sqrt-at-zero" in rr.stdout and f":{sqrt_line} (pairwise_distance)" in rr.stdout


@pytest.mark.slow
def test_torch_example_stops_at_step_5_and_reproduces(tmp_path):
    script = EXAMPLES / "torch_masked_attention.py"
    r = gradsan("run", script, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert last_step(r.stdout) == "step 5"
    assert "the 6th backward call" in r.stderr
    assert "re-running the script up to backward call 6" in r.stderr
    # the -inf mask is intentional: the NaN is born in the softmax of the fully masked row
    soft_line = line_of(script, "attention weights")
    assert f"torch_masked_attention.py:{soft_line} (forward)" in r.stderr
    assert "softmax-all-neg-inf" in r.stderr
    assert "model.v.weight" in r.stderr
    d = only_repro(tmp_path)
    assert (d / "inputs.pt").exists()
    rr = subprocess.run([sys.executable, str(d / "repro.py")], capture_output=True, text=True,
                        timeout=300, cwd=tmp_path)
    assert rr.returncode == 3, rr.stderr
    assert "bit-identical in the re-run" in rr.stderr
    assert f"torch_masked_attention.py:{soft_line} (forward)" in rr.stdout


@pytest.mark.slow
def test_torch_trace_mode_needs_no_rerun(tmp_path):
    script = EXAMPLES / "torch_masked_attention.py"
    r = gradsan("run", "--trace", script, cwd=tmp_path)
    assert r.returncode == 3
    assert "re-running" not in r.stderr
    assert f":{line_of(script, 'attention weights')} (forward)" in r.stderr


def test_eager_jax_grad_in_a_function(tmp_path):
    script = write(tmp_path, "s.py", """
        import jax, jax.numpy as jnp, sys

        def loss(x):
            return jnp.sqrt(jnp.sum(x ** 2))  # the norm

        def main():
            g = jax.grad(loss)
            for step in range(3):
                print("step", step, flush=True)
                x = jnp.ones(3) * (1 - step)   # x = 0 at step 1
                g(x)
            sys.exit(0)

        if __name__ == "__main__":
            main()
    """)
    r = gradsan("run", script, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert last_step(r.stdout) == "step 1"
    assert "the 2nd call of `loss` (jax.grad)" in r.stderr
    assert f"s.py:{line_of(script, 'the norm')} (loss)" in r.stderr
    rr = subprocess.run([sys.executable, str(only_repro(tmp_path) / "repro.py")],
                        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert rr.returncode == 3, rr.stderr


def test_healthy_script_keeps_its_exit_code_and_imports_no_backend(tmp_path):
    script = write(tmp_path, "ok.py", """
        import sys
        print("args", sys.argv[1:], "backends", "jax" in sys.modules or "torch" in sys.modules)
        sys.exit(5)
    """)
    r = gradsan("run", script, "--lr", "3", cwd=tmp_path)
    assert r.returncode == 5, r.stderr
    assert "args ['--lr', '3'] backends False" in r.stdout
    assert not any(p.name.startswith("gradsan-repro-") for p in tmp_path.iterdir())


def test_library_jits_are_not_wrapped_and_tracing_passes_through(tmp_path):
    script = write(tmp_path, "lib.py", """
        import jax, jax.numpy as jnp

        @jax.jit
        def f(x):
            return jax.grad(lambda y: jnp.sum(y ** 2))(x)   # grad inside jit: traced, unchecked

        print(type(f).__name__, f(jnp.ones(2)).tolist(), f.lower(jnp.ones(2)) is not None)
        print(jnp.where(jnp.ones(2) > 0, -jnp.inf, 0.0).tolist())
    """)
    r = gradsan("run", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Watched [2.0, 2.0] True" in r.stdout


def test_sanitize_reports_kinks_without_stopping(tmp_path):
    script = write(tmp_path, "kink.py", """
        import jax, jax.numpy as jnp
        g = jax.grad(lambda x: jnp.sum(jnp.abs(x)))
        print(g(jnp.zeros(2)).tolist())
        print("finished")
    """)
    r = gradsan("run", "--sanitize", "--json", "k.json", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "finished" in r.stdout
    assert "--sanitize:" in r.stderr and "kink" in r.stderr
    data = json.loads((tmp_path / "k.json").read_text())
    assert data["reports"] and data["reports"][0]["kind"] == "sanitize"


def test_cli_help_lists_run(tmp_path):
    r = gradsan("run", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "--trace" in r.stdout and "--sanitize" in r.stdout
