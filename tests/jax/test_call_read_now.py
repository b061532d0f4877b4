"""``GRADSAN_JAX_FLAG_READ=now`` under `gradsan run`: every jitted step's flag is read right
after its call (a sync per call), so the script stops at the failing call and none of its
code after that call runs. By default a step still running after its dispatch has its flag
read one call late: the line that says so names this opt-out."""

import contextlib
import io
import os
import subprocess
import sys

import pytest

from gradsan._run import _patch_jax
from gradsan._run._failure import EXIT_NONFINITE, Stop
from gradsan._run._hooks import Hooks, run_script

BAD = 3  # the step whose batch holds a negative value: log goes NaN there

SCRIPT = """
import numpy as np
import jax, jax.numpy as jnp

data = np.ones((6, {n}), np.float32)
data[{bad}, 2] = -1.0  # log of it: NaN at step {bad}
m = jnp.asarray(np.eye({n}, dtype=np.float32) * 0.5)

def update(w, b):
    '{case}'
    for _ in range({layers}):
        w = jnp.tanh(m @ w)
    return w + jnp.log(b)  # the NaN line

step = jax.jit(update, donate_argnums=(0,) if {donate} else ())
w = jnp.ones(({n}, {n}))
for i in range(len(data)):
    print(f"step {{i}}", flush=True)
    w = step(w, data[i])
    print(f"  w {{float(w.sum()):.3f}}", flush=True)
print("done")
"""


def _script(tmp_path, name, n=4, layers=1, donate=False) -> str:
    p = tmp_path / f"{name}.py"  # its own code per test (a trace cache keyed by code)
    p.write_text(SCRIPT.format(n=n, layers=layers, bad=BAD, case=p, donate=donate))
    return str(p)


def _under_gradsan(path: str) -> tuple[int, list, str, str]:
    got: list = []

    def on_failure(f):
        got.append(f)
        raise Stop(f)

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code, _ = run_script(path, [], Hooks(on_failure))
    return code, got, out.getvalue(), err.getvalue()


@pytest.fixture
def still_running(monkeypatch):
    """Every step still running right after its dispatch (as on an accelerator)."""
    monkeypatch.setattr(_patch_jax, "_ready", lambda flag: False)


@pytest.mark.parametrize("donate", [False, True], ids=["plain", "donated"])
def test_now_stops_at_the_failing_call(tmp_path, monkeypatch, still_running, donate):
    monkeypatch.setenv("GRADSAN_JAX_FLAG_READ", "now")
    code, got, out, err = _under_gradsan(_script(tmp_path, f"now_{donate}", donate=donate))
    assert code == EXIT_NONFINITE
    assert out.splitlines()[-1] == f"step {BAD}"  # nothing after the failing call ran
    assert [f.call for f in got] == [BAD + 1]
    assert f"the {BAD + 1}th call of `update` (jax.jit) returned NaN/Inf" in err
    assert "read one call late" not in err


def test_the_late_read_names_the_opt_out(tmp_path, monkeypatch, still_running):
    monkeypatch.delenv("GRADSAN_JAX_FLAG_READ", raising=False)
    code, got, out, err = _under_gradsan(_script(tmp_path, "late_default"))
    assert code == EXIT_NONFINITE
    assert out.splitlines()[-2:] == ["  w nan", f"step {BAD + 1}"]  # ran past the failing call
    assert [f.call for f in got] == [BAD + 1]
    line = next(x for x in err.splitlines() if "is read one call late" in x)
    assert line.endswith(
        "call ran as it does without gradsan (set GRADSAN_JAX_FLAG_READ=now to stop at the "
        "failing call)."
    )


def test_an_unknown_value_is_said_and_ignored(tmp_path, monkeypatch, still_running):
    monkeypatch.setenv("GRADSAN_JAX_FLAG_READ", "sometimes")
    monkeypatch.setattr(_patch_jax, "_WARNED", [])
    code, got, out, err = _under_gradsan(_script(tmp_path, "unknown"))
    assert code == EXIT_NONFINITE
    assert "GRADSAN_JAX_FLAG_READ='sometimes' is not 'now' or 'late': ignored" in err
    assert "is read one call late" in err  # the default read


@pytest.mark.slow  # one `gradsan run` subprocess
def test_gradsan_run_with_now_stops_at_the_failing_step(tmp_path):
    """The real command line, on a step too slow to be done by the end of its dispatch (the
    default read would take it one call late and print step 4)."""
    path = _script(tmp_path, "slow_step", n=256, layers=4)
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", path],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "GRADSAN_JAX_FLAG_READ": "now"},
    )
    assert r.returncode == 3, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == f"step {BAD}"
    assert f"the {BAD + 1}th call of `update` (jax.jit) returned NaN/Inf" in r.stderr
    assert "read one call late" not in r.stderr
