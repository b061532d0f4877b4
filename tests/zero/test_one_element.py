"""std/var over a single element is its own case, not "constant data" (#14), in both backends:
n - ddof = 0 (ddof=1, torch's default) makes the value 0 / 0; with ddof=0 the gradient is the
derivative of sqrt at 0 times x - mean = 0."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import torch

from gradsan._report._text import headline
from gradsan.jax._explain import diagnose
from gradsan.torch._explain import explain as torch_explain
from gradsan.torch._explain import run_functional

# the reports' words without the verification of their fixes (tests/fix verifies those)


def _jax(fun, x):
    (f,) = diagnose(jax.grad(fun), (x,), {}).findings
    return f


def _torch(fun, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "degrees of freedom is <= 0"
        return run_functional(torch_explain(None), fun, (torch.tensor(x, requires_grad=True),), {})


def test_jax_std_of_one_element_ddof0_is_sqrt_of_zero():
    f = _jax(lambda x: jnp.std(x), jnp.array([3.0]))
    assert f.explanation.startswith("Here jnp.std reduces over a single element: the mean of")
    assert "the derivative of sqrt at 0 (inf) times that 0" in f.explanation
    assert "This is not constant data" in f.explanation and "cone point" not in f.explanation
    assert f.title == "jnp.std of a single element: the derivative of sqrt(0)"


def test_jax_std_of_one_element_along_an_axis():
    f = _jax(lambda x: jnp.sum(x / (jnp.std(x, axis=0) + 1e-5)), jnp.array([[3.0, 1.0]]))
    assert f.explanation.startswith("Here jnp.std reduces over a single element")


def test_jax_std_of_one_element_ddof1_is_zero_over_zero():
    f = _jax(lambda x: jnp.std(x, ddof=1), jnp.array([3.0]))
    assert "(0.0 / 0.0 = nan already in the forward pass)" in headline(f)
    assert f.explanation.startswith(
        "Here jnp.std reduces over a single element with ddof=1: the divisor n - ddof is 1 - 1 = 0"
    )
    assert f.title == "jnp.std of a single element: n - ddof = 0, the value is 0 / 0 = NaN"


def test_jax_var_of_one_element_ddof1():
    f = _jax(lambda x: jnp.var(x, ddof=1), jnp.array([3.0]))
    assert f.explanation.startswith("Here jnp.var reduces over a single element with ddof=1")


def test_jax_std_of_constant_data_keeps_the_cone_point():
    f = _jax(lambda x: jnp.std(x), jnp.array([3.0, 3.0]))
    assert "cone point" in f.explanation and "single element" not in f.explanation


def test_torch_std_of_one_element_default_unbiased():
    (f,) = _torch(lambda x: torch.std(x), [3.0]).findings
    assert headline(f).endswith("got 3.0 (one element with ddof=1: n - ddof = 0, so 0 / 0 = nan).")
    assert f.explanation.startswith(
        "Here torch.std reduces over a single element with ddof=1: the divisor n - ddof is 1 - 1"
    )
    assert "cone point" not in f.explanation


def test_torch_std_and_var_along_a_dim_of_one():
    (f,) = _torch(lambda x: torch.std(x, 1).sum(), [[3.0], [4.0]]).findings
    assert f.explanation.startswith("Here torch.std reduces over a single element with ddof=1")
    (f,) = _torch(lambda x: x.var(dim=1).sum(), [[3.0], [4.0]]).findings
    assert f.explanation.startswith("Here torch.var reduces over a single element with ddof=1")


def test_torch_population_std_of_one_element_is_clean():
    # torch's StdBackward gives 0 where std == 0: nothing to report, and nothing is
    assert _torch(lambda x: torch.std(x, correction=0), [3.0]).ok
    assert _torch(lambda x: x.std(unbiased=False), [3.0]).ok
