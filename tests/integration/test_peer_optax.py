"""What optax's own suite found under ``pytest --gradsan`` (#17), in-process: ``jax.jit`` of a
bound method of another object (``jax.jit(opt.init)`` for each optimizer in a loop, optax's
alias_test::test_gradient_accumulation*) reused the first object's fused program (same code,
globals and defaults; the object was not part of the function's identity): the second
optimizer's init returned the first one's state and its update failed with AttributeError."""

import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402


class Scale:
    def __init__(self, k: float) -> None:
        self.k = k

    def f(self, x):
        return x * self.k


def test_a_jitted_bound_method_of_another_object_is_its_own_function(gradsan_check):
    with gradsan_check():
        two = jax.jit(Scale(2.0).f)(1.0)
        three = jax.jit(Scale(3.0).f)(1.0)
    assert (float(two), float(three)) == (2.0, 3.0)


def test_multisteps_of_each_optimizer_gets_its_own_state(gradsan_check):
    fun = lambda x: jnp.sum(x**2)  # noqa: E731
    params = jnp.array([1.0, 2.0])
    grads = jax.grad(fun)(params)
    seen = []
    with gradsan_check():
        for make in (optax.adabelief, optax.adagrad):
            opt = optax.MultiSteps(make(1.0), every_k_schedule=4)
            state = jax.jit(opt.init)(params)
            updates, _ = jax.jit(opt.update)(grads, state, params)  # AttributeError before
            seen.append(type(state.inner_opt_state[0]).__name__)
            assert jnp.array_equal(updates, jnp.zeros_like(grads))
    assert seen == ["ScaleByBeliefState", "ScaleByRssState"]


def test_a_constant_inf_the_init_writes_into_its_state_is_not_a_finding(gradsan_check):
    # optax contrib _common_test::test_preserve_dtype40/41, test_gradient_accumulation40/41:
    # reduce_on_plateau's init keeps best_value=inf (a literal in the jaxpr) as its sentinel
    opt = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau())
    params = jnp.array([1.0, 2.0])
    with gradsan_check():
        state = jax.jit(opt.init)(params)
        state = jax.jit(opt.init)(params)  # the fused program's flag, too
    assert bool(jnp.isinf(state[1].best_value))


def test_an_inf_the_step_computes_from_a_literal_is_still_found(gradsan_check):
    with pytest.raises(Exception, match="Inf"), gradsan_check():
        jax.jit(lambda x: x + jnp.log(0.0))(jnp.ones(2))
