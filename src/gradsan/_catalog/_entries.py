"""The entries. Each constant is one singular or non-smooth operation; ids are stable.

To add an entry: write the constant, add it to ENTRIES, add its predicate in _classify.py,
point a fix at its safe function, regenerate docs/catalog.md (python tools/gen_catalog_doc.py),
and add a trigger program to tests/jax/test_catalog_triggers.py. README.md says what each field
holds; the conventions are measured (JAX 0.10.2, PyTorch 2.13, CPU), not guessed.
"""

from __future__ import annotations

from ._singularity import Fix, Singularity

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
        ),
        Fix(
            "Guard it with the double-where trick (both branches stay finite):",
            "ok = x > 0\ny = jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0)",
            "ok = x > 0\ny = torch.where(ok, torch.sqrt(torch.where(ok, x, 1.0)), 0.0)",
        ),
        Fix(
            "If x is a power, fold the root into the exponent: sqrt(a ** p) == a ** (p / 2).",
            "y = a ** (p / 2)",
            "y = a ** (p / 2)",
        ),
    ),
    safe="sqrt",
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
        "A real square root needs x >= 0. A negative x is almost always a rounding artefact "
        "upstream: a variance computed as mean(x**2) - mean(x)**2, a squared distance formed as "
        "|a|**2 + |b|**2 - 2 a.b, or 1 - cos(t)**2, each of which can come out one ulp below 0. "
        "The NaN is in the forward value and in the gradient, and the unselected branch of a "
        "where does not hide the gradient's NaN."
    ),
    fixes=(
        Fix(
            "Clamp at 0 and use gradsan's safe sqrt (derivative 0 at 0 instead of inf):",
            "y = gradsan.jax.safe.sqrt(jnp.maximum(x, 0.0))",
            "y = gradsan.torch.safe.sqrt(torch.clamp(x, min=0.0))",
        ),
        Fix(
            "Compute the quantity in a form that cannot go negative:",
            "v = jnp.mean((x - jnp.mean(x)) ** 2)  # not jnp.mean(x**2) - jnp.mean(x)**2",
            "v = ((x - x.mean()) ** 2).mean()  # not (x**2).mean() - x.mean()**2",
        ),
    ),
    safe="sqrt",
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
        ),
    ),
    safe="rsqrt",
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
        ),
        Fix(
            "For x < 0 use the real cube root, not x ** (1/3) (still singular at 0):",
            "y = jnp.cbrt(x)",
            "y = torch.sign(x) * torch.abs(x) ** (1 / 3)",
        ),
    ),
    safe="cbrt",
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
        ),
        Fix(
            "Guard the base with the double-where trick:",
            "ok = x > 0\ny = jnp.where(ok, jnp.where(ok, x, 1.0) ** p, 0.0)",
            "ok = x > 0\ny = torch.where(ok, torch.where(ok, x, 1.0) ** p, 0.0)",
        ),
    ),
    safe="pow",
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
        "special-case their power so that jnp.power and torch.pow return it. The NaN appears when "
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
        "masked out afterwards (jnp.where), the backward pass still divides by y and the "
        "masked branch's gradient, 0 * inf, is NaN."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe div: x / y where y != 0, and `fill` (default 0) with gradient 0 "
            "where y == 0.",
            "z = gradsan.jax.safe.div(x, y)",
            "z = gradsan.torch.safe.div(x, y)",
        ),
        Fix(
            "Guard the denominator with the double-where trick:",
            "ok = y != 0\nz = jnp.where(ok, x / jnp.where(ok, y, 1.0), 0.0)",
            "ok = y != 0\nz = torch.where(ok, x / torch.where(ok, y, 1.0), 0.0)",
        ),
    ),
    safe="div",
)

LOG_AT_ZERO = Singularity(
    id="log-at-zero",
    op="log",
    kind="pole",
    title="log at 0: -inf value, infinite slope",
    singular_set="x == 0 (x < 0 is outside the domain: NaN)",
    derivative="d/dx log(x) = 1 / x, which is +inf at x = 0",
    conventions={
        "jax": "log(0.) = -inf; grad is ct / x = inf (NaN where the arriving gradient is 0)",
        "torch": "log(0.) = -inf; LogBackward0 computes grad / x",
    },
    explanation=(
        "log has a pole at 0: the value is -inf and the slope 1 / x is infinite. A probability "
        "that underflowed to 0.0 (sigmoid(-800), softmax of a large negative logit) reaches it "
        "even though the real-valued log-probability is finite."
    ),
    fixes=(
        Fix(
            "Compute the log-probability directly instead of log of a probability:",
            "logp = jax.nn.log_sigmoid(z)    # not jnp.log(jax.nn.sigmoid(z))\n"
            "logp = jax.nn.log_softmax(z)    # not jnp.log(jax.nn.softmax(z))",
            "logp = torch.nn.functional.logsigmoid(z)\nlogp = torch.log_softmax(z, dim=-1)",
        ),
        Fix(
            "Use gradsan's safe log where a 0 is legitimate and masked later:",
            "y = gradsan.jax.safe.log(x)",
            "y = gradsan.torch.safe.log(x)",
        ),
    ),
    safe="log",
)

LOG_OF_NEGATIVE = Singularity(
    id="log-of-negative",
    op="log",
    kind="domain",
    title="log of a negative number: NaN",
    singular_set="x < 0 in log, log2 and log10 (x < -1 in log1p)",
    derivative="d/dx log(x) = 1 / x is finite there, but log(x) has no real value for x < 0: NaN",
    conventions={
        "jax": "jnp.log(-1.) = nan; its grad is -1.0 (1 / x, finite): the NaN travels in the value",
        "torch": "torch.log(-1.) = nan; LogBackward0 gives -1.0",
    },
    explanation=(
        "A logarithm's argument must be positive. Here the slope 1 / x stays finite, so the NaN "
        "is born in the forward value and reaches the gradient through whatever consumes it. "
        "Typical sources: a probability computed as a difference (1 - p rounding below 0), the "
        "log of a raw network output, a log-determinant through a matrix that lost "
        "positive-definiteness."
    ),
    fixes=(
        Fix(
            "Produce log-quantities directly (log_sigmoid, log_softmax) instead of log of a "
            "difference:",
            "log_q = jax.nn.log_sigmoid(-z)  # not jnp.log(1 - jax.nn.sigmoid(z))",
            "log_q = torch.nn.functional.logsigmoid(-z)",
        ),
        Fix(
            "Clamp an argument that must be >= 0 and use gradsan's safe log:",
            "y = gradsan.jax.safe.log(jnp.maximum(x, 0.0))",
            "y = gradsan.torch.safe.log(torch.clamp(x, min=0.0))",
        ),
    ),
    safe="log",
)

LOG1P_AT_MINUS_ONE = Singularity(
    id="log1p-at-minus-one",
    op="log1p",
    kind="pole",
    title="log1p at -1: -inf value, infinite slope",
    singular_set="x == -1 (x < -1 is outside the domain: NaN, see log-of-negative)",
    derivative="d/dx log1p(x) = 1 / (1 + x), which is +inf at x = -1",
    conventions={
        "jax": "jnp.log1p(-1.) = -inf; grad inf",
        "torch": "torch.log1p(-1.) = -inf; Log1PBackward0 gives inf",
    },
    explanation=(
        "log1p(x) = log(1 + x) inherits log's pole, at x = -1. It is reached as log1p(-p) for "
        "log(1 - p) with p == 1 (a saturated sigmoid, a probability rounded to 1.0), or as "
        "log1p(-exp(a)) with a == 0."
    ),
    fixes=(
        Fix(
            "Compute log(1 - sigmoid(z)) as log_sigmoid(-z), which never rounds to log(0):",
            "log_q = jax.nn.log_sigmoid(-z)  # not jnp.log1p(-jax.nn.sigmoid(z))",
            "log_q = torch.nn.functional.logsigmoid(-z)",
        ),
        Fix(
            "Use gradsan's safe log1p where a -1 is legitimate and masked later:",
            "y = gradsan.jax.safe.log1p(x)",
            "y = gradsan.torch.safe.log1p(x)",
        ),
    ),
    safe="log1p",
)

