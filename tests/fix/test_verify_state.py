"""The fix verifier runs the program again (original and patched) on copies of what it is
given: a train step that updates its arguments in place (an NNX module and optimizer, a dict of
arrays) is left by explain exactly as the user's one call left it, and the fixes are checked at
the state the failing call started from."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import gradsan.jax as gsj

sys.path.append(str(Path(__file__).resolve().parents[1] / "jax"))


def root_loss(w, x):
    return jnp.sum(jnp.sqrt(w * x))


def dict_step(state, x):
    g = jax.grad(root_loss)(state["w"], x)
    state["w"] = state["w"] - 0.1 * g
    state["calls"].append(1)
    return g


def _state():
    return {"w": jnp.array([1.0, 2.0]), "calls": []}


def test_a_dict_the_step_updates_is_updated_once():
    x = jnp.array([0.0, 1.0])  # sqrt(w * 0): an infinite gradient
    state = _state()
    report = gsj.explain(dict_step)(state, x)
    [p] = [p for f in report.findings for p in f.fixes if p.code]
    # it ran at w before the user's update: d/dw sqrt(w * 1) at w = 2 (after it, w = 1.96...)
    assert f"[0, {0.5 / np.sqrt(2.0):.6g}]" in p.checked, p.checked
    ref = _state()
    dict_step(ref, x)
    assert state["calls"] == [1]  # the user's call, and no other
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(ref["w"]))


def test_an_nnx_step_leaves_the_users_model_and_optimizer_as_one_step_does():
    import realworld_nets as rn
    from flax import nnx

    fun, (model, opt, a, b) = rn.make_nnx_step()
    report = gsj.explain(fun)(model, opt, a, b)
    checked = [p for f in report.findings for p in f.fixes if p.code]
    assert checked and all(p.checked for p in checked)  # the verifier ran (and said what)
    _, (model2, opt2, a2, b2) = rn.make_nnx_step()
    fun(model2, opt2, a2, b2)  # the same step, with no fix checking
    assert int(opt.step[...]) == 1
    for got, want in zip(
        jax.tree.leaves(nnx.state((model, opt))), jax.tree.leaves(nnx.state((model2, opt2)))
    ):
        np.testing.assert_array_equal(_data(got), _data(want))  # rng counters and keys too


def _data(a):
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(a))
    return np.asarray(a)
