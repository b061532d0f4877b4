"""Logarithms. jnp.log2/log10 and torch.log2/log10 are log(x) / log(base) to both backends:
a zero is log-at-zero.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from .. import _masks as m
from .._classify import rule
from .._types import Fix, Singularity

LOG_AT_ZERO = Singularity(
    id="log-at-zero",
    op="log",
    kind="pole",
    title="log at 0: -inf value, infinite slope",
    singular_set=(
        "x == 0, also in log2 and log10, which are log(x) / log(base) (x < 0 is outside the "
        "domain: NaN)"
    ),
    derivative="d/dx log(x) = 1 / x, which is +inf at x = 0",
    conventions={
        "jax": "log(0.) = -inf; grad is ct / x = inf (NaN where the arriving gradient is 0)",
        "torch": "log(0.) = -inf; LogBackward0 computes grad / x",
    },
    explanation=(
        "log has a pole at 0: the value is -inf and the slope 1 / x is infinite. It is reached "
        "by a probability that underflowed to 0.0 (sigmoid(-800), softmax of a large negative "
        "logit) although the real-valued log-probability is finite, or by a 0 the program "
        "excludes by design (padding, a mask) whose log is still computed."
    ),
    fixes=(
        Fix(
            "Compute the log-probability directly instead of log of a probability:",
            "logp = jax.nn.log_sigmoid(z)    # not jnp.log(jax.nn.sigmoid(z))\n"
            "logp = jax.nn.log_softmax(z)    # not jnp.log(jax.nn.softmax(z))",
            "logp = torch.nn.functional.logsigmoid(z)\nlogp = torch.log_softmax(z, dim=-1)",
            rewrite="log_prob",
        ),
        Fix(
            "Use gradsan's safe log where a 0 is legitimate and masked later:",
            "y = gradsan.jax.safe.log(x)",
            "y = gradsan.torch.safe.log(x)",
            rewrite="safe",
        ),
    ),
    safe="log",
    point={"x": 0.0},
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
            rewrite="safe",
        ),
    ),
    safe="log1p",
    point={"x": -1.0},
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
            rewrite="safe",
        ),
    ),
    safe="xlogy",
    library=("jax.scipy.special.xlogy", "jax.scipy.special.entr", "torch.special.entr"),
    point={"x": 0.0, "y": 0.0},
)


# ---- which entry an op hit, in priority order (sets from _masks) ---------------------------

rule("log", (LOG_AT_ZERO, m.at_zero), (LOG_OF_NEGATIVE, m.negative))
rule("log1p", (LOG1P_AT_MINUS_ONE, m.at_minus_one), (LOG_OF_NEGATIVE, m.below_minus_one))
rule(
    "xlogy",  # operands: (x, y) of x * log(y)
    (XLOGY_AT_ZERO, m.xlogy_at_zero),
    (LOG_AT_ZERO, m.xlogy_log_at_zero, 1),
    (LOG_OF_NEGATIVE, m.xlogy_log_of_negative, 1),
)


ENTRIES: tuple[Singularity, ...] = (
    LOG_AT_ZERO,
    LOG_OF_NEGATIVE,
    LOG1P_AT_MINUS_ONE,
    XLOGY_AT_ZERO,
)