LOG2_AT_ZERO = Singularity(
    id="log2-at-zero",
    op="log2",
    kind="pole",
    title="log2 at 0: -inf value, infinite slope",
    singular_set="x == 0 (x < 0 is outside the domain: NaN, see log-of-negative)",
    derivative="d/dx log2(x) = 1 / (x ln 2), which is +inf at x = 0",
    conventions={
        "jax": "jnp.log2(0.) = -inf; grad inf",
        "torch": "torch.log2(0.) = -inf; Log2Backward0 gives inf",
    },
    explanation=(
        "log2 is log / ln 2 and shares log's pole at 0. The usual way in is an entropy in bits, "
        "p * log2(p), at a probability that is exactly 0: the product is NaN (0 * -inf) in the "
        "value and in the gradient."
    ),
    fixes=(
        Fix(
            "For entropy terms use xlogy, which is 0 at p == 0 (its slope there is still "
            "infinite):",
            "h = -jax.scipy.special.xlogy(p, p) / jnp.log(2.0)",
            "h = -torch.xlogy(p, p) / 0.6931471805599453",
        ),
        Fix(
            "Use gradsan's safe log where a 0 is legitimate and masked later:",
            "y = gradsan.jax.safe.log(x) / jnp.log(2.0)",
            "y = gradsan.torch.safe.log(x) / 0.6931471805599453",
        ),
    ),
    safe="log",
)

LOG10_AT_ZERO = Singularity(
    id="log10-at-zero",
    op="log10",
    kind="pole",
    title="log10 at 0: -inf value, infinite slope",
    singular_set="x == 0 (x < 0 is outside the domain: NaN, see log-of-negative)",
    derivative="d/dx log10(x) = 1 / (x ln 10), which is +inf at x = 0",
    conventions={
        "jax": "jnp.log10(0.) = -inf; grad inf",
        "torch": "torch.log10(0.) = -inf; Log10Backward0 gives inf",
    },
    explanation=(
        "log10 is log / ln 10 and shares log's pole at 0. Decibel losses, 10 * log10(power), "
        "reach it on a silent frame or an all-zero spectrogram bin."
    ),
    fixes=(
        Fix(
            "Put a floor under the power, as audio code does:",
            "db = 10.0 * jnp.log10(jnp.maximum(power, 1e-10))",
            "db = 10.0 * torch.log10(torch.clamp(power, min=1e-10))",
        ),
        Fix(
            "Use gradsan's safe log where a 0 is legitimate and masked later:",
            "y = gradsan.jax.safe.log(x) / jnp.log(10.0)",
            "y = gradsan.torch.safe.log(x) / 2.302585092994046",
        ),
    ),
    safe="log",
)

XLOGY_AT_ZERO = Singularity(
    id="xlogy-at-zero",
    op="xlogy",
    kind="singular",
    title="x * log(x) and xlogy(x, y) at 0: value 0 by continuity, infinite slope",
    singular_set="x == 0 and y == 0 in xlogy(x, y), which includes x * log(x) at x == 0",
    derivative=(
        "d/dx (x log x) = log(x) + 1, which is -inf at x = 0; for xlogy(x, y): d/dx = log(y) = "
        "-inf and d/dy = x / y = 0 / 0"
    ),
    conventions={
        "jax": "xlogy(0., 0.) = 0. with grads (-inf, nan); xlogy(x, x) and entr(x) at 0 give "
        "grad nan and inf; x * jnp.log(x) is nan in value and grad",
        "torch": "xlogy(0., 0.) = 0. with grads (0., nan) (XlogyBackward0); xlogy(x, x) at 0 "
        "gives nan, special.entr inf; x * torch.log(x) is nan in value and grad",
    },
    explanation=(
        "x log x tends to 0 as x -> 0+, so entropy and KL terms define it as 0 there, and "
        "xlogy returns that 0. The slope log(x) + 1 is still -inf: the value is fixed, the "
        "derivative is not. As a function of two variables xlogy(x, y) has no limit at (0, 0) at "
        "all (along y = exp(-1 / x) it is -1), so its 0 there is a convention. Written by hand, "
        "x * log(x) is 0 * -inf = NaN already in the forward value."
    ),
    fixes=(
        Fix(
            "For the entropy of a softmax, use log_softmax, which is smooth in the logits:",
            "h = -jnp.sum(jax.nn.softmax(z) * jax.nn.log_softmax(z))",
            "h = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)",
        ),
        Fix(
            "For x * log(x), use gradsan's safe xlogx: 0 at 0 and the true derivative -inf "
            "there, no 0 / 0:",
            "h = gradsan.jax.safe.xlogx(p)",
            "h = gradsan.torch.safe.xlogx(p)",
        ),
        Fix(
            "For x * log(y), use gradsan's safe xlogy:",
            "z = gradsan.jax.safe.xlogy(x, y)",
            "z = gradsan.torch.safe.xlogy(x, y)",
        ),
    ),
    safe="xlogy",
    library=("jax.scipy.special.xlogy", "jax.scipy.special.entr", "torch.special.entr"),
)

ATAN2_AT_ORIGIN = Singularity(
    id="atan2-at-origin",
    op="atan2",
    kind="discontinuity",
    title="atan2 at the origin: the angle of the zero vector",
    singular_set="y == 0 and x == 0 in atan2(y, x)",
    derivative=(
        "d atan2(y, x) = (x dy - y dx) / (x**2 + y**2): 0 / 0 at the origin, where every angle "
        "in (-pi, pi] is a limit of atan2"
    ),
    conventions={
        "jax": "jnp.arctan2(0., 0.) = 0.; grad (nan, nan)",
        "torch": "torch.atan2(0., 0.) = 0.; Atan2Backward0 gives (0., -0.), a finite number "
        "that is no derivative of anything",
    },
    explanation=(
        "The angle of the zero vector is undefined: arbitrarily close to the origin atan2 takes "
        "every value in (-pi, pi], so it is not even continuous there and no gradient or "
        "subgradient exists. atan2(0, 0) = 0 is a convention. It is reached by the phase of a "
        "complex number that is 0, the heading of a zero velocity, or an angle between "
        "coincident points."
    ),
    fixes=(
        Fix(
            "Guard the origin with the double-where trick and choose the angle there:",
            "ok = (x != 0) | (y != 0)\n"
            "theta = jnp.where(ok, jnp.arctan2(jnp.where(ok, y, 0.0), jnp.where(ok, x, 1.0)), 0.0)",
            "ok = (x != 0) | (y != 0)\n"
            "theta = torch.where(ok, torch.atan2(torch.where(ok, y, 0.0), "
            "torch.where(ok, x, 1.0)), 0.0)",
        ),
        Fix(
            "Use gradsan's safe atan2 (the same guard, gradient 0 at the origin):",
            "theta = gradsan.jax.safe.atan2(y, x)",
            "theta = gradsan.torch.safe.atan2(y, x)",
        ),
    ),
    safe="atan2",
)

