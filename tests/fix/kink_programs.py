"""Kink programs for tests/fix/test_kink_fixes.py (a file of their own: the fixes are verified
by swapping a patched copy of these functions in)."""

import jax
import jax.numpy as jnp
import torch

W = jnp.array([2.0, 3.0])


def relu_weighted(x):
    return jnp.sum(jax.nn.relu(x) * W)  # L:relu


def abs_sum(x):
    return jnp.sum(jnp.abs(x))  # L:abs


def abs_wrong(x):
    # the "fix" the test writes here has the right value but a slope of 3 at 0
    return jnp.sum(jnp.abs(x))  # L:abs-wrong


def torch_abs(x):
    return torch.abs(x).sum()  # L:torch-abs
