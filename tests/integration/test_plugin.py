"""`pytest --gradsan` and the `gradsan_check` fixture, run in a subprocess through pytester."""

import pytest

pytest_plugins = ["pytester"]

# slow: pytest runs pytest in a subprocess
pytestmark = pytest.mark.slow

JAX_TESTS = """
import jax, jax.numpy as jnp
import pytest

def loss(x):
    return jnp.sqrt(jnp.sum(x ** 2))  # the norm

@jax.jit
def step(x):
    return jax.grad(loss)(x)

def test_healthy():
    assert jnp.isfinite(step(jnp.ones(3))).all()

def test_nan_gradient():
    jax.grad(loss)(jnp.zeros(3))

def test_nan_in_jitted_step():
    step(jnp.zeros(3))

@pytest.mark.gradsan_allow_nonfinite
def test_allowed():
    assert jnp.isnan(jax.grad(loss)(jnp.zeros(3))).all()

def test_fixture(gradsan_check):
    import gradsan
    with pytest.raises(gradsan.NonFiniteError, match="sqrt"):
        gradsan_check(jax.grad(loss))(jnp.zeros(3))
    assert gradsan_check(jax.grad(loss))(jnp.ones(3)).shape == (3,)
"""


@pytest.mark.slow
def test_gradsan_option_fails_nan_tests_with_a_section(pytester):
    pytester.makepyfile(test_jax=JAX_TESTS)
    r = pytester.runpytest_subprocess("--gradsan", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=3, failed=2)
    r.stdout.fnmatch_lines(
        [
            "*- gradsan -*",
            "*the 1st call of `loss` (jax.grad) returned NaN/Inf*",
            "*sqrt at test_jax.py:5 (loss)*",
        ]
    )
    r.stdout.fnmatch_lines(["*the 2nd call of `step` (jax.jit) returned NaN/Inf*"])
    r.stdout.no_fnmatch_line("*_run.py*")


def test_without_the_option_nothing_is_checked(pytester):
    pytester.makepyfile(
        test_plain="""
        import sys
        def test_no_backend(gradsan_check):
            assert "jax" not in sys.modules and "torch" not in sys.modules
        def test_nan_is_allowed():
            assert float("nan") != float("nan")
    """
    )
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=2)


def test_help_lists_the_options(pytester):
    r = pytester.runpytest_subprocess("--help")
    r.stdout.fnmatch_lines(["*gradsan*", "*--gradsan *fail tests whose*"])


@pytest.mark.slow
def test_torch_backward_and_fixture(pytester):
    pytest.importorskip("torch")
    pytester.makepyfile(
        test_torch="""
        import torch, pytest
        import gradsan

        def test_nan_backward():
            x = torch.zeros(3, requires_grad=True)
            torch.sqrt((x * x).sum()).backward()

        def test_block(gradsan_check):
            x = torch.zeros(3, requires_grad=True)
            with pytest.raises(gradsan.NonFiniteError):
                with gradsan_check():
                    torch.sqrt((x * x).sum()).backward()
    """
    )
    r = pytester.runpytest_subprocess("--gradsan", "--gradsan-trace", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["*- gradsan -*", "*the 1st backward call*", "*test_torch.py:6*"])
