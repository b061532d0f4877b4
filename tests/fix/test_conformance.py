"""The fix conformance suite (issue #13): every catalog entry x backend x (eager, jit /
torch.compile). The entry's trigger program (conformance_jax.py, conformance_torch.py) reports
that entry at the marked line; when the entry has a code fix, the first printed fix is verified
by gradsan, and ``Report.patch()`` applied with GNU patch (eager) or ``git apply`` (jit /
compile) to a temporary copy of the program gives the true gradient (analytic, or an element of
the entry's Clarke set) with the same forward value.

The catalog is enumerated: an entry without a trigger fails ``test_every_entry_is_covered``
unless NO_TRIGGER says why; an entry with a code fix whose trigger cannot be verified is listed
in NOT_VERIFIED with the reason."""

import importlib.util
import itertools
import math
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
from gradsan import _catalog
from tests.conftest import line_of
from tests.fix import conformance_jax as CJ
from tests.fix import conformance_torch as CT
from tests.fix import programs_jax as PJ

# the var-of-constant trigger is the variance of one sample, which torch warns about
pytestmark = pytest.mark.filterwarnings("ignore:var... degrees of freedom:UserWarning")

_count = itertools.count()
# the copies' modules stay alive: gradsan.jax._source caches places by jaxlib traceback, whose
# key a new code object at a freed one's address would share
_KEEP: list = []

# (backend, entry id) -> why there is no trigger program
NO_TRIGGER = {
    ("jax", "activation-corner"): (
        "jax.nn's piecewise activations are where selections and relu6's max/min in the "
        "jaxpr: their corners are reported as where-at-boundary / relu-at-zero / max-tie "
        "(tests/jax/test_sanitize_activations.py), never as this torch-only entry"
    ),
    ("jax", "activation-jump"): (
        "jax.nn has no fused hardshrink or threshold: written with jnp.where they are "
        "where-at-boundary, never this torch-only entry"
    ),
    ("jax", "pow-exponent-grad-at-zero-base"): (
        "JAX's pow rule returns d/dp 0 ** p = 0 for p >= 0 (log(0) replaced by log(1)): no "
        "NaN to trigger; the NaN it explains comes from exp(p * log a), exp-log-at-zero"
    ),
    ("torch", "pow-exponent-grad-at-zero-base"): (
        "PowBackward1 returns 0 where the base is 0 and p >= 0: no NaN to trigger; the NaN it "
        "explains comes from exp(p * log a), exp-log-at-zero"
    ),
    ("jax", "tan-at-pole"): (
        "float32 never reaches tan's pole: tan(float32(pi / 2)) = -2.3e7 is finite"
    ),
    ("torch", "tan-at-pole"): (
        "float32 never reaches tan's pole: torch.tan(float32(pi / 2)) = -2.3e7 is finite"
    ),
    ("jax", "var-of-constant"): (
        "jnp.var has no NaN of its own (its gradient 2 (x - mean) / (n - ddof) is 0 at a "
        "constant); the sqrt after it is std-of-constant, one sample with ddof=1 gives a NaN "
        "value that gradsan reports as the 0 / 0 of the division (div-by-zero)"
    ),
    ("torch", "cbrt-at-zero"): "torch has no cbrt op (x ** (1/3) is pow-fractional-at-zero)",
    ("torch", "i0e-at-zero"): (
        "torch's i0e derivative at 0 is 0 (sign(0) = 0), inside the admissible set [-1, 1]: "
        "sanitize rightly reports nothing"
    ),
}
# (backend, entry id) -> why the entry's code fix cannot be verified on its trigger
NOT_VERIFIED = {
    ("jax", "sqrt-of-negative"): (
        "the trigger is outside sqrt's domain: certify finds no gradient there, so the clamp "
        "(a stated value change) has no true gradient to be checked against"
    ),
    ("torch", "sqrt-of-negative"): (
        "the trigger is outside sqrt's domain: no difference quotient exists there to check "
        "the clamp against"
    ),
    ("torch", "var-of-constant"): (
        "the variance of one sample with ddof=1 is itself undefined (0 / 0): no true gradient "
        "for a fix to give"
    ),
}
# jit for every JAX entry; torch.compile (aot_eager) for these only: on this machine the first
# compile costs ~45 s and each further one ~4 s, and the fix machinery is the same per entry
COMPILED = ("sqrt-at-zero", "where-trap", "abs-at-zero")


def has_code_fix(entry) -> bool:
    return entry.id == "where-trap" or any(fx.rewrite for fx in entry.fixes)


def _cases():
    for backend, mod in (("jax", CJ), ("torch", CT)):
        for entry_id in _catalog.ids():
            if entry_id not in mod.TRIGGERS:
                continue
            yield pytest.param(backend, entry_id, "eager", id=f"{backend}-{entry_id}-eager")
            if backend == "jax":
                yield pytest.param(
                    backend, entry_id, "jit", id=f"jax-{entry_id}-jit", marks=pytest.mark.slow
                )
            elif entry_id in COMPILED:
                yield pytest.param(
                    backend, entry_id, "compile", id=f"torch-{entry_id}-compile",
                    marks=pytest.mark.slow,
                )  # fmt: skip


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


