"""gradsan on equinox, flax linen/NNX and optax training code (tests/jax/realworld_nets.py, each
program from a public report), called as their users call them."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from tests.conftest import line_of

from . import realworld_nets as rn

NETS = rn.__file__


@pytest.mark.slow
def test_equinox_module_with_python_fields_is_explained_like_filter_jit_runs_it():
    # eqx.nn.MultiheadAttention holds a Dropout whose p (a float) and inference (a bool) are
    # pytree leaves; equinox keeps them static. explain used to trace them and fail with
    # "uses the value of a traced array in Python control flow".
    fun, args = rn.make_eqx_attn()
    report = gsj.explain(fun)(*args)
    assert report.ok and not report.findings
    ref = fun(*args)
    for a, b in zip(jax.tree.leaves(report.outputs), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(a, b)


def test_equinox_python_float_field_stays_a_python_float_inside():
    seen = []

    class Scaled(eqx.Module):
        w: jax.Array
        scale: float
        training: bool

        def __call__(self, x):
            seen.append(type(self.scale))
            if self.training:  # Python control flow on a static field, as equinox allows
                x = x * 2.0
            return jnp.sum(self.w * x) * self.scale

    m = Scaled(jnp.ones(2), 0.5, True)
    report = gsj.explain(eqx.filter_grad(lambda m, x: jnp.log(m(x))))(m, jnp.zeros(2))
    [f] = report.findings
    assert f.catalog_id == "log-at-zero"
    assert float in seen


def _one(report, catalog_id):
    hits = [f for f in report.findings if f.catalog_id == catalog_id]
    assert hits, repr(report)
    return hits[0]


def _at(f, marker, function):
    assert f.where.file == NETS, f.where
    assert (f.where.line, f.where.function) == (line_of(NETS, marker), function)


@pytest.mark.slow
def test_flax_linen_mnist_log_of_softmax():
    fun, args = rn.make_mnist_grad()
    report = gsj.explain(fun)(*args)
    f = _one(report, "log-at-zero")
    _at(f, "L:mnist-log", "mnist_loss")
    assert f.primitive == "log" and f.phase == "gradient" and f.form == "0*nan"
    assert f.zero_from.line == line_of(NETS, "L:mnist-log")  # the softmax that underflowed
    assert f.count > 0 and f.values.startswith("log got 0.0")
    # the forward value is -inf there: no fix is printed as verified
    assert not any(p.status == "verified" for p in f.fixes)


@pytest.mark.slow
def test_equinox_soft_margin_exp_overflow():
    fun, args = rn.make_eqx_grad()
    report = gsj.explain(fun)(*args)
    [f] = report.findings
    assert f.catalog_id == "exp-overflow" and f.primitive == "exp"
    _at(f, "L:eqx-softplus", "eqx_soft_margin_grad")
    assert any("mlp.layers" in o.path for o in f.outputs)


def test_equinox_optax_step_std_of_a_padding_row():
    fun, args = rn.make_eqx_step()
    report = gsj.explain(fun)(*args)
    f = _one(report, "std-of-constant")
    _at(f, "L:eqx-std", "__call__")
    assert f.library == "jnp.std" and f.primitive == "sqrt"
    paths = {o.path for o in f.outputs}
    assert "output[0].lin1.weight" in paths  # the updated model, through adamw
    assert any(".mu.lin1" in p for p in paths)  # and adamw's moments
    # gradsan.jax.safe.std would fix it, but the model's __call__ is a method of the class the
    # arguments already hold: a fix that could not be run is never printed as verified
    assert not any(p.status == "verified" for p in f.fixes)


@pytest.mark.slow
def test_wmt_weighted_cross_entropy_of_an_all_padding_batch():
    fun, args = rn.make_wmt_grad()
    report = gsj.explain(fun)(*args)
    phases = sorted(f.phase for f in report.findings if f.catalog_id == "div-by-zero")
    assert phases == ["gradient", "value"]
    for f in report.findings:
        _at(f, "L:wmt-div", "weighted_xent")


@pytest.mark.slow
def test_normalized_gd_norm_of_a_zero_gradient():
    fun, args = rn.make_ngd_grad()
    report = gsj.explain(fun)(*args)
    f = _one(report, "div-by-zero")
    _at(f, "L:ngd-div", "normalized_gd_loss")
    assert not any(p.status == "verified" for p in f.fixes)  # safe.div leaves it NaN


def test_smooth_flax_and_equinox_code_has_no_flags():
    for make in (rn.make_linen_smooth, rn.make_eqx_attn):
        fun, args = make()
        report = gsj.sanitize(fun)(*args)
        assert report.ok and not report.findings, repr(report)


@pytest.mark.slow
def test_flax_train_step_with_a_typed_prng_key_is_explained():
    # explain(mnist_step)(params, opt_state, x, y, jax.random.key(1)) raised TypeError: JAX
    # array with PRNGKey dtype cannot be converted to a NumPy array (_fix/_verify moved every
    # leaf of the arguments with np.asarray, the key too)
    fun, args = rn.make_mnist_step()
    report = gsj.explain(fun)(*args)
    assert _one(report, "log-at-zero").where.line == line_of(NETS, "L:mnist-log")


def test_nnx_step_that_writes_nan_weights_is_not_reported_clean():
    # nnx_step returns a finite loss and writes NaN into the model and adam's moments in place;
    # explain used to say "no findings: every output is finite"
    fun, args = rn.make_nnx_step()
    report = gsj.explain(fun)(*args)
    assert np.isfinite(report.outputs)  # what the step returned
    f = _one(report, "norm-at-zero")
    _at(f, "L:nnx-norm", "nnx_contrastive_loss")
    paths = {o.path for o in f.outputs}
    assert "model.lin.kernel.value (after the call)" in paths
    assert any(p.startswith("optimizer.opt_state") for p in paths)


def test_nnx_step_on_a_clean_batch_is_clean():
    fun, args = rn.make_nnx_step(bad=False)
    report = gsj.explain(fun)(*args)
    assert report.ok and not report.findings


def test_explain_of_an_nnx_step_updates_the_users_model_once():
    fun, (model, opt, a, b) = rn.make_nnx_step()
    gsj.explain(fun)(model, opt, a, b)
    assert int(opt.step[...]) == 1  # the user's call, and no other


def test_guard_stops_at_the_nnx_step_that_wrote_nan_weights():
    from flax import nnx

    import gradsan

    fun, (model, opt, a, b) = rn.make_nnx_step()
    before = jax.tree_util.tree_leaves(nnx.state((model, opt)))
    with pytest.raises(gradsan.NonFiniteError) as ei:
        gsj.guard(fun)(model, opt, a, b)
    report = ei.value.report
    assert report.findings and report.findings[0].where is not None, report
    assert any("(after the call)" in o.path for f in report.findings for o in f.outputs)
    assert any("was undone" in n for n in report.notes)
    after = jax.tree_util.tree_leaves(nnx.state((model, opt)))
    assert all(x is y or bool((x == y).all()) for x, y in zip(before, after))  # no update
    # a clean batch: the same guard passes and the update happens
    clean, (m2, o2, a2, b2) = rn.make_nnx_step(bad=False)
    gsj.guard(clean)(m2, o2, a2, b2)
    assert int(o2.step[...]) == 1
    # under nnx.jit the same: stopped, the update undone
    fun, (model, opt, a, b) = rn.make_nnx_step()
    with pytest.raises(gradsan.NonFiniteError) as ei:
        gsj.guard(nnx.jit(fun))(model, opt, a, b)
    assert int(opt.step[...]) == 0 and "(after the call)" in str(ei.value.report)


def test_guard_on_an_equinox_optax_loop_stops_at_the_padded_batch():
    import gradsan

    step = gsj.guard(rn.eqx_step)
    _, (model, opt_state, x, y) = rn.make_eqx_step(bad=False)
    _, (_, _, x_bad, _) = rn.make_eqx_step(bad=True)
    for i, xb in enumerate([x, x, x_bad, x]):
        ref = rn.eqx_step(model, opt_state, xb, y)
        if i == 2:
            with pytest.raises(gradsan.NonFiniteError) as info:
                step(model, opt_state, xb, y)
            f = _one(info.value.report, "std-of-constant")
            _at(f, "L:eqx-std", "__call__")
            return
        out = step(model, opt_state, xb, y)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
            np.testing.assert_array_equal(a, b)  # a clean step's outputs are the same
        model, opt_state, _ = out
    raise AssertionError("guard did not stop")


@pytest.mark.slow
def test_flax_vae_hand_written_bce_of_a_saturated_sigmoid():
    fun, args = rn.make_vae_grad()
    report = gsj.explain(fun)(*args)
    f = _one(report, "log-at-zero")
    _at(f, "L:vae-bce", "vae_loss")
    assert f.phase == "gradient" and f.primitive == "log"
    # log(1 - recon) at recon == 1.0: the forward value is inf, no fix is called verified
    assert not any(p.status == "verified" for p in f.fixes)
