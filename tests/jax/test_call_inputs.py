"""guard, sanitize, nansafe and certify on what people pass and return (issue 17): typed keys,
equinox modules, non-array leaves, Python control flow, calls inside transformations, NaN in
the data; and outputs labelled as what they are."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan
import gradsan.jax as gsj
from gradsan import UsageError

eqx = pytest.importorskip("equinox")


def _line(fn, text: str) -> int:
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def _report(api: str, fun, *args):
    """The report of one call of ``fun`` under ``api`` (guard's from its NonFiniteError)."""
    if api == "guard":
        with pytest.raises(gradsan.NonFiniteError) as e:
            gsj.guard(fun)(*args)
        return e.value.report
    if api == "nansafe":
        return gsj.nansafe(fun, report=True)(*args)[1]
    return getattr(gsj, api)(fun)(*args)


APIS = ["explain", "guard", "sanitize", "nansafe"]


def loss_with_key(w, key):
    k1, k2 = jax.random.split(key)
    keep = jax.random.bernoulli(k2, 0.5, w.shape)
    noise = 0.0 * jax.random.normal(k1, w.shape)
    return jnp.sum(jnp.sqrt(w) + keep + noise)


@pytest.mark.parametrize("api", APIS)
def test_typed_keys(api):
    w = jnp.zeros(3)
    for key in (jax.random.key(0), jax.random.PRNGKey(0)):
        r = _report(api, jax.grad(loss_with_key), w, key)
        [f] = r.findings
        assert f.primitive == "sqrt" and f.where.line == _line(loss_with_key, "jnp.sqrt")
        assert [h.path for h in f.outputs] == ["w"] and f.outputs[0].kind == "grad"


class Net(eqx.Module):
    mlp: eqx.nn.MLP
    name: str = eqx.field(static=True)

    def __call__(self, x):
        return self.mlp(x)


def eqx_loss(model, x):
    return jnp.sum(jnp.sqrt(model(x) - 100.0))


@pytest.mark.parametrize("api", APIS)
def test_equinox_module_argument_and_gradient(api):
    model = Net(eqx.nn.MLP(2, 1, 4, 2, key=jax.random.PRNGKey(0)), "net")
    x = jnp.ones(2)
    g = eqx.filter_grad(eqx_loss)
    r = _report(api, g, model, x)
    [f] = r.findings
    assert f.primitive == "sqrt" and f.where.line == _line(eqx_loss, "jnp.sqrt")
    paths = [h.path for h in f.outputs]
    assert "model.mlp.layers[0].weight" in paths and all(h.kind == "grad" for h in f.outputs)
    # the outputs are equinox's own: the same module type, static field and structure
    if api != "guard":
        out, plain = r.outputs, g(model, x)
        assert type(out) is Net and out.name == "net"
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(plain)


@pytest.mark.parametrize("api", APIS)
def test_equinox_module_finite_passes_through(api):
    model = Net(eqx.nn.MLP(2, 1, 4, 2, key=jax.random.PRNGKey(0)), "net")
    x = jnp.ones(2)
    g = eqx.filter_value_and_grad(lambda m, x: jnp.sum(m(x) ** 2))
    plain = g(model, x)
    if api == "guard":
        got = gsj.guard(g)(model, x)
    elif api == "nansafe":
        got = gsj.nansafe(g)(model, x)
    else:
        got = getattr(gsj, api)(g)(model, x).outputs
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(plain)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(plain)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), strict=True)


def aux_loss(w):
    return jnp.sum(jnp.sqrt(w)), {"msg": "hi", "n": 3}


@pytest.mark.parametrize("api", APIS)
def test_has_aux_with_non_array_aux(api):
    r = _report(api, jax.grad(aux_loss, has_aux=True), jnp.zeros(2))
    [f] = r.findings
    assert f.where.line == _line(aux_loss, "jnp.sqrt")
    assert [h.path for h in f.outputs] == ["w"]
    if api != "guard":
        assert r.outputs[1] == {"msg": "hi", "n": 3}


@pytest.mark.parametrize("api", APIS)
def test_metrics_dict_with_names(api):
    def step(x):
        return {"loss": jnp.log(x), "step": 3, "name": "run-a"}

    r = _report(api, step, jnp.array([1.0, 0.0]))
    [f] = r.findings
    assert f.primitive == "log" and [h.path for h in f.outputs] == ["output['loss']"]
    assert f.outputs[0].kind == "output"


