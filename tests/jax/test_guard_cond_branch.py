"""A ``lax.cond`` output counts as passed through only when the branch the step took returns
it unchanged: the branch index is read from the step (not the output's value), so a taken
branch that computes exactly the input's value (``s * 1.0``: a copy is computed) is the call's
finding, on the host check, in the fused program and under `gradsan run`."""

import jax
import jax.numpy as jnp
import pytest

import gradsan
from gradsan._run import _patch_jax
from gradsan._run._hooks import Hooks
from gradsan.jax._forward import forwarded_outputs, host_computed_flag

INF = jnp.array([jnp.inf, 1.0])


@jax.jit
def copy_or_pass(x, state):
    copy = x[0] > 0  # True: the taken branch computes s * 1.0, equal to s element for element
    state = jax.lax.cond(copy, lambda s: s * 1.0, lambda s: s, state)
    return x - 1.0, state


@jax.jit
def switch3(x, state):
    i = jnp.int32(x[0])  # 0: pass through, 1: s + 0.0 (computed), 2: pass through
    state = jax.lax.switch(i, [lambda s: s, lambda s: s + 0.0, lambda s: s], state)
    return x * 2.0, state


def _calls(g, *args):
    """Three calls: the host check, then the fused program; the outcome of each."""
    got = []
    for _ in range(3):
        try:
            g(*args)
            got.append("passed")
        except gradsan.NonFiniteError as e:
            got.append(e.value.report if hasattr(e, "value") else e.report)
        t = g._gradsan_state["thread"]
        if t is not None:
            t.join()
    return got


def test_a_taken_branch_that_computes_the_same_value_is_found():
    got = _calls(gradsan.jax.guard(copy_or_pass), jnp.ones(2), INF)
    assert all(r != "passed" for r in got), got  # host check and fused program alike
    paths = [h.path for f in got[-1].findings for h in f.outputs]
    assert "output[1]" in paths  # the copy of the inf state: the call computed it
    assert not any("passed through unchanged" in n for n in got[-1].notes)


def test_the_pass_through_branch_taken_passes():
    assert _calls(gradsan.jax.guard(copy_or_pass), -jnp.ones(2), INF) == ["passed"] * 3


@pytest.mark.parametrize("branch, found", [(0, False), (1, True), (2, False)])
def test_switch_reads_which_of_its_branches_ran(branch, found):
    x = jnp.array([float(branch), 1.0])
    got = _calls(gradsan.jax.guard(switch3), x, INF)
    assert [r != "passed" for r in got] == [found] * 3


def test_the_host_decision_reads_the_branch():
    out = copy_or_pass(jnp.ones(2), INF)  # s * 1.0 taken: the inf state is computed
    assert host_computed_flag(copy_or_pass, (jnp.ones(2), INF), {}, out) is False
    assert forwarded_outputs(copy_or_pass, (jnp.ones(2), INF), {}, out) == {}
    out = copy_or_pass(-jnp.ones(2), INF)  # the pass-through branch
    assert host_computed_flag(copy_or_pass, (-jnp.ones(2), INF), {}, out) is True
    assert forwarded_outputs(copy_or_pass, (-jnp.ones(2), INF), {}, out) == {1: 1}


def test_a_step_with_a_print_is_decided_by_value_and_prints_once(capfd):
    @jax.jit
    def noisy(x, state):
        jax.debug.print("step {}", x[0])
        copy = x[0] > 0
        state = jax.lax.cond(copy, lambda s: s * 1.0, lambda s: s, state)
        return x - 1.0, state

    got = _calls(gradsan.jax.guard(noisy), -jnp.ones(2), INF)
    assert got == ["passed"] * 3
    jax.effects_barrier()
    assert capfd.readouterr().out.count("step -1") == 3  # the step's print, never repeated


@pytest.fixture
def hooks():
    got: list = []
    h = Hooks(got.append)
    _patch_jax.patch_jax(h, jax)
    h.failures = got
    yield h
    h.uninstall()


def test_gradsan_run_reads_the_branch(hooks):
    def step(x, state):
        copy = x[0] > 0
        state = jax.lax.cond(copy, lambda s: s * 1.0, lambda s: s, state)
        return x - 1.0, state

    watched = jax.jit(step)
    assert isinstance(watched, _patch_jax.Watched)
    for _ in range(2):  # the first call settles the fused program, the next takes its path
        watched(-jnp.ones(2), INF)  # passed through: no failure
    assert hooks.failures == []
    for _ in range(2):
        watched(jnp.ones(2), INF)  # copied: found
    assert len(hooks.failures) == 2
