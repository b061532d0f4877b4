"""JAX trigger programs of the conformance suite (tests/fix/test_conformance.py): one per catalog
entry, each line marked ``# L:<entry-id>`` is where the entry is reported at POINT. The suite
copies this file to a temporary folder, imports the copy and applies ``Report.patch()`` to it.

``TRIGGERS[entry_id] = (function, point, truth, tool)``: ``truth`` is the true gradient at the
point (analytic) or ``"clarke"`` (an element of the entry's admissible set), None for an entry
without a code fix; ``tool`` is ``"explain"`` or ``"sanitize"`` (kinks)."""

import jax
import jax.numpy as jnp
import jax.scipy.special

MASK = jnp.array([False, True])


def sqrt_zero(x):
    return jnp.sum(jnp.sqrt(x) * 0.0)  # L:sqrt-at-zero


def sqrt_negative(x):
    return jnp.sum(jnp.sqrt(x - 1.0))  # L:sqrt-of-negative


def rsqrt_zero(x):
    return jnp.sum(jnp.where(MASK, jax.lax.rsqrt(x), 0.0))  # L:rsqrt-at-zero


def cbrt_zero(x):
    return jnp.sum(jnp.cbrt(x) * 0.0)  # L:cbrt-at-zero


def pow_frac(x):
    return jnp.sum((x**0.5) * 0.0)  # L:pow-fractional-at-zero


def pow_negative_zero(x):
    return jnp.sum(x**-0.5)  # L:pow-negative-at-zero


def pow_negative_base(x):
    return jnp.sum((x - 2.0) ** 1.5)  # L:pow-negative-base


def int_pow(x):
    return jnp.sum(jnp.where(MASK, x**-2, 0.0))  # L:integer-pow-negative-at-zero


def div_zero(x):
    return jnp.sum(jnp.where(MASK, 1.0 / x, 0.0))  # L:div-by-zero


def log_zero(x):
    return jnp.sum(jnp.where(MASK, jnp.log(x), 0.0))  # L:log-at-zero


def log2_zero(x):
    return jnp.sum(jnp.where(MASK, jnp.log2(x), 0.0))  # L:log2-log10-at-zero


def exp_log(x):
    return jnp.sum(jnp.exp(2.0 * jnp.log(x)))  # L:exp-log-at-zero


def log_negative(x):
    return jnp.sum(jnp.log(x - 1.0))  # L:log-of-negative


def log1p_minus_one(x):
    return jnp.sum(jnp.where(MASK, jnp.log1p(x - 1.0), 0.0))  # L:log1p-at-minus-one


def xlogy_zero(x):
    return jnp.sum(jnp.where(MASK, jax.scipy.special.xlogy(x, x), 0.0))  # L:xlogy-at-zero


def atan2_origin(x):
    return jnp.sum(jnp.where(MASK, jnp.arctan2(x, x), 0.0))  # L:atan2-at-origin


def acos_one(x):
    return jnp.sum(jnp.arccos(x + 1.0) * 0.0)  # L:acos-at-one


def asin_one(x):
    return jnp.sum(jnp.arcsin(x + 1.0) * 0.0)  # L:asin-at-one


def atanh_one(x):
    return jnp.sum(jnp.where(MASK, jnp.arctanh(x), 0.0))  # L:atanh-at-one


def acosh_one(x):
    return jnp.sum(jnp.arccosh(x + 1.0))  # L:acosh-at-one


def exp_overflow(x):
    return jnp.sum(jnp.exp(x + 100.0))  # L:exp-overflow


def expm1_overflow(x):
    return jnp.sum(jnp.expm1(x + 100.0))  # L:expm1-overflow


def float16_overflow(x):
    return jnp.sum(jnp.exp(x.astype(jnp.float16) + 12.0))  # L:float16-overflow


def lgamma_pole(x):
    return jnp.sum(jax.lax.lgamma(x))  # L:lgamma-at-pole


def digamma_pole(x):
    return jnp.sum(jax.lax.digamma(x))  # L:digamma-at-pole


def erf_inv_one(x):
    return jnp.sum(jax.lax.erf_inv(x + 1.0))  # L:erf-inv-at-one


def norm_zero(x):
    return jnp.linalg.norm(jnp.stack([x[0], x[0]]))  # L:norm-at-zero


def std_const(x):
    return jnp.std(jnp.stack([x[0], x[0]]), axis=0, keepdims=True)[0]  # L:std-of-constant


def logsumexp_neg_inf(x):
    z = jnp.where(jnp.array([False, False]), x, -jnp.inf)
    return jax.nn.logsumexp(z)  # L:logsumexp-all-neg-inf


def softmax_neg_inf(x):
    z = jnp.where(jnp.array([False, False]), x, -jnp.inf)
    return jnp.sum(jax.nn.softmax(z))  # L:softmax-all-neg-inf


def where_trap(x):
    return jnp.sum(jnp.where(x > 1.0, jnp.log(x), 0.0))  # L:where-trap


def nonfinite_input(x):
    return jnp.sum(x * 2.0)  # L:nonfinite-input


def abs_zero(x):
    return jnp.sum(jnp.abs(x))  # L:abs-at-zero


def relu_zero(x):
    return jnp.sum(jax.nn.relu(x))  # L:relu-at-zero


def max_tie(x):
    return jnp.maximum(x[0], x[1])  # L:max-tie


def clip_bound(x):
    return jnp.sum(jnp.clip(x, 0.0, 1.0))  # L:clip-at-bound


