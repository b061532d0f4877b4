"""guard_finite: raises with the explanation, or skips, counts and explains (eager and jit)."""

import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import gradsan  # noqa: E402
from gradsan.integrations.optax import guard_finite  # noqa: E402


def loss(params, x):
    return jnp.sqrt(jnp.sum((params["w"] * x) ** 2))  # the norm


PARAMS = {"w": jnp.ones(3)}
ZERO = jnp.zeros(3)


def test_raise_mode_explains_eagerly():
    tx = guard_finite(optax.sgd(0.1), explain_fn=jax.grad(loss))
    state = tx.init(PARAMS)
    grads = jax.grad(loss)(PARAMS, ZERO)
    with pytest.raises(gradsan.NonFiniteError) as e:
        tx.update(grads, state, PARAMS, x=ZERO)
    assert e.value.report.findings[0].catalog_id == "sqrt-at-zero"
    assert "test_optax.py" in str(e.value) and "(loss)" in str(e.value)


@pytest.mark.parametrize("jit", [False, True])
def test_skip_mode_counts_and_explains(jit):
    seen = []
    tx = guard_finite(
        optax.adam(0.1),
        explain_fn=jax.grad(loss),
        mode="skip",
        on_report=lambda r, step: seen.append((step, r)),
    )
    state = tx.init(PARAMS)

    def step(params, state, x):
        grads = jax.grad(loss)(params, x)
        updates, state = tx.update(grads, state, params, x=x)
        return optax.apply_updates(params, updates), state

    if jit:
        step = jax.jit(step)
    params, state = step(PARAMS, state, jnp.ones(3))
    before = params
    params, state = step(params, state, ZERO)  # the bad step is skipped
    jax.effects_barrier()
    assert bool(jnp.all(params["w"] == before["w"]))
    assert int(state.total_notfinite) == 1 and int(state.notfinite_count) == 1
    params, state = step(params, state, jnp.ones(3))
    assert int(state.notfinite_count) == 0 and int(state.total_notfinite) == 1
    assert bool(jnp.all(jnp.isfinite(params["w"])))
    jax.effects_barrier()
    assert [s for s, _ in seen] == [1]
    assert seen[0][1].findings[0].catalog_id == "sqrt-at-zero"


def test_without_explain_fn_lists_the_bad_leaves(capsys):
    tx = guard_finite(mode="skip")
    state = tx.init(PARAMS)
    updates, state = tx.update({"w": jnp.array([1.0, jnp.nan, 2.0])}, state)
    assert bool(jnp.all(updates["w"] == 0)) and int(state.total_notfinite) == 1
    err = capsys.readouterr().err
    assert "skipped the update of step 0" in err and "['w'] (1 of 3 elements)" in err


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="'raise' or 'skip'"):
        guard_finite(mode="ignore")
