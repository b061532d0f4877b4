"""gradsan on 8 simulated devices (jax.shard_map with pmean, and jit over NamedSharding inputs),
on examples/jax_shardmap_dp.py, a data-parallel loop whose padded batch NaNs on one device:
`gradsan run` (exit code, the located report naming the device) and, in the same kind of child
process, explain and guard called from Python. XLA gives a CPU process 8 devices only when asked
before JAX starts, so both run as child processes (one per fixture)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import line_of

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "jax_shardmap_dp.py"

CHILD = r"""
import json, runpy, sys
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import gradsan, gradsan.jax as gsj

ns = runpy.run_path(sys.argv[1], run_name="dp")
out = {"devices": len(jax.devices())}
*clean, (x, y) = list(ns["batches"](4, pad=True))
w = jnp.full((3, 1), 0.1)

report = gsj.explain(ns["train_step"])(w, x, y)
out["explain"] = [
    dict(id=f.catalog_id, prim=f.primitive, line=f.where.line, fn=f.where.function,
         device=f.detail.get("device"), context=f.context, outputs=[o.path for o in f.outputs])
    for f in report.findings
]

# guard over the loop: the clean steps' outputs are the plain ones, the padded step raises
step = gsj.guard(ns["train_step"])
same, raised, wg = [], None, w
for i, (xb, yb) in enumerate([*clean, (x, y)]):
    ref = ns["train_step"](wg, xb, yb)
    try:
        got = step(wg, xb, yb)
    except gradsan.NonFiniteError as e:
        raised = (i, [(f.catalog_id, f.where.line) for f in e.report.findings])
        break
    same.append(all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref))))
    wg = got[0]
out["guard"] = {"same": same, "raised": raised}

# jit over NamedSharding inputs, no shard_map: a per-row norm with a padded zero row on device 5
mesh = ns["MESH"]
def norm_loss(w, x):
    return jnp.sum(jnp.linalg.norm(x * w, axis=-1))  # L:mesh-norm
xs = np.ones((16, 3), np.float32); xs[11] = 0.0
xs = jax.device_put(xs, NamedSharding(mesh, P("data")))
r2 = gsj.explain(jax.jit(jax.grad(norm_loss)))(jnp.ones(3), xs)
out["sharded"] = [dict(id=f.catalog_id, line=f.where.line, index=f.index, context=f.context,
                       device=f.detail.get("device")) for f in r2.findings]
print("RESULT " + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    d = tmp_path_factory.mktemp("mesh")
    prog = d / "child.py"
    prog.write_text(CHILD)
    r = subprocess.run(
        [sys.executable, str(prog), str(SCRIPT)],
        env=env,
        cwd=d,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    line = next(s for s in r.stdout.splitlines() if s.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), prog


def test_explain_names_the_device_whose_shard_was_padding(child):
    out, _ = child
    assert out["devices"] == 8
    [f] = out["explain"]
    assert f["id"] == "sqrt-at-zero" and f["prim"] == "sqrt"
    assert (f["line"], f["fn"]) == (line_of(SCRIPT, "per-device RMSE"), "rmse")
    assert f["device"] == 7 and "device 7 of 8" in f["context"]
    assert f["outputs"] == ["output[0]"]  # the updated weights; the mean loss stays finite


def test_guard_raises_at_the_padded_step_and_leaves_clean_steps_alone(child):
    out, _ = child
    assert out["guard"]["same"] == [True, True, True]
    i, findings = out["guard"]["raised"]
    assert i == 3 and findings == [["sqrt-at-zero", line_of(SCRIPT, "per-device RMSE")]]


def test_jit_over_named_sharding_names_the_row_and_its_device(child):
    out, prog = child
    [f] = out["sharded"]
    assert f["id"] == "norm-at-zero" and f["line"] == line_of(prog, "L:mesh-norm")
    assert f["device"] == 5  # row 11 of 16, two rows a device
