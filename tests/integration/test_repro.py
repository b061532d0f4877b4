"""JAX reproducers: arrays saved by path, the rest (a flax TrainState with optax functions,
equinox modules) re-created by running the script up to the first matching call, so a
notebook-style script is not run whole; the environment variables the script read are
recorded and set again; a reproducer is announced only after it was loaded."""

import json
import subprocess
import sys

import pytest

from tests.conftest import line_of
from tests.integration.test_run import gradsan, only_repro, write

pytestmark = pytest.mark.slow


def repro(d, *args, cwd):
    return subprocess.run(
        [sys.executable, str(d / "repro.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


# A flax TrainState with optax functions reproduces: in test_frameworks.py
# (test_a_train_state_with_optax_functions_reproduces shares that file's run of the script).


NOTEBOOK = """
    import os
    import jax, jax.numpy as jnp

    n = int(os.environ["WIDTH"])           # the size comes from the environment
    scale = float(os.getenv("SCALE", "1"))

    @jax.jit
    def step(w, x):
        return w + jnp.log(x) * scale  # the log

    w = jnp.ones(n)
    for i in range(4):                     # the loop at module level
        print(f"step {i}", flush=True)
        w = step(w, jnp.full(n, 1.0 - i / 2))
"""


def test_a_notebook_style_script_is_not_rerun_whole_and_its_env_is_recorded(tmp_path):
    s = write(tmp_path, "nb.py", NOTEBOOK)
    env = {**__import__("os").environ, "WIDTH": "3"}
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(s)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 3, r.stderr
    assert r.stdout.split() == ["step", "0", "step", "1", "step", "2"]  # log(0) at step 2
    d = only_repro(tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    assert meta["environ"] == {"WIDTH": "3", "SCALE": None}
    rr = repro(d, cwd=tmp_path)  # WIDTH is not set here: the reproducer sets it
    assert rr.returncode == 3, rr.stderr
    assert rr.stdout.startswith("step 0\n") and "step 1" not in rr.stdout  # stopped at call 1
    assert f"nb.py:{line_of(s, 'the log')} (step)" in rr.stdout


def test_a_reproducer_that_cannot_load_is_not_announced(tmp_path):
    s = write(
        tmp_path,
        "once.py",
        """
        import os, sys
        import jax, jax.numpy as jnp
        if os.path.exists("ran.flag"):
            sys.exit(0)                    # a second run does nothing
        open("ran.flag", "w").close()
        jax.jit(jnp.log)(jnp.zeros(2))
    """,
    )
    r = gradsan("run", s, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "reproducer written" not in r.stderr
    assert "but its repro.py does not load (the reproducer does not load: the re-run" in r.stderr
