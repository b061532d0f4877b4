"""The canonical op vocabulary and the classes of ops the transformations reason with.

Canonical op names are lax's primitive names where lax has the op (``sqrt``, ``integer_pow``,
``reduce_max``, ``convert_element_type``, ``select_and_scatter_add``), plus the names of ops
that are one function in a library but a composite in lax (``relu``, ``hypot``, ``xlogy``,
``norm``, ``std``, ``var``, ``logsumexp``, ``softmax``, ``det``), ``where`` (a select at the
boundary of the comparison that chose its branch: lax's ``select_n`` with the comparison's two
sides as operands) and ``trunc`` (a float -> integer ``convert_element_type``). A backend maps
its names onto these (``gradsan.jax._rules``, ``gradsan.torch._rules``) and nothing more.

Each class is a frozenset; they combine with ``|`` and ``-`` as checkify's error sets do.
"""

from __future__ import annotations

# Library functions that are one op in PyTorch (or in the catalog) but a composite in lax.
LIBRARY: frozenset[str] = frozenset(
    {
        "relu",
        "activation",  # PyTorch's fused piecewise activations (leaky_relu, elu, hardswish, ...)
        "hypot",
        "xlogy",
        "norm",
        "std",
        "var",
        "logsumexp",
        "softmax",
        "log_softmax",
        "det",
    }
)

# ---- where the value or the derivative is non-finite at a finite input --------------------

# Ops with a catalog entry of kind singular, pole, domain or overflow, and atan2 (0 / 0 at
# the origin); integer_pow only for a negative exponent (a backend checks the exponent).
SINGULAR: frozenset[str] = frozenset(
    {
        "sqrt",
        "rsqrt",
        "cbrt",
        "pow",
        "integer_pow",
        "div",
        "log",
        "log1p",
        "atan2",
        "acos",
        "asin",
        "atanh",
        "acosh",
        "tan",
        "exp",
        "expm1",
        "lgamma",
        "digamma",
        "erf_inv",
    }
)
# lax special functions that can be non-finite at a finite input but have no catalog entry
# (yet): a finding there says "not in the catalog".
SINGULAR_UNCATALOGUED: frozenset[str] = frozenset(
    {
        "exp2",
        "rem",
        "igamma",
        "igammac",
        "polygamma",
        "zeta",
        "bessel_i0e",
        "bessel_i1e",
        "regularized_incomplete_beta",
        "random_gamma_grad",
        "logistic",
    }
)
# Every op whose output (value or derivative) can be non-finite from finite inputs, but
# integer_pow (singular only for y < 0: test the exponent).
CAN_MAKE_NONFINITE: frozenset[str] = (SINGULAR | SINGULAR_UNCATALOGUED) - {"integer_pow"}

# Singular or non-smooth where the first operand is 0 (div's is its second: its denominator).
AT_ZERO: frozenset[str] = frozenset(
    {"sqrt", "rsqrt", "cbrt", "log", "pow", "integer_pow", "atan2", "abs", "sign"}
)
# Singular where |x| == 1 (acosh: x == 1).
AT_UNIT: frozenset[str] = frozenset({"acos", "asin", "atanh", "acosh"})

# ---- structure ------------------------------------------------------------------------------

# Elementwise ops f with f(0) == 0 exactly and one float operand (integer_pow for y > 0:
# test the exponent): a structural zero passes through them.
ZERO_TO_ZERO: frozenset[str] = frozenset(
    {
        "neg",
        "convert_element_type",
        "reduce_precision",
        "copy",
        "real",
        "imag",
        "conj",
        "sin",
        "tan",
        "tanh",
        "sinh",
        "asin",
        "atan",
        "asinh",
        "atanh",
        "expm1",
        "log1p",
        "abs",
        "sign",
        "sqrt",
        "cbrt",
        "erf",
        "erf_inv",
        "optimization_barrier",
    }
)

# Comparisons: a select on one is a kink (``where``) where its two sides are equal.
COMPARISONS: frozenset[str] = frozenset({"gt", "ge", "lt", "le", "eq", "ne"})

# ---- kinks, ties and jumps ------------------------------------------------------------------

# Piecewise selections, continuous at their kinks: at a tie the candidates agree in value, and
# when their tangents agree too every piece gives the same gradient.
CONTINUOUS_KINKS: frozenset[str] = frozenset(
    {
        "abs",
        "relu",
        "activation",
        "i0e",
        "max",
        "min",
        "clamp",
        "reduce_max",
        "reduce_min",
        "argmax",
        "argmin",
        "sort",
        "top_k",
        "cummax",
        "cummin",
        "reduce_window_max",
        "reduce_window_min",
    }
)
# Piecewise constant ops: they jump, so no (sub)gradient exists at the jump.
JUMPS: frozenset[str] = frozenset({"sign", "floor", "ceil", "round", "trunc"})
# Kinks whose tied candidates are functions of the inputs, so a tie can be trivial (the same
# function: the gradient is exact) or not.
TIES: frozenset[str] = CONTINUOUS_KINKS | JUMPS | {"where", "hypot"}
# Spectral kinks: a repeated eigenvalue (singular value).
SPECTRAL: frozenset[str] = frozenset({"eigh", "svd"})
# Every op with a kink, tie, jump or discontinuity entry in the catalog (atan2 at the origin).
KINKS: frozenset[str] = TIES | SPECTRAL | {"atan2"}

# Ties at the equality of two operands (clamp: x at a bound); with COMPARISONS, where too.
EQUALITY_TIES: frozenset[str] = frozenset({"max", "min", "clamp"})
# Reductions, sorts, scans and pooling whose extreme can be attained twice
# (select_and_scatter_add is max pooling's gradient: it ties where pooling does).
REDUCTION_TIES: frozenset[str] = frozenset(
    {
        "select_and_scatter_add",
        "reduce_max",
        "reduce_min",
        "argmax",
        "argmin",
        "sort",
        "top_k",
        "cummax",
        "cummin",
        "reduce_window_max",
        "reduce_window_min",
    }
)
# Roundings to a grid, piecewise constant: lax spells trunc as convert_element_type, and a
# rounding to a narrower float (reduce_precision) is one too.
ROUNDINGS: frozenset[str] = frozenset(
    {"floor", "ceil", "round", "convert_element_type", "reduce_precision"}
)
