"""The entries. Each constant is one singular or non-smooth operation; ids are stable.

To add an entry: write the constant, add it to ENTRIES, add its predicate in _classify.py,
point a fix at its safe function, and add a trigger program to tests/jax/test_catalog_triggers.py.
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
        ),
    ),
    safe="sqrt",
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

NONFINITE_INPUT = Singularity(
    id="nonfinite-input",
    op="input",
    kind="input",
    title="an input was already NaN or Inf",
    singular_set="an argument of the function holds NaN or +-inf",
    derivative="not applicable: the value was non-finite before any operation ran",
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
    SQRT_AT_ZERO,
    DIV_BY_ZERO,
    LOG_AT_ZERO,
    NONFINITE_INPUT,
)
