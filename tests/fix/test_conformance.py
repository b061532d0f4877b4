"""The fix conformance suite: for every trigger program (JAX eager and jit, torch eager) the
report names the entry at the marked line, its first printed fix is verified by gradsan, and
``Report.patch()`` applied with GNU patch and with ``git apply`` to a temporary copy of the
program gives the true gradient."""

import importlib.util
import itertools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import gradsan.jax as gsj
import gradsan.torch as gst
from tests.conftest import line_of
from tests.fix import programs_jax as PJ
from tests.fix import programs_torch as PT

_count = itertools.count()
# the copies' modules stay alive: gradsan.jax._source caches places by jaxlib traceback, whose
# key a new code object at a freed one's address would share
_KEEP: list = []
HERE = os.path.dirname(__file__)


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def copy_of(tmp_path, monkeypatch):
    """A copy of a program file in a temporary folder (the working directory, so the patch's
    paths are relative to it), imported as a fresh module."""
    monkeypatch.chdir(tmp_path)
    made = []

    def make(src):
        dst = tmp_path / os.path.basename(src)
        n = next(_count)
        # a copy's functions start on other lines than earlier copies': JAX reuses a jit trace
        # for equal code objects (the file name is not part of code equality)
        with open(src) as fh:
            dst.write_text(f'"""copy {n}."""\n' + "\n" * n + fh.read())
        name = f"_fixprog{n}"
        made.append(name)
        return dst, load(str(dst), name)

    yield make
    for name in made:
        _KEEP.append(sys.modules.pop(name, None))


def apply_patch(tmp_path, text, tool):
    (tmp_path / "fix.patch").write_text(text)
    if tool == "git":
        subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
        cmd = ["git", "apply", "fix.patch"]
    else:
        cmd = ["patch", "-p1", "-i", "fix.patch"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", sorted(PJ.POINTS))
@pytest.mark.parametrize(
    "jit", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "jit"]
)
def test_jax_trigger_fix_is_verified_and_its_patch_gives_the_true_gradient(
    name, jit, copy_of, tmp_path
):
    path, mod = copy_of(PJ.__file__)
    fn = getattr(mod, name)
    x = jnp.array(PJ.POINTS[name])
    prog = jax.jit(jax.grad(fn)) if jit else jax.grad(fn)
    report = gsj.explain(prog)(x)
    ids = [f.catalog_id for f in report.findings]
    want = PJ.ENTRY[name]
    assert want in ids, (name, ids)
    f = report.findings[ids.index(want)]
    assert f.where.line == line_of(str(path), f"L:{want}")
    first = f.fixes[0]
    assert first.status == "verified", str(report)
    assert f.suggestions[0].endswith("# verified: " + first.checked)
    text = report.patch()
    assert text.startswith(f"--- a/{path.name}\n+++ b/{path.name}\n")
    apply_patch(tmp_path, text, "git" if jit else "gnu")
    fixed = load(str(path), f"_fixprog{next(_count)}")
    _KEEP.append(fixed)
    g = jax.grad(getattr(fixed, name))(x)
    np.testing.assert_allclose(np.asarray(g), PJ.TRUTH[name], rtol=1e-5, atol=1e-6)
    assert float(getattr(fixed, name)(x)) == pytest.approx(float(fn(x)), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("name", sorted(PT.POINTS))
def test_torch_trigger_fix_is_verified_and_its_patch_gives_the_true_gradient(
    name, copy_of, tmp_path
):
    path, mod = copy_of(PT.__file__)
    fn = getattr(mod, name)
    x = torch.tensor(PT.POINTS[name], requires_grad=True)
    report = gst.explain(fn)(x)
    ids = [f.catalog_id for f in report.findings]
    want = PT.ENTRY[name]
    assert want in ids, (name, ids)
    f = report.findings[ids.index(want)]
    assert f.where.line == line_of(str(path), PT.MARKER.get(name, f"L:{want}"))
    assert f.fixes[0].status == "verified", str(report)
    apply_patch(tmp_path, report.patch(), "gnu")
    fixed = load(str(path), f"_fixprog{next(_count)}")
    _KEEP.append(fixed)
    x2 = torch.tensor(PT.POINTS[name], requires_grad=True)
    loss = getattr(fixed, name)(x2)
    loss.backward()
    np.testing.assert_allclose(x2.grad.numpy(), PT.TRUTH[name], rtol=1e-5, atol=1e-6)
    x3 = torch.tensor(PT.POINTS[name])
    assert float(loss.detach()) == pytest.approx(float(fn(x3)), rel=1e-6, abs=1e-7)


def test_two_findings_are_verified_together_and_patched_together(copy_of, tmp_path):
    path, mod = copy_of(PJ.__file__)
    x = jnp.array([0.0, 0.5])
    report = gsj.explain(jax.grad(mod.two_findings))(x)
    lines = sorted(f.where.line for f in report.findings)
    assert lines == [line_of(str(path), "L:two-a"), line_of(str(path), "L:two-b")]
    assert all(f.fixes[0].status == "verified" for f in report.findings), str(report)
    text = report.patch()
    assert text.count("\n-    ") == 2  # both statements, one hunk each or together
    apply_patch(tmp_path, text, "gnu")
    fixed = load(str(path), f"_fixprog{next(_count)}")
    _KEEP.append(fixed)
    np.testing.assert_allclose(np.asarray(jax.grad(fixed.two_findings)(x)), [0.0, 2.0], atol=1e-6)
