"""PyTorch trigger programs of the conformance suite (see conformance_jax.py): ``TRIGGERS`` in
the same form; each function returns a scalar loss of its one argument."""

import torch

MASK = torch.tensor([False, True])


def sqrt_zero(x):
    return (torch.sqrt(x) * 0.0).sum()  # L:sqrt-at-zero


def sqrt_negative(x):
    return torch.sqrt(x - 1.0).sum()  # L:sqrt-of-negative


def rsqrt_zero(x):
    return torch.where(MASK, torch.rsqrt(x), 0.0).sum()  # L:rsqrt-at-zero


def pow_frac(x):
    return ((x**0.5) * 0.0).sum()  # L:pow-fractional-at-zero


def pow_negative_zero(x):
    return (x**-0.5).sum()  # L:pow-negative-at-zero


def pow_negative_base(x):
    return ((x - 2.0) ** 1.5).sum()  # L:pow-negative-base


def int_pow(x):
    return torch.where(MASK, x**-2, 0.0).sum()  # L:integer-pow-negative-at-zero


def div_zero(x):
    return torch.where(MASK, torch.ones_like(x) / x, 0.0).sum()  # L:div-by-zero


def log_zero(x):
    return torch.where(MASK, torch.log(x), 0.0).sum()  # L:log-at-zero


def log2_zero(x):
    return torch.where(MASK, torch.log2(x), 0.0).sum()  # L:log2-log10-at-zero


def exp_log(x):
    return torch.exp(2.0 * torch.log(x)).sum()  # L:exp-log-at-zero


def log_negative(x):
    return torch.log(x - 1.0).sum()  # L:log-of-negative


def log1p_minus_one(x):
    return torch.where(MASK, torch.log1p(x - 1.0), 0.0).sum()  # L:log1p-at-minus-one


def xlogy_zero(x):
    return torch.where(MASK, torch.xlogy(x, x), 0.0).sum()  # L:xlogy-at-zero


def atan2_origin(x):
    return torch.where(MASK, torch.atan2(x, x), 0.0).sum()  # L:atan2-at-origin


def acos_one(x):
    return (torch.acos(x + 1.0) * 0.0).sum()  # L:acos-at-one


def asin_one(x):
    return (torch.asin(x + 1.0) * 0.0).sum()  # L:asin-at-one


def atanh_one(x):
    return torch.where(MASK, torch.atanh(x), 0.0).sum()  # L:atanh-at-one


def acosh_one(x):
    return torch.acosh(x + 1.0).sum()  # L:acosh-at-one


def exp_overflow(x):
    return torch.exp(x + 100.0).sum()  # L:exp-overflow


def expm1_overflow(x):
    return torch.expm1(x + 100.0).sum()  # L:expm1-overflow


def lgamma_pole(x):
    return torch.lgamma(x).sum()  # L:lgamma-at-pole


def digamma_pole(x):
    return torch.digamma(x).sum()  # L:digamma-at-pole


def erf_inv_one(x):
    return torch.erfinv(x + 1.0).sum()  # L:erf-inv-at-one


def norm_zero(x):
    return torch.linalg.norm(torch.stack([x[0], x[0]]))  # L:norm-at-zero


def std_const(x):
    return torch.std(torch.stack([x[0], x[0]]), dim=0, keepdim=True)[0]  # L:std-of-constant


def var_one_sample(x):
    return torch.var(x[:1])  # L:var-of-constant


def float16_overflow(x):
    return torch.exp(x.half() + 12.0).sum()  # L:float16-overflow


def logsumexp_neg_inf(x):
    z = torch.where(torch.tensor([False, False]), x, -torch.inf)
    return torch.logsumexp(z, 0)  # L:logsumexp-all-neg-inf


def softmax_neg_inf(x):
    z = torch.where(torch.tensor([False, False]), x, -torch.inf)
    return torch.softmax(z, 0).sum()  # L:softmax-all-neg-inf


def where_trap(x):
    return torch.where(x > 1.0, torch.log(x), 0.0).sum()  # L:where-trap


def nonfinite_input(x):
    return (x * 2.0).sum()  # L:nonfinite-input


def abs_zero(x):
    return torch.abs(x).sum()  # L:abs-at-zero


def relu_zero(x):
    return torch.relu(x).sum()  # L:relu-at-zero


def max_tie(x):
    return torch.maximum(x[0], x[1])  # L:max-tie


def clip_bound(x):
    return torch.clamp(x, 0.0, 1.0).sum()  # L:clip-at-bound


def leaky_relu_corner(x):
    return torch.nn.functional.leaky_relu(x, 0.1).sum()  # L:activation-corner


