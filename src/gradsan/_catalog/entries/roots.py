"""Square roots, powers and division.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _masks as m
from .._classify import Hit, first, hit, predicate, rule
from .._types import Fix, Singularity

SQRT_AT_ZERO = Singularity(
    id="sqrt-at-zero",
    op="sqrt",
    kind="singular",
    title="sqrt at 0: finite value, infinite slope",
    singular_set="x == 0 (and x < 0 is outside the domain: NaN)",
    derivative="d/dx sqrt(x) = 1 / (2 sqrt(x)), which is +inf at x = 0",
    subdifferential=None,
    conventions={
        "jax": "grad(jnp.sqrt)(0.) = inf; a zero gradient arriving makes 0 * inf = NaN",
        "torch": "SqrtBackward0 computes grad / (2 * sqrt(x)): 0 / 0 = NaN, 1 / 0 = inf",
    },
    explanation=(
        "sqrt is continuous at 0 but its slope there is infinite. The chain rule multiplies that "
        "infinite slope by the derivative of whatever feeds the sqrt or consumes it; when that "
        "other factor is exactly 0 (a squared difference at its minimum, a constant entry, "
        "A0 ** theta with A0 == 0) the product 0 * inf is NaN, even when the function as a "
        "whole is smooth and its true derivative is finite."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe sqrt: the same values, derivative 0 at 0 instead of inf.",
            "y = gradsan.jax.safe.sqrt(x)",
            "y = gradsan.torch.safe.sqrt(x)",
            rewrite="safe",
        ),
        Fix(
            "Guard it with the double-where trick (both branches stay finite):",
            "ok = x > 0\ny = jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0)",
            "ok = x > 0\ny = torch.where(ok, torch.sqrt(torch.where(ok, x, 1.0)), 0.0)",
            rewrite="double_where",
        ),
        Fix(
            "If x is a power, fold the root into the exponent: sqrt(a ** p) == a ** (p / 2).",
            "y = a ** (p / 2)",
            "y = a ** (p / 2)",
            rewrite="fold_pow",
        ),
    ),
    safe="sqrt",
    point={"x": 0.0},
)

SQRT_OF_NEGATIVE = Singularity(
    id="sqrt-of-negative",
    op="sqrt",
    kind="domain",
    title="sqrt of a negative number: NaN value and gradient",
    singular_set="x < 0 (also rsqrt(x) and x ** 0.5 for x < 0)",
    derivative="d/dx sqrt(x) = 1 / (2 sqrt(x)) has no real value for x < 0: NaN",
    conventions={
        "jax": "jnp.sqrt(-1.) = nan and its grad is nan; so are lax.rsqrt(-1.) and (-1.) ** 0.5",
        "torch": "torch.sqrt(-1.) = nan and SqrtBackward0 returns nan; so does RsqrtBackward0",
    },
    explanation=(
        "A real square root needs x >= 0. A tiny negative x is a rounding artefact upstream: a "
        "variance computed as mean(x**2) - mean(x)**2, a squared distance formed as "
        "|a|**2 + |b|**2 - 2 a.b, or 1 - cos(t)**2, each of which can come out one ulp below 0; "
        "a larger one is a real negative reaching a formula that assumes x >= 0. "
        "The NaN is in the forward value and in the gradient, and the unselected branch of a "
        "where does not hide the gradient's NaN."
    ),
    fixes=(
        Fix(
            "Clamp at 0 and use gradsan's safe sqrt (derivative 0 at 0 instead of inf):",
            "y = gradsan.jax.safe.sqrt(jnp.maximum(x, 0.0))",
            "y = gradsan.torch.safe.sqrt(torch.clamp(x, min=0.0))",
            rewrite="clamp_safe",
        ),
        Fix(
            "Compute the quantity in a form that cannot go negative:",
            "v = jnp.mean((x - jnp.mean(x)) ** 2)  # not jnp.mean(x**2) - jnp.mean(x)**2",
            "v = ((x - x.mean()) ** 2).mean()  # not (x**2).mean() - x.mean()**2",
        ),
    ),
    safe="sqrt",
    point={"x": -1.0},
)

RSQRT_AT_ZERO = Singularity(
    id="rsqrt-at-zero",
    op="rsqrt",
    kind="pole",
    title="rsqrt at 0: +inf value, -inf slope",
    singular_set="x == 0 (x < 0 is outside the domain: NaN, see sqrt-of-negative)",
    derivative="d/dx x**(-1/2) = -1 / (2 x**(3/2)), which is -inf at x = 0",
    conventions={
        "jax": "lax.rsqrt(0.) = inf; grad = -inf (NaN where the arriving gradient is 0)",
        "torch": "torch.rsqrt(0.) = inf; RsqrtBackward0 gives -inf",
    },
    explanation=(
        "rsqrt(x) = 1 / sqrt(x) has a pole at 0. It usually sits in a normalization, "
        "x * rsqrt(sum(x**2)) or (x - mean) * rsqrt(var), where an all-zero vector or a constant "
        "feature makes the argument exactly 0. Layer norms add eps inside the root for this reason."
    ),
    fixes=(
        Fix(
            "Add the epsilon inside the root, as layer norms do:",
            "y = jax.lax.rsqrt(x + 1e-6)",
            "y = torch.rsqrt(x + 1e-6)",
        ),
        Fix(
            "Use gradsan's safe rsqrt where a 0 is legitimate and masked later:",
            "y = gradsan.jax.safe.rsqrt(x)",
            "y = gradsan.torch.safe.rsqrt(x)",
            rewrite="safe",
        ),
    ),
    safe="rsqrt",
    point={"x": 0.0},
)

CBRT_AT_ZERO = Singularity(
    id="cbrt-at-zero",
    op="cbrt",
    kind="singular",
    title="cbrt at 0: finite value, infinite slope from both sides",
    singular_set="x == 0 (cbrt is real for x < 0; x ** (1/3) is not)",
    derivative="d/dx cbrt(x) = 1 / (3 cbrt(x)**2), which is +inf at x = 0 from both sides",
    conventions={
        "jax": "grad(jnp.cbrt)(0.) = inf; jnp.cbrt(-1.) = -1. with grad 1/3",
        "torch": "torch has no cbrt; x ** (1/3) gives grad inf at 0, and NaN value and grad for "
        "x < 0",
    },
    explanation=(
        "cbrt is continuous and odd, with an infinite slope at 0 from both sides. Whenever the "
        "gradient arriving at it, or the derivative of its argument, is 0 there, the chain rule "
        "forms 0 * inf = NaN: cbrt(x) ** 3 has derivative 1 at 0, and plain AD returns NaN. In "
        "PyTorch, x ** (1/3) adds a second trap: a negative x gives NaN, not the real cube root."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe cbrt: the same values, a finite derivative at 0:",
            "y = gradsan.jax.safe.cbrt(x)",
            "y = gradsan.torch.safe.cbrt(x)",
            rewrite="safe",
        ),
        Fix(
            "For x < 0 use the real cube root, not x ** (1/3) (still singular at 0):",
            "y = jnp.cbrt(x)",
            "y = torch.sign(x) * torch.abs(x) ** (1 / 3)",
        ),
    ),
    safe="cbrt",
    point={"x": 0.0},
)

POW_FRACTIONAL_AT_ZERO = Singularity(
    id="pow-fractional-at-zero",
    op="pow",
    kind="singular",
    title="x ** p with 0 < p < 1 at x = 0: finite value, infinite slope",
    singular_set=(
        "x == 0 with a fractional exponent 0 < p < 1 (and p == 0 in JAX, where x ** 0. is "
        "differentiated as 0 * 0 ** -1)"
    ),
    derivative="d/dx x**p = p x**(p - 1), which is +inf at x = 0 when 0 < p < 1",
    conventions={
        "jax": "grad(lambda x: x ** 0.5)(0.) = inf (also for 0.3); x ** 0. gives grad NaN at 0",
        "torch": "PowBackward0 gives inf at 0 for 0 < p < 1; x ** 0. gives grad 0",
    },
    explanation=(
        "A power with 0 < p < 1 behaves like sqrt at 0: continuous, with an infinite slope. When "
        "anything on the path multiplies that slope by 0 (a squared error at its minimum, a "
        "constant or masked entry) the product 0 * inf is NaN, although the function as a whole "
        "may be smooth. Powers compose: sqrt(a ** p) is a ** (p / 2), with one singular factor "
        "fewer."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe pow: the same values, a finite derivative at base 0:",
            "y = gradsan.jax.safe.pow(x, p)",
            "y = gradsan.torch.safe.pow(x, p)",
            rewrite="safe",
        ),
        Fix(
            "Guard the base with the double-where trick:",
            "ok = x > 0\ny = jnp.where(ok, jnp.where(ok, x, 1.0) ** p, 0.0)",
            "ok = x > 0\ny = torch.where(ok, torch.where(ok, x, 1.0) ** p, 0.0)",
            rewrite="double_where",
        ),
    ),
    safe="pow",
    point={"x": 0.0, "p": 0.5},
)

POW_NEGATIVE_AT_ZERO = Singularity(
    id="pow-negative-at-zero",
    op="pow",
    kind="pole",
    title="x ** p with p < 0 at x = 0: infinite value",
    singular_set=(
        "x == 0 with a negative float exponent p < 0 (x ** -k with a Python int is "
        "integer-pow-negative-at-zero)"
    ),
    derivative="d/dx x**p = p x**(p - 1), which is -inf at x = +0 for every p < 0",
    conventions={
        "jax": "0. ** -0.5 = inf with grad -inf; d/dp there is NaN",
        "torch": "0. ** -0.5 = inf; PowBackward0 gives -inf, PowBackward1 (d/dp) gives -inf",
    },
    explanation=(
        "A negative power is a reciprocal, x ** p == 1 / x ** -p, with a pole at 0: the value "
        "is inf and so is the slope. Inverse-distance weights, 1 / r**p potentials and inverse "
        "frequencies reach it when a distance or a count is exactly 0."
    ),
    fixes=(
        Fix(
            "Keep the base away from 0:",
            "y = jnp.maximum(x, 1e-6) ** p",
            "y = torch.clamp(x, min=1e-6) ** p",
        ),
        Fix(
            "Guard the base with the double-where trick and choose the value at 0:",
            "ok = x > 0\ny = jnp.where(ok, jnp.where(ok, x, 1.0) ** p, 0.0)",
            "ok = x > 0\ny = torch.where(ok, torch.where(ok, x, 1.0) ** p, 0.0)",
        ),
    ),
    point={"x": 0.0, "p": -0.5},
)

POW_NEGATIVE_BASE = Singularity(
    id="pow-negative-base",
    op="pow",
    kind="domain",
    title="x ** p with x < 0 and a non-integer p: NaN",
    singular_set=(
        "x < 0 with a non-integer exponent p (with an integer-valued float p the value is real, "
        "but d/dp x**p = x**p log(x) is still NaN)"
    ),
    derivative=(
        "x**p = exp(p log x) has no real value for x < 0 and non-integer p; "
        "d/dp x**p = x**p log(x) is NaN for every x < 0"
    ),
    conventions={
        "jax": "(-1.) ** 0.5 = nan with grad nan; (-2.) ** 2. = 4. with d/dx = -4. but d/dp = nan",
        "torch": "the same: nan and nan; (-2.) ** 2. = 4., PowBackward0 -4., PowBackward1 nan",
    },
    explanation=(
        "A real power of a negative number exists only for an integer exponent. With a float "
        "exponent the frameworks give NaN for a negative base, and when the exponent is itself "
        "trained, its gradient x**p log(x) is NaN for any negative x, even when p happens to be "
        "an integer. A base that should be non-negative but came out slightly negative (a "
        "difference of rounded terms) lands here too."
    ),
    fixes=(
        Fix(
            "If the base is signed on purpose, use the odd (sign-preserving) power:",
            "y = jnp.sign(x) * jnp.abs(x) ** p",
            "y = torch.sign(x) * torch.abs(x) ** p",
        ),
        Fix(
            "If the base must be >= 0, clamp it and use gradsan's safe pow:",
            "y = gradsan.jax.safe.pow(jnp.maximum(x, 0.0), p)",
            "y = gradsan.torch.safe.pow(torch.clamp(x, min=0.0), p)",
        ),
        Fix(
            "If the exponent only takes integer values, keep it a Python int (no exponent "
            "gradient):",
            "y = x ** 3",
            "y = x ** 3",
        ),
    ),
    safe="pow",
    point={"x": -1.0, "p": 1.5},
)

POW_EXPONENT_GRAD_AT_ZERO_BASE = Singularity(
    id="pow-exponent-grad-at-zero-base",
    op="pow",
    kind="singular",
    title="d/dp a ** p at a = 0: 0 * log(0)",
    singular_set="a == 0 in a ** p when the exponent p is differentiated",
    derivative=(
        "d/dp a**p = a**p log(a), which is 0 * -inf at a = 0. Its limit is 0 for p > 0 "
        "(0 ** p == 0 for every p > 0); for p <= 0 the power jumps and has no derivative in p"
    ),
    conventions={
        "jax": "d/dp jnp.power(0., p) = 0 for p >= 0 (JAX replaces log(0) by log(1) in that "
        "term), NaN for p < 0; jnp.exp(p * jnp.log(a)) gives NaN at a = 0",
        "torch": "PowBackward1 returns 0 where a == 0 and p >= 0, -inf for p < 0; "
        "torch.exp(p * torch.log(a)) gives NaN at a = 0",
    },
    explanation=(
        "The exponent's derivative has a factor log(a), which is -inf at a = 0, times a ** p, "
        "which is 0 there for p > 0. The true derivative is 0 for p > 0, and both frameworks "
        "special-case their power function so that it returns it. The NaN appears when "
        "the power is written by hand as exp(p * log(a)) (or in log-space code that does the "
        "same), and for p <= 0, where 0 ** p jumps from inf to 1 to 0. The Zygote thread's "
        "A0 .^ theta with a 0 in A0 differentiates through exactly this term."
    ),
    fixes=(
        Fix(
            "Write the power as a power, not as exp(p * log(a)):",
            "y = a ** p  # not jnp.exp(p * jnp.log(a))",
            "y = a ** p  # not torch.exp(p * torch.log(a))",
        ),
        Fix(
            "Use gradsan's safe pow, whose exponent gradient is 0 at base 0:",
            "y = gradsan.jax.safe.pow(a, p)",
            "y = gradsan.torch.safe.pow(a, p)",
            rewrite="safe",
        ),
    ),
    safe="pow",
)

INTEGER_POW_NEGATIVE_AT_ZERO = Singularity(
    id="integer-pow-negative-at-zero",
    op="integer_pow",
    kind="pole",
    title="x ** -k at x = 0: a pole of order k",
    singular_set="x == 0 with a negative integer exponent -k (x ** -2 with a Python int)",
    derivative="d/dx x**-k = -k x**(-k - 1), which is infinite at x = 0 (-inf at x = +0)",
    conventions={
        "jax": "0. ** -2 = inf (lax.integer_pow with y=-2); grad -inf",
        "torch": "0. ** -2 = inf; PowBackward0 gives -inf",
    },
    explanation=(
        "x ** -k is 1 / x ** k: the value and every derivative are infinite at 0. Even when the "
        "value is masked away afterwards, the backward pass multiplies the masked branch's 0 by "
        "the infinite slope and gets NaN."
    ),
    fixes=(
        Fix(
            "Divide with gradsan's safe div: `fill` (default 0) with gradient 0 where x ** k == 0:",
            "y = gradsan.jax.safe.div(1.0, x ** k)",
            "y = gradsan.torch.safe.div(1.0, x ** k)",
            rewrite="safe",
        ),
        Fix(
            "Guard the base with the double-where trick:",
            "ok = x != 0\ny = jnp.where(ok, jnp.where(ok, x, 1.0) ** -k, 0.0)",
            "ok = x != 0\ny = torch.where(ok, torch.where(ok, x, 1.0) ** -k, 0.0)",
        ),
    ),
    safe="div",
)

DIV_BY_ZERO = Singularity(
    id="div-by-zero",
    op="div",
    kind="pole",
    title="division by 0",
    singular_set="y == 0 in x / y",
    derivative="d/dy (x / y) = -x / y**2 and d/dx (x / y) = 1 / y, both infinite at y = 0",
    conventions={
        "jax": "x / 0 = +-inf (0 / 0 = NaN); its gradient is inf or NaN",
        "torch": "the same IEEE results; DivBackward0 divides by y again",
    },
    explanation=(
        "Division by an exact 0 gives +-inf (or NaN for 0 / 0). Even when the forward value is "
        "masked out afterwards (by a where), the backward pass still divides by y and the "
        "masked branch's gradient, 0 * inf, is NaN."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe div: x / y where y != 0, and `fill` (default 0) with gradient 0 "
            "where y == 0.",
            "z = gradsan.jax.safe.div(x, y)",
            "z = gradsan.torch.safe.div(x, y)",
            rewrite="safe",
        ),
        Fix(
            "Guard the denominator with the double-where trick:",
            "ok = y != 0\nz = jnp.where(ok, x / jnp.where(ok, y, 1.0), 0.0)",
            "ok = y != 0\nz = torch.where(ok, x / torch.where(ok, y, 1.0), 0.0)",
        ),
    ),
    safe="div",
    point={"x": 1.0, "y": 0.0},
)


# ---- which entry an op hit, in priority order (sets from _masks) ---------------------------

rule("sqrt", (SQRT_AT_ZERO, m.at_zero), (SQRT_OF_NEGATIVE, m.negative))
rule("rsqrt", (RSQRT_AT_ZERO, m.at_zero), (SQRT_OF_NEGATIVE, m.negative))
rule("cbrt", (CBRT_AT_ZERO, m.at_zero))
rule("integer_pow", (INTEGER_POW_NEGATIVE_AT_ZERO, m.negative_integer_power_at_zero))
rule("div", (DIV_BY_ZERO, m.second_at_zero, 1))

_POW = (
    (POW_NEGATIVE_BASE, m.pow_negative_base),
    (POW_NEGATIVE_AT_ZERO, m.pow_negative_at_zero),
    (POW_FRACTIONAL_AT_ZERO, m.pow_fractional_at_zero),
    (POW_EXPONENT_GRAD_AT_ZERO_BASE, m.pow_exponent_grad_at_zero_base),
)


@predicate("pow", entries=[e for e, _ in _POW])
def _pow(operands: Any, out: Any, params: Any) -> Hit | None:
    """operands: (base, exponent). ``params["exponent_grad"]`` says the exponent is
    differentiated (only then is a 0 base with p >= 1 a hit: the frameworks' own d/dp is 0)."""
    ops = np.broadcast_arrays(operands[0], operands[1])
    cases = _POW if params.get("exponent_grad") else _POW[:-1]
    return first(*(hit(e.id, fn(np, ops, params), operands) for e, fn in cases))


ENTRIES: tuple[Singularity, ...] = (
    SQRT_AT_ZERO,
    SQRT_OF_NEGATIVE,
    RSQRT_AT_ZERO,
    CBRT_AT_ZERO,
    POW_FRACTIONAL_AT_ZERO,
    POW_NEGATIVE_AT_ZERO,
    POW_NEGATIVE_BASE,
    POW_EXPONENT_GRAD_AT_ZERO_BASE,
    INTEGER_POW_NEGATIVE_AT_ZERO,
    DIV_BY_ZERO,
)
