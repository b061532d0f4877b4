"""gradsan on vmap, remat and loops of real programs (tests/jax/realworld_loops.py, each from a
public report): the transformation around ``jax.grad`` is not mistaken for ``jax.grad`` itself."""

import jax
import pytest

import gradsan
import gradsan.jax as gsj
from gradsan.jax import _compat
from tests.conftest import line_of

from . import realworld_loops as rl


def test_grad_info_does_not_look_through_vmap():
    # vmap(grad(f)) is a batch of gradients, not grad(f) of the whole batch
    g = jax.grad(rl.spring_energy)
    assert _compat.grad_info(g) is not None
    assert _compat.grad_info(jax.jit(g)) is not None  # jit computes the same function
    for t in (jax.vmap(g), jax.jacfwd(g), jax.jacrev(g), jax.hessian(rl.spring_energy)):
        assert _compat.grad_info(t) is None


def test_certify_of_per_example_gradients_is_refused_not_wrong():
    # it used to certify grad(f) of the whole batch: rows 0 and 2 (smooth points) came back
    # as [0.667, 1.333] and [1.333, 0] where the gradient is [0.553, 1.106] and [1, 0]
    fun, args = rl.make_per_example()
    with pytest.raises(gradsan.UsageError, match="scalar loss or jax.grad"):
        gsj.certify(fun)(*args)


def test_explain_per_example_norm_does_not_reject_a_fix_against_a_wrong_limit():
    fun, args = rl.make_per_example()
    report = gsj.explain(fun)(*args)
    [f] = report.findings
    assert f.catalog_id == "norm-at-zero" and f.library == "jnp.linalg.norm"
    assert (f.where.function, f.where.line) == (
        "spring_energy",
        line_of(rl.__file__, "L:spring-norm"),
    )
    assert f.index == (1,)  # the row whose point sits on its anchor
    for p in f.fixes:
        assert "certified limit" not in p.checked