def branchy(x):
    if x > 0:  # a Python branch on a value
        return jnp.sqrt(x)
    return jnp.log(x)


@pytest.mark.parametrize("api", ["sanitize", "nansafe"])
def test_python_control_flow_names_the_line(api):
    with pytest.raises(UsageError) as e:
        _report(api, branchy, -1.0)
    msg = str(e.value)
    assert f"test_call_inputs.py:{_line(branchy, 'if x > 0')} (branchy)" in msg
    assert "jnp.where" in msg and "Tracer" not in type(e.value).__name__


def test_python_control_flow_runs_under_guard_and_nansafe_when_finite():
    assert float(gsj.guard(branchy)(4.0)) == 2.0
    assert float(gsj.nansafe(branchy)(4.0)) == 2.0


def test_guard_on_python_control_flow_raises_non_finite_with_the_line():
    with pytest.raises(gradsan.NonFiniteError) as e:
        gsj.guard(branchy)(-1.0)
    msg = str(e.value)
    assert "could not be replayed" in msg
    assert f"test_call_inputs.py:{_line(branchy, 'if x > 0')} (branchy)" in msg


@pytest.mark.parametrize("api", ["guard", "sanitize"])
def test_inside_jit_vmap_and_closing_over_a_tracer(api):
    def call(f, x):
        out = getattr(gsj, api)(f)(x)
        return out.outputs if api == "sanitize" else out

    with pytest.raises(UsageError, match="inside a JAX transformation"):
        jax.jit(lambda x: call(jnp.sqrt, x))(1.0)
    with pytest.raises(UsageError, match="inside a JAX transformation"):
        jax.vmap(lambda x: call(jnp.log, x))(jnp.zeros(3))
    with pytest.raises(UsageError, match="closes over a value traced|closing over a value"):
        jax.jit(lambda y: call(lambda x: x * y, 1.0))(2.0)


def test_nansafe_works_inside_jit_and_over_an_outer_tracer():
    g = jax.grad(lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0))
    assert float(jax.jit(gsj.nansafe(g))(-1.0)) == 0.0
    out = jax.jit(lambda y: gsj.nansafe(lambda x: g(x) * y)(-1.0))(2.0)
    assert float(out) == 0.0


def test_nan_in_the_data_under_nansafe_report_names_the_input():
    g = jax.grad(lambda w, x: jnp.sum((x @ w) ** 2))
    x = jnp.array([[1.0, jnp.nan]])
    out, rep = gsj.nansafe(g, report=True)(jnp.ones(2), x)
    assert np.isnan(np.asarray(out)).all()
    assert rep.findings and "every output is finite" not in str(rep)
    [f] = rep.findings
    assert f.catalog_id == "nonfinite-input" and "`x`" in str(rep)


def test_certify_names_a_nan_input_instead_of_undecided():
    def loss(w, x):
        return jnp.sum((x @ w) ** 2)

    rep = gsj.certify(loss)(jnp.ones(2), jnp.array([[1.0, jnp.nan]]))
    assert "undecided" not in str(rep).lower()
    [f] = rep.findings
    assert f.catalog_id == "nonfinite-input" and "`x`" in str(rep)


def test_train_step_outputs_are_not_called_gradients():
    # parameters that were NaN on entry: the new parameters are an output, not a gradient
    def step(params, x):
        g = jax.grad(lambda p: jnp.sum((x @ p["w"]) ** 2))(params)
        return {"w": params["w"] - 0.1 * g["w"]}

    params = {"w": jnp.array([1.0, jnp.nan])}
    r = gsj.explain(step)(params, jnp.ones((3, 2)))
    [f] = r.findings
    assert f.catalog_id == "nonfinite-input"
    assert {h.kind for h in f.outputs} == {"output"}
    assert "gradient" not in str(r).split("\n")[0]


def test_forward_value_of_the_same_shape_is_an_output():
    r = gsj.explain(lambda x: jnp.log(x))(jnp.array([0.0, 1.0]))
    [f] = r.findings
    assert [h.path for h in f.outputs] == ["output"] and f.outputs[0].kind == "output"


def test_string_argument_is_still_refused_with_partial_advice():
    for api in ("nansafe", "sanitize"):
        with pytest.raises(UsageError, match="functools.partial"):
            getattr(gsj, api)(lambda x, mode: x)(1.0, "fast")
