"""`gradsan run` writes the verified fixes as fix.patch next to the reproducer; the pytest report
shows them (gradsan._fix._hooks, called from _run/ and the plugin)."""

import subprocess

import pytest

from gradsan._fix._hooks import pytest_section, write_fix_patch
from gradsan._run._failure import Failure
from tests.fix.test_conformance import load

PROG = """\
import jax
import jax.numpy as jnp


def loss(w):
    return jnp.linalg.norm(w - jnp.array([1.0, 2.0]))


step = jax.jit(jax.grad(loss))
"""


@pytest.fixture
def prog(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(PROG)
    return load(str(tmp_path / "train.py"), "_hooks_train")


def test_fix_patch_is_written_and_applies(prog, tmp_path, capsys):
    import jax.numpy as jnp

    from gradsan.jax._explain import diagnose

    args = (jnp.array([1.0, 2.0]),)
    report = diagnose(prog.step, args, {})  # what the guard hands `gradsan run`: not verified
    assert all(p.status != "verified" for f in report.findings for p in f.fixes)
    failure = Failure("jax", report, 1, "`step` (jax.jit)", fun=prog.step, args=args)
    d = tmp_path / "repro"
    d.mkdir()
    path = write_fix_patch(failure, str(d))
    assert path is not None
    err = capsys.readouterr().err
    assert "git apply" in err and "patch -p1" in err
    text = (d / "fix.patch").read_text()
    assert text.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+import gradsan.jax\n" in text and "+    return gradsan.jax.safe.norm(" in text
    name, body = pytest_section(report)
    assert name == "gradsan fix.patch" and text in body
    r = subprocess.run(["patch", "-p1", "-i", str(d / "fix.patch")], cwd=tmp_path)
    assert r.returncode == 0
    fixed = load(str(tmp_path / "train.py"), "_hooks_train_fixed")
    g = fixed.step(*args)
    assert jnp.all(jnp.isfinite(g)) and float(jnp.linalg.norm(g)) <= 1.0
    assert report.patch() == ""  # the file now holds the fix: nothing left to patch


def test_no_patch_when_nothing_is_verified(tmp_path):
    from gradsan._report._records import Report

    failure = Failure("torch", Report(), 1, "loss.backward()")
    assert write_fix_patch(failure, str(tmp_path)) is None
    assert pytest_section(Report()) is None