ACOS_AT_ONE = Singularity(
    id="acos-at-one",
    op="acos",
    kind="singular",
    title="acos at +-1: finite value, infinite slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative="d/dx acos(x) = -1 / sqrt(1 - x**2), which is -inf at x = +-1 and NaN for |x| > 1",
    conventions={
        "jax": "grad(jnp.arccos)(1.) = -inf, also at -1.; jnp.arccos(2.) = nan with grad nan",
        "torch": "AcosBackward0 gives -inf at +-1; nan outside [-1, 1]",
    },
    explanation=(
        "acos is continuous on [-1, 1] with a vertical tangent at both ends. The angle between "
        "two vectors, acos(u . v / (|u| |v|)), reaches it whenever the vectors are parallel, and "
        "rounding can push the cosine one ulp past 1, which makes the value NaN too. acos(1 - "
        "x**2) is Lipschitz at x = 0 (it is about sqrt(2) |x|), yet AD gives 0 * inf = NaN."
    ),
    fixes=(
        Fix(
            "Clip the cosine strictly inside (-1, 1):",
            "theta = jnp.arccos(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "theta = torch.acos(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
        Fix(
            "Use gradsan's safe arccos (finite derivative at +-1):",
            "theta = gradsan.jax.safe.arccos(x)",
            "theta = gradsan.torch.safe.arccos(x)",
        ),
    ),
    safe="arccos",
)

ASIN_AT_ONE = Singularity(
    id="asin-at-one",
    op="asin",
    kind="singular",
    title="asin at +-1: finite value, infinite slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative="d/dx asin(x) = 1 / sqrt(1 - x**2), which is +inf at x = +-1 and NaN for |x| > 1",
    conventions={
        "jax": "grad(jnp.arcsin)(1.) = inf, also at -1.; jnp.arcsin(2.) = nan with grad nan",
        "torch": "AsinBackward0 gives inf at +-1; nan outside [-1, 1]",
    },
    explanation=(
        "asin is continuous on [-1, 1] with a vertical tangent at both ends. Latitudes, "
        "haversine distances (2 asin(sqrt(h)) with h rounding to 1 for antipodal points) and "
        "angles recovered from a sine reach it, and rounding past 1 makes the value NaN as well."
    ),
    fixes=(
        Fix(
            "Clip the argument strictly inside (-1, 1):",
            "a = jnp.arcsin(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "a = torch.asin(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
        Fix(
            "Use gradsan's safe arcsin (finite derivative at +-1):",
            "a = gradsan.jax.safe.arcsin(x)",
            "a = gradsan.torch.safe.arcsin(x)",
        ),
    ),
    safe="arcsin",
)

ATANH_AT_ONE = Singularity(
    id="atanh-at-one",
    op="atanh",
    kind="pole",
    title="atanh at +-1: infinite value and slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative="d/dx atanh(x) = 1 / (1 - x**2), which is +inf at x = +-1",
    conventions={
        "jax": "jnp.arctanh(1.) = inf, grad inf; jnp.arctanh(2.) = nan with a finite grad -1/3",
        "torch": "torch.atanh(1.) = inf; AtanhBackward0 gives inf; nan value outside [-1, 1]",
    },
    explanation=(
        "atanh maps (-1, 1) onto the real line, so its ends are poles. tanh-squashed policies "
        "that invert an action at the bound (log-probabilities in SAC), Fisher's z of a "
        "correlation of exactly 1, and Poincare-ball distances reach them; a float32 tanh "
        "already rounds to exactly 1.0 for inputs of about 10 and above."
    ),
    fixes=(
        Fix(
            "Clip the argument strictly inside (-1, 1):",
            "u = jnp.arctanh(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "u = torch.atanh(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
        Fix(
            "Use gradsan's safe arctanh where a +-1 is legitimate and masked later:",
            "u = gradsan.jax.safe.arctanh(x)",
            "u = gradsan.torch.safe.arctanh(x)",
        ),
    ),
    safe="arctanh",
)

ACOSH_AT_ONE = Singularity(
    id="acosh-at-one",
    op="acosh",
    kind="singular",
    title="acosh at 1: finite value, infinite slope",
    singular_set="x == 1 (x < 1 is outside the domain: NaN)",
    derivative="d/dx acosh(x) = 1 / sqrt(x**2 - 1), which is +inf at x = 1 and NaN for x < 1",
    conventions={
        "jax": "jnp.arccosh(1.) = 0., grad inf; jnp.arccosh(0.5) = nan with grad nan",
        "torch": "torch.acosh(1.) = 0.; AcoshBackward0 gives inf; nan below 1",
    },
    explanation=(
        "acosh starts at x = 1 with a vertical tangent, like sqrt at 0 (acosh(1 + t) is about "
        "sqrt(2 t)). Hyperbolic distances (the Lorentz model's acosh(-<u, v>)) reach it at "
        "distance 0, that is for a point and itself, and rounding can push the argument below 1."
    ),
    fixes=(
        Fix(
            "Keep the argument strictly above 1:",
            "d = jnp.arccosh(jnp.maximum(x, 1.0 + 1e-6))",
            "d = torch.acosh(torch.clamp(x, min=1.0 + 1e-6))",
        ),
        Fix(
            "Write acosh(1 + t) as log1p(t + sqrt(t (t + 2))) and use gradsan's safe sqrt:",
            "d = jnp.log1p(t + gradsan.jax.safe.sqrt(t * (t + 2.0)))",
            "d = torch.log1p(t + gradsan.torch.safe.sqrt(t * (t + 2.0)))",
        ),
    ),
)

TAN_AT_POLE = Singularity(
    id="tan-at-pole",
    op="tan",
    kind="pole",
    title="tan near pi/2 + k pi: an overflowing value and slope",
    singular_set=(
        "cos(x) == 0, x = pi/2 + k pi. No float is exactly there, so: |cos(x)| within a few "
        "ulps of 0, or a non-finite tan(x) from a finite x"
    ),
    derivative=(
        "d/dx tan(x) = 1 + tan(x)**2 = 1 / cos(x)**2, infinite at the pole; at the float nearest "
        "pi/2 it is 2.7e32 in float64, 5.2e14 in float32 and inf in float16"
    ),
    conventions={
        "jax": "jnp.tan(float32(pi/2)) = -2.29e7 with grad 5.23e14; in float16 tan = 2066. "
        "with grad inf",
        "torch": "the same: -2.29e7 and 5.23e14 in float32 (TanBackward0); grad inf in float16",
    },
    explanation=(
        "tan has poles where cos(x) = 0. In floating point an argument lands within an ulp of a "
        "pole rather than on it, so the value is huge but finite and the slope 1 + tan**2 is "
        "larger still: it overflows in float16, or a few operations later in float32. Angles "
        "that are free parameters (a learned slope angle, a field of view near 180 degrees) "
        "drift there."
    ),
    fixes=(
        Fix(
            "Bound the angle away from the pole:",
            "y = jnp.tan(jnp.clip(x, -1.5, 1.5))",
            "y = torch.tan(torch.clamp(x, -1.5, 1.5))",
        ),
        Fix(
            "Carry the ratio as a pair (sin, cos) and divide only where cos is safely nonzero:",
            "s, c = jnp.sin(x), jnp.cos(x)\n"
            "y = jnp.where(jnp.abs(c) > 1e-3, s / jnp.where(jnp.abs(c) > 1e-3, c, 1.0), 0.0)",
            "s, c = torch.sin(x), torch.cos(x)\n"
            "y = torch.where(c.abs() > 1e-3, s / torch.where(c.abs() > 1e-3, c, 1.0), 0.0)",
        ),
    ),
)

EXP_OVERFLOW = Singularity(
    id="exp-overflow",
    op="exp",
    kind="overflow",
    title="exp overflow: a finite input, an infinite value",
    singular_set=(
        "exp(x) beyond the largest float: x > 88.72 (float32), 709.78 (float64), 11.09 (float16)"
    ),
    derivative=(
        "d/dx exp(x) = exp(x): inf where the value overflowed, so an arriving 0 makes 0 * inf = NaN"
    ),
    conventions={
        "jax": "jnp.exp(float32(89.)) = inf, grad inf",
        "torch": "torch.exp(float32(89.)) = inf; ExpBackward0 gives grad * inf",
    },
    explanation=(
        "exp(x) is finite for every real x, but float32 holds it only up to x = 88.72. Softmax "
        "or logsumexp written by hand (exp(z) / sum(exp(z)) is then inf / inf = NaN), exp of an "
        "unconstrained log-variance or log-rate, and cosh/sinh of a large argument overflow "
        "this way."
    ),
    fixes=(
        Fix(
            "Stay in log space with logsumexp / log_softmax (they subtract the max first):",
            "lse = jax.nn.logsumexp(z)  # not jnp.log(jnp.sum(jnp.exp(z)))",
            "lse = torch.logsumexp(z, dim=-1)  # not torch.log(torch.exp(z).sum(-1))",
        ),
        Fix(
            "Bound the exponent of a free parameter:",
            "y = jnp.exp(jnp.minimum(x, 80.0))",
            "y = torch.exp(torch.clamp(x, max=80.0))",
        ),
    ),
)

EXPM1_OVERFLOW = Singularity(
    id="expm1-overflow",
    op="expm1",
    kind="overflow",
    title="expm1 overflow: a finite input, an infinite value",
    singular_set=(
        "expm1(x) beyond the largest float: x > 88.72 (float32), 709.78 (float64), 11.09 (float16)"
    ),
    derivative=(
        "d/dx expm1(x) = exp(x): inf where the value overflowed, so an arriving 0 makes "
        "0 * inf = NaN"
    ),
    conventions={
        "jax": "jnp.expm1(float32(89.)) = inf, grad inf",
        "torch": "torch.expm1(float32(89.)) = inf; Expm1Backward0 gives grad * inf",
    },
    explanation=(
        "expm1(x) = exp(x) - 1 is accurate near 0 and overflows exactly like exp for large x. "
        "It appears in softplus inverses, log1mexp-style code and ELU/SELU with a large "
        "argument on the wrong branch of a where."
    ),
    fixes=(
        Fix(
            "Bound the argument:",
            "y = jnp.expm1(jnp.minimum(x, 80.0))",
            "y = torch.expm1(torch.clamp(x, max=80.0))",
        ),
        Fix(
            "For the inverse softplus log(expm1(x)), switch to the identity for large x:",
            "big = x > 20.0\ny = jnp.where(big, x, jnp.log(jnp.expm1(jnp.where(big, 1.0, x))))",
            "big = x > 20.0\n"
            "y = torch.where(big, x, torch.log(torch.expm1(torch.where(big, 1.0, x))))",
        ),
    ),
)

FLOAT16_OVERFLOW = Singularity(
    id="float16-overflow",
    op="overflow",
    kind="overflow",
    title="overflow in float16/bfloat16 of a value that float32 holds",
    singular_set=(
        "a result beyond 65504 in magnitude (float16) or about 3.39e38 (bfloat16) from finite "
        "inputs, where the float32 result is finite"
    ),
    derivative=(
        "not a singularity of the function: the value is finite in exact arithmetic and in "
        "float32; gradients, often larger than the values, overflow first"
    ),
    conventions={
        "jax": "jnp.float16(300.) ** 2 = inf (grad 600.); jnp.exp(float16(12.)) = inf, grad inf",
        "torch": "the same IEEE results: float16 300. * 300. = inf, exp(float16 12.) = inf; "
        "bfloat16 keeps both finite (90112., 162816.)",
    },
    explanation=(
        "float16 holds magnitudes up to 65504 only. Activations, squared norms, attention "
        "logits, sums over long axes and especially gradients (multiplied by the loss scale) "
        "overflow there while float32 would hold them. bfloat16 has float32's range but 8 bits "
        "of precision, so it overflows only where float32 nearly does."
    ),
    fixes=(
        Fix(
            "Compute the sensitive reduction in float32 and cast back:",
            "y = jnp.sum(x.astype(jnp.float32) ** 2).astype(x.dtype)",
            "y = (x.float() ** 2).sum().to(x.dtype)",
        ),
        Fix(
            "Use bfloat16 (float32's range) instead of float16:",
            "x = x.astype(jnp.bfloat16)",
            "x = x.to(torch.bfloat16)",
        ),
    ),
)

LGAMMA_AT_POLE = Singularity(
    id="lgamma-at-pole",
    op="lgamma",
    kind="pole",
    title="lgamma at 0, -1, -2, ...: infinite value",
    singular_set="x a non-positive integer (0, -1, -2, ...), where Gamma has its poles",
    derivative="d/dx lgamma(x) = digamma(x), which has poles at the same points",
    conventions={
        "jax": "lax.lgamma(0.) = inf; grad nan (JAX's digamma(0.) is nan), also at -1., -2.",
        "torch": "torch.lgamma(0.) = inf; LgammaBackward0 gives -inf at 0 and nan at -1., -2.",
    },
    explanation=(
        "log|Gamma(x)| is +inf where Gamma has poles. Gamma, Beta, Dirichlet and "
        "negative-binomial likelihoods reach x = 0 when a concentration or count parameter that "
        "must be positive is produced by an unconstrained parameter or a ReLU."
    ),
    fixes=(
        Fix(
            "Keep the parameter positive with softplus and a floor:",
            "alpha = jax.nn.softplus(raw) + 1e-6",
            "alpha = torch.nn.functional.softplus(raw) + 1e-6",
        ),
    ),
)

DIGAMMA_AT_POLE = Singularity(
    id="digamma-at-pole",
    op="digamma",
    kind="pole",
    title="digamma at 0, -1, -2, ...: infinite value",
    singular_set="x a non-positive integer (0, -1, -2, ...)",
    derivative="d/dx digamma(x) = polygamma(1, x), which is +inf at the poles",
    conventions={
        "jax": "lax.digamma(0.) = nan (not inf), grad inf; digamma(-1.) = nan, grad inf",
        "torch": "torch.digamma(0.) = -inf, DigammaBackward0 inf; digamma(-1.) = nan with a "
        "huge finite grad (6.6e32 in float64)",
    },
    explanation=(
        "digamma, the derivative of lgamma, has poles at the non-positive integers. It appears "
        "in the gradient of every Gamma/Beta/Dirichlet log-likelihood and in their KL "
        "divergences, and is reached when a concentration parameter that must be positive "
        "hits 0."
    ),
    fixes=(
        Fix(
            "Keep the parameter positive with softplus and a floor:",
            "alpha = jax.nn.softplus(raw) + 1e-6",
            "alpha = torch.nn.functional.softplus(raw) + 1e-6",
        ),
    ),
)

ERF_INV_AT_ONE = Singularity(
    id="erf-inv-at-one",
    op="erf_inv",
    kind="pole",
    title="erf_inv at +-1: infinite value and slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative=("d/dx erfinv(x) = sqrt(pi) / 2 * exp(erfinv(x)**2), which is +inf at x = +-1"),
    conventions={
        "jax": "lax.erf_inv(1.) = inf, grad inf; erf_inv(2.) = nan with grad nan",
        "torch": "torch.erfinv(1.) = inf; ErfinvBackward0 gives inf; nan outside [-1, 1]",
    },
    explanation=(
        "erfinv maps (-1, 1) onto the real line. The Gaussian quantile "
        "sqrt(2) erfinv(2 u - 1) reaches the poles for u = 0 or 1: a uniform sample rounded to "
        "an endpoint, or a probit link at a saturated probability."
    ),
    fixes=(
        Fix(
            "Clip the argument strictly inside (-1, 1):",
            "z = jax.lax.erf_inv(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "z = torch.erfinv(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
    ),
)

NORM_AT_ZERO = Singularity(
    id="norm-at-zero",
    op="norm",
    kind="kink",
    title="norm at the zero vector: a cone, no gradient",
    singular_set="x == 0 (every element) in norm(x) = sqrt(sum(x**2))",
    derivative=(
        "d/dx |x| = x / |x|: 0 / 0 at x = 0. Inside, AD forms sqrt'(0) = inf times "
        "d(sum(x**2)) = 2 x = 0"
    ),
    subdifferential="the unit ball {g : |g| <= 1}; 0 is its minimum-norm element",
    conventions={
        "jax": "grad(jnp.linalg.norm)(zeros(2)) = [nan, nan] (vector_norm and matrix norms too)",
        "torch": "torch.linalg.norm and torch.norm give [0., 0.] at 0 "
        "(LinalgVectorNormBackward0 masks it); F.normalize(zeros) gives 1e12 (1 / eps)",
    },
    explanation=(
        "The Euclidean norm is Lipschitz everywhere, with a cone point at 0 where every vector "
        "of the unit ball is a subgradient. JAX differentiates it as sqrt(sum(x**2)) and meets "
        "0 * inf = NaN; PyTorch returns the subgradient 0. Distances between identical points, "
        "the norm of a zero update or embedding, and normalize(x) = x / |x| reach it."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe norm: the same values, gradient 0 at 0 (a valid subgradient):",
            "r = gradsan.jax.safe.norm(x)",
            "r = gradsan.torch.safe.norm(x)",
        ),
        Fix(
            "Normalize with gradsan's safe normalize (0 maps to 0 with a finite gradient):",
            "u = gradsan.jax.safe.normalize(x)",
            "u = gradsan.torch.safe.normalize(x)",
        ),
        Fix(
            "Guard the sum of squares with the double-where trick:",
            "sq = jnp.sum(x ** 2)\nok = sq > 0\nr = jnp.where(ok, jnp.sqrt(jnp.where(ok, sq, 1.0)), 0.0)",
            "sq = (x ** 2).sum()\nok = sq > 0\nr = torch.where(ok, torch.sqrt(torch.where(ok, sq, 1.0)), 0.0)",
        ),
    ),
    safe="norm",
    library=(
        "jax.numpy.linalg.norm",
        "jax.numpy.linalg.vector_norm",
        "jax.numpy.linalg.matrix_norm",
        "torch.linalg.norm",
        "torch.linalg.vector_norm",
        "torch.norm",
    ),
)

STD_OF_CONSTANT = Singularity(
    id="std-of-constant",
    op="std",
    kind="kink",
    title="std of a constant: a cone at 0, NaN gradient in JAX",
    singular_set="all elements equal along the reduced axes (std == 0)",
    derivative=(
        "d/dx std(x) = (x - mean) / ((n - ddof) std): 0 / 0 when std == 0. Inside, AD forms "
        "sqrt'(0) = inf times d var = 2 (x - mean) / (n - ddof) = 0"
    ),
    subdifferential=(
        "{P g / sqrt(n - ddof) : |g| <= 1} with P = I - 1 1^T / n (centering); 0 is its "
        "minimum-norm element"
    ),
    conventions={
        "jax": "grad(jnp.std)(ones(3)) = [nan, nan, nan]; (x - mean) / (std + eps) gives NaN too",
        "torch": "StdBackward0 returns 0 where std == 0: grad [0., 0., 0.], and "
        "(x - mean) / (std + eps) gets 0",
    },
    explanation=(
        "std(x) = |x - mean| / sqrt(n - ddof) is Lipschitz with a cone point where all elements "
        "are equal, like a norm at 0. Normalizing by (std + eps), as in the Flux thread, has a "
        "finite true derivative there (the numerator is 0 too and eps keeps the denominator "
        "away from 0), yet JAX's std gradient is 0 * inf = NaN and it reaches every input. "
        "Constant features, padded rows, a batch of one repeated sample, or a dead channel "
        "hit it."
    ),
    fixes=(
        Fix(
            "Normalize with sqrt(var + eps), as layer and batch norms do (smooth at var == 0):",
            "y = (x - jnp.mean(x)) / jnp.sqrt(jnp.var(x) + 1e-5)",
            "y = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-5)",
        ),
        Fix(
            "Use gradsan's safe std: the same values, gradient 0 where std == 0:",
            "s = gradsan.jax.safe.std(x)",
            "s = gradsan.torch.safe.std(x)",
        ),
    ),
    safe="std",
    library=("jax.numpy.std", "jax.numpy.nanstd", "torch.std", "torch.std_mean"),
)

VAR_OF_CONSTANT = Singularity(
    id="var-of-constant",
    op="var",
    kind="singular",
    title="var of a constant (or of too few samples): a 0 fed to sqrt or a division",
    singular_set=(
        "all elements equal along the reduced axes (var == 0) where sqrt(var) or 1 / var "
        "follows; or n - ddof <= 0 (one sample with ddof=1, PyTorch's default)"
    ),
    derivative=(
        "d/dx var(x) = 2 (x - mean) / (n - ddof): 0 at a constant x (var itself is smooth), "
        "0 / 0 when n - ddof == 0"
    ),
    conventions={
        "jax": "grad(jnp.var)(ones(3)) = [0., 0., 0.]; jnp.var(x, ddof=1) of one element = nan, "
        "grad nan",
        "torch": "VarBackward0 gives [0., 0., 0.]; torch.var of one element (unbiased by "
        "default) = nan with a warning, grad nan",
    },
    explanation=(
        "var is a quadratic, smooth everywhere, and its gradient at a constant input is simply "
        "0. The NaN comes from what follows it: sqrt(var) (see std-of-constant), rsqrt(var) or "
        "1 / var without an eps, all singular at 0. Separately, the unbiased estimator divides "
        "by n - ddof, which is 0 / 0 for a single sample."
    ),
    fixes=(
        Fix(
            "Add eps inside the root before dividing:",
            "y = (x - jnp.mean(x)) * jax.lax.rsqrt(jnp.var(x) + 1e-5)",
            "y = (x - x.mean()) * torch.rsqrt(x.var(unbiased=False) + 1e-5)",
        ),
        Fix(
            "For a single sample use the population variance (ddof=0):",
            "v = jnp.var(x)  # ddof=0",
            "v = x.var(unbiased=False)",
        ),
        Fix(
            "Use gradsan's safe var:",
            "v = gradsan.jax.safe.var(x)",
            "v = gradsan.torch.safe.var(x)",
        ),
    ),
    safe="var",
    library=("jax.numpy.var", "jax.numpy.nanvar", "torch.var", "torch.var_mean"),
)

LOGSUMEXP_ALL_NEG_INF = Singularity(
    id="logsumexp-all-neg-inf",
    op="logsumexp",
    kind="pole",
    title="logsumexp of an all -inf row: -inf value, NaN gradient",
    singular_set="every element along the reduced axes is -inf (a fully masked row)",
    derivative=(
        "d/dx_i logsumexp(x) = exp(x_i - logsumexp(x)) = softmax(x)_i: exp(-inf - (-inf)) = "
        "exp(nan) on an all -inf row"
    ),
    conventions={
        "jax": "jax.nn.logsumexp([-inf, -inf]) = -inf; grad [nan, nan] (jax.scipy too)",
        "torch": "torch.logsumexp([-inf, -inf]) = -inf; LogsumexpBackward0 gives [nan, nan]",
    },
    explanation=(
        "Masking with -inf is exact as long as one element per row survives. A row with every "
        "element masked (a padded query in attention, an impossible path in a CTC or CRF "
        "lattice, a mixture with every weight -inf) has logsumexp = log(0) = -inf and its "
        "gradient is the softmax of the row, -inf - (-inf) = NaN."
    ),
    fixes=(
        Fix(
            "Mask with the most negative finite number instead of -inf:",
            "z = jnp.where(mask, z, jnp.finfo(z.dtype).min)",
            "z = z.masked_fill(~mask, torch.finfo(z.dtype).min)",
        ),
        Fix(
            "Pass the mask to gradsan's safe logsumexp: -inf on a fully masked row, gradient 0:",
            "lse = gradsan.jax.safe.logsumexp(z, axis=-1, where=mask)",
            "lse = gradsan.torch.safe.logsumexp(z, axis=-1, where=mask)",
        ),
    ),
    safe="logsumexp",
    library=("jax.nn.logsumexp", "jax.scipy.special.logsumexp", "torch.logsumexp"),
)

SOFTMAX_ALL_NEG_INF = Singularity(
    id="softmax-all-neg-inf",
    op="softmax",
    kind="domain",
    title="softmax of an all -inf row: NaN value and gradient",
    singular_set="every element along the softmax axis is -inf (a fully masked row)",
    derivative=(
        "softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x): with max x = -inf every term "
        "is exp(nan); softmax has no value there, so there is nothing to differentiate"
    ),
    conventions={
        "jax": "jax.nn.softmax([-inf, -inf]) = [nan, nan], grad nan (log_softmax too); "
        "softmax(z, where=mask) with nothing selected gives 0. and grad 0.",
        "torch": "torch.softmax and torch.log_softmax of [-inf, -inf] = [nan, nan]; "
        "SoftmaxBackward0 and LogSoftmaxBackward0 give nan",
    },
    explanation=(
        "softmax normalizes by the sum of the row, which is 0 when every logit is -inf: 0 / 0. "
        "It happens in attention when a query has every key masked (padding, a causal mask "
        "shifted by one), and the NaN then spreads through the whole batch in the backward pass."
    ),
    fixes=(
        Fix(
            "Pass the mask to softmax (JAX), or mask with the most negative finite number:",
            "p = jax.nn.softmax(z, where=mask)",
            "p = torch.softmax(z.masked_fill(~mask, torch.finfo(z.dtype).min), dim=-1)",
        ),
        Fix(
            "Pass the mask to gradsan's safe softmax / log_softmax: a fully masked row gets "
            "gradient 0, no NaN:",
            "p = gradsan.jax.safe.softmax(z, where=mask)\n"
            "logp = gradsan.jax.safe.log_softmax(z, where=mask)",
            "p = gradsan.torch.safe.softmax(z, where=mask)\n"
            "logp = gradsan.torch.safe.log_softmax(z, where=mask)",
        ),
    ),
    safe="softmax",
    library=(
        "jax.nn.softmax",
        "jax.nn.log_softmax",
        "torch.softmax",
        "torch.log_softmax",
        "torch.nn.functional.softmax",
        "torch.nn.functional.log_softmax",
    ),
)

ABS_AT_ZERO = Singularity(
    id="abs-at-zero",
    op="abs",
    kind="kink",
    title="abs at 0: a corner; the gradient is a convention",
    singular_set="x == 0",
    derivative="d/dx |x| = sign(x): -1 left of 0, +1 right of 0; no derivative at 0",
    subdifferential="[-1, 1]",
    conventions={
        "jax": "grad(jnp.abs)(0.) = 1.0",
        "torch": "AbsBackward0 gives sign(0.) = 0.0",
    },
    explanation=(
        "|x| is Lipschitz with a corner at 0, where every value in [-1, 1] is a valid "
        "subgradient. The two frameworks pick different ones, so the same model trains "
        "differently wherever an |x| sits exactly at 0: L1 penalties on weights initialized or "
        "pruned to 0, |a - b| losses at a perfect fit. The same function written as sqrt(x**2) "
        "gives NaN instead (0 * inf)."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe abs for one documented subgradient in both frameworks:",
            "y = gradsan.jax.safe.abs(x)",
            "y = gradsan.torch.safe.abs(x)",
        ),
        Fix(
            "Where a derivative at 0 matters, smooth the corner (pseudo-Huber):",
            "y = jnp.sqrt(x ** 2 + 1e-12) - 1e-6",
            "y = torch.sqrt(x ** 2 + 1e-12) - 1e-6",
        ),
    ),
    safe="abs",
)

RELU_AT_ZERO = Singularity(
    id="relu-at-zero",
    op="relu",
    kind="kink",
    title="relu at 0: a corner; the gradient is a convention",
    singular_set="x == 0",
    derivative="d/dx max(x, 0) = 0 for x < 0, 1 for x > 0; no derivative at 0",
    subdifferential="[0, 1]",
    conventions={
        "jax": "grad(jax.nn.relu)(0.) = 0.0 (a custom_jvp); jnp.maximum(x, 0.) gives 0.5 at 0",
        "torch": "ReluBackward0 gives 0.0; torch.clamp(x, min=0.) gives 1.0; "
        "torch.maximum(x, zeros) gives 0.5",
    },
    explanation=(
        "relu is Lipschitz with a corner at 0, where every value in [0, 1] is a valid "
        "subgradient. Both frameworks choose 0 for relu itself, but equivalent spellings choose "
        "differently (0.5 for maximum, 1 for clamp), and relu(x) - relu(-x) = x gets derivative "
        "0 at 0 instead of 1. Exact zeros are common: zero-initialized biases, quantized or "
        "integer-valued inputs."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe maximum for one documented tie rule in both frameworks:",
            "y = gradsan.jax.safe.maximum(x, 0.0)",
            "y = gradsan.torch.safe.maximum(x, 0.0)",
        ),
    ),
    safe="maximum",
    library=("jax.nn.relu", "torch.relu", "torch.nn.functional.relu"),
)

MAX_TIE = Singularity(
    id="max-tie",
    op="max",
    kind="kink",
    title="max/min at a tie: the gradient is split by convention",
    singular_set=(
        "maximum(x, y) or minimum(x, y) with x == y; max, min, argmax or argmin with two or "
        "more equal extreme elements (sort and top_k: sort-tie)"
    ),
    derivative=(
        "d/dx max(x, y) = 1 if x > y, 0 if x < y; none at x == y. A reduction's gradient is the "
        "indicator of the maximal element, undefined when it is not unique"
    ),
    subdifferential=(
        "the convex hull of the tied pieces: {(t, 1 - t) : t in [0, 1]} for maximum(x, y); "
        "any convex combination over the tied elements for a reduction"
    ),
    conventions={
        "jax": "jnp.maximum(1., 1.) gives (0.5, 0.5); jnp.max([1., 1., 0.]) gives "
        "[0.5, 0.5, 0.]; argmax picks the first index",
        "torch": "MaximumBackward0 gives (0.5, 0.5); torch.max(x) and torch.amax give "
        "[0.5, 0.5, 0.]; torch.max(x, dim=0) gives [1., 0., 0.] (the index it returns)",
    },
    explanation=(
        "max is Lipschitz, with a kink wherever two candidates tie. Every convex combination of "
        "the tied elements' gradients is a valid subgradient; the frameworks split evenly for "
        "max/amax and give everything to one index for max(dim=...), sort and argmax-based "
        "gathers. Ties are common with ReLU outputs (many exact zeros), max-pooling over a flat "
        "region, quantized values and padding."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe maximum for one documented tie rule in both frameworks:",
            "z = gradsan.jax.safe.maximum(x, y)",
            "z = gradsan.torch.safe.maximum(x, y)",
        ),
        Fix(
            "Where ties are expected and a smooth gradient helps, use a soft maximum "
            "(temperature t):",
            "z = t * jax.nn.logsumexp(jnp.stack([x, y]) / t, axis=0)",
            "z = t * torch.logsumexp(torch.stack([x, y]) / t, dim=0)",
        ),
    ),
    safe="maximum",
    library=(
        "jax.numpy.max",
        "jax.numpy.amax",
        "jax.numpy.min",
        "jax.numpy.amin",
        "jax.numpy.argmax",
        "jax.numpy.argmin",
        "torch.max",
        "torch.amax",
        "torch.min",
        "torch.amin",
    ),
)

SORT_TIE = Singularity(
    id="sort-tie",
    op="sort",
    kind="kink",
    title="sort/top_k with tied values: the gradient goes to one index by convention",
    singular_set="two or more equal values along the sorted axis (for top_k, among the top k)",
    derivative=(
        "each sorted output is one input's value, so its gradient is the indicator of that "
        "input; with a tie, which input is a convention"
    ),
    subdifferential=(
        "for each order statistic: the convex hull of the indicators of the tied inputs"
    ),
    conventions={
        "jax": "jnp.sort([3., 1., 3., 2.])[-1] sends the gradient to index 2 (the later 3.); "
        "lax.top_k(x, 1) to index 0",
        "torch": "torch.sort gives index 2 as well; torch.topk(x, 1) index 0",
    },
    explanation=(
        "Sorting is Lipschitz: each order statistic is piecewise one of the inputs, with kinks "
        "where two inputs tie. Every convex combination of the tied inputs' indicators is a "
        "valid subgradient; sort and top_k give the whole gradient to the index they returned, "
        "so which of the tied inputs learns depends on the sorting algorithm. Ranking losses, "
        "trimmed means and top-k routing over quantized or saturated scores hit it."
    ),
    fixes=(
        Fix(
            "If only the extreme value matters, use max, which splits the gradient over ties:",
            "m = jnp.max(x, axis=-1)",
            "m = torch.amax(x, dim=-1)",
        ),
    ),
    library=("jax.numpy.sort", "jax.lax.top_k", "torch.sort", "torch.topk"),
)

DET_AT_SINGULAR = Singularity(
    id="det-at-singular",
    op="det",
    kind="pole",
    title="det/slogdet of a singular matrix: log|det| = -inf; PyTorch's det gradient is 0",
    singular_set="det(A) == 0: a rank-deficient square matrix",
    derivative=(
        "d det(A) = adj(A)^T, finite everywhere (det is a polynomial); d log|det A| = A^-T, "
        "infinite at det == 0"
    ),
    conventions={
        "jax": "grad(jnp.linalg.det) at [[1, 2], [2, 4]] = adj^T = [[4, -2], [-2, 1]], right; "
        "slogdet's log|det| gradient there is +-inf or nan",
        "torch": "LinalgDetBackward0 returns [[0, 0], [0, 0]] at [[1, 2], [2, 4]], a wrong "
        "finite gradient (adj^T is [[4, -2], [-2, 1]]); LinalgSlogdetBackward0 gives +-inf or nan",
    },
    explanation=(
        "det is a polynomial in the entries, so its gradient adj(A)^T exists everywhere, also "
        "at a singular matrix; PyTorch computes it through the inverse and returns 0 when the "
        "matrix is exactly singular, which is not the derivative. log|det A| is a pole there: "
        "Gaussian log-densities, normalizing flows and volume terms reach it when a covariance "
        "or Jacobian loses rank."
    ),
    fixes=(
        Fix(
            "Add jitter so the matrix stays positive definite, and use slogdet:",
            "sign, logdet = jnp.linalg.slogdet(a + 1e-6 * jnp.eye(a.shape[-1]))",
            "sign, logdet = torch.linalg.slogdet(a + 1e-6 * torch.eye(a.shape[-1]))",
        ),
        Fix(
            "Parameterize a covariance by a Cholesky factor with a positive diagonal:",
            "logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))",
            "logdet = 2.0 * torch.log(torch.diagonal(chol)).sum()",
        ),
    ),
    library=(
        "jax.numpy.linalg.det",
        "jax.numpy.linalg.slogdet",
        "torch.det",
        "torch.linalg.det",
        "torch.linalg.slogdet",
        "torch.logdet",
    ),
)

CLIP_AT_BOUND = Singularity(
    id="clip-at-bound",
    op="clamp",
    kind="kink",
    title="clip at a bound: a corner; the gradient is a convention",
    singular_set="x == lo or x == hi in clip(x, lo, hi)",
    derivative="d/dx clip(x, lo, hi) = 1 strictly inside (lo, hi), 0 outside; none at a bound",
    subdifferential="[0, 1] for x (the bound that is hit gets the rest, 1 - t)",
    conventions={
        "jax": "grad(lambda x: jnp.clip(x, 0., 1.)) at 0. and at 1. = 0.5 (clip is max then "
        "min: a tie split); lax.clamp gives 0.0 at both bounds",
        "torch": "ClampBackward1 gives 1.0 at both bounds (the bound counts as inside)",
    },
    explanation=(
        "clip is Lipschitz with corners at both bounds, where every value in [0, 1] is a valid "
        "subgradient. JAX's jnp.clip splits the tie (0.5), lax.clamp gives 0 and PyTorch gives "
        "1, so a value sitting exactly on a bound (a probability clipped to [0, 1] that is 0.0, "
        "a clipped action at its limit) gets a different gradient in each."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe clip for one documented rule in both frameworks:",
            "y = gradsan.jax.safe.clip(x, lo, hi)",
            "y = gradsan.torch.safe.clip(x, lo, hi)",
        ),
    ),
    safe="clip",
    library=("jax.numpy.clip", "torch.clamp", "torch.clip"),
)

SIGN_AT_ZERO = Singularity(
    id="sign-at-zero",
    op="sign",
    kind="discontinuity",
    title="sign at 0: a jump; the gradient is 0 by convention",
    singular_set="x == 0",
    derivative="0 for x != 0; sign jumps from -1 to 1 at 0 and has no derivative there",
    conventions={
        "jax": "grad(jnp.sign)(0.) = 0.0, and 0.0 everywhere else",
        "torch": "SignBackward0 gives 0.0 everywhere, including 0",
    },
    explanation=(
        "AD differentiates sign as 0 everywhere, including at the jump, where 0 is no "
        "subgradient of anything: the function is discontinuous. A loss that depends on x only "
        "through sign(x) therefore gets no gradient at all, and at x = 0 the value sign(0) = 0 "
        "is a third convention. Straight-through estimators replace the derivative on purpose."
    ),
    fixes=(
        Fix(
            "For a surrogate gradient, use a straight-through estimator:",
            "y = x + jax.lax.stop_gradient(jnp.sign(x) - x)",
            "y = x + (torch.sign(x) - x).detach()",
        ),
        Fix(
            "For a smooth sign, use tanh with a temperature t:",
            "y = jnp.tanh(x / t)",
            "y = torch.tanh(x / t)",
        ),
    ),
)

FLOOR_ROUND_AT_JUMP = Singularity(
    id="floor-round-at-jump",
    op="floor",
    kind="discontinuity",
    title="floor/ceil/round at a jump: a step; the gradient is 0 by convention",
    singular_set="x an integer for floor and ceil; x a half-integer (k + 0.5) for round",
    derivative="0 between the jumps; no derivative at a jump",
    conventions={
        "jax": "grad of jnp.floor, jnp.ceil and jnp.round = 0.0 everywhere, including the jumps",
        "torch": "FloorBackward0, CeilBackward0 and RoundBackward0 give 0.0 everywhere",
    },
    explanation=(
        "A step function is flat between its jumps, so AD gives 0 everywhere; at a jump the "
        "function is discontinuous and that 0 is a convention, not a subgradient. Quantization, "
        "binning and index computations from floats land on the jumps exactly (x = 2.0), and "
        "the parameters before them silently stop learning."
    ),
    fixes=(
        Fix(
            "For quantization, use a straight-through estimator:",
            "y = x + jax.lax.stop_gradient(jnp.round(x) - x)",
            "y = x + (torch.round(x) - x).detach()",
        ),
    ),
)

WHERE_AT_BOUNDARY = Singularity(
    id="where-at-boundary",
    op="where",
    kind="discontinuity",
    title="where on its boundary: the comparison holds with equality",
    singular_set=(
        "the comparison that chose the branch holds with equality (x == 0 in where(x > 0, a, b))"
    ),
    derivative=(
        "the derivative of the selected branch; at the boundary the other branch's is just as "
        "valid, and if the branches differ in value there the function jumps and has none"
    ),
    subdifferential=(
        "when the branches agree in value on the boundary: the convex hull of the two "
        "branches' gradients; when they differ: none"
    ),
    conventions={
        "jax": "the branch the comparison selected: grad(lambda x: jnp.where(x > 0, x, 0.))(0.) "
        "= 0.0; the unselected branch still receives a zero gradient, so "
        "where(x > 0, sqrt(x), 0.) gives nan at 0",
        "torch": "the same: 0.0, and WhereBackward0 sends 0 into the unselected branch, so "
        "torch.where(x > 0, torch.sqrt(x), 0.) gives nan at 0",
    },
    explanation=(
        "A piecewise function (Huber, piecewise linear, a guarded log) is evaluated by a "
        "comparison; with equality, only the selected piece's gradient is returned. If the "
        "pieces meet continuously this is a kink and the result is one valid subgradient; if "
        "they do not, the function jumps and no gradient is right. Separately, the unselected "
        "branch is still differentiated: 0 times its infinite slope is NaN (the where trap)."
    ),
    fixes=(
        Fix(
            "Make the unselected branch finite with the double-where trick:",
            "ok = x > 0\ny = jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0)",
            "ok = x > 0\ny = torch.where(ok, torch.sqrt(torch.where(ok, x, 1.0)), 0.0)",
        ),
        Fix(
            "Use gradsan's safe where, which does that and documents the boundary rule:",
            "y = gradsan.jax.safe.where(x > 0, jnp.sqrt, 0.0, x)",
            "y = gradsan.torch.safe.where(x > 0, torch.sqrt, 0.0, x)",
        ),
    ),
    safe="where",
    library=("jax.numpy.where", "torch.where"),
)

HYPOT_AT_ORIGIN = Singularity(
    id="hypot-at-origin",
    op="hypot",
    kind="kink",
    title="hypot at the origin: a cone; the frameworks disagree",
    singular_set="x == 0 and y == 0 in hypot(x, y)",
    derivative="d hypot(x, y) = (x, y) / hypot(x, y): 0 / 0 at the origin",
    subdifferential="the unit disk {g : |g| <= 1}",
    conventions={
        "jax": "grad of jnp.hypot at (0., 0.) = (0.5, 0.5), inside the disk: a valid subgradient",
        "torch": "HypotBackward0 gives (nan, nan): x / hypot = 0 / 0",
    },
    explanation=(
        "hypot(x, y) is the 2-norm of (x, y), Lipschitz with a cone point at the origin where "
        "every vector of the unit disk is a subgradient. JAX returns one of them; PyTorch "
        "divides 0 by 0. The length of a zero 2-D vector (a velocity, a gradient of an image) "
        "reaches it."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe hypot: the same values, gradient (0, 0) at the origin:",
            "r = gradsan.jax.safe.hypot(x, y)",
            "r = gradsan.torch.safe.hypot(x, y)",
        ),
    ),
    safe="hypot",
    library=("jax.numpy.hypot", "torch.hypot"),
)

EIGH_REPEATED_EIGENVALUES = Singularity(
    id="eigh-repeated-eigenvalues",
    op="eigh",
    kind="kink",
    title="eigh/svd with repeated eigenvalues: eigenvectors are not determined",
    singular_set=(
        "two or more equal eigenvalues of a symmetric matrix (equal singular values for svd)"
    ),
    derivative=(
        "d v_i contains 1 / (w_j - w_i) for j != i, infinite when w_j == w_i; each eigenvalue's "
        "gradient v_i v_i^T is finite but depends on which basis of the eigenspace was returned"
    ),
    subdifferential=(
        "for the k-th sorted eigenvalue: the convex hull of v v^T over unit vectors v in the "
        "repeated eigenspace; the eigenvectors themselves are not continuous there and have none"
    ),
    conventions={
        "jax": "grad of sum(eigh(eye(2))[0]) = eye(2) (finite); any use of the eigenvectors "
        "gives nan (1 / (w_j - w_i) = 1 / 0)",
        "torch": "the same: LinalgEighBackward0 is finite for the eigenvalues and nan through "
        "the eigenvectors",
    },
    explanation=(
        "Sorted eigenvalues are Lipschitz functions of a symmetric matrix, with kinks where two "
        "cross; at a crossing the eigenvectors of the repeated eigenvalue can be any "
        "orthonormal basis of its eigenspace, so they are not even continuous and their "
        "derivative divides by the gap w_j - w_i = 0. Identity-initialized or symmetric "
        "matrices, graph Laplacians of symmetric graphs and low-rank matrices (repeated 0) hit "
        "it exactly."
    ),
    fixes=(
        Fix(
            "Differentiate only spectral functions (trace, logdet, eigenvalues), which stay "
            "well defined:",
            "w = jnp.linalg.eigvalsh(a)",
            "w = torch.linalg.eigvalsh(a)",
        ),
        Fix(
            "Use gradsan's safe eigh, which drops the 1 / 0 terms inside a repeated eigenspace:",
            "w, v = gradsan.jax.safe.eigh(a)",
            "w, v = gradsan.torch.safe.eigh(a)",
        ),
    ),
    safe="eigh",
    library=(
        "jax.numpy.linalg.eigh",
        "jax.numpy.linalg.svd",
        "torch.linalg.eigh",
        "torch.linalg.svd",
    ),
)

NONFINITE_INPUT = Singularity(
    id="nonfinite-input",
    op="input",
    kind="input",
    title="an input was already NaN or Inf",
    singular_set="an argument of the function holds NaN or +-inf",
    derivative="not applicable: the value was non-finite before any operation ran",
    conventions={
        "jax": "NaN and +-inf propagate through every operation (nan * 0. = nan); nothing is "
        "raised unless jax_debug_nans is on",
        "torch": "the same IEEE propagation; anomaly mode names the first backward function "
        "that returned NaN, not the input",
    },
    explanation=(
        "The NaN or Inf came in with the arguments: no operation of the function created it. "
        "Look at where the data or parameters were produced (a previous update step, a data "
        "loader, an uninitialized buffer)."
    ),
    fixes=(
        Fix(
            "Check the inputs before the step, or find the step that first produced them:",
            "assert all(jnp.isfinite(x).all() for x in jax.tree_util.tree_leaves(inputs))",
            "assert all(torch.isfinite(t).all() for t in tensors)",
        ),
    ),
)

ENTRIES: tuple[Singularity, ...] = (
    # square roots and powers
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
    # logarithms
    LOG_AT_ZERO,
    LOG_OF_NEGATIVE,
    LOG1P_AT_MINUS_ONE,
    LOG2_AT_ZERO,
    LOG10_AT_ZERO,
    XLOGY_AT_ZERO,
    # angles: inverse trigonometric and hyperbolic functions, tan
    ATAN2_AT_ORIGIN,
    ACOS_AT_ONE,
    ASIN_AT_ONE,
    ATANH_AT_ONE,
    ACOSH_AT_ONE,
    TAN_AT_POLE,
    # overflow
    EXP_OVERFLOW,
    EXPM1_OVERFLOW,
    FLOAT16_OVERFLOW,
    # special functions
    LGAMMA_AT_POLE,
    DIGAMMA_AT_POLE,
    ERF_INV_AT_ONE,
    # library functions
    NORM_AT_ZERO,
    STD_OF_CONSTANT,
    VAR_OF_CONSTANT,
    LOGSUMEXP_ALL_NEG_INF,
    SOFTMAX_ALL_NEG_INF,
    # kinks, ties and jumps: finite gradients that are conventions
    ABS_AT_ZERO,
    RELU_AT_ZERO,
    MAX_TIE,
    SORT_TIE,
    CLIP_AT_BOUND,
    SIGN_AT_ZERO,
    FLOOR_ROUND_AT_JUMP,
    WHERE_AT_BOUNDARY,
    HYPOT_AT_ORIGIN,
    EIGH_REPEATED_EIGENVALUES,
    DET_AT_SINGULAR,
    # inputs
    NONFINITE_INPUT,
)