# ---- the catalog is covered ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_every_entry_is_covered(backend):
    mod = CJ if backend == "jax" else CT
    ids = set(_catalog.ids())
    assert set(mod.TRIGGERS) <= ids, set(mod.TRIGGERS) - ids
    skipped = {e for b, e in NO_TRIGGER if b == backend}
    assert skipped <= ids and not skipped & set(mod.TRIGGERS), skipped
    assert ids - set(mod.TRIGGERS) - skipped == set(), "entries without a trigger or a reason"
    for entry_id, (_, _, truth, _) in mod.TRIGGERS.items():
        entry = _catalog.get(entry_id)
        unverifiable = (backend, entry_id) in NOT_VERIFIED
        if has_code_fix(entry) and not unverifiable:
            assert truth is not None, f"{entry_id}: a code fix, but no true gradient to check"
        else:
            assert truth is None, f"{entry_id}: no code fix to check the truth with"
    for (_b, entry_id), why in {**NO_TRIGGER, **NOT_VERIFIED}.items():
        assert why.strip() and entry_id in ids, entry_id
    for _b, entry_id in NOT_VERIFIED:
        assert has_code_fix(_catalog.get(entry_id)), entry_id


# ---- each trigger ------------------------------------------------------------------------------


def _finding(report, entry_id):
    for f in report.findings:
        if f.catalog_id == entry_id or f.detail.get("zero_entry") == entry_id:
            return f
    raise AssertionError(f"{entry_id}: got {[f.catalog_id for f in report.findings]}\n{report}")


def _true(entry_id, truth, grad):
    if truth == "clarke":
        adm = _catalog.get(entry_id).admissible
        assert adm is not None and adm.contains(grad, tol=1e-5, sum_tol=1e-5), (entry_id, grad)
    else:
        np.testing.assert_allclose(grad, truth, rtol=1e-5, atol=1e-6)


def _same_value(a, b):
    if math.isnan(b):
        return
    assert a == pytest.approx(b, rel=1e-6, abs=1e-7)


def _run_jax(entry_id, mode, copy_of, tmp_path):
    path, mod = copy_of(CJ.__file__)
    fn0, point, truth, tool = CJ.TRIGGERS[entry_id]
    fn = getattr(mod, fn0.__name__)
    x = jnp.array(point)
    prog = jax.value_and_grad(fn)
    prog = jax.jit(prog) if mode == "jit" else prog
    report = (gsj.sanitize if tool == "sanitize" else gsj.explain)(prog)(x)
    f = _finding(report, entry_id)
    if f.where is None:  # an argument's NaN: named by the input, no line
        assert entry_id == "nonfinite-input" and f.detail.get("input"), str(report)
    else:
        assert f.where.line == line_of(str(path), f"L:{entry_id}"), str(report)
    if truth is None:
        return
    first = next(p for p in f.fixes if p.code is not None)
    assert first.status == "verified", str(report)
    assert f.suggestions[0].endswith("# verified: " + first.checked)
    text = report.patch()
    assert text.startswith(f"--- a/{path.name}\n+++ b/{path.name}\n"), text
    apply_patch(tmp_path, text, "git" if mode == "jit" else "gnu")
    fixed = load(str(path), f"_fixprog{next(_count)}")
    _KEEP.append(fixed)
    value, grad = jax.value_and_grad(getattr(fixed, fn0.__name__))(x)
    _true(entry_id, truth, np.asarray(grad))
    _same_value(float(value), float(fn(x)))


def _run_torch(entry_id, mode, copy_of, tmp_path, programs=None):
    path, mod = copy_of(CT.__file__)
    fn0, point, truth, tool, *rest = programs or CT.TRIGGERS[entry_id]
    marker = entry_id
    if rest:
        entry_id = rest[0]
    fn = getattr(mod, fn0.__name__)
    if mode == "compile":
        fn = torch.compile(fn, backend="aot_eager")
    x = torch.tensor(point, requires_grad=True)
    report = (gst.sanitize if tool == "sanitize" else gst.explain)(fn)(x)
    f = _finding(report, entry_id)
    assert f.where is not None and f.where.line == line_of(str(path), f"L:{marker}"), str(report)
    if truth is None:
        return
    first = next(p for p in f.fixes if p.code is not None)
    assert first.status == "verified", str(report)
    assert f.suggestions[0].endswith("# verified: " + first.checked)
    apply_patch(tmp_path, report.patch(), "git" if mode == "compile" else "gnu")
    fixed = load(str(path), f"_fixprog{next(_count)}")
    _KEEP.append(fixed)
    x2 = torch.tensor(point, requires_grad=True)
    loss = getattr(fixed, fn0.__name__)(x2)
    loss.backward()
    _true(entry_id, truth, x2.grad.numpy())
    _same_value(float(loss.detach()), float(fn0(torch.tensor(point))))


@pytest.mark.parametrize("backend, entry_id, mode", list(_cases()))
def test_trigger_reports_its_entry_and_its_verified_patch_gives_the_true_gradient(
    backend, entry_id, mode, copy_of, tmp_path
):
    if backend == "jax":
        _run_jax(entry_id, mode, copy_of, tmp_path)
    else:
        _run_torch(entry_id, mode, copy_of, tmp_path)


@pytest.mark.parametrize("marker", sorted(CT.EXTRA))
def test_torch_extra_programs(marker, copy_of, tmp_path):
    _run_torch(marker, "eager", copy_of, tmp_path, programs=CT.EXTRA[marker])


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
