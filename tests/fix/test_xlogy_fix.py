"""safe.xlogy(x, x) as a fix: offered and verified where the element at 0 is masked out (its
gradient there is then the true 0), never verified where x * log(x) is differentiated at 0
itself (the true one-sided derivative is -inf; safe.xlogy's 0 would be a wrong slope)."""

import jax
import jax.numpy as jnp
import torch

import gradsan.jax as gsj
import gradsan.torch as gst

MASK = jnp.array([False, True])
TMASK = torch.tensor([False, True])


def jax_masked(x):
    return jnp.sum(jnp.where(MASK, jax.scipy.special.xlogy(x, x), 0.0))


def jax_bare(x):
    return jnp.sum(jax.scipy.special.xlogy(x, x))


def torch_masked(x):
    loss = torch.where(TMASK, torch.xlogy(x, x), 0.0).sum()
    loss.backward()
    return loss


def torch_bare(x):
    loss = torch.xlogy(x, x).sum()
    loss.backward()
    return loss


def _fix(report):
    found = [f for f in report.findings if f.kind == "nonfinite"]
    assert found and all(f.catalog_id == "xlogy-at-zero" for f in found), str(report)
    return found[0]


def _safe_xlogy(f):
    return [p for p in f.fixes if p.code and "safe.xlogy(x, x)" in p.replacement]


def test_offered_and_verified_under_a_mask():
    for report in (
        gsj.explain(jax.grad(jax_masked))(jnp.array([0.0, 1.0])),
        gst.explain(torch_masked)(torch.tensor([0.0, 1.0], requires_grad=True)),
    ):
        f = _fix(report)
        # the where's double where comes first (it guards the log's argument), then safe.xlogy:
        # both printed, both verified
        printed = [p for p in f.fixes if p.status != "failed"]
        dw, safe = printed[0], _safe_xlogy(f)[0]
        assert "xlogy(x, " in dw.replacement and "where(" in dw.replacement.split("xlogy(x, ")[1]
        for p in (dw, safe):
            assert p.status == "verified" and "gradient [0, 1]" in p.checked, str(report)


def test_never_verified_where_the_slope_is_minus_inf():
    for report in (
        gsj.explain(jax.grad(jax_bare))(jnp.array([0.0, 1.0])),
        gst.explain(torch_bare)(torch.tensor([0.0, 1.0], requires_grad=True)),
    ):
        f = _fix(report)
        assert not [p for p in _safe_xlogy(f) if p.status == "verified"], str(report)
        assert "# verified" not in "\n".join(f.suggestions)
