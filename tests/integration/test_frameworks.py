"""`gradsan run` on equinox and flax (NNX, linen with dropout) training scripts: each stops at
its padded batch with a report located at the user's line (exit 3) and runs unchanged when
the batch is not padded; eager `eqx.filter_grad` / `nnx.grad` calls are checked too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import line_of
from tests.integration.test_repro import repro
from tests.integration.test_run import gradsan, only_repro, write

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = {
    "equinox_mlp.py": "(eqx.filter_jit)",
    "flax_nnx_mlp.py": "(nnx.jit)",
    "flax_linen_dropout.py": "(jax.jit)",
}


@pytest.fixture(scope="module")
def padded_run(tmp_path_factory):
    """`gradsan run <script>` (the padded batch), run once per script in its own directory:
    the located report and the reproducer it leaves are asserted by separate tests."""
    runs: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}

    def run(name: str) -> tuple[subprocess.CompletedProcess, Path]:
        if name not in runs:
            cwd = tmp_path_factory.mktemp(name.removesuffix(".py"))
            runs[name] = (gradsan("run", EXAMPLES / name, cwd=cwd), cwd)
        return runs[name]

    return run


# The scripts run without gradsan, each as `python <script> --no-pad` runs it (as __main__, with
# that argv and sys.path[0]), one after the other in one interpreter: one start-up of python,
# jax, flax and equinox instead of three. Each output is its script's own (no script reads
# another's state: each seeds its own data and keys).
PLAIN = """
import contextlib, io, json, os, runpy, sys, traceback
out = {}
for path in sys.argv[1:]:
    sys.argv, sys.path[0] = [path, "--no-pad"], os.path.dirname(path)
    buf, code = io.StringIO(), 0
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    out[path] = [code, buf.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def plain_no_pad(tmp_path_factory):
    """{script name: (exit code, stdout)} of each script run with --no-pad without gradsan."""
    paths = [str(EXAMPLES / name) for name in sorted(SCRIPTS)]
    r = subprocess.run(
        [sys.executable, "-c", PLAIN, *paths],
        capture_output=True,
        text=True,
        cwd=tmp_path_factory.mktemp("plain"),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    return {name: tuple(out[str(EXAMPLES / name)]) for name in SCRIPTS}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_stops_at_the_padded_batch_with_a_located_report(padded_run, name):
    script = EXAMPLES / name
    r, _ = padded_run(name)
    assert r.returncode == 3, r.stderr
    if "is read at the end of the script" in r.stderr:
        # the last step was still running when its call returned (the machine's timing): its
        # flag was read when the script ended, and the script's own code after it ran
        assert r.stdout.splitlines()[-1] == "done"
        assert "the flag of the 6th call of `train_step`" in r.stderr
    else:
        assert r.stdout.splitlines()[-1] == "step 5"  # stopped at the padded batch
    assert f"the 6th call of `train_step` {SCRIPTS[name]} returned NaN/Inf" in r.stderr
    assert (
        f"{script}:{line_of(script, 'unit-length rows' if 'flax' in name else 'unit-length input')}"
        in r.stderr
    )
    assert "div-by-zero" in r.stderr


def test_a_train_state_with_optax_functions_reproduces(padded_run):
    # (from test_repro.py: it shares the linen script's `gradsan run` with the test above)
    r, cwd = padded_run("flax_linen_dropout.py")
    assert r.returncode == 3, r.stderr
    d = only_repro(cwd)
    assert f"reproducer written to {d.name}/ (python {d.name}/repro.py)" in r.stderr
    meta = json.loads((d / "meta.json").read_text())
    assert "[0][0].params['Dense_0']['kernel']" in meta["paths"]
    rr = repro(d, cwd=cwd)
    assert rr.returncode == 3, rr.stderr
    assert "div-by-zero" in rr.stdout and "flax_linen_dropout.py" in rr.stdout


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_runs_unchanged_when_no_batch_is_padded(tmp_path, plain_no_pad, name):
    script = EXAMPLES / name
    plain_code, plain_stdout = plain_no_pad[name]
    r = gradsan("run", script, "--no-pad", cwd=tmp_path)
    assert r.returncode == 0 == plain_code, r.stderr
    assert r.stdout == plain_stdout  # the same losses, to the printed digit
    assert "done" in r.stdout
    assert (
        f"checked 6 calls of 1 JAX function (`train_step` {SCRIPTS[name]} x6): all finite"
        in r.stderr
    )
    assert not list(tmp_path.glob("gradsan-repro-*"))


def test_eager_filter_grad_and_nnx_grad_are_checked(tmp_path):
    script = write(
        tmp_path,
        "eager.py",
        """
        import sys
        import equinox as eqx
        import jax.numpy as jnp
        from flax import nnx

        class M(eqx.Module):
            w: jnp.ndarray
            act: object = jnp.tanh          # a non-array leaf

        def loss(m, x):
            return jnp.sum(jnp.sqrt(m.act(m.w * x)))  # the sqrt

        m = M(jnp.ones(3))
        if sys.argv[1] == "eqx":
            eqx.filter_grad(loss)(m, jnp.ones(3))           # fine
            print("ok", flush=True)
            eqx.filter_value_and_grad(loss)(m, jnp.zeros(3))  # sqrt'(0) = inf
        else:
            lin = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
            f = lambda lin, x: jnp.sum(jnp.sqrt(lin(x) ** 2))  # the nnx sqrt
            nnx.grad(f)(lin, jnp.ones((1, 3)))
            print("ok", flush=True)
            nnx.value_and_grad(f)(lin, jnp.zeros((1, 3)) * lin.kernel[:, 0])
        print("not reached")
    """,
    )
    for which, label, marker in (
        ("eqx", "`loss` (eqx.filter_value_and_grad)", "the sqrt"),
        ("nnx", "(nnx.value_and_grad)", "the nnx sqrt"),
    ):
        r = gradsan("run", script, which, cwd=tmp_path)
        assert r.returncode == 3, r.stderr
        assert r.stdout.split() == ["ok"]
        assert f"the 1st call of {label}" in r.stderr or (
            "the 1st call of" in r.stderr and label in r.stderr
        )
        assert f"eager.py:{line_of(script, marker)}" in r.stderr


def test_a_re_created_filter_jit_is_traced_once_as_without_gradsan(tmp_path):
    # equinox's own test_jit_grad: eqx.filter_jit(eqx.filter_grad(f)) made twice traces f once
    script = write(
        tmp_path,
        "retrace.py",
        """
        import equinox as eqx
        import jax.numpy as jnp

        traces = 0

        def f(x):
            global traces
            traces += 1
            return x + 1

        assert eqx.filter_jit(eqx.filter_grad(f))(jnp.array(1.0)) == 1
        assert eqx.filter_jit(eqx.filter_grad(f))(jnp.array(2.0)) == 1
        print("traces", traces)
    """,
    )
    r = gradsan("run", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["traces", "1"]
    assert "checked 2 calls of 1 JAX function (`f` (eqx.filter_jit) x2): all finite." in r.stderr
