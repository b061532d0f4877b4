"""A failing call's report says only what the call did: outputs it returned unchanged from its
inputs (already non-finite when given: optax's inf sentinels in optimizer state) are not
listed as its findings ("already in the input"), only named in one note."""

import functools

import jax
import jax.numpy as jnp
import pytest

import gradsan
from gradsan._run import _patch_jax
from gradsan._run._hooks import Hooks
from gradsan.jax._guard import Checker

STATE = {"best_value": jnp.array([jnp.inf, 1.0]), "count": jnp.array(jnp.nan)}


@jax.jit
def log_step(x, state):
    return jnp.log(x), state  # log of a negative: the call's NaN; state passed through


@jax.jit
def cond_step(x, state):
    keep = x[0] < 0  # True below: state comes back through the cond's pass-through branch
    state = jax.lax.cond(keep, lambda s: s, lambda s: jax.tree.map(lambda v: v * 2.0, s), state)
    return jnp.log(x), state


def _failures(guarded, *args, calls=3):
    """The reports of ``calls`` failing calls: the host check, then the fused program."""
    got = []
    for _ in range(calls):
        with pytest.raises(gradsan.NonFiniteError) as e:
            guarded(*args)
        got.append(e.value.report)
        t = guarded._gradsan_state["thread"]
        if t is not None:
            t.join()
    return got


def _only_the_log(report):
    assert [f.catalog_id for f in report.findings] == ["log-of-negative"]
    assert [h.path for h in report.findings[0].outputs] == ["output[0]"]
    text = str(report)
    assert "already in the input" not in text
    line = [n for n in report.notes if "passed through unchanged" in n]
    assert len(line) == 1, report.notes
    return line[0]


def test_forwarded_state_is_a_note_not_a_finding():
    for report in _failures(gradsan.jax.guard(log_step), -jnp.ones(2), STATE):
        line = _only_the_log(report)
        assert line.startswith("2 outputs are inputs passed through unchanged")
        assert "state['best_value']" in line and "state['count']" in line


def test_state_a_cond_passed_through_is_a_note_not_a_finding():
    for report in _failures(gradsan.jax.guard(cond_step), -jnp.ones(2), STATE):
        line = _only_the_log(report)
        assert "state['best_value']" in line and "state['count']" in line


def test_an_output_computed_from_the_non_finite_input_is_still_reported():
    @jax.jit
    def step(x, state):
        return jnp.log(x), state, state * 3.0  # the product is computed: the call's

    (report,) = _failures(gradsan.jax.guard(step), -jnp.ones(2), STATE["best_value"], calls=1)
    paths = sorted(h.path for f in report.findings for h in f.outputs)
    assert paths == ["output[0]", "output[2]"]  # not output[1], the input as it came
    assert any(f.catalog_id == "nonfinite-input" for f in report.findings)
    assert any(
        "1 output is an input passed through" in n and "`state`" not in n for n in report.notes
    )


def test_static_arguments_do_not_shift_the_input_names():
    @functools.partial(jax.jit, static_argnums=0)
    def step(n, x, state):
        return jnp.log(x) * n, state

    c = Checker(step, background=False, keep_inputs=False)  # as `gradsan run` checks it
    args = (2, -jnp.ones(2), STATE)
    out, ok, via = c.run(args, {})
    assert not ok
    line = _only_the_log(c.report(args, {}, out, via))
    assert "state['best_value']" in line


def test_nothing_is_noted_when_nothing_was_passed_through():
    (report,) = _failures(
        gradsan.jax.guard(log_step), -jnp.ones(2), {"best_value": jnp.ones(2)}, calls=1
    )
    assert not any("passed through" in n for n in report.notes)


@pytest.fixture
def hooks():
    got: list = []
    h = Hooks(got.append)
    _patch_jax.patch_jax(h, jax)
    h.failures = got
    yield h
    h.uninstall()


def test_gradsan_run_reports_only_what_the_call_computed(hooks):
    def step(x, state):
        return jnp.log(x), state

    watched = jax.jit(step)
    assert isinstance(watched, _patch_jax.Watched)
    for _ in range(2):  # the first call settles the fused program, the next takes its path
        watched(-jnp.ones(2), STATE)
    assert len(hooks.failures) == 2
    for failure in hooks.failures:
        _only_the_log(failure.report)
