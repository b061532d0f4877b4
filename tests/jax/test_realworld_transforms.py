"""gradsan on vmap, remat and loops of real programs (tests/jax/realworld_loops.py, each from a
public report): the transformation around ``jax.grad`` is not mistaken for ``jax.grad`` itself."""

import jax
import numpy as np
import pytest

import gradsan
import gradsan.jax as gsj
from gradsan.jax import _compat
from tests.conftest import line_of

from . import realworld_loops as rl


def test_grad_info_does_not_look_through_vmap():
    # vmap(grad(f)) is a batch of gradients, not grad(f) of the whole batch
    g = jax.grad(rl.spring_energy)
    assert _compat.grad_info(g) is not None
    assert _compat.grad_info(jax.jit(g)) is not None  # jit computes the same function
    for t in (jax.vmap(g), jax.jacfwd(g), jax.jacrev(g), jax.hessian(rl.spring_energy)):
        assert _compat.grad_info(t) is None


def test_certify_of_per_example_gradients_is_refused_not_wrong():
    # it used to certify grad(f) of the whole batch: rows 0 and 2 (smooth points) came back
    # as [0.667, 1.333] and [1.333, 0] where the gradient is [0.553, 1.106] and [1, 0]
    fun, args = rl.make_per_example()
    with pytest.raises(gradsan.UsageError, match="scalar loss or jax.grad"):
        gsj.certify(fun)(*args)


def test_explain_per_example_norm_does_not_reject_a_fix_against_a_wrong_limit():
    fun, args = rl.make_per_example()
    report = gsj.explain(fun)(*args)
    [f] = report.findings
    assert f.catalog_id == "norm-at-zero" and f.library == "jnp.linalg.norm"
    assert (f.where.function, f.where.line) == (
        "spring_energy",
        line_of(rl.__file__, "L:spring-norm"),
    )
    assert f.index == (1,)  # the row whose point sits on its anchor
    for p in f.fixes:
        assert "certified limit" not in p.checked


LOOPS = rl.__file__


def _paste(fix):
    """The program file with the printed fix pasted in (and ``import gradsan.jax`` at the top
    when the fix names it), as a module of its own: what a user runs after reading the report."""
    import types

    with open(fix.file) as fh:
        text = fh.read()
    lines = text.splitlines(keepends=True)
    start = sum(len(s) for s in lines[: fix.start_line - 1]) + fix.start_col
    end = sum(len(s) for s in lines[: fix.end_line - 1]) + fix.end_col
    assert text[start:end] == fix.original
    new = text[:start] + fix.replacement + text[end:]
    if fix.needs_import:
        new = f"import {fix.needs_import}\n" + new
    mod = types.ModuleType("pasted_realworld_loops")
    mod.__file__ = fix.file
    exec(compile(new, fix.file, "exec"), mod.__dict__)
    return mod


def _verified(report, catalog_id):
    [f] = [f for f in report.findings if f.catalog_id == catalog_id]
    fixes = [p for p in f.fixes if p.status == "verified"]
    assert fixes, [(p.status, p.checked) for p in f.fixes]
    return f, fixes[0]


def test_masked_rnn_mean_over_an_empty_sequence_fix_pasted():
    fun, args = rl.make_rnn()
    report = gsj.explain(fun)(*args)
    f, fix = _verified(report, "div-by-zero")
    assert (f.where.line, f.where.function) == (line_of(LOOPS, "L:rnn-div"), "rnn_loss")
    assert "gradsan.jax.safe.div" in fix.code
    fixed = _paste(fix)
    g = fixed.make_rnn()[0](*args)
    assert np.isfinite(g)
    # the loss is unchanged (the empty sequence is dropped by the where)
    assert fixed.rnn_loss(*args) == rl.rnn_loss(*args)
    # the gradient of the valid sequences: w only reaches them
    w, xs, lengths = args
    np.testing.assert_allclose(g, jax.grad(rl.rnn_loss)(w, xs[:, :2], lengths[:2]), rtol=1e-6)


def test_angular_loss_arccos_fix_pasted():
    fun, args = rl.make_arccos()
    report = gsj.explain(fun)(*args)
    f, fix = _verified(report, "acos-at-one")
    assert (f.where.line, f.where.function) == (line_of(LOOPS, "L:arccos"), "angular_loss")
    fixed = _paste(fix)
    g = fixed.make_arccos()[0](*args)
    assert np.all(np.isfinite(g))
    assert fixed.angular_loss(*args) == rl.angular_loss(*args)


def test_custom_vjp_logsumexp_names_the_backward_rule():
    fun, args = rl.make_custom_vjp()
    report = gsj.explain(fun)(*args)
    f = report.findings[0]
    assert f.catalog_id == "logsumexp-all-neg-inf" and f.form == "inf-inf"
    # the -inf - (-inf) happens in the user's bwd rule, not at the call of lse
    assert (f.met_where.line, f.met_where.function) == (line_of(LOOPS, "L:lse-bwd"), "_lse_bwd")


def test_fori_loop_drain_sqrt_at_empty_tank():
    fun, args = rl.make_drain()
    report = gsj.explain(fun)(*args)
    [f] = report.findings
    assert f.catalog_id == "sqrt-at-zero" and f.primitive == "sqrt"
    assert (f.where.line, f.where.function) == (line_of(LOOPS, "L:drain-sqrt"), "body")
    # the loop body is a closure: gradsan cannot run a fix there and says so
    assert all(p.status in ("unverified", "prose") for p in f.fixes)


def test_vmapped_gaussian_nll_softplus_overflow():
    fun, args = rl.make_nll()
    report = gsj.explain(fun)(*args)
    [f] = report.findings
    assert f.catalog_id == "exp-overflow"
    assert (f.where.line, f.where.function) == (line_of(LOOPS, "L:nll-softplus"), "gaussian_nll")
    assert f.index == (1,)  # the element with the raw scale of 120


def test_beta_logpdf_at_the_boundary():
    fun, args = rl.make_beta()
    report = gsj.explain(fun)(*args)
    f = report.findings[0]
    assert f.catalog_id == "log-at-zero"
    assert (f.where.line, f.where.function) == (line_of(LOOPS, "L:beta"), "beta_logpdf")
    assert not any(p.status == "verified" for p in f.fixes)


@pytest.mark.slow
def test_programs_jax_now_handles_are_reported_clean():
    # jax-ml/jax#6811's HMM, #23842's masked logsumexp and a fully masked attention row under
    # remat: this JAX returns finite gradients, and gradsan says nothing about them
    for make in (
        rl.make_hmm,
        rl.make_masked_lse,
        rl.make_remat_attn,
        rl.make_smooth_scan,
        rl.make_smooth_lse,
    ):
        fun, args = make()
        report = gsj.sanitize(fun)(*args)
        assert report.ok and not report.findings, (make.__name__, repr(report))
