"""Logarithms written another way: log2/log10 (log(x) / log(base)) and the power written as
exp(p * log(a)). Their op is ``log`` (the op that meets the 0); a finding of log-at-zero is routed
here when the user's statement under the caret is that call or that shape
(:func:`gradsan._fix.route`), so that their own fixes are the ones offered.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from .._types import Fix, Singularity

LOG2_LOG10_AT_ZERO = Singularity(
    id="log2-log10-at-zero",
    op="log",
    kind="pole",
    title="log2 / log10 at 0: -inf value, infinite slope",
    singular_set="x == 0 in log2(x) = log(x) / ln 2 and log10(x) = log(x) / ln 10",
    derivative=(
        "d/dx log2(x) = 1 / (x ln 2) and d/dx log10(x) = 1 / (x ln 10), both +inf at x = 0"
    ),
    conventions={
        "jax": "jnp.log2(0.) = -inf: lax.log(x) / lax.log(2.); grad is inf (NaN where the "
        "arriving gradient is 0)",
        "torch": "torch.log2(0.) = -inf; Log2Backward0 computes grad / (x ln 2)",
    },
    explanation=(
        "log2 and log10 are the natural log divided by a constant, so they share log's pole at "
        "0: the value is -inf and the slope infinite. A 0 the program masks or multiplies away "
        "later (padding, an entropy term of an empty bin) still sends that infinite slope "
        "backward, where 0 * inf = NaN. gradsan's safe log has a finite slope at 0; dividing it "
        "by ln 2 or ln 10 keeps the value of log2 / log10 everywhere."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe log divided by the log of the base (the same value, a finite "
            "slope at a 0 that is masked later):",
            "y = gradsan.jax.safe.log(x) / 0.6931471805599453  # log2; / 2.302585092994046 "
            "for log10",
            "y = gradsan.torch.safe.log(x) / 0.6931471805599453  # log2; / 2.302585092994046 "
            "for log10",
            rewrite="safe",
        ),
        Fix(
            "Keep the 0 out of the log: mask the argument before the log, not only the result "
            "after it:",
            "y = jnp.where(x > 0, jnp.log2(jnp.where(x > 0, x, 1.0)), 0.0)",
            "y = torch.where(x > 0, torch.log2(torch.where(x > 0, x, 1.0)), 0.0)",
        ),
    ),
    safe="log",
    point={"x": 0.0},
)

EXP_LOG_AT_ZERO = Singularity(
    id="exp-log-at-zero",
    op="log",
    kind="singular",
    title="exp(p * log(a)) at a = 0: a power written through a log",
    singular_set="a == 0 in exp(p * log(a)), the power a ** p written by hand",
    derivative=(
        "d/da exp(p log a) = exp(p log a) * p / a: at a = 0 that is 0 * inf for p > 1 (the "
        "power's true slope p a^(p-1) is 0), inf for p < 1"
    ),
    conventions={
        "jax": "jnp.exp(p * jnp.log(0.)) = 0. (exp(-inf)); its grad is 0 * inf = NaN",
        "torch": "torch.exp(p * torch.log(0.)) = 0.; ExpBackward0 * LogBackward0 give 0 * inf "
        "= NaN",
    },
    explanation=(
        "exp(p * log(a)) is a ** p computed through the log: at a = 0 the log is -inf and exp "
        "turns it back into the right value 0, but backward multiplies exp's 0 by log's "
        "infinite slope, 0 * inf = NaN, although the power itself has a finite slope there "
        "(0 for p > 1). Written as one power, with a derivative rule finite at 0, the gradient "
        "is the power's."
    ),
    fixes=(
        Fix(
            "exp(p * log(a)) is the power a ** p; write it as one (gradsan's safe pow is finite "
            "at a == 0):",
            "y = gradsan.jax.safe.pow(x, p)  # not jnp.exp(p * jnp.log(x))",
            "y = gradsan.torch.safe.pow(x, p)  # not torch.exp(p * torch.log(x))",
            rewrite="exp_log",
        ),
        Fix(
            "Where a must stay in log space, keep p * log(a) as the log of the quantity and "
            "never exponentiate a log of 0 (mask a == 0 before the log).",
            "log_y = p * jnp.log(jnp.where(x > 0, x, 1.0))",
            "log_y = p * torch.log(torch.where(x > 0, x, 1.0))",
        ),
    ),
    safe="pow",
    point={"x": 0.0, "p": 2.0},
)


ENTRIES: tuple[Singularity, ...] = (LOG2_LOG10_AT_ZERO, EXP_LOG_AT_ZERO)
