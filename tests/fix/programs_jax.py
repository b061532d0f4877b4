"""JAX trigger programs for the fix conformance suite: each line marked ``# L:<entry-id>`` gives
a finite value and a NaN gradient at POINTS[name], whose true gradient is TRUTH[name].

The suite copies this file to a temporary folder, imports the copy, and applies the patch
``Report.patch()`` writes to it, so the markers and the patch name the same file."""

import jax
import jax.numpy as jnp
import jax.scipy.special

MASK = jnp.array([False, True])


def sqrt_zero(x):
    return jnp.sum(jnp.sqrt(x) * 0.0)  # L:sqrt-at-zero


def cbrt_zero(x):
    return jnp.sum(jnp.cbrt(x) * 0.0)  # L:cbrt-at-zero


def pow_frac(x):
    return jnp.sum((x**0.5) * 0.0)  # L:pow-fractional-at-zero


def acos_one(x):
    return jnp.sum(jnp.arccos(x + 1.0) * 0.0)  # L:acos-at-one


def asin_one(x):
    return jnp.sum(jnp.arcsin(x + 1.0) * 0.0)  # L:asin-at-one


def norm_zero(x):
    return jnp.linalg.norm(jnp.stack([x[0], x[0]]))  # L:norm-at-zero


def std_const(x):
    return jnp.std(jnp.stack([x[0], x[0]]), axis=0, keepdims=True)[0]  # L:std-of-constant


def masked_log(x):
    return jnp.sum(jnp.where(MASK, jnp.log(x), 0.0))  # L:log-at-zero


def masked_div(x):
    return jnp.sum(jnp.where(MASK, 1.0 / x, 0.0))  # L:div-by-zero


def masked_rsqrt(x):
    return jnp.sum(jnp.where(MASK, jax.lax.rsqrt(x), 0.0))  # L:rsqrt-at-zero


def masked_int_pow(x):
    return jnp.sum(jnp.where(MASK, x**-2, 0.0))  # L:integer-pow-negative-at-zero


def masked_log1p(x):
    return jnp.sum(jnp.where(MASK, jnp.log1p(x - 1.0), 0.0))  # L:log1p-at-minus-one


def exp_log(x):
    return jnp.sum(jnp.exp(2.0 * jnp.log(x)) * 0.0)  # L:exp-log-at-zero


POINTS = {
    "sqrt_zero": [0.0, 1.0],
    "cbrt_zero": [0.0, 1.0],
    "pow_frac": [0.0, 1.0],
    "acos_one": [0.0, -0.5],
    "asin_one": [0.0, -0.5],
    "norm_zero": [0.0, 1.0],
    "std_const": [0.0, 1.0],
    "masked_log": [0.0, 0.5],
    "masked_div": [0.0, 0.5],
    "masked_rsqrt": [0.0, 0.25],
    "masked_int_pow": [0.0, 0.5],
    "masked_log1p": [0.0, 1.5],
    "exp_log": [0.0, 1.0],
}
TRUTH = {
    "sqrt_zero": [0.0, 0.0],
    "cbrt_zero": [0.0, 0.0],
    "pow_frac": [0.0, 0.0],
    "acos_one": [0.0, 0.0],
    "asin_one": [0.0, 0.0],
    "norm_zero": [0.0, 0.0],  # a kink: 0 is in the Clarke set [-sqrt 2, sqrt 2] (certify's choice)
    "std_const": [0.0, 0.0],
    "masked_log": [0.0, 2.0],
    "masked_div": [0.0, -4.0],
    "masked_rsqrt": [0.0, -4.0],
    "masked_int_pow": [0.0, -16.0],
    "masked_log1p": [0.0, 2.0 / 3.0],
    "exp_log": [0.0, 0.0],
}
ENTRY = {
    "sqrt_zero": "sqrt-at-zero",
    "cbrt_zero": "cbrt-at-zero",
    "pow_frac": "pow-fractional-at-zero",
    "acos_one": "acos-at-one",
    "asin_one": "asin-at-one",
    "norm_zero": "norm-at-zero",
    "std_const": "std-of-constant",
    "masked_log": "log-at-zero",
    "masked_div": "div-by-zero",
    "masked_rsqrt": "rsqrt-at-zero",
    "masked_int_pow": "integer-pow-negative-at-zero",
    "masked_log1p": "log1p-at-minus-one",
    "exp_log": "exp-log-at-zero",
}


def two_findings(x):
    a = jnp.sqrt(x) * 0.0  # L:two-a
    b = jnp.where(MASK, jnp.log(x), 0.0)  # L:two-b
    return jnp.sum(a + b)