def hypot_origin(x):
    return jnp.hypot(x[0], x[1])  # L:hypot-at-origin


def sort_tie(x):
    return jnp.sort(x)[0] * 2.0  # L:sort-tie


def sign_zero(x):
    return jnp.sum(jnp.sign(x) * x)  # L:sign-at-zero


def floor_jump(x):
    return jnp.sum(jnp.floor(x) * x)  # L:floor-round-at-jump


def where_boundary(x):
    return jnp.sum(jnp.where(x > 0.0, x, 2.0 * x))  # L:where-at-boundary


def eigh_repeated(x):
    return jnp.linalg.eigh(jnp.diag(x))[1][0, 0]  # L:eigh-repeated-eigenvalues


def i0e_zero(x):
    return jnp.sum(jax.scipy.special.i0e(x))  # L:i0e-at-zero


def det_singular(x):
    return jnp.linalg.slogdet(jnp.outer(x, x))[1]  # L:det-at-singular


TRIGGERS = {
    "sqrt-at-zero": (sqrt_zero, [0.0, 1.0], [0.0, 0.0], "explain"),
    "sqrt-of-negative": (sqrt_negative, [0.0, 2.0], None, "explain"),
    "rsqrt-at-zero": (rsqrt_zero, [0.0, 0.25], [0.0, -4.0], "explain"),
    "cbrt-at-zero": (cbrt_zero, [0.0, 1.0], [0.0, 0.0], "explain"),
    "pow-fractional-at-zero": (pow_frac, [0.0, 1.0], [0.0, 0.0], "explain"),
    "pow-negative-at-zero": (pow_negative_zero, [0.0, 1.0], None, "explain"),
    "pow-negative-base": (pow_negative_base, [0.0, 3.0], None, "explain"),
    "integer-pow-negative-at-zero": (int_pow, [0.0, 0.5], [0.0, -16.0], "explain"),
    "div-by-zero": (div_zero, [0.0, 0.5], [0.0, -4.0], "explain"),
    "log-at-zero": (log_zero, [0.0, 0.5], [0.0, 2.0], "explain"),
    "log2-log10-at-zero": (log2_zero, [0.0, 0.5], [0.0, 2.8853900817779268], "explain"),
    "exp-log-at-zero": (exp_log, [0.0, 1.0], [0.0, 2.0], "explain"),
    "log-of-negative": (log_negative, [0.0, 2.0], None, "explain"),
    "log1p-at-minus-one": (log1p_minus_one, [0.0, 1.5], [0.0, 2.0 / 3.0], "explain"),
    "xlogy-at-zero": (xlogy_zero, [0.0, 1.0], [0.0, 1.0], "explain"),
    "atan2-at-origin": (atan2_origin, [0.0, 1.0], [0.0, 0.0], "explain"),
    "acos-at-one": (acos_one, [0.0, -0.5], [0.0, 0.0], "explain"),
    "asin-at-one": (asin_one, [0.0, -0.5], [0.0, 0.0], "explain"),
    "atanh-at-one": (atanh_one, [1.0, 0.5], [0.0, 4.0 / 3.0], "explain"),
    "acosh-at-one": (acosh_one, [0.0, 1.0], None, "explain"),
    "exp-overflow": (exp_overflow, [0.0, -200.0], None, "explain"),
    "expm1-overflow": (expm1_overflow, [0.0, -200.0], None, "explain"),
    "float16-overflow": (float16_overflow, [0.0, -20.0], None, "explain"),
    "lgamma-at-pole": (lgamma_pole, [0.0, 1.5], None, "explain"),
    "digamma-at-pole": (digamma_pole, [0.0, 1.5], None, "explain"),
    "erf-inv-at-one": (erf_inv_one, [0.0, -1.5], None, "explain"),
    "norm-at-zero": (norm_zero, [0.0, 1.0], "clarke", "explain"),
    "std-of-constant": (std_const, [0.0, 1.0], [0.0, 0.0], "explain"),
    "logsumexp-all-neg-inf": (logsumexp_neg_inf, [0.0, 1.0], None, "explain"),
    "softmax-all-neg-inf": (softmax_neg_inf, [0.0, 1.0], None, "explain"),
    "where-trap": (where_trap, [0.0, 2.0], [0.0, 0.5], "explain"),
    "nonfinite-input": (nonfinite_input, [float("nan"), 1.0], None, "explain"),
    "abs-at-zero": (abs_zero, [0.0, 0.0], "clarke", "sanitize"),
    "relu-at-zero": (relu_zero, [0.0, 0.0], "clarke", "sanitize"),
    "max-tie": (max_tie, [1.0, 1.0], "clarke", "sanitize"),
    "clip-at-bound": (clip_bound, [0.0, 1.0], "clarke", "sanitize"),
    "hypot-at-origin": (hypot_origin, [0.0, 0.0], "clarke", "sanitize"),
    "sort-tie": (sort_tie, [1.0, 1.0], None, "sanitize"),
    "sign-at-zero": (sign_zero, [0.0, 1.0], None, "sanitize"),
    "floor-round-at-jump": (floor_jump, [1.0, 0.5], None, "sanitize"),
    "where-at-boundary": (where_boundary, [0.0, 1.0], None, "sanitize"),
    "eigh-repeated-eigenvalues": (eigh_repeated, [1.0, 1.0], None, "sanitize"),
    "i0e-at-zero": (i0e_zero, [0.0, 1.0], None, "sanitize"),
    "det-at-singular": (det_singular, [1.0, 2.0], None, "explain"),
}  # fmt: skip
