"""PyTorch trigger programs for the fix conformance suite (see programs_jax.py)."""

import torch

MASK = torch.tensor([False, True])


def sqrt_zero(x):
    return (torch.sqrt(x) * 0.0).sum()  # L:sqrt-at-zero


def sqrt_method(x):
    y = x.sqrt()  # L:sqrt-method
    return (y * 0.0).sum()


def masked_log(x):
    return torch.where(MASK, torch.log(x), 0.0).sum()  # L:log-at-zero


def pow_frac(x):
    return ((x**0.5) * 0.0).sum()  # L:pow-fractional-at-zero


def acos_one(x):
    return (torch.acos(x + 1.0) * 0.0).sum()  # L:acos-at-one


POINTS = {
    "sqrt_zero": [0.0, 1.0],
    "sqrt_method": [0.0, 1.0],
    "masked_log": [0.0, 0.5],
    "pow_frac": [0.0, 1.0],
    "acos_one": [0.0, -0.5],
}
TRUTH = {
    "sqrt_zero": [0.0, 0.0],
    "sqrt_method": [0.0, 0.0],
    "masked_log": [0.0, 2.0],
    "pow_frac": [0.0, 0.0],
    "acos_one": [0.0, 0.0],
}
ENTRY = {
    "sqrt_zero": "sqrt-at-zero",
    "sqrt_method": "sqrt-at-zero",
    "masked_log": "log-at-zero",
    "pow_frac": "pow-fractional-at-zero",
    "acos_one": "acos-at-one",
}
MARKER = {"sqrt_method": "L:sqrt-method"}
