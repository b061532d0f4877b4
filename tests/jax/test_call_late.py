"""Under `gradsan run` a jitted step's finiteness flag is read one call late, on the CPU as on
accelerators (issue 17): the NaN at step k is reported as step k, replayed with step k's own
inputs (also when the script refills its numpy batch buffer in place), the script's own code
after step k runs as it would without gradsan, the (k+1)th call does not return, and the
process exits with status 3. A donating step's flag is read before its next call is
dispatched, so the report never reads a buffer that call consumed. A step done within its
own dispatch (a cheap one on the CPU) has its flag read at once instead, with no snapshot:
these tests force the late read (GRADSAN_JAX_FLAG_READ=late) but one, which checks that."""

import contextlib
import io
import os
import runpy
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from gradsan._run import _patch_jax
from gradsan._run._failure import EXIT_NONFINITE, Stop
from gradsan._run._hooks import Hooks, run_script

BAD = 3  # the step whose batch holds a negative value: log goes NaN there

SCRIPT = """
import sys
import numpy as np
import jax, jax.numpy as jnp

DONATE = {donate}
data = np.ones((6, 4), np.float32) * np.arange(1, 7, dtype=np.float32)[:, None]
data[{bad}, 2] = -1.0  # log of it: NaN at step {bad}

def update(w, b):
    '{case}'
    return w * 0.5 + jnp.log(b)  # the NaN line

step = jax.jit(update, donate_argnums=(0,) if DONATE else ())
w = jnp.ones(4)
buf = np.zeros(4, np.float32)  # one batch buffer, refilled in place every step
for i in range(len(data)):
    print(f"step {{i}}", flush=True)
    buf[:] = data[i]
    w = step(w, buf)
    print(f"  w {{float(w.sum()):.3f}}", flush=True)
print("done")
"""


def _script(tmp_path, donate: bool) -> str:
    # each script's `update` has its own code (its docstring names the test): two scripts
    # with equal code in different files are reported at the first one's file (a trace
    # cache keyed by code; polish's item this session)
    p = tmp_path / f"train_{'donate' if donate else 'plain'}.py"
    p.write_text(SCRIPT.format(donate=donate, bad=BAD, case=p))
    return str(p)


