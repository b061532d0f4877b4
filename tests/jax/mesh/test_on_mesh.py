"""shard_map and pmap bodies entered per device (run by tests/jax/test_mesh.py in a process with
8 simulated CPU devices; skipped in a process with fewer)."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import gradsan.jax as gsj
from gradsan.jax._call import flatten_call, trace_call
from gradsan.jax._explain import Provenance

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")


def _line(fn, text: str) -> int:
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def _interpreted(fun, *args):
    call = flatten_call(fun, args, {})
    t = trace_call(call, "explain")
    outs, _ = Provenance().explain_closed(t.closed, call.flat, [f"a{i}" for i in range(len(args))])
    return outs


def _mesh1():
    return Mesh(np.array(jax.devices()[:8]), ("data",))


def _mesh2():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def _smap(body, mesh, in_specs, out_specs):
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


CASES = {
    "psum": (_mesh1, lambda x: jax.lax.psum(jnp.sum(x * x), "data"), P("data"), P()),
    "pmean": (_mesh1, lambda x: jax.lax.pmean(x, "data"), P("data"), P()),
    "pmax": (_mesh1, lambda x: jax.lax.pmax(x, "data"), P("data"), P()),
    "pmin": (_mesh1, lambda x: jax.lax.pmin(x, "data"), P("data"), P()),
    "all_gather": (_mesh1, lambda x: jax.lax.all_gather(x, "data"), P("data"), P("data")),
    "all_gather_tiled": (
        _mesh1,
        lambda x: jax.lax.all_gather(x, "data", tiled=True),
        P("data"),
        P("data"),
    ),
    "ppermute": (
        _mesh1,
        lambda x: jax.lax.ppermute(x, "data", [(i, (i + 1) % 8) for i in range(8)]),
        P("data"),
        P("data"),
    ),
    "axis_index": (
        _mesh1,
        lambda x: x * jax.lax.axis_index("data").astype(x.dtype),
        P("data"),
        P("data"),
    ),
    "all_to_all": (
        _mesh1,
        lambda x: jax.lax.all_to_all(x, "data", 1, 0, tiled=True),
        P("data"),
        P("data"),
    ),
    "psum_scatter": (
        _mesh1,
        lambda x: jax.lax.psum_scatter(x, "data", tiled=True),
        P(),
        P("data"),
    ),
    "mesh2_psum_model": (
        _mesh2,
        lambda x: jax.lax.psum(x, "model"),
        P("data", "model"),
        P("data", None),
    ),
    "mesh2_both": (
        _mesh2,
        lambda x: jax.lax.psum(jnp.sin(x), ("data", "model")),
        P("data", "model"),
        P(None, None),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_collectives_match_jax(name):
    mesh, body, ins, outs = CASES[name]
    f = _smap(body, mesh(), ins, outs)
    x = jnp.arange(64.0).reshape(8, 8) / 7.0 - 3.0
    want = f(x)
    [got] = _interpreted(f, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def _row_norms(x):
    return jnp.sum(jnp.sqrt(jnp.sum(x * x, axis=1)))  # L:norm


def test_nan_inside_shard_map_on_device_5():
    mesh = _mesh1()

    def loss(x):
        local = _row_norms(x)
        return jax.lax.pmean(local, "data")

    f = _smap(loss, mesh, P("data"), P())
    x = jnp.ones((16, 3)).at[10].set(0.0)  # row 10 lives on device 5 (2 rows a device)
    g = jax.grad(f)
    assert np.isnan(np.asarray(g(x))).any()
    [finding] = gsj.explain(g)(x).findings
    assert finding.primitive == "sqrt" and finding.values.startswith("sqrt got 0.0")
    assert finding.where.line == _line(_row_norms, "L:norm")
    assert finding.detail["device"] == 5 and finding.detail["mesh_coordinate"] == {"data": 5}
    assert finding.detail["global_index"] == (10,)
    assert "device 5 of 8 (data=5)" in finding.context
    assert finding.zero_from is not None and finding.zero_from.line == _line(_row_norms, "L:norm")


def test_nan_on_a_2x4_mesh_names_both_coordinates():
    mesh = _mesh2()

    def loss(x):
        return jax.lax.psum(jnp.sum(jnp.log(x)), ("data", "model"))  # L:log

    f = _smap(loss, mesh, P("data", "model"), P())
    x = jnp.ones((4, 8)).at[3, 6].set(0.0)  # rows 2-3 on data=1, columns 6-7 on model=3
    [finding] = gsj.explain(jax.grad(f))(x).findings
    assert finding.primitive == "log"
    assert finding.detail["mesh_coordinate"] == {"data": 1, "model": 3}
    assert finding.detail["device"] == 7 and finding.detail["global_index"] == (3, 6)


def test_pmap():
    def loss(x):
        return jax.lax.pmean(jnp.sum(jnp.sqrt(x)), "i")  # L:pmap

    g = jax.pmap(jax.grad(loss), axis_name="i")
    x = jnp.ones((8, 3)).at[5, 1].set(0.0)
    assert np.isinf(np.asarray(g(x))).any()
    [finding] = gsj.explain(g)(x).findings
    assert finding.primitive == "sqrt" and finding.where.line == _line(loss, "L:pmap")
    assert finding.detail["device"] == 5


def _norm_loss(w, x):
    return jnp.mean(jnp.sqrt(jnp.sum(x * x * w, axis=1)))  # L:jitnorm


@pytest.mark.parametrize("explicit", [False, True])
def test_sharded_jit_names_the_device_of_the_row(explicit):
    from jax.sharding import AxisType, NamedSharding

    types = (AxisType.Explicit if explicit else AxisType.Auto,) * 2
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=types)
    x = jax.device_put(jnp.ones((16, 4)).at[10].set(0.0), NamedSharding(mesh, P("data")))
    g = jax.jit(jax.grad(_norm_loss))
    w = jnp.ones((4,))
    assert np.isnan(np.asarray(g(w, x))).any()
    [finding] = gsj.explain(g)(w, x).findings
    assert finding.primitive == "sqrt" and finding.where.line == _line(_norm_loss, "L:jitnorm")
    assert finding.index == (10,)
    # rows 8-11 live on data=2; replicated over `model`: the device at model=0 is named
    assert finding.detail["mesh_coordinate"]["data"] == 2
    assert "held by device" in finding.context
