"""The demo gallery: every case is diagnosed, and its fix gives the true gradient."""

import jax
import numpy as np
import pytest

import gradsan.jax as gsj
from gradsan import _demo
from gradsan._demo import case as demo_cases


@pytest.mark.parametrize("name", sorted(demo_cases.CASES))
def test_case_is_diagnosed_and_fixed(name):
    case = demo_cases.CASES[name]()
    report = gsj.explain(case.grad)(*case.args)
    assert not report.ok and report.findings[0].where.file == demo_cases.__file__
    fixed = case.fixed(*case.args)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(fixed))
    if callable(case.truth):
        for got, want in zip(
            jax.tree_util.tree_leaves(fixed), jax.tree_util.tree_leaves(case.truth(*case.args))
        ):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_nansafe_repairs_the_structural_cases_and_certifies_or_refuses_the_numerical_ones():
    for name, structural in (
        ("zygote-sqrt", True),
        ("where-trap", True),
        ("abs-vs-norm", False),
        ("flux-normalise", False),
    ):
        case = demo_cases.CASES[name]()
        out, report = gsj.nansafe(case.grad, report=True)(*case.args)
        finite = all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(out))
        if structural:
            assert finite, name
        if not finite:  # never a silent wrong number: left non-finite and reported
            assert report.by_kind("unresolved"), name
            continue
        if not structural:  # certified by the limit engine, and labelled so
            assert any(
                f.detail.get("rule", "").startswith("limit engine")
                for f in report.by_kind("resolved")
            ), name
        if callable(case.truth):
            for a, b in zip(
                jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(case.truth(*case.args))
            ):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_demo_command_prints_a_summary(capsys):
    assert _demo.main(["zygote-sqrt"]) == 0
    out = capsys.readouterr().out
    assert "true gradient       4.94376" in out and "gradsan.jax.nansafe 4.94376" in out
    assert "zygote-sqrt" in out.split("Summary")[1]
    assert _demo.main(["no-such-case"]) == 2
