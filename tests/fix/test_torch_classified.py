"""torch findings that were located but had no catalog entry (so no words and no fix): each now
names its entry, and where the entry has a code fix it is verified on the program."""

import torch

import gradsan.torch as gst

MASK = torch.tensor([False, True])


def reciprocal_masked(x):
    loss = torch.where(MASK, 1.0 / x, 0.0).sum()  # 1.0 / x is aten.reciprocal
    loss.backward()
    return loss


def _nonfinite(report):
    found = [f for f in report.findings if f.kind == "nonfinite"]
    assert found, str(report)
    return found


def test_reciprocal_is_a_division_by_zero_with_a_verified_fix():
    x = torch.tensor([0.0, 0.5], requires_grad=True)
    report = gst.explain(reciprocal_masked)(x)
    (f,) = _nonfinite(report)
    assert f.catalog_id == "div-by-zero", str(report)
    assert f.explanation
    verified = [p for p in f.fixes if p.status == "verified"]
    assert any("safe.div(1.0, x)" in p.replacement for p in verified), str(report)
    assert "gradsan catalog div-by-zero" in str(report)


def lse_masked(x):
    z = torch.where(torch.tensor([False, False]), x, -torch.inf)  # the -inf comes in here
    loss = torch.logsumexp(z, 0)  # and is born a finding here: log(0), as JAX says
    loss.backward()
    return loss


def test_logsumexp_of_a_masked_row_is_born_at_the_logsumexp_as_in_jax():
    import jax
    import jax.numpy as jnp

    import gradsan.jax as gsj

    def jax_lse(x):
        z = jnp.where(jnp.array([False, False]), x, -jnp.inf)
        return jax.nn.logsumexp(z)

    jf = _nonfinite(gsj.explain(jax_lse)(jnp.array([0.0, 1.0])))[0]
    report = gst.explain(lse_masked)(torch.tensor([0.0, 1.0], requires_grad=True))
    (tf,) = _nonfinite(report)
    assert tf.catalog_id == jf.catalog_id == "logsumexp-all-neg-inf", str(report)
    assert "torch.logsumexp(z, 0)" in tf.where.code and tf.primitive == "logsumexp"
    assert "where" not in tf.title.lower()


def half_square(x):
    y = x.half() * 300.0  # finite: -6000 in float16
    loss = (y * y).sum()  # finite value; its gradient 2 * y * 300 = -3.6e6 is not
    loss.backward()
    return loss


def test_float16_overflow_in_the_backward_is_classified_as_in_jax():
    import jax
    import jax.numpy as jnp

    import gradsan.jax as gsj

    def jax_half_square(x):
        y = x.astype(jnp.float16) * 300.0
        return jnp.sum(y * y)

    jr = gsj.explain(jax.value_and_grad(jax_half_square))(jnp.array([0.0, -20.0]))
    report = gst.explain(half_square)(torch.tensor([0.0, -20.0], requires_grad=True))
    jgrad = [f for f in _nonfinite(jr) if f.phase == "gradient"]
    tgrad = [f for f in _nonfinite(report) if f.phase == "gradient"]
    assert jgrad and tgrad, str(report)
    assert jgrad[0].catalog_id == tgrad[0].catalog_id == "float16-overflow", str(report)
    assert tgrad[0].where.code.strip().startswith("y = x.half() * 300.0")
    assert "65504" in tgrad[0].explanation
