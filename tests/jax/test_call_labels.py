"""``flatten_call`` (every JAX wrapper's first step) names the argument leaves only when a
report reads them: the names are built on first read, from the tree as it was flattened, and
are the same names as before."""

import collections
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from gradsan.jax import _call

S = collections.namedtuple("S", "count best_value")


class M(eqx.Module):
    w: jax.Array
    act: object = eqx.field(static=True)


@functools.partial(jax.jit, static_argnums=1, static_argnames="scale")
def step(x, n, *, state, scale=1.0):
    return x * n * scale


def loose(params, model, key, name, *rest, **kw):
    return params


def test_labels_are_built_only_when_read(monkeypatch):
    built = []
    real = _call._path_labels
    monkeypatch.setattr(_call, "_path_labels", lambda f, t: built.append(1) or real(f, t))
    call = _call.flatten_call(step, (jnp.ones(2), 3), {"state": S(jnp.ones(()), jnp.ones(2))})
    assert built == []  # a healthy call never names its leaves
    assert call.labels == ["x", "state.count", "state.best_value"]
    assert call.labels is call.labels and built == [1]  # once


def test_the_names_are_those_of_every_kind_of_leaf():
    args = (
        {"a": [jnp.ones(2), 1.0], "b": (np.ones(3),)},
        M(jnp.ones(2), jnp.tanh),
        jax.random.key(0),
        "a string",
        5,
        jnp.ones(1),
    )
    call = _call.flatten_call(loose, args, {"z": {"q": jnp.ones(1)}})
    assert call.labels == [
        "params['a'][0]",
        "params['a'][1]",
        "params['b'][0]",
        "model.w",
        "key",  # a typed key: its key data is the leaf
        "args[4]",
        "args[5]",
        "z['q']",
    ]
    assert len(call.flat) == len(call.labels)
    grad = jax.grad(lambda p: p["w"].sum())
    assert _call.flatten_call(grad, ({"w": jnp.ones(2)},), {}).labels == ["p['w']"]


def test_the_names_are_of_the_tree_as_it_was_flattened():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    call = _call.flatten_call(loose, (params, None, None, None), {})
    params["extra"] = jnp.ones(3)  # the user's code (or its trace) changes the dict after
    del params["b"]
    assert call.labels == ["params['b']", "params['w']"]


def test_replace_keeps_the_names_and_the_rest():
    call = _call.flatten_call(step, (jnp.ones(2), 3), {"state": S(jnp.ones(()), jnp.ones(2))})
    flat = [jnp.asarray(a) for a in call.flat]
    other = call._replace(flat=flat)
    assert other.flat is flat and call.flat is not flat
    assert other.labels == call.labels == ["x", "state.count", "state.best_value"]
    assert (other.in_tree, other.statics, other.fun) == (call.in_tree, call.statics, call.fun)
    out = other.fun(*other.flat)
    assert np.allclose(np.asarray(out), 3.0)  # the static n=3 bound: x * 3
