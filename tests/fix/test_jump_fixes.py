"""At a point where the original function has no gradient (a where that jumps at 0, x log x at
0), both backends treat a fix the same way: gradsan applies it and runs it; it is printed "not
verified" with what was checked (the value, nearby points) and that the fixed gradient is a
convention there, never dropped as failed by one backend and printed by the other. The xlogy
double where guards the log's argument (xlogy(x, 0) is -inf for x != 0), verified by running
it."""

import jax
import jax.numpy as jnp
import numpy as np
import torch

import gradsan.jax as gsj
import gradsan.torch as gst
from gradsan._fix import _verify

MASK = jnp.array([False, True])
TMASK = torch.tensor([False, True])


def jax_jump(x):
    y = jnp.where(x > 0, 1.0 / x, 0.0)
    return y.sum()


def torch_jump(x):
    y = torch.where(x > 0, 1.0 / x, 0.0)
    return y.sum()


def jax_xlogx(x):
    y = jax.scipy.special.xlogy(x, x)
    return y.sum()


def torch_xlogx(x):
    y = torch.xlogy(x, x)
    return y.sum()


def jax_masked2(x, y):
    return jnp.sum(jnp.where(MASK, jax.scipy.special.xlogy(x, y), 0.0))


def torch_masked2(x, y):
    return torch.where(TMASK, torch.xlogy(x, y), 0.0).sum()


def _both(jfun, tfun, point):
    j = gsj.explain(jax.grad(jfun))(jnp.array(point))
    t = gst.explain(tfun)(torch.tensor(point, requires_grad=True))
    return j, t


def _code_fixes(report):
    (f,) = [f for f in report.findings if f.kind == "nonfinite"]
    return f, [p for p in f.fixes if p.code]


def _same_treatment(j, t, want):
    fj, pj = _code_fixes(j)
    ft, pt = _code_fixes(t)
    assert len(pj) == len(pt) == want, (pj, pt)
    for p in [*pj, *pt]:
        # ran, printed, and says why it is not verified: no true gradient at the point
        assert p.status == "unverified", (p.status, p.checked)
        assert "no gradient" in p.checked and "is a convention" in p.checked, p.checked
        assert "checked: same value" in p.checked, p.checked
    for f in (fj, ft):
        text = "\n".join(f.suggestions)
        assert text.count("# not verified:") == want and "# verified" not in text, text


def test_a_where_jump_gets_the_same_fixes_in_both_backends():
    j, t = _both(jax_jump, torch_jump, [0.0, 2.0])
    _same_treatment(j, t, 2)
    for r in (j, t):
        _, ps = _code_fixes(r)
        # the fixed gradient at the point: 0 where the where selects 0, -1/x**2 = -0.25 at 2
        assert all("the fixed gradient [0, -0.25] is a convention" in p.checked for p in ps)
        assert any("where(x > 0, x, 1.0)" in p.replacement for p in ps)  # the double where
        assert any("safe.div(1.0, x)" in p.replacement for p in ps)


def test_bare_xlogy_at_zero_gets_the_same_fix_in_both_backends():
    j, t = _both(jax_xlogx, torch_xlogx, [0.0, 2.0])
    _same_treatment(j, t, 1)
    for r in (j, t):
        (_, (p,)) = _code_fixes(r)
        assert "safe.xlogy(x, x)" in p.replacement
        # log(2) + 1 at 2; the 0 at 0 is safe.xlogy's convention (the true slope is -inf)
        assert "the fixed gradient [0, 1.69315] is a convention" in p.checked, p.checked


def test_torch_differencing_tells_a_jump_from_a_disagreement():
    from gradsan._fix._verify_torch import NO_LIMIT, _TorchProgram

    x = torch.tensor([0.0, 2.0], requires_grad=True)
    prog = _TorchProgram(torch_jump, (x,), {})
    assert prog.central([np.array([0.0, -0.25])]) == NO_LIMIT
    smooth = _TorchProgram(
        lambda x: (x**2).sum(), (torch.tensor([1.0, 2.0], requires_grad=True),), {}
    )
    assert smooth.central([np.array([2.0, 4.0])]) == "central differences"
    assert smooth.central([np.array([2.0, 5.0])]) is False  # a wrong gradient still fails


def test_the_words_are_shared():
    assert _verify.convention("X finds no gradient", "the fixed gradient [0]", []) == (
        "X finds no gradient; the fixed gradient [0] is a convention"
    )
    assert (
        _verify.convention("X", "G", ["same value"]) == "X; G is a convention; checked: same value"
    )


def test_the_xlogy_double_where_guards_the_log_argument_and_runs():
    j = gsj.explain(jax.grad(jax_masked2, argnums=(0, 1)))(
        jnp.array([1.0, 1.0]), jnp.array([0.0, 1.0])
    )
    t = gst.explain(torch_masked2)(
        torch.tensor([1.0, 1.0], requires_grad=True), torch.tensor([0.0, 1.0], requires_grad=True)
    )
    for r, want in (
        (j, "jax.scipy.special.xlogy(x, jnp.where(MASK, y, 1.0))"),
        (t, "torch.xlogy(x, torch.where(TMASK, y, 1.0))"),
    ):
        f = r.findings[0]
        dw = [
            p
            for p in f.fixes
            if p.code and "where(" in p.replacement and "safe" not in p.replacement
        ]
        assert dw and want in dw[0].replacement, [p.replacement for p in f.fixes]
        assert dw[0].status == "verified", (dw[0].status, dw[0].checked)
        assert "same value" in dw[0].checked
        assert f.suggestions[0].startswith("Double where") and want in f.suggestions[0]