def hardshrink_jump(x):
    return torch.nn.functional.hardshrink(x, 0.5).sum()  # L:activation-jump


def hypot_origin(x):
    return torch.hypot(x[0], x[1])  # L:hypot-at-origin


def sort_tie(x):
    return torch.sort(x).values[0] * 2.0  # L:sort-tie


def sign_zero(x):
    return (torch.sign(x) * x).sum()  # L:sign-at-zero


def floor_jump(x):
    return (torch.floor(x) * x).sum()  # L:floor-round-at-jump


def where_boundary(x):
    return torch.where(x > 0.0, x, 2.0 * x).sum()  # L:where-at-boundary


def eigh_repeated(x):
    return torch.linalg.eigh(torch.diag(x))[1][0, 0]  # L:eigh-repeated-eigenvalues


def det_singular(x):
    return torch.linalg.det(torch.outer(x, x))  # L:det-at-singular


TRIGGERS = {
    "sqrt-at-zero": (sqrt_zero, [0.0, 1.0], [0.0, 0.0], "explain"),
    "sqrt-of-negative": (sqrt_negative, [0.0, 2.0], None, "explain"),
    "rsqrt-at-zero": (rsqrt_zero, [0.0, 0.25], [0.0, -4.0], "explain"),
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
    "atan2-at-origin": (atan2_origin, [0.0, 1.0], [0.0, 0.0], "sanitize"),
    "acos-at-one": (acos_one, [0.0, -0.5], [0.0, 0.0], "explain"),
    "asin-at-one": (asin_one, [0.0, -0.5], [0.0, 0.0], "explain"),
    "atanh-at-one": (atanh_one, [1.0, 0.5], [0.0, 4.0 / 3.0], "explain"),
    "acosh-at-one": (acosh_one, [0.0, 1.0], None, "explain"),
    "exp-overflow": (exp_overflow, [0.0, -200.0], None, "explain"),
    "expm1-overflow": (expm1_overflow, [0.0, -200.0], None, "explain"),
    "lgamma-at-pole": (lgamma_pole, [0.0, 1.5], None, "explain"),
    "digamma-at-pole": (digamma_pole, [0.0, 1.5], None, "explain"),
    "erf-inv-at-one": (erf_inv_one, [0.0, -1.5], None, "explain"),
    "norm-at-zero": (norm_zero, [0.0, 1.0], "clarke", "sanitize"),
    "std-of-constant": (std_const, [0.0, 1.0], [0.0, 0.0], "sanitize"),
    "var-of-constant": (var_one_sample, [0.0, 1.0], None, "explain"),
    "float16-overflow": (float16_overflow, [0.0, -20.0], None, "explain"),
    "logsumexp-all-neg-inf": (logsumexp_neg_inf, [0.0, 1.0], None, "explain"),
    "softmax-all-neg-inf": (softmax_neg_inf, [0.0, 1.0], None, "explain"),
    "where-trap": (where_trap, [0.0, 2.0], [0.0, 0.5], "explain"),
    "nonfinite-input": (nonfinite_input, [float("nan"), 1.0], None, "explain"),
    "abs-at-zero": (abs_zero, [0.0, 0.0], "clarke", "sanitize"),
    "relu-at-zero": (relu_zero, [0.0, 0.0], "clarke", "sanitize"),
    "max-tie": (max_tie, [1.0, 1.0], "clarke", "sanitize"),
    "clip-at-bound": (clip_bound, [0.0, 1.0], "clarke", "sanitize"),
    "activation-corner": (leaky_relu_corner, [0.0, 1.0], None, "sanitize"),
    "activation-jump": (hardshrink_jump, [0.5, 1.0], None, "sanitize"),
    "hypot-at-origin": (hypot_origin, [0.0, 0.0], "clarke", "sanitize"),
    "sort-tie": (sort_tie, [1.0, 1.0], None, "sanitize"),
    "sign-at-zero": (sign_zero, [0.0, 1.0], None, "sanitize"),
    "floor-round-at-jump": (floor_jump, [1.0, 0.5], None, "sanitize"),
    "where-at-boundary": (where_boundary, [0.0, 1.0], None, "sanitize"),
    "eigh-repeated-eigenvalues": (eigh_repeated, [1.0, 1.0], None, "sanitize"),
    "det-at-singular": (det_singular, [1.0, 2.0], None, "sanitize"),
}  # fmt: skip


def sqrt_method(x):
    y = x.sqrt()  # L:sqrt-method
    return (y * 0.0).sum()


# programs beyond one per entry: marker -> (function, point, truth, tool, entry id)
EXTRA = {"sqrt-method": (sqrt_method, [0.0, 1.0], [0.0, 0.0], "explain", "sqrt-at-zero")}
