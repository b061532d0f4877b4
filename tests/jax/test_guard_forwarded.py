"""A non-finite output a jitted call returns unchanged from its inputs is not that call's
finding (issue 17: optax's L-BFGS state holds ``value=inf`` by design and a step's
``lax.cond`` passes it through); everything the call computes still is, a copy included
(``x + 0``), and a NaN gradient computed from NaN data is always found."""

import functools

import jax
import jax.numpy as jnp
import pytest

import gradsan
from gradsan._run import _patch_jax
from gradsan._run._hooks import Hooks
from gradsan.jax._forward import forwarding
from gradsan.jax._guard import Checker

INF = jnp.array([jnp.inf, 1.0])


def _settled(guarded, *args):
    """Call twice: the first call checks on the host, the next ones in the fused program."""
    out = guarded(*args)
    state = guarded._gradsan_state
    if state["thread"] is not None:
        state["thread"].join()
    assert state["compiled"] is not None or state["use_jit"]
    return out, guarded(*args), guarded(*args)


@jax.jit
def passthrough(params, state):
    return params * 2.0, state  # state (holding inf) leaves the step unchanged


@jax.jit
def through_cond(params, state):
    skip = params[0] > 0  # True: state is returned as it came
    new = jax.lax.cond(skip, lambda s: s, lambda s: s * 2.0, state)
    return params - 1.0, new


@jax.jit
def nan_grad(params, data):
    return jax.grad(lambda p: jnp.sum(p * data))(params), data  # data passed through too


def test_guard_passes_an_input_returned_unchanged():
    _settled(gradsan.jax.guard(passthrough), jnp.ones(2), INF)


def test_guard_passes_state_a_cond_returned_unchanged():
    _settled(gradsan.jax.guard(through_cond), jnp.ones(2), INF)


def test_a_cond_branch_that_computed_the_inf_is_found():
    g = gradsan.jax.guard(through_cond)
    for _ in range(3):  # host check, then the fused program: found every time
        with pytest.raises(gradsan.NonFiniteError):
            g(-jnp.ones(2), INF)  # skip False: s * 2 computes inf from inf
        if g._gradsan_state["thread"] is not None:
            g._gradsan_state["thread"].join()


def test_a_nan_gradient_from_nan_data_is_found():
    g = gradsan.jax.guard(nan_grad)
    data = jnp.array([jnp.nan, 1.0])
    for _ in range(3):
        with pytest.raises(gradsan.NonFiniteError) as e:
            g(jnp.ones(2), data)
        if g._gradsan_state["thread"] is not None:
            g._gradsan_state["thread"].join()
    paths = [h.path for f in e.value.report.findings for h in f.outputs]
    assert any(p.startswith("output[0]") for p in paths)  # the gradient, not only the data


def test_a_copy_is_computed_and_asarray_is_forwarded():
    # decided by the program, not by what XLA makes of it: ``x + 0`` is an equation (found),
    # ``jnp.asarray(x)`` of an array is no equation at all (the input itself: passed)
    copy = gradsan.jax.guard(jax.jit(lambda x: x + 0.0))
    with pytest.raises(gradsan.NonFiniteError):
        copy(INF)
    _settled(gradsan.jax.guard(jax.jit(lambda x: jnp.asarray(x))), INF)


def test_forwarded_inputs_beside_a_computed_nan_still_fail():
    @jax.jit
    def step(x, state):
        return jnp.log(x), state

    g = gradsan.jax.guard(step)
    with pytest.raises(gradsan.NonFiniteError) as e:
        g(-jnp.ones(2), INF)
    assert any(f.primitive == "log" for f in e.value.report.findings)


def test_static_and_keyword_arguments_are_matched():
    @functools.partial(jax.jit, static_argnums=1, static_argnames="scale")
    def step(x, n, *, state, scale=1.0):
        return x * n * scale, state

    c = Checker(step, background=False, keep_inputs=False)  # as `gradsan run` checks it
    for _ in range(2):
        out, ok, via = c.run((jnp.ones(2), 3), {"state": INF, "scale": 2.0})
        assert ok and via is not None
    out, ok, via = c.run((INF, 3), {"state": INF, "scale": 2.0})
    assert not ok  # x * n * scale computed inf


def test_forwarding_reads_nested_jits_and_conds():
    inner = jax.jit(lambda a, b: (b, a + 1.0))

    def f(x, y, p):
        b, _ = inner(x, y)
        c = jax.lax.cond(p, lambda u, v: u, lambda u, v: v, x, y)
        return b, c, x * 1.0

    jaxpr = jax.make_jaxpr(f)(1.0, 2.0, True)
    got = forwarding(jaxpr)
    assert got[0] == (True, frozenset([1]))  # y, through the inner jit
    assert got[1] == (False, frozenset([0, 1]))  # x or y, by the branch taken
    assert got[2] is None  # computed


def test_forwarding_reads_loop_carries():
    def f(x, s):
        x2, s2 = jax.lax.while_loop(lambda c: c[0] < 3.0, lambda c: (c[0] + 1.0, c[1]), (x, s))
        (x3, s3), _ = jax.lax.scan(lambda c, _: ((c[0] * 2.0, c[1]), None), (x, s), None, 2)
        return x2, s2, x3, s3

    got = forwarding(jax.make_jaxpr(f)(1.0, 2.0))
    assert got == [None, (True, frozenset([1])), None, (True, frozenset([1]))]
    _settled(gradsan.jax.guard(jax.jit(f)), jnp.ones(()), jnp.array(jnp.inf))


@pytest.fixture
def hooks():
    got: list = []
    h = Hooks(got.append)
    _patch_jax.patch_jax(h, jax)
    h.failures = got
    yield h
    h.uninstall()


def test_gradsan_run_wrapper_passes_forwarded_state_and_finds_the_nan_gradient(hooks):
    def step(params, state):
        skip = params[0] > 0
        state = jax.lax.cond(skip, lambda s: s, lambda s: s * 2.0, state)
        return params - 1.0, state

    watched = jax.jit(step)
    assert isinstance(watched, _patch_jax.Watched)
    for _ in range(3):  # the first call settles the fused program, the next take its path
        watched(jnp.ones(2), INF)
    assert hooks.failures == []

    grad = jax.jit(lambda p, d: jax.grad(lambda q: jnp.sum(q * d))(p))
    grad(jnp.ones(2), jnp.ones(2))
    grad(jnp.ones(2), jnp.array([jnp.nan, 1.0]))
    assert len(hooks.failures) == 1
