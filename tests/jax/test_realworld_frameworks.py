"""gradsan on equinox, flax linen/NNX and optax training code (tests/jax/realworld_nets.py, each
program from a public report), called as their users call them."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import gradsan.jax as gsj
from tests.conftest import line_of

from . import realworld_nets as rn

NETS = rn.__file__


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
