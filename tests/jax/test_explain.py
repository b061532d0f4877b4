"""gradsan.jax.explain on the seed threads and nested programs: ids, exact lines, values."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan
import gradsan.jax as gsj
from tests.conftest import line_of

HERE = os.path.abspath(__file__)
A0 = jnp.array([[1.0, 0.0], [0.0, 3.0]])


def zygote_loss(theta):
    A = A0**theta  # L:zy-pow
    A = jnp.sqrt(A)  # L:zy-sqrt
    return jnp.sqrt(jnp.sum((A - A0) ** 2))  # L:zy-loss


def test_zygote_seed(maybe_jit):
    report = gsj.explain(maybe_jit(jax.grad(zygote_loss)))(4.0)
    assert not report.ok
    [f] = report.findings
    assert f.kind == "nonfinite" and f.catalog_id == "sqrt-at-zero"
    assert f.primitive == "sqrt" and f.phase == "gradient" and f.result == "nan"
    assert f.where.file == HERE and f.where.line == line_of("L:zy-sqrt")
    assert f.where.function == "zygote_loss"
    assert f.where.code.strip().startswith("A = jnp.sqrt(A)")
    assert (f.where.column, f.where.end_column) == (8, 19)
    assert f.zero_from.line == line_of("L:zy-loss") and f.form == "0*inf"
    assert (f.count, f.size, f.index) == (2, 4, (0, 1))
    assert f.values == "sqrt got 0.0 in 2 of 4 elements, first at [0, 1]"
    assert [(o.path, o.count, o.size) for o in f.outputs] == [("theta", 1, 1)]
    assert np.isnan(report.outputs)
    text = str(report)
    assert "NaN in the gradient for `theta`: sqrt at" in text
    assert "gradsan.jax.safe.sqrt" in text and "Details: gradsan catalog sqrt-at-zero" in text


def test_report_json_has_the_same_content():
    import json

    report = gsj.explain(jax.grad(zygote_loss))(4.0)
    d = json.loads(report.to_json())
    assert d["ok"] is False
    [f] = d["findings"]
    assert f["catalog_id"] == "sqrt-at-zero" and f["where"]["line"] == line_of("L:zy-sqrt")
    assert f["zero_from"]["line"] == line_of("L:zy-loss") and f["index"] == [0, 1]


def abs_vs_norm(x, y):
    return jnp.linalg.norm(x - y)  # L:norm


def test_norm_of_zero_vector_names_the_user_line_and_library(maybe_jit):
    report = gsj.explain(maybe_jit(jax.grad(abs_vs_norm, argnums=(0, 1))))(
        jnp.zeros(3), jnp.zeros(3)
    )
    [f] = report.findings
    assert f.where.line == line_of("L:norm") and f.where.file == HERE
    assert f.library == "jnp.linalg.norm" and f.primitive == "sqrt"
    assert f.catalog_id == ("norm-at-zero" if "norm-at-zero" in gradsan.catalog.ids() else "sqrt-at-zero")
    assert sorted(o.path for o in f.outputs) == ["x", "y"] or len(f.outputs) == 2


def flux_normalise(x):
    z = (x - jnp.mean(x, axis=0)) / (jnp.std(x, axis=0) + 1e-5)  # L:flux
    return jnp.sum(jnp.sin(z))


def test_flux_std_of_constant_data(maybe_jit):
    report = gsj.explain(maybe_jit(jax.grad(flux_normalise)))(jnp.ones((3, 3)))
    assert not report.ok
    [f] = report.findings
    assert f.where.line == line_of("L:flux") and f.library == "jnp.std"
    assert f.primitive == "sqrt"
    assert f.outputs[0].path == "x" and f.outputs[0].count == 9


def where_trap(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))  # L:where


def test_where_trap(maybe_jit):
    report = gsj.explain(maybe_jit(jax.grad(where_trap)))(jnp.array([0.0, 1.0]))
    [f] = report.findings
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of("L:where")
    assert f.index == (0,) and f.count == 1
    assert f.outputs[0].count == 1


def scan_loss(x):
    def body(c, xi):
        return c + jnp.sqrt(xi * c), None  # L:scan

    c, _ = jax.lax.scan(body, x, jnp.array([1.0, 1.0, 0.0, 1.0]))
    return c


def test_scan_iteration(maybe_jit):
    [f] = gsj.explain(maybe_jit(jax.grad(scan_loss)))(1.0).findings
    assert f.where.line == line_of("L:scan") and f.catalog_id == "sqrt-at-zero"
    assert "scan iteration 2 (of 4)" in f.context


def cond_loss(x):
    return jax.lax.cond(x > -1, lambda x: jnp.log(x), lambda x: x, x)  # L:cond


def test_cond_branch(maybe_jit):
    [f] = gsj.explain(maybe_jit(jax.grad(cond_loss)))(0.0).findings
    assert f.where.line == line_of("L:cond") and f.primitive == "log"
    assert f.catalog_id == "log-at-zero" and "cond branch 1" in f.context


def test_remat_and_vmap():
    def f(x):
        return jnp.sqrt(x) * jnp.sqrt(x)  # L:remat

    # both square roots are origins: two findings on the same line, different columns
    g1, g2 = gsj.explain(jax.grad(jax.checkpoint(f)))(0.0).findings
    assert g1.where.line == g2.where.line == line_of("L:remat") and g1.primitive == "sqrt"
    assert {g1.where.column, g2.where.column} == {15, 29}

    def rows(X):
        return jnp.sum(jax.vmap(lambda r: jnp.sqrt(jnp.sum(r * r)))(X))  # L:vmap

    [g] = gsj.explain(jax.grad(rows))(jnp.array([[1.0, 2.0], [0.0, 0.0]])).findings
    assert g.where.line == line_of("L:vmap") and g.index == (1,)


def test_while_iteration():
    def w(x):
        return jax.lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + jnp.log(c[0] - 2.0)), (0, x)  # L:while
        )[1]

    [f] = gsj.explain(w)(1.0).findings  # log(-2) at iteration 0, log(-1) at 1: one finding
    assert f.where.line == line_of("L:while") and f.phase == "value"
    assert "while iteration 0" in f.context


def test_value_and_grad_with_aux_names_both_outputs():
    def loss(x):
        return jnp.log(x), {"aux": x}  # L:vag

    report = gsj.explain(jax.value_and_grad(loss, has_aux=True))(0.0)
    phases = {f.phase for f in report.findings}
    assert phases == {"value", "gradient"}
    assert all(f.where.line == line_of("L:vag") for f in report.findings)
    outs = [(o.path, o.kind) for f in report.findings for o in f.outputs]
    assert ("x", "grad") in outs and ("value", "value") in outs


def test_nan_already_in_the_input_is_not_blamed_on_an_op(maybe_jit):
    report = gsj.explain(maybe_jit(jax.grad(lambda x: jnp.sum(x**2))))(jnp.array([1.0, jnp.nan]))
    [f] = report.findings
    assert f.catalog_id == "nonfinite-input" and f.where is None
    assert "`x` holds nan in 1 of 2 elements, first at [1]" in f.values


def test_var_nan_constant_is_not_blamed():
    # jnp.var carries a NaN constant (where(dof > 0, var, nan)); a finite program stays clean.
    report = gsj.explain(jax.grad(lambda x: jnp.var(x) + jnp.std(x + jnp.arange(3.0))))(jnp.ones(3))
    assert report.ok and report.findings == []


def test_finite_program_outputs_are_bit_identical(maybe_jit):
    f = maybe_jit(jax.grad(lambda x: jnp.sum(jnp.tanh(x) ** 2)))
    x = jnp.linspace(-1, 1, 7)
    report = gsj.explain(f)(x)
    assert report.ok
    np.testing.assert_array_equal(np.asarray(report.outputs).view(np.uint32),
                                  np.asarray(f(x)).view(np.uint32))


def test_inf_minus_inf():
    def f(x):
        return jnp.log(x) - jnp.log(2 * x)  # L:infinf

    [f1, *rest] = gsj.explain(jax.grad(f))(0.0).findings
    assert f1.where.line == line_of("L:infinf") and f1.form == "inf-inf" and f1.zero_from is None


def test_optax_train_step_jitted():
    optax = pytest.importorskip("optax")
    opt = optax.adam(1e-3)

    def loss(params, x):
        d = x - params["c"]
        return jnp.sum(jnp.sqrt(jnp.sum(d * d, axis=-1)))  # L:optax

    @jax.jit
    def step(params, state, x):
        g = jax.grad(loss)(params, x)
        updates, state = opt.update(g, state, params)
        return optax.apply_updates(params, updates), state

    params = {"c": jnp.zeros(2)}
    report = gsj.explain(step)(params, opt.init(params), jnp.zeros((4, 2)))
    [f] = report.findings
    assert f.where.line == line_of("L:optax") and f.primitive == "sqrt"
    assert any("['c']" in o.path for o in f.outputs)


def test_bad_input_errors():
    with pytest.raises(gradsan.UsageError, match="takes a function"):
        gsj.explain(3.0)
    with pytest.raises(gradsan.UsageError, match="functools.partial"):
        gsj.explain(lambda x, mode: x)(1.0, "fast")
    with pytest.raises(gradsan.UsageError, match="float"):
        gsj.explain(jax.grad(lambda x: x * 2))(3)
    with pytest.raises(gradsan.UsageError, match="scalar"):
        gsj.explain(jax.grad(lambda x: x * 2))(jnp.ones(3))
    x = jnp.array([1.0, jnp.nan])
    gsj.explain(jax.grad(lambda x: jnp.sum(x)))(x)
    assert np.isnan(np.asarray(x)[1])  # the user's values are untouched


def test_flax_module_line():
    nn = pytest.importorskip("flax.linen")

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(2)(x)
            return jnp.sqrt(jnp.sum(h * h))  # L:flax

    m = Model()
    x = jnp.zeros((1, 3))
    params = m.init(jax.random.PRNGKey(0), x)
    params = jax.tree_util.tree_map(jnp.zeros_like, params)
    report = gsj.explain(jax.grad(lambda p: m.apply(p, x)))(params)
    [f] = report.findings
    assert f.where.line == line_of("L:flax") and f.primitive == "sqrt"
    assert any("kernel" in o.path for o in f.outputs)


def test_equinox_module_line():
    eqx = pytest.importorskip("equinox")

    class M(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            return jnp.log(self.w * x)  # L:eqx

    m = M(jnp.zeros(()))
    [f, *_] = gsj.explain(jax.grad(lambda m: m(1.0)))(m).findings
    assert f.where.line == line_of("L:eqx") and f.primitive == "log"
    assert f.outputs[0].path.endswith(".w")


def test_partial_and_kwargs():
    def loss(x, scale=1.0):
        return jnp.sqrt(x * scale)  # L:kw

    report = gsj.explain(jax.grad(functools.partial(loss, scale=0.0)))(1.0)
    [f] = report.findings
    assert f.where.line == line_of("L:kw")


@jax.custom_vjp
def _clip_grad(x):
    return x


def _clip_grad_fwd(x):
    return x, x


def _clip_grad_bwd(x, g):
    scale = g * 2.0
    return (scale / x,)  # L:bwd


_clip_grad.defvjp(_clip_grad_fwd, _clip_grad_bwd)


def test_custom_vjp_bwd_rule_is_blamed_on_its_own_line(maybe_jit):
    f = maybe_jit(jax.grad(lambda x: _clip_grad(x) * 2))
    f(1.0)  # a cached trace must not hide the rule's lines
    [finding] = gsj.explain(f)(0.0).findings
    assert finding.where.line == line_of("L:bwd") and finding.where.function == "_clip_grad_bwd"
    assert finding.catalog_id == "div-by-zero"


def test_shard_map_names_the_shard_map_and_its_body_line():
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("i",))

    def body(x):
        return jnp.log(x)  # L:shard

    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    [finding] = gsj.explain(f)(jnp.zeros(4)).findings
    # the body is entered per device: the log itself, on its device (was: one opaque shard_map)
    assert finding.library is None and finding.primitive == "log"
    assert finding.where.line == line_of("L:shard")
    assert finding.detail["device"] == 0 and "device 0 of 1 (i=0)" in finding.context
