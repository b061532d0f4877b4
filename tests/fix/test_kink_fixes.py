"""Sanitize's kink fixes are verified against the Clarke set the catalog knows (issue #13): the
fixed program keeps its value, its gradient at the kink lies between the original program's
one-sided gradients, and its outputs near the kink are the original's; a fix whose gradient
leaves that set is dropped."""

import jax
import jax.numpy as jnp
import torch

import gradsan.jax as gsj
import gradsan.torch as gst
from gradsan._fix import render_suggestions, verify_kinks
from tests.fix import kink_programs as K


def _kink(report, entry):
    [f] = [f for f in report.findings if f.catalog_id == entry]
    return f


def test_relu_fix_is_verified_in_the_clarke_set():
    rep = gsj.sanitize(jax.grad(K.relu_weighted))(jnp.array([0.0, 1.0]))
    f = _kink(rep, "relu-at-zero")
    p = f.fixes[0]
    assert p.status == "verified", str(rep)
    assert "in the Clarke set" in p.checked and "[0, 1]" in p.checked
    assert p.checked.startswith("same value")
    assert f.suggestions[0].endswith("# verified: " + p.checked)
    # relu's derivative s in [0, 1] at the kink: the first component is 2 s
    assert "+import gradsan.jax" in rep.patch()


def test_abs_fix_is_verified_and_the_gradient_is_the_safe_choice():
    rep = gsj.sanitize(jax.grad(K.abs_sum))(jnp.array([0.0, -2.0]))
    p = _kink(rep, "abs-at-zero").fixes[0]
    assert p.status == "verified", str(rep)
    assert "gradient [0, -1]" in p.checked


def test_a_fix_whose_gradient_leaves_the_clarke_set_is_dropped():
    rep = gsj.sanitize(jax.grad(K.abs_wrong))(jnp.array([0.0, 1.0]))
    f = _kink(rep, "abs-at-zero")
    assert f.fixes[0].status == "verified"
    # the same statement with a slope of 3 at 0 (|x| + 3 * (x - stop_gradient(x)) keeps the value)
    p = f.fixes[0]
    p.replacement = p.replacement.replace(
        "gradsan.jax.safe.abs(x)", "(jnp.abs(x) + 3.0 * (x - jax.lax.stop_gradient(x)))"
    )
    p.status, p.checked = "unverified", ""
    verify_kinks(rep, jax.grad(K.abs_wrong), (jnp.array([0.0, 1.0]),), {}, "jax")
    assert p.status == "failed", p.checked
    assert "outside the one-sided gradients" in p.checked
    assert all("3.0 * (x" not in s for s in render_suggestions(f.fixes))


def test_a_program_that_is_not_a_gradient_keeps_its_reason():
    rep = gsj.sanitize(K.abs_sum)(jnp.array([0.0, 1.0]))
    for f in rep.findings:
        for p in f.fixes:
            if p.code is not None:
                assert p.status == "unverified" and "jax.grad" in p.checked


def test_torch_sanitize_kink_fix_is_verified():
    x = torch.tensor([0.0, -2.0], requires_grad=True)
    rep = gst.sanitize(K.torch_abs)(x)
    p = _kink(rep, "abs-at-zero").fixes[0]
    assert p.status == "verified", str(rep)
    assert "in the Clarke set" in p.checked and "gradient [0, -1]" in p.checked
