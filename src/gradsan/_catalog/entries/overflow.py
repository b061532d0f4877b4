"""Overflow: exp, expm1, and any op in half precision.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from typing import Any

from .. import _masks as m
from .._classify import Hit, hit, predicate, real
from .._types import Fix, Singularity

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


# ---- which entry an op hit, in priority order (sets from _masks) ---------------------------


def _exp_overflow(entry: Singularity, operands: Any, out: Any) -> Hit | None:
    x = operands[0]
    if not real(x):
        return None
    over = m.nonfinite_from_finite(x, out)
    if over is None:  # no output: the threshold log(max float) of the input's dtype
        over = m.exp_threshold(x)
    return hit(entry.id, over, operands)


@predicate("exp", entries=[EXP_OVERFLOW])
def _exp(operands: Any, out: Any, params: Any) -> Hit | None:
    return _exp_overflow(EXP_OVERFLOW, operands, out)


@predicate("expm1", entries=[EXPM1_OVERFLOW])
def _expm1(operands: Any, out: Any, params: Any) -> Hit | None:
    return _exp_overflow(EXPM1_OVERFLOW, operands, out)


# FLOAT16_OVERFLOW is any op's: gradsan._catalog._overflow.classify_overflow names it.


ENTRIES: tuple[Singularity, ...] = (
    EXP_OVERFLOW,
    EXPM1_OVERFLOW,
    FLOAT16_OVERFLOW,
)
