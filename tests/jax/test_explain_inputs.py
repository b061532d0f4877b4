"""explain on what people pass and return: non-array outputs, typed keys, Python control flow,
calls from inside a transformation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj
from gradsan import UsageError


def _line(fn, text: str) -> int:
    import inspect

    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def test_string_and_metrics_outputs_pass_through():
    def step(x):
        return {"loss": jnp.log(x), "step": 3, "name": "run-a"}

    r = gsj.explain(step)(jnp.array([1.0, 0.0]))
    assert r.outputs["name"] == "run-a" and r.outputs["step"] == 3
    [f] = r.findings
    assert f.primitive == "log" and f.where.line == _line(step, "jnp.log")
    assert [h.path for h in f.outputs] == ["output['loss']"]


def test_has_aux_with_a_string():
    def loss(w):
        return jnp.sum(jnp.sqrt(w)), {"msg": "hi"}

    r = gsj.explain(jax.grad(loss, has_aux=True))(jnp.zeros(2))
    grads, aux = r.outputs
    assert aux == {"msg": "hi"} and np.isinf(np.asarray(grads)).all()
    [f] = r.findings
    assert f.primitive == "sqrt" and f.where.line == _line(loss, "jnp.sqrt")


def test_typed_keys_dropout():
    def loss(w, key):
        k1, k2 = jax.random.split(key)
        keep = jax.random.bernoulli(k2, 0.5, w.shape)
        noise = 0.0 * jax.random.normal(k1, w.shape)
        return jnp.sum(jnp.sqrt(jnp.where(keep, w * w, 0.0)) + noise)

    w = jnp.zeros(4)
    for key in (jax.random.key(0), jax.random.PRNGKey(0)):
        r = gsj.explain(jax.grad(loss))(w, key)
        assert np.array_equal(np.asarray(r.outputs), np.asarray(jax.grad(loss)(w, key)), True)
        [f] = r.findings
        assert f.primitive == "sqrt" and f.where.line == _line(loss, "jnp.sqrt")


def test_python_branch_on_a_value_names_the_line():
    def f(x):
        if x > 0:
            return jnp.sqrt(x)
        return x

    with pytest.raises(UsageError) as e:
        gsj.explain(f)(1.0)
    msg = str(e.value)
    assert f"test_explain_inputs.py:{_line(f, 'if x > 0')} (f)" in msg and "jnp.where" in msg


def test_called_inside_jit_or_vmap():
    @jax.jit
    def inside(x):
        return gsj.explain(jnp.sqrt)(x).outputs

    with pytest.raises(UsageError, match="inside a JAX transformation"):
        inside(1.0)
    with pytest.raises(UsageError, match="inside a JAX transformation"):
        jax.vmap(lambda x: gsj.explain(jnp.log)(x).outputs)(jnp.zeros(3))