def _plain_stdout(path: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    return out.getvalue()


def _under_gradsan(path: str) -> tuple[int, list, str, str]:
    got: list = []

    def on_failure(f):
        got.append(f)
        raise Stop(f)

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code, _ = run_script(path, [], Hooks(on_failure))
    return code, got, out.getvalue(), err.getvalue()


def _upto(stdout: str, line: str) -> str:
    lines = stdout.splitlines(keepends=True)
    return "".join(lines[: lines.index(line + "\n") + 1])


@pytest.mark.parametrize(
    "donate, ready",
    [(False, True), (False, False), (True, False)],
    ids=["finished", "still-running", "donated"],
)
def test_the_nan_step_is_reported_with_its_own_inputs(tmp_path, monkeypatch, donate, ready):
    """``ready``: whether step k has finished when the script calls step k+1 (then its flag
    is read before step k+1 is dispatched; else after). A donating step's flag is read before
    its next call is dispatched either way."""
    monkeypatch.setenv("GRADSAN_JAX_FLAG_READ", "late")  # this cheap step is read at once
    monkeypatch.setattr(_patch_jax, "_ready", lambda flag: ready)
    path = _script(tmp_path, donate)
    plain = _plain_stdout(path)
    assert "  w nan\n" in plain and plain.endswith("done\n")  # the script alone runs on
    code, got, out, err = _under_gradsan(path)
    assert code == EXIT_NONFINITE
    (f,) = got
    assert f.call == BAD + 1  # the 4th call is step 3
    # the script's own output after step k is what it would be: its code between the two
    # calls ran (it printed step k's NaN and the next step's header), then gradsan stopped
    # the (k+1)th call before it returned
    assert out == _upto(plain, f"step {BAD + 1}")
    assert f"the flag of the {BAD + 1}th call of `update` (jax.jit) is read one call late" in err
    if donate or ready:
        said = f"at the {BAD + 2}th call, before it was dispatched: the {BAD + 2}th call does not"
    else:
        said = f"at the {BAD + 2}th call, after it was dispatched (the {BAD + 1}th call was still"
    assert said in err
    # step k's batch, not step k+1's (the script refilled the buffer in place since)
    assert np.array_equal(np.asarray(f.args[1]), np.array([BAD + 1] * 2 + [-1, BAD + 1]))
    if donate:  # w was consumed by the call itself: the report lists the bad outputs
        assert any("donated" in n for n in f.report.notes)
        assert "non-finite outputs" in " ".join(f.report.notes)
    else:
        (finding,) = f.report.findings
        assert finding.primitive == "log"
        assert finding.where.function == "update" and finding.where.file == path
        assert np.array_equal(np.asarray(f.args[0]), np.asarray(_w_before(BAD)))


def _w_before(k: int) -> jnp.ndarray:
    w = np.ones(4, np.float32)
    for i in range(k):
        w = w * 0.5 + np.log(np.float32(i + 1))
    return jnp.asarray(w)


@pytest.mark.parametrize("donate", [False, True], ids=["plain", "donated"])
def test_a_step_done_within_its_dispatch_is_reported_at_its_own_call(tmp_path, monkeypatch, donate):
    """The default read: this cheap step is done when its dispatch returns (XLA:CPU runs it
    inline), so its flag is read at once, with no snapshot: the NaN at step k is reported
    inside step k's call, with the script's live inputs, and the script's code after it
    does not run."""
    # whether a step is done when its dispatch returns is the machine's (bench_call_cost
    # counts it); fixed here, to test what follows from it
    monkeypatch.setattr(_patch_jax, "_ready", lambda flag: True)
    path = _script(tmp_path, donate)
    plain = _plain_stdout(path)
    code, got, out, err = _under_gradsan(path)
    assert code == EXIT_NONFINITE
    (f,) = got
    assert f.call == BAD + 1 and "read one call late" not in err
    assert out == _upto(plain, f"step {BAD}")  # stopped inside step k's call
    assert np.array_equal(np.asarray(f.args[1]), np.array([BAD + 1] * 2 + [-1, BAD + 1]))
    if not donate:
        (finding,) = f.report.findings
        assert finding.primitive == "log" and finding.where.file == path
        assert np.array_equal(np.asarray(f.args[0]), np.asarray(_w_before(BAD)))


def test_a_step_whose_flag_is_never_followed_is_read_at_the_end(tmp_path, monkeypatch):
    """The NaN at the last step: its flag is read when the script ends, still step k."""
    monkeypatch.setenv("GRADSAN_JAX_FLAG_READ", "late")
    p = tmp_path / "last.py"
    p.write_text(
        "import jax, jax.numpy as jnp\n"
        "step = jax.jit(lambda x: jnp.sqrt(x))\n"
        "for v in (1.0, 2.0, -1.0):\n"
        "    y = step(jnp.full(2, v))\n"
        "print('end', flush=True)\n"
    )
    code, got, out, err = _under_gradsan(str(p))
    assert code == EXIT_NONFINITE and out == "end\n"
    (f,) = got
    assert f.call == 3 and float(f.args[0][0]) == -1.0
    assert "read one call late" not in err  # read at the end, no next call involved
    assert "the flag of the 3rd call of" in err and "is read at the end of the script" in err


def test_gradsan_run_exits_3_at_the_nan_step(tmp_path):
    """One subprocess: the real command line on the donating step, its exit status and the
    header naming step k; the reproducer is not announced (the donated input is gone)."""
    import subprocess

    path = _script(tmp_path, True)
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", path],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "GRADSAN_JAX_FLAG_READ": "late"},  # the one-call-late read
    )
    assert r.returncode == 3, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == f"step {BAD + 1}"
    assert f"the {BAD + 1}th call of `update` (jax.jit) returned NaN/Inf" in r.stderr
    assert "the step donated args[0] to the failing call, which consumed them" in r.stderr
    assert "reproducer written" not in r.stderr
